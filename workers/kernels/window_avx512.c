/* The window products (window.h) on CPUs with AVX-512 BW and VNNI: a weight matrix
   times a window of tokens with activations rounded to int8 per block of 32.

   Why: a verify window and a prompt are many tokens against the same weights.
   The one-token kernels (16-bit activations) redo each block's unpacking and
   multiply 32 pairs an instruction for every token; here a block pair is unpacked
   once for up to CHUNK tokens, and each token takes one 64-pair VNNI product.

   Shapes. Two blocks b, b + 1 (a "pair", 64 values) fill one 512-bit vector of
   16 int32 lanes, interleaved: lane 2k sums values 4k..4k+3 of block b, lane
   2k + 1 the same values of block b + 1. VNNI multiplies unsigned bytes by
   signed ones. 4-bit quants are unsigned (Q4_0's minus 8 is an offset, -8 d),
   so they meet the activations xq as they are. Int8 quants (Q8_0, FMT_I8) are
   signed, so they meet xq + 128: a lane's product is then sum(w * xq) +
   128 * sum(w), and the second term, the same for every token, is subtracted
   in the lane's starting value. A lane's float term is w_scale * x_scale *
   isum, accumulated over the row's pairs in the lanes, offsets (Q4_1's m,
   Q4_0's -8 d, K-quants') times the blocks' rounded sums in the same lanes, and
   the lanes folded by fold4. The activations are rounded as llama.cpp rounds
   them for each weight type (window_quantize).

   The target's Q8_0 matrices come laid out for this at load (FMT_W8): pairs
   already interleaved, scales in float32, and quants + 128, unsigned, so they
   meet xq as 4-bit quants do and the 128 * sum(xq) they add is taken off with a
   per-token vector (window_act.qc) instead of a per-row one: a token or two then
   multiplies a pair in a few instructions. The same integers and scales, so the
   same bits. A window's last 1-3 tokens take four rows at a time (tile8).

   Q4_K comes as FMT_N4: FMT_I8's quants (0-15) as nibbles, met as Q4_0's are, with its
   scales and offsets as floats per block; Q6_K as FMT_N6, its nibbles and top bits made
   FMT_I8's signed quants in registers. The integer sums, the scales and the float steps
   are FMT_I8's, so the bits are too, from 0.75 and 1.0 bytes a weight (FMT_I8: 1.375, 1.25).

   Row tiles (FMT_T4_1, FMT_T8_0, FMT_T4_K, FMT_T6_K; tile16): the target's matrices whose
   rows are a multiple of 16 are held the other way round, a lane a row. A product then
   broadcasts 4 values of a token against 16 rows' 4 weights, a block's integer sums for
   16 rows take 8 products, and the float steps run once per 16 rows, with no lanes to
   fold: the pair layouts spend those steps on every pair of blocks of every row, and a
   token's products were bound by them rather than by the bytes read.

   Batch invariance: a token's float operations are the same sequence whatever
   the window, chunk or token next to it; only the integer sums and the unpacking
   are shared, and integers are exact. */
#include <math.h>

#include "window.h"

#if WINDOW_AVX512

int window_act_kind(const hs_mat *w) {
    const int f = w->fmt;
    return f == FMT_I8 || f == FMT_N4 || f == FMT_N6 || f == FMT_T4_K || f == FMT_T6_K ? ACT_Q8_K
         : f == FMT_Q4_1 || f == FMT_T4_1 ? ACT_Q8_1 : ACT_Q8_0;
}

static inline float round_half(float x) { return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)); }

/* Lane k of a pair's natural dwords (block b: 0-7, block b + 1: 8-15), interleaved. */
#define INTERLEAVE _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0)

/* x's n values rounded as `kind` says: xq = x * 127 / max|x| to nearest even, the
   max taken per block (Q8_0, Q8_1) or per 256 values (Q8_K). The scale is
   max / 127 in float16 (Q8_0, Q8_1) or 1 / (127 / max) in float32 (Q8_K); sum is
   scale * sum(xq), except Q8_1's, float16(max / 127 * sum(xq)). */
