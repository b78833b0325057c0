/* The window products (window.h) on CPUs without AVX-512 VNNI: activations rounded
   to int8 per block of 32, as llama.cpp rounds them, multiplied with AVX2's byte
   products.

   Why: a 16-bit one-token kernel multiplies 16 pairs an instruction and unpacks every
   block again for each token of a window, so a window of w tokens cost nearly w
   passes. Here a block is unpacked once for up to CHUNK tokens, and each token takes
   one 32-pair byte product (vpmaddubsw, then vpmaddwd to int32 lanes).

   Shapes. A block of 32 weights fills one 256-bit vector of bytes in order; its
   product with a token's 32 int8 activations leaves 8 int32 lanes, lane k summing
   values 4k..4k+3 (lanes 0-3 the block's first 16 values, 4-7 its last 16, which is
   where a scale per 16 values goes). vpmaddubsw multiplies unsigned bytes by signed
   ones: 4-bit quants (Q4_0, Q4_1, FMT_K4) are unsigned and meet the activations as
   they are; signed quants (Q8_0, FMT_Q5, FMT_I8, FMT_K6's values - 32) meet them through
   their absolute values, the activations taking the quants' signs (|q| * |x| * 2
   <= 32258 fits its int16 sums). A lane's float term is w_scale * x_scale * isum,
   accumulated over the row's blocks in the lanes; offsets (Q4_1's m, Q4_0's -8 d,
   K-quants' mins) times the blocks' rounded sums in the same lanes; the lanes summed
   last. Those row-at-a-time products take the matrices whose rows do not make tiles.

   Row tiles (FMT_T4_1, FMT_T8_0, FMT_T4_K, FMT_T6_K; tile_half): every matrix whose rows
   are a multiple of 16 comes in window_avx512.c's tiles of 16 rows, read here 8 rows at a
   time, a lane a row: a block's integer sums for 8 rows take 8 byte products, the float
   steps run once per 8 rows, and no lanes are folded. The row-at-a-time products spent
   those float steps and folds on every block of every row, and a token's pass was bound by
   them rather than by the bytes it reads. Q8_0's quants are |q| <= 127 (llama.cpp's
   rounding, and Q5_0's q - 16), so moving signs onto them never meets -128.

   Batch invariance: a token's float operations are the same sequence whatever the
   window, chunk or token next to it; only the unpacking is shared. */
#include <math.h>

#include "window.h"

#if !WINDOW_AVX512

int window_act_kind(const hs_mat *w) {
    const int f = w->fmt;
    return f == FMT_I8 || f == FMT_K4 || f == FMT_K6 || f == FMT_T4_K || f == FMT_T6_K ? ACT_Q8_K
         : f == FMT_Q4_1 || f == FMT_T4_1 ? ACT_Q8_1 : ACT_Q8_0;
}

static inline float round_half(float x) { return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)); }

/* x's n values rounded as `kind` says: xq = x * 127 / max|x| to nearest even, the max
   taken per block (Q8_0, Q8_1) or per 256 values (Q8_K). The scale is max / 127 in
   float16 (Q8_0, Q8_1) or 1 / (127 / max) in float32 (Q8_K); sum is scale * sum(xq),
   except Q8_1's, float16(max / 127 * sum(xq)). The same rules as window_avx512.c's. */