void window_quantize(const float *x, int n, int kind, window_act *out) {
    const int nb = n / BLOCK;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    float top[nb];
    for (int b = 0; b < nb; b++)
        top[b] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + b * BLOCK)),
                                                    _mm512_andnot_ps(sign, _mm512_loadu_ps(x + b * BLOCK + 16))));
    if (kind == ACT_Q8_K && nb % 8 == 0)     /* K-quant rows are whole 256s; Q5_1's (FMT_I8) may not be */
        for (int g = 0; g < nb; g += 8) {
            float most = top[g];
            for (int b = g + 1; b < g + 8; b++) most = fmaxf(most, top[b]);
            for (int b = g; b < g + 8; b++) top[b] = most;
        }
    for (int p = 0; p < (nb + 1) / 2; p++) {
        __m128i bytes[4];
        for (int h = 0; h < 2; h++) {
            const int b = 2 * p + h;
            if (b == nb) {          /* no partner: xq = 0 */
                bytes[2 * h] = bytes[2 * h + 1] = _mm_setzero_si128();
                out->scale[b] = 0.0f;
                continue;
            }
            const float inv = top[b] > 0.0f ? 127.0f / top[b] : 0.0f;
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + b * BLOCK), _mm512_set1_ps(inv)));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + b * BLOCK + 16), _mm512_set1_ps(inv)));
            bytes[2 * h] = _mm512_cvtepi32_epi8(q0);
            bytes[2 * h + 1] = _mm512_cvtepi32_epi8(q1);
            _mm_storeu_si128((__m128i *)(out->q + b * BLOCK), bytes[2 * h]);
            _mm_storeu_si128((__m128i *)(out->q + b * BLOCK + 16), bytes[2 * h + 1]);
            out->qsum[2 * b] = _mm512_reduce_add_epi32(q0);
            out->qsum[2 * b + 1] = _mm512_reduce_add_epi32(q1);
            const float qsum = (float)(out->qsum[2 * b] + out->qsum[2 * b + 1]);
            const float d = top[b] / 127.0f;
            out->scale[b] = kind == ACT_Q8_K ? (inv > 0.0f ? 1.0f / inv : 0.0f) : round_half(d);
            out->sum[b] = kind == ACT_Q8_1 ? round_half(d * qsum) : out->scale[b] * qsum;
        }
        __m512i pair = _mm512_castsi128_si512(bytes[0]);
        pair = _mm512_inserti32x4(pair, bytes[1], 1);
        pair = _mm512_inserti32x4(pair, bytes[2], 2);
        pair = _mm512_inserti32x4(pair, bytes[3], 3);
        pair = _mm512_permutexvar_epi32(INTERLEAVE, pair);
        const __m512i lane_sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), pair);
        _mm512_store_si512(out->qc + 128 * p, pair);
        _mm512_store_si512(out->qc + 128 * p + 64, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(lane_sums, 7)));
        _mm512_storeu_si512(out->u + 64 * p, _mm512_xor_si512(pair, _mm512_set1_epi8((char)0x80)));
    }
}

/* Two blocks' float16 scales (the second 0 when there is none), b's in the even lanes. */
static inline __m512 block_scales(const uint16_t *d, int both) {
    uint32_t two = d[0];
    if (both) memcpy(&two, d, 4);
    return _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_castps_pd(_mm_cvtph_ps(_mm_cvtsi32_si128((int)two)))));
}

/* Row r's pair p as bytes in the pair layout (unsigned for 4-bit formats, signed
   for int8 ones), and its per-lane weight scales. fmt is w->fmt, a constant
   where this is inlined (see window_rows), so no branch on it is left in the loops. */
static inline __attribute__((always_inline)) __m512i pair_weights(const hs_mat *w, const int fmt, int r, int nb,
                                                                  int p, __m512 *scales) {
    const int b = 2 * p, whole = b + 1 < nb;
    const size_t at = (size_t)r * nb + b;
    if (fmt == FMT_W8) {            /* laid out at load: pairs interleaved, quants + 128, float scales */
        const size_t pair = w8_pair(w, r, p);
        *scales = _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_load_sd((const double *)(w->scales + 2 * pair))));
        return _mm512_loadu_si512(w->qs + 64 * pair);
    }
    if (fmt == FMT_Q4_0 || fmt == FMT_Q4_1 || fmt == FMT_N4 || fmt == FMT_N6) {
        /* a block's byte j holds values j and j + 16: the low nibbles in the lower
           half, the high ones in the upper, then dwords b 0-15, b+1 0-15, b 16-31, b+1 16-31 */
        const __m512i v = whole ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w->qs + at * 16)))
                                : _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(w->qs + at * 16)));
        const __m512i shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
        __m512i q = _mm512_and_si512(_mm512_srlv_epi64(v, shift), _mm512_set1_epi8(15));
        if (fmt == FMT_N6) {        /* each 128-bit quarter's top bits 2 * quarter up in the pair's bytes */
            const __m512i top = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(w->sub + 16 * ((size_t)r * ((nb + 1) / 2) + p))));
            const __m512i bits = _mm512_and_si512(_mm512_srlv_epi64(top, _mm512_set_epi64(6, 6, 4, 4, 2, 2, 0, 0)), _mm512_set1_epi8(3));
            q = _mm512_sub_epi8(_mm512_or_si512(q, _mm512_slli_epi16(bits, 4)), _mm512_set1_epi8(32));
        }
        q = _mm512_permutexvar_epi32(_mm512_set_epi32(15, 11, 14, 10, 13, 9, 12, 8, 7, 3, 6, 2, 5, 1, 4, 0), q);
        if (!whole) q = _mm512_maskz_mov_epi32(0x5555, q);
        if (fmt == FMT_N6) {        /* FMT_I8's scales */
            const __m128 s = whole ? _mm_loadu_ps(w->scales + 2 * at) : _mm_castpd_ps(_mm_load_sd((const double *)(w->scales + 2 * at)));
            *scales = _mm512_permutexvar_ps(_mm512_set_epi32(3, 1, 3, 1, 3, 1, 3, 1, 2, 0, 2, 0, 2, 0, 2, 0),
                                            _mm512_castps128_ps512(s));
            return q;
        }
        /* FMT_N4's float32 scales, b's in the even lanes as block_scales places them: the
           lanes FMT_I8's per-16 scales fill with the same value twice */
        *scales = fmt != FMT_N4 ? block_scales(w->d + at, whole)
                                : _mm512_castpd_ps(_mm512_broadcastsd_pd(whole ? _mm_load_sd((const double *)(w->scales + at))
                                                                              : _mm_castps_pd(_mm_load_ss(w->scales + at))));
        return q;
    }
    const int8_t *qs = (const int8_t *)w->qs + at * 32;      /* Q8_0 and FMT_I8: 32 int8 a block */
    const __m512i q = _mm512_permutexvar_epi32(INTERLEAVE, whole ? _mm512_loadu_si512(qs)
                                                                 : _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)qs)));
    if (fmt == FMT_I8) {            /* a scale per 16 values: lanes 0-7 even/odd cover the two halves of b, b + 1 */
        const __m128 s = whole ? _mm_loadu_ps(w->scales + 2 * at) : _mm_castpd_ps(_mm_load_sd((const double *)(w->scales + 2 * at)));
        *scales = _mm512_permutexvar_ps(_mm512_set_epi32(3, 1, 3, 1, 3, 1, 3, 1, 2, 0, 2, 0, 2, 0, 2, 0),
                                        _mm512_castps128_ps512(s));
    } else {
        *scales = block_scales(w->d + at, whole);
    }
    return whole ? q : _mm512_maskz_mov_epi32(0x5555, q);
}

/* Sixteen of row r's per-block offsets from block b (fewer at the row's end; zeros past it). */
static inline __attribute__((always_inline)) __m512 block_offsets(const hs_mat *w, const int fmt, int r, int nb, int b) {
    const __mmask16 keep = nb - b >= 16 ? 0xffff : (__mmask16)((1u << (nb - b)) - 1);
    const size_t at = (size_t)r * nb + b;
    if (fmt == FMT_Q4_1) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(keep, w->m + at));
    if (fmt == FMT_Q4_0) return _mm512_mul_ps(_mm512_set1_ps(-8.0f), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(keep, w->d + at)));
    return _mm512_maskz_loadu_ps(keep, w->offsets + at);
}

enum { CHUNK = 8 };     /* accumulators a tile keeps in registers: rows x tokens */

/* Rows r..r+R-1 of W for n tokens of x, R * n <= CHUNK (R, n and fmt constants at
   each call, so the loops unroll). A few tokens take four rows at a time: one token's
   row alone is a single chain of dependent FMAs, and four fold at once. Each row and
   token gets the same float steps in any tile: the tiles only share loops. */