void window_quantize(const float *x, int n, int kind, window_act *out) {
    const int nb = n / BLOCK;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    float top[nb];
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * BLOCK;
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(xb));
        for (int c = 1; c < 4; c++) a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * c)));
        top[b] = hmax8(a);
    }
    if (kind == ACT_Q8_K && nb % 8 == 0)     /* K-quant rows are whole 256s; Q5_1's (FMT_I8) may not be */
        for (int g = 0; g < nb; g += 8) {
            float most = top[g];
            for (int b = g + 1; b < g + 8; b++) most = fmaxf(most, top[b]);
            for (int b = g; b < g + 8; b++) top[b] = most;
        }
    for (int b = 0; b < nb; b++) {
        const float inv = top[b] > 0.0f ? 127.0f / top[b] : 0.0f;
        __m256i q[4];
        for (int c = 0; c < 4; c++)
            q[c] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + b * BLOCK + 8 * c), _mm256_set1_ps(inv)));
        const __m256i sums = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(out->q + b * BLOCK), ordered);
        _mm256_storeu_si256((__m256i *)(out->aq + b * BLOCK), _mm256_abs_epi8(ordered));
        const float qsum = (float)_mm_cvtsi128_si32(t), d = top[b] / 127.0f;
        out->scale[b] = kind == ACT_Q8_K ? (inv > 0.0f ? 1.0f / inv : 0.0f) : round_half(d);
        out->sum[b] = kind == ACT_Q8_1 ? round_half(d * qsum) : out->scale[b] * qsum;
        if (kind == ACT_Q8_K) {
            const __m256i halves = _mm256_hadd_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(halves), _mm256_extracti128_si256(halves, 1));
            /* h: lanes 0 and 1 sum values 0-15 (pairs of q[0] + q[1]), lanes 2 and 3 values 16-31 */
            out->sum16[2 * b] = (int16_t)(_mm_extract_epi32(h, 0) + _mm_extract_epi32(h, 1));
            out->sum16[2 * b + 1] = (int16_t)(_mm_extract_epi32(h, 2) + _mm_extract_epi32(h, 3));
        }
    }
}

/* Block b of row r as 32 bytes in order (unsigned for 4-bit formats and FMT_K6, whose
   32 tile_k takes off; signed for the others), and its weight scale in each lane (two scales for a scale per 16 values).
   fmt is w->fmt, a constant where this is inlined (see window_rows), so no branch on it
   is left in the loops. */
static inline __attribute__((always_inline)) __m256i block_weights(const hs_mat *w, const int fmt, int r, int nb,
                                                                   int b, __m256 *scales) {
    const size_t at = (size_t)r * nb + b;
    const __m128i mask = _mm_set1_epi8(15);
    if (fmt == FMT_Q4_0 || fmt == FMT_Q4_1 || fmt == FMT_K4) {     /* byte j holds values j and j + 16 */
        const __m128i v = _mm_loadu_si128((const __m128i *)(w->qs + at * 16));
        if (fmt == FMT_K4) {
            const size_t s = (size_t)r * (nb / 8) + b / 8;
            *scales = _mm256_set1_ps(w->scales[2 * s] * (float)w->sub[16 * s + b % 8]);
        } else {
            *scales = _mm256_set1_ps(_cvtsh_ss(w->d[at]));
        }
        return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mask), _mm_and_si128(v, mask));
    }
    if (fmt == FMT_K6) {            /* low nibbles as above, then the top bits (k6_quants) */
        __m128i qa, qb;
        k6_quants(w->qs + at * 24, &qa, &qb);
        const float d = w->scales[(size_t)r * (nb / 8) + b / 8];
        const int8_t *sc = (const int8_t *)w->sub + 2 * at;
        *scales = _mm256_set_m128(_mm_set1_ps(d * (float)sc[1]), _mm_set1_ps(d * (float)sc[0]));
        return _mm256_set_m128i(qb, qa);
    }
    if (fmt == FMT_Q5) {            /* q - 16, signed */
        *scales = _mm256_set1_ps(_cvtsh_ss(w->d[at]));
        return q5_quants(w->qs + at * 20);
    }
    if (fmt == FMT_I8)              /* a float scale per 16 values */
        *scales = _mm256_set_m128(_mm_set1_ps(w->scales[2 * at + 1]), _mm_set1_ps(w->scales[2 * at]));
    else
        *scales = _mm256_set1_ps(_cvtsh_ss(w->d[at]));
    return _mm256_loadu_si256((const __m256i *)(w->qs + at * 32));
}

/* Eight of row r's per-block offsets from block b (fewer at the row's end; zeros past it). */
static inline __attribute__((always_inline)) __m256 block_offsets(const hs_mat *w, const int fmt, int r, int nb, int b) {
    const size_t at = (size_t)r * nb + b;
    if (nb - b < 8) {
        float o[8] = {0};
        for (int k = 0; k < nb - b; k++)
            o[k] = fmt == FMT_Q4_1 ? _cvtsh_ss(w->m[at + k]) : fmt == FMT_Q4_0 ? -8.0f * _cvtsh_ss(w->d[at + k])
                                                              : w->offsets[at + k];
        return _mm256_loadu_ps(o);   /* FMT_K4 rows hold whole superblocks: never here */
    }
    if (fmt == FMT_Q4_1) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->m + at)));
    if (fmt == FMT_Q4_0) return _mm256_mul_ps(_mm256_set1_ps(-8.0f), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->d + at))));
    if (fmt == FMT_K4) {
        const size_t s = (size_t)r * (nb / 8) + b / 8;
        const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w->sub + 16 * s + 8))));
        return _mm256_mul_ps(_mm256_set1_ps(-w->scales[2 * s + 1]), mins);
    }
    return _mm256_loadu_ps(w->offsets + at);
}