static inline __attribute__((always_inline)) void tile8(const hs_mat *w, const int fmt, int r, const int R,
                                                        const window_act *x, const int n, float *y, int ystride) {
    const int nb = w->cols / BLOCK, pairs = (nb + 1) / 2;
    const int nibbles = fmt == FMT_Q4_0 || fmt == FMT_Q4_1 || fmt == FMT_N4, biased = fmt == FMT_W8;
    const int has_offsets = nibbles || (fmt == FMT_I8 && w->offsets);
    const uint8_t *xq[CHUNK];       /* two pointers a token: with more a tile of 8 runs out of registers */
    const float *xs[CHUNK];
    for (int t = 0; t < n; t++) xq[t] = biased || nibbles ? x[t].qc : x[t].u, xs[t] = x[t].scale;
    __m512 acc[CHUNK];
    for (int k = 0; k < R * n; k++) acc[k] = _mm512_setzero_ps();
    for (int p = 0; p < pairs; p++)
        for (int i = 0; i < R; i++) {
            __m512 ws;
            const __m512i q = pair_weights(w, fmt, r + i, nb, p, &ws);
            const __m512i start = nibbles || biased ? _mm512_setzero_si512()
                                          : _mm512_sub_epi32(_mm512_setzero_si512(),
                                                             _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), q));
            for (int t = 0; t < n; t++) {
                const __m512i s = biased ? _mm512_dpbusd_epi32(_mm512_load_si512(xq[t] + 128 * p + 64), q,
                                                               _mm512_load_si512(xq[t] + 128 * p))
                                : nibbles ? _mm512_dpbusd_epi32(start, q, _mm512_load_si512(xq[t] + 128 * p))
                                          : _mm512_dpbusd_epi32(start, _mm512_loadu_si512(xq[t] + 64 * p), q);
                const __m512 scale = _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_load_sd((const double *)(xs[t] + 2 * p))));
                acc[i * n + t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(ws, scale), acc[i * n + t]);
            }
        }
    if (has_offsets)
        for (int b = 0; b < nb; b += 16) {
            const __mmask16 keep = nb - b >= 16 ? 0xffff : (__mmask16)((1u << (nb - b)) - 1);
            for (int i = 0; i < R; i++) {
                const __m512 o = block_offsets(w, fmt, r + i, nb, b);
                for (int t = 0; t < n; t++)
                    acc[i * n + t] = _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(keep, x[t].sum + b), acc[i * n + t]);
            }
        }
    for (int k0 = 0; k0 < R * n; k0 += 4) {
        __m512 four[4];
        for (int k = 0; k < 4; k++) four[k] = k0 + k < R * n ? acc[k0 + k] : _mm512_setzero_ps();
        float sums[4];
        _mm_storeu_ps(sums, fold4(four));
        for (int k = 0; k < 4 && k0 + k < R * n; k++)
            y[(size_t)((k0 + k) % n) * ystride + r + (k0 + k) / n] = sums[k];
    }
}

enum { ROWS = 4 };      /* rows a tile for the last 1-3 tokens of a window */

/* Rows r0..r1-1 of Y = W X for T tokens (token t's outputs at y + t * ystride), ROWS
   rows at a time: their tokens 8 or 4 at a time a row, the last 1-3 tokens all four rows
   at once (see tile8). */
static inline __attribute__((always_inline)) void matmat8_fmt(const hs_mat *w, const int fmt, const window_act *x, int T,
                                                              float *y, int ystride, const hs_mat *next, int r0, int r1) {
    const int many = T & ~3, few = T - many;
    for (int r = r0; r < r1; r += ROWS) {
        const int R = r1 - r < ROWS ? r1 - r : ROWS;
        prefetch_ahead(w, next, r + AHEAD, R);
        for (int t = 0; t < many; t += CHUNK)      /* a chunk's activations stay in L1 across the tile's rows */
            for (int i = 0; i < R; i++) {
                if (t + CHUNK <= many) tile8(w, fmt, r + i, 1, x + t, CHUNK, y + (size_t)t * ystride, ystride);
                else tile8(w, fmt, r + i, 1, x + t, 4, y + (size_t)t * ystride, ystride);
            }
        float *yf = y + (size_t)many * ystride;
        if (R == ROWS) {
            if (few == 1) tile8(w, fmt, r, ROWS, x + many, 1, yf, ystride);
            else if (few == 2) tile8(w, fmt, r, ROWS, x + many, 2, yf, ystride);
            else if (few == 3) { tile8(w, fmt, r, ROWS, x + many, 2, yf, ystride);
                                 tile8(w, fmt, r, ROWS, x + many + 2, 1, yf + (size_t)2 * ystride, ystride); }
        } else {
            for (int i = 0; i < R; i++)
                for (int t = 0; t < few; t++) tile8(w, fmt, r + i, 1, x + many + t, 1, yf + (size_t)t * ystride, ystride);
        }
    }
}

/* A row tile's block (formats.h, FMT_T*): its quants as 8 vectors of 16 rows' dwords,
   wq[k] holding each row's values 4k..4k+3 (unsigned: FMT_T8_0's + 128, FMT_T6_K's + 32). */
static inline __attribute__((always_inline)) void tile_quants(const uint8_t *q, const int fmt, __m512i *wq) {
    const __m512i low = _mm512_set1_epi8(15), top = _mm512_set1_epi8(0x30);
    for (int j = 0; j < 8; j++) {
        if (fmt == FMT_T8_0) wq[j] = _mm512_loadu_si512(q + 64 * j);
        else if (j < 4) {
            const __m512i v = _mm512_loadu_si512(q + 64 * j);
            wq[j] = _mm512_and_si512(v, low);
            wq[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
    }
    if (fmt == FMT_T6_K)        /* nibble vector j's top bits at 2 (j % 4) of vector j / 4: moved to bits 4-5 */
        for (int h = 0; h < 2; h++) {
            const __m512i v = _mm512_loadu_si512(q + 256 + 64 * h);
            wq[4 * h] = _mm512_or_si512(wq[4 * h], _mm512_and_si512(_mm512_slli_epi16(v, 4), top));
            wq[4 * h + 1] = _mm512_or_si512(wq[4 * h + 1], _mm512_and_si512(_mm512_slli_epi16(v, 2), top));
            wq[4 * h + 2] = _mm512_or_si512(wq[4 * h + 2], _mm512_and_si512(v, top));
            wq[4 * h + 3] = _mm512_or_si512(wq[4 * h + 3], _mm512_and_si512(_mm512_srli_epi16(v, 2), top));
        }
}

/* The row tiles (FMT_T*): tile g (rows 16g..16g+15) for n <= 4 tokens. A block's quants
   are unpacked once for the tokens; each product of 4 values broadcasts one dword of a
   token's xq against 16 rows, so a lane is a row and a block's integer sums for 16 rows
   take 8 VNNI products, with no lanes to fold. Biased quants (q + 128, q + 32) add the
   bias times sum(xq), taken off in the products' starting values. Float steps, per row,
   token and block in order: acc += isum * (d * xscale) (FMT_T6_K: for each 16-value half
   with its own scale), then acc += offset * xsum where there are offsets; the same in any
   tile, so a token's rows do not depend on the tokens beside it. */
static inline __attribute__((always_inline)) void tile16(const hs_mat *w, const int fmt, int g, const window_act *x,
                                                         const int n, float *y, int ystride) {
    const int nb = w->cols / BLOCK, bytes = fmt == FMT_T8_0 ? 512 : fmt == FMT_T6_K ? 384 : 256;
    const int halves = fmt == FMT_T6_K, chains = halves || n <= 2 ? 4 : 2;   /* a chain of 8 products waits */
    const size_t tb = (size_t)g * nb;      /* the tile's first block */
    __m512 acc[4];
    for (int t = 0; t < n; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *q = w->qs + (tb + b) * bytes;
        for (int k = 0; k < bytes; k += 64) _mm_prefetch((const char *)(q + 8 * bytes + k), _MM_HINT_T0);
        __m512i wq[8];
        tile_quants(q, fmt, wq);
        __m512 ds, hs, os;      /* scales (FMT_T6_K: the first half's, then hs the second's), offsets */
        if (fmt == FMT_T4_1 || fmt == FMT_T8_0) {
            ds = hs = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->d + 16 * (tb + b))));
            os = fmt == FMT_T4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->m + 16 * (tb + b)))) : ds;
        } else {
            ds = _mm512_loadu_ps(w->scales + (halves ? 32 : 16) * (tb + b));
            hs = halves ? _mm512_loadu_ps(w->scales + 32 * (tb + b) + 16) : ds;
            os = halves ? ds : _mm512_loadu_ps(w->offsets + 16 * (tb + b));
        }
        for (int t = 0; t < n; t++) {
            int xq[8];      /* dword k: the token's values 4k..4k+3 of the block, wq[k]'s */
            memcpy(xq, x[t].q + b * BLOCK, sizeof xq);
            const int *sum16 = x[t].qsum + 2 * b;
            __m512i c[4];   /* FMT_T6_K: c[0], c[1] the first half's (k < 4), c[2], c[3] the second's */
            for (int k = 0; k < chains; k++) {
                const int at = halves ? (k & 1) + 4 * (k >> 1) : k;
                const int bias = fmt == FMT_T8_0 && k == 0 ? -128 * (sum16[0] + sum16[1])
                               : halves && (k & 1) == 0 ? -32 * sum16[k >> 1] : 0;
                c[k] = _mm512_dpbusd_epi32(_mm512_set1_epi32(bias), wq[at], _mm512_set1_epi32(xq[at]));
            }
            for (int k = 0; k < 8; k++) {
                const int chain = halves ? (k & 1) + 2 * (k >> 2) : k % chains;
                if (halves ? (k & 3) >= 2 : k >= chains)
                    c[chain] = _mm512_dpbusd_epi32(c[chain], wq[k], _mm512_set1_epi32(xq[k]));
            }
            const __m512 xs = _mm512_set1_ps(x[t].scale[b]);
            if (halves) {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c[0], c[1])), _mm512_mul_ps(ds, xs), acc[t]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c[2], c[3])), _mm512_mul_ps(hs, xs), acc[t]);
                continue;
            }
            if (chains == 4) c[0] = _mm512_add_epi32(c[0], c[2]), c[1] = _mm512_add_epi32(c[1], c[3]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c[0], c[1])), _mm512_mul_ps(ds, xs), acc[t]);
            if (fmt == FMT_T4_1 || fmt == FMT_T4_K) acc[t] = _mm512_fmadd_ps(os, _mm512_set1_ps(x[t].sum[b]), acc[t]);
        }
    }
    for (int t = 0; t < n; t++) _mm512_storeu_ps(y + (size_t)t * ystride + 16 * g, acc[t]);
}