/* The activations' per-block sums from block b, zeros past the row's end. */
static inline __m256 block_sums(const float *sum, int nb, int b) {
    if (nb - b >= 8) return _mm256_loadu_ps(sum + b);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(sum + b, _mm256_cmpgt_epi32(_mm256_set1_epi32(nb - b), lanes));
}

/* Each token's offsets share, offset * the activations' block sum, into its lanes: Q4_0's
   -8 d, Q4_1's m, Q4_K's -dmin * m, FMT_I8's offsets (none for Q8_0 and Q6_K). */
static inline __attribute__((always_inline)) void add_offsets(const hs_mat *w, const int fmt, int r, const window_act *x,
                                                              const int n, __m256 *acc) {
    if (fmt == FMT_Q8_0 || fmt == FMT_Q5 || fmt == FMT_K6 || (fmt == FMT_I8 && !w->offsets)) return;
    const int nb = w->cols / BLOCK;
    for (int b = 0; b < nb; b += 8) {
        const __m256 o = block_offsets(w, fmt, r, nb, b);
        for (int t = 0; t < n; t++) acc[t] = _mm256_fmadd_ps(o, block_sums(x[t].sum, nb, b), acc[t]);
    }
}

enum { CHUNK = 4 };     /* tokens a tile keeps accumulators for: more spill them */

/* Row r of W for n tokens of x, n <= CHUNK (n and fmt constants at each call, so the
   loops unroll). A row and token get the same float steps in any tile: the tiles only
   share the loops and the unpacking. */
static inline __attribute__((always_inline)) void tile8(const hs_mat *w, const int fmt, int r, const window_act *x,
                                                        const int n, float *y, int ystride) {
    const int nb = w->cols / BLOCK;
    const int unsigned_q = fmt == FMT_Q4_0 || fmt == FMT_Q4_1 || fmt == FMT_K4;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[CHUNK];
    for (int t = 0; t < n; t++) acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256 ws;
        const __m256i q = block_weights(w, fmt, r, nb, b, &ws);
        const __m256i aq = unsigned_q ? q : _mm256_sign_epi8(q, q);
        for (int t = 0; t < n; t++) {
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[t].q + b * BLOCK));
            const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, unsigned_q ? xq : _mm256_sign_epi8(xq, q)), ones);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(ws, _mm256_set1_ps(x[t].scale[b])), acc[t]);
        }
    }
    add_offsets(w, fmt, r, x, n, acc);
    for (int t = 0; t < n; t++) y[(size_t)t * ystride + r] = hsum8(acc[t]);
}

/* tile8 for Q4_K and Q6_K (FMT_K4, FMT_K6), whose activations have one scale per 256
   values (Q8_K): as llama.cpp does, a superblock's products are summed in int32, each
   block's (or half-block's) times its integer scale, and meet the floats once, d times
   the activations' scale; Q4_K's mins go in with the offsets, as tile8's do. Q6_K's
   quants meet the activations unsigned, and 32 * scale * sum(xq) per 16 values comes
   off the integer sum. Integer sums are exact, so a token's floats are the same
   sequence in any tile. */
static inline __attribute__((always_inline)) void tile_k(const hs_mat *w, const int fmt, int r, const window_act *x,
                                                         const int n, float *y, int ystride) {
    const int nb = w->cols / BLOCK, supers = nb / 8;
    __m256 acc[CHUNK];
    for (int t = 0; t < n; t++) acc[t] = _mm256_setzero_ps();
    for (int s = 0; s < supers; s++) {
        const size_t at = (size_t)r * supers + s;
        __m256i isum[CHUNK];
        for (int t = 0; t < n; t++) isum[t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const int b = 8 * s + j;
            __m256 unused;
            const __m256i q = block_weights(w, fmt, r, nb, b, &unused);
            __m256i sc;                  /* the block's integer scale (per 16 for Q6_K), on its int16 lanes */
            if (fmt == FMT_K4) {
                sc = _mm256_set1_epi16(w->sub[16 * at + j]);
            } else {
                const int8_t *sub = (const int8_t *)w->sub + 16 * at + 2 * j;
                sc = _mm256_set_m128i(_mm_set1_epi16(sub[1]), _mm_set1_epi16(sub[0]));
            }
            for (int t = 0; t < n; t++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[t].q + b * BLOCK));
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), sc));
            }
        }
        if (fmt == FMT_K6) {
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w->sub + 16 * at)));
            for (int t = 0; t < n; t++) {
                const __m256i xs = _mm256_loadu_si256((const __m256i *)(x[t].sum16 + 16 * s));
                isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(_mm256_madd_epi16(sc16, xs), 5));
            }
        }
        const float d = fmt == FMT_K4 ? w->scales[2 * at] : w->scales[at];
        for (int t = 0; t < n; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * x[t].scale[8 * s]), acc[t]);
    }
    add_offsets(w, fmt, r, x, n, acc);
    for (int t = 0; t < n; t++) y[(size_t)t * ystride + r] = hsum8(acc[t]);
}

static inline __attribute__((always_inline)) void tile(const hs_mat *w, const int fmt, int r, const window_act *x,
                                                       const int n, float *y, int ystride) {
    if (fmt == FMT_K4 || fmt == FMT_K6) tile_k(w, fmt, r, x, n, y, ystride);
    else tile8(w, fmt, r, x, n, y, ystride);
}

/* Rows r0..r1-1 of Y = W X for T tokens (token t's outputs at y + t * ystride), a row
   at a time, its tokens CHUNK at a time. Tiles of four rows for a token or two, as
   window_avx512.c takes, were slower here: four rows' streams at once. */
static inline __attribute__((always_inline)) void matmat8_fmt(const hs_mat *w, const int fmt, const window_act *x, int T,
                                                              float *y, int ystride, const hs_mat *next, int r0, int r1) {
    for (int r = r0; r < r1; r++) {
        prefetch_ahead(w, next, r + AHEAD, 1);
        for (int t = 0; t < T; t += CHUNK) {
            float *yt = y + (size_t)t * ystride;
            switch (T - t < CHUNK ? T - t : CHUNK) {
            case 1: tile(w, fmt, r, x + t, 1, yt, ystride); break;
            case 2: tile(w, fmt, r, x + t, 2, yt, ystride); break;
            case 3: tile(w, fmt, r, x + t, 3, yt, ystride); break;
            default: tile(w, fmt, r, x + t, 4, yt, ystride); break;
            }
        }
    }
}

/* A row tile's block (formats.h, FMT_T*), the half `half` of its 16 rows (rows 8 half..8 half
   + 7, the half of each 64-byte vector): its quants as 8 vectors of 8 rows' dwords, wq[k]
   holding each row's values 4k..4k+3: unsigned for the 4-bit formats and FMT_T6_K (+ 32),
   FMT_T8_0's signed (the + 128 taken off again). */
static inline __attribute__((always_inline)) void tile_quants(const uint8_t *q, const int fmt, __m256i *wq) {
    const __m256i low = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
    for (int j = 0; j < 8; j++) {
        if (fmt == FMT_T8_0) wq[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(q + 64 * j)), _mm256_set1_epi8((char)0x80));
        else if (j < 4) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * j));
            wq[j] = _mm256_and_si256(v, low);
            wq[4 + j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
    }
    if (fmt == FMT_T6_K)        /* nibble vector j's top bits at 2 (j % 4) of vector j / 4: moved to bits 4-5 */
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 256 + 64 * h));
            wq[4 * h] = _mm256_or_si256(wq[4 * h], _mm256_and_si256(_mm256_slli_epi16(v, 4), top));
            wq[4 * h + 1] = _mm256_or_si256(wq[4 * h + 1], _mm256_and_si256(_mm256_slli_epi16(v, 2), top));
            wq[4 * h + 2] = _mm256_or_si256(wq[4 * h + 2], _mm256_and_si256(v, top));
            wq[4 * h + 3] = _mm256_or_si256(wq[4 * h + 3], _mm256_and_si256(_mm256_srli_epi16(v, 2), top));
        }
}