/* Rows r0..r1-1 (multiples of 16) of Y = W X for T tokens of a row-tile format, four tokens a tile. */
static inline __attribute__((always_inline)) void tiles16(const hs_mat *w, const int fmt, const window_act *x, int T,
                                                          float *y, int ystride, int r0, int r1) {
    for (int g = r0 / 16; g < r1 / 16; g++) {
        int t = 0;
        for (; t + 4 <= T; t += 4) tile16(w, fmt, g, x + t, 4, y + (size_t)t * ystride, ystride);
        float *yt = y + (size_t)t * ystride;
        if (T - t == 3) tile16(w, fmt, g, x + t, 3, yt, ystride);
        else if (T - t == 2) tile16(w, fmt, g, x + t, 2, yt, ystride);
        else if (T - t == 1) tile16(w, fmt, g, x + t, 1, yt, ystride);
    }
}

/* Rows r0..r1-1 of Y = W X for T tokens, the kernel specialised for W's format. */
void window_rows(const hs_mat *w, const window_act *x, int T, float *y, int ystride, const hs_mat *next, int r0, int r1) {
    switch (w->fmt) {
    case FMT_W8: matmat8_fmt(w, FMT_W8, x, T, y, ystride, next, r0, r1); break;
    case FMT_Q8_0: matmat8_fmt(w, FMT_Q8_0, x, T, y, ystride, next, r0, r1); break;
    case FMT_Q4_0: matmat8_fmt(w, FMT_Q4_0, x, T, y, ystride, next, r0, r1); break;
    case FMT_Q4_1: matmat8_fmt(w, FMT_Q4_1, x, T, y, ystride, next, r0, r1); break;
    case FMT_N4: matmat8_fmt(w, FMT_N4, x, T, y, ystride, next, r0, r1); break;
    case FMT_N6: matmat8_fmt(w, FMT_N6, x, T, y, ystride, next, r0, r1); break;
    case FMT_T4_1: tiles16(w, FMT_T4_1, x, T, y, ystride, r0, r1); break;
    case FMT_T8_0: tiles16(w, FMT_T8_0, x, T, y, ystride, r0, r1); break;
    case FMT_T4_K: tiles16(w, FMT_T4_K, x, T, y, ystride, r0, r1); break;
    case FMT_T6_K: tiles16(w, FMT_T6_K, x, T, y, ystride, r0, r1); break;
    default: matmat8_fmt(w, FMT_I8, x, T, y, ystride, next, r0, r1); break;
    }
}


long window_act_floats(int widest) {
    return (widest / BLOCK + 1) / 2 * 68 + 2 * (widest / BLOCK) + 36;    /* 16 to align qc */
}

void window_act_at(window_act *a, float *work, int widest) {
    const size_t pairs = (size_t)(widest / BLOCK + 1) / 2;
    a->qc = (uint8_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
    a->u = a->qc + 128 * pairs;
    a->scale = (float *)(a->u + 64 * pairs);
    a->sum = a->scale + 2 * pairs;
    a->q = (int8_t *)(a->sum + 2 * pairs);
    a->qsum = (int *)(a->q + 64 * pairs);
}

#endif