/* Rows 16 g + 8 half..+7 of a row-tile matrix (FMT_T*, the layout window_avx512.c reads 16
   rows at a time) for n <= 4 tokens: a lane a row. A block's quants are unpacked once for
   the tokens; a product broadcasts one dword of a token's xq against 8 rows' dwords
   (vpmaddubsw), so a block's integer sums for 8 rows take 8 byte products and no lanes to
   fold. The byte products' int16 sums are added before they widen where they cannot
   overflow: 8 of 4-bit quants (8 x 2 x 15 x 127), 2 of FMT_T6_K's 6-bit ones; FMT_T8_0's
   signed quants meet |xq| with xq's signs (vpsignb), each product widened alone. Float
   steps, per row, token and block in order: acc += isum * (d * xscale) (FMT_T6_K: for each
   16-value half, with its own scale, its + 32 taken off the integer sum as 32 * sum(xq)),
   then acc += offset * xsum where there are offsets: the same in any tile, so a token's rows
   do not depend on the tokens beside it, nor on the window's size. */
static inline __attribute__((always_inline)) void tile_half(const hs_mat *w, const int fmt, int g, int half,
                                                            const window_act *x, const int n, float *y, int ystride) {
    const int nb = w->cols / BLOCK, bytes = fmt == FMT_T8_0 ? 512 : fmt == FMT_T6_K ? 384 : 256;
    const size_t tb = (size_t)g * nb;      /* the tile's first block */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    for (int t = 0; t < n; t++) acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *q = w->qs + (tb + b) * bytes;
        if (half == 0)      /* the other half is in the same lines, read just after */
            for (int k = 0; k < bytes; k += 64) _mm_prefetch((const char *)(q + 8 * bytes + k), _MM_HINT_T0);
        __m256i wq[8];
        tile_quants(q + 32 * half, fmt, wq);
        const size_t at = 16 * (tb + b) + 8 * half;
        __m256 ds, hs, os;      /* scales (FMT_T6_K: the first half's, then hs the second's), offsets */
        if (fmt == FMT_T4_1 || fmt == FMT_T8_0) {
            ds = hs = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->d + at)));
            os = fmt == FMT_T4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->m + at))) : ds;
        } else if (fmt == FMT_T6_K) {
            ds = _mm256_loadu_ps(w->scales + 32 * (tb + b) + 8 * half);
            hs = _mm256_loadu_ps(w->scales + 32 * (tb + b) + 16 + 8 * half);
            os = ds;
        } else {
            ds = hs = _mm256_loadu_ps(w->scales + at);
            os = _mm256_loadu_ps(w->offsets + at);
        }
        for (int t = 0; t < n; t++) {
            int xq[8], ax[8];   /* dword k: the token's values 4k..4k+3 of the block, wq[k]'s (ax: |xq|) */
            memcpy(xq, x[t].q + b * BLOCK, sizeof xq);
            if (fmt == FMT_T8_0) memcpy(ax, x[t].aq + b * BLOCK, sizeof ax);
            const __m256 xs = _mm256_set1_ps(x[t].scale[b]);
            __m256i p[8];
            for (int k = 0; k < 8; k++) {
                const __m256i xk = _mm256_set1_epi32(xq[k]);
                p[k] = fmt == FMT_T8_0 ? _mm256_maddubs_epi16(_mm256_set1_epi32(ax[k]), _mm256_sign_epi8(wq[k], xk))
                                       : _mm256_maddubs_epi16(wq[k], xk);
            }
            if (fmt == FMT_T6_K) {
                const __m256i lo = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), ones),
                                                    _mm256_madd_epi16(_mm256_add_epi16(p[2], p[3]), ones));
                const __m256i hi = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p[4], p[5]), ones),
                                                    _mm256_madd_epi16(_mm256_add_epi16(p[6], p[7]), ones));
                const __m256i bias_lo = _mm256_set1_epi32(32 * x[t].sum16[2 * b]);
                const __m256i bias_hi = _mm256_set1_epi32(32 * x[t].sum16[2 * b + 1]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo, bias_lo)), _mm256_mul_ps(ds, xs), acc[t]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi, bias_hi)), _mm256_mul_ps(hs, xs), acc[t]);
                continue;
            }
            __m256i isum;
            if (fmt == FMT_T8_0) {
                __m256i s[4];
                for (int k = 0; k < 4; k++)
                    s[k] = _mm256_add_epi32(_mm256_madd_epi16(p[k], ones), _mm256_madd_epi16(p[k + 4], ones));
                isum = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]));
            } else {
                const __m256i s = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
                                                   _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])));
                isum = _mm256_madd_epi16(s, ones);
            }
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(ds, xs), acc[t]);
            if (fmt == FMT_T4_1 || fmt == FMT_T4_K) acc[t] = _mm256_fmadd_ps(os, _mm256_set1_ps(x[t].sum[b]), acc[t]);
        }
    }
    for (int t = 0; t < n; t++) _mm256_storeu_ps(y + (size_t)t * ystride + 16 * g + 8 * half, acc[t]);
}

/* Rows r0..r1-1 (multiples of 16) of Y = W X for T tokens of a row-tile format: each tile's
   two halves in turn, four tokens at a time (the second half reads lines the first brought in). */
static inline __attribute__((always_inline)) void tiles16(const hs_mat *w, const int fmt, const window_act *x, int T,
                                                          float *y, int ystride, int r0, int r1) {
    for (int g = r0 / 16; g < r1 / 16; g++)
        for (int half = 0; half < 2; half++) {
            int t = 0;
            for (; t + 4 <= T; t += 4) tile_half(w, fmt, g, half, x + t, 4, y + (size_t)t * ystride, ystride);
            float *yt = y + (size_t)t * ystride;
            if (T - t == 3) tile_half(w, fmt, g, half, x + t, 3, yt, ystride);
            else if (T - t == 2) tile_half(w, fmt, g, half, x + t, 2, yt, ystride);
            else if (T - t == 1) tile_half(w, fmt, g, half, x + t, 1, yt, ystride);
        }
}

/* Rows r0..r1-1 of Y = W X for T tokens, the kernel specialised for W's format. */
void window_rows(const hs_mat *w, const window_act *x, int T, float *y, int ystride, const hs_mat *next, int r0, int r1) {
    switch (w->fmt) {
    case FMT_Q8_0: matmat8_fmt(w, FMT_Q8_0, x, T, y, ystride, next, r0, r1); break;
    case FMT_Q5: matmat8_fmt(w, FMT_Q5, x, T, y, ystride, next, r0, r1); break;
    case FMT_Q4_0: matmat8_fmt(w, FMT_Q4_0, x, T, y, ystride, next, r0, r1); break;
    case FMT_Q4_1: matmat8_fmt(w, FMT_Q4_1, x, T, y, ystride, next, r0, r1); break;
    case FMT_K4: matmat8_fmt(w, FMT_K4, x, T, y, ystride, next, r0, r1); break;
    case FMT_K6: matmat8_fmt(w, FMT_K6, x, T, y, ystride, next, r0, r1); break;
    case FMT_T4_1: tiles16(w, FMT_T4_1, x, T, y, ystride, r0, r1); break;
    case FMT_T8_0: tiles16(w, FMT_T8_0, x, T, y, ystride, r0, r1); break;
    case FMT_T4_K: tiles16(w, FMT_T4_K, x, T, y, ystride, r0, r1); break;
    case FMT_T6_K: tiles16(w, FMT_T6_K, x, T, y, ystride, r0, r1); break;
    default: matmat8_fmt(w, FMT_I8, x, T, y, ystride, next, r0, r1); break;
    }
}

long window_act_floats(int widest) {
    return 2 * (widest / 4) + 3 * (widest / BLOCK) + 8;
}

void window_act_at(window_act *a, float *work, int widest) {
    a->q = (int8_t *)work;
    a->aq = (uint8_t *)(work + widest / 4);
    a->scale = work + 2 * (widest / 4);
    a->sum = a->scale + widest / BLOCK;
    a->sum16 = (int16_t *)(a->sum + widest / BLOCK);
}

#endif
