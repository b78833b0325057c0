/* A Llama-, Qwen2-, Qwen3- or Gemma-3-architecture model read straight from a GGUF
   file's blocks (workers/common/native_model.py binds it): the native draft and the
   native target both run it. One layer body (layer) serves a pass over T positions;
   a pass multiplies either one token through the one-token kernels below (hs_forward,
   the draft's step: activations rounded to 16 bits), or a window of up to MAX_WINDOW
   tokens through the window products of window.h (hs_forward_window, the target, and
   the draft filling its cache from a long feed: activations rounded to 8 bits).

   Why 16 bits for a step: drafting is one row at a time, so it is bound by reading
   the weights and by per-token overheads. llama.cpp pays more of those overheads per
   token, and rounds activations to 8 bits, which costs agreement with the target;
   the step reads the same blocks with activations rounded to 16 bits, faster and
   closer to the target (measured: e7e822d:docs/kernels.md).

   Activations are rounded to int16 per 32-value block. A weight row of format
     Q8_0: d * q        Q4_0: d * (q - 8)        Q4_1: d * q + m
     I8: s * q + o, s per 16 values, o per 32 (K-quants' exact values)
   times a block of activations x ~ dx * xq is d * dx * sum(q * xq) (minus
   8 * d * dx * sum(xq) for Q4_0), plus m * sum(x) for Q4_1 (o * sum(x) for I8).

   Conventions are llama.cpp's. What differs between architectures is a field that
   is NULL or 0 where unused (native_model.py, ARCHITECTURES, sets each):
   - rope over adjacent pairs (Llama 2/3, Mistral: GGUF conversion permuted the query
     and key rows for it) or over the heads' two halves (neox_rope: the others);
     Llama 3 divides the angles by its rope_freqs, linear scaling multiplies them;
   - biases on query, key and value (Qwen2: bq, bk, bv);
   - query and key heads RMS-normalised before rope (Qwen3, Gemma 3: q_norm, k_norm);
   - Gemma 3's: the embedding scaled by sqrt(width) (embd_scale), a norm after
     attention and after the MLP (post_attn_norm, post_ffn_norm; its norm weights are
     stored with the 1 already added), GELU (tanh) gating (gelu), and sliding-window
     layers (sliding, window) with their own rope base (rope_base_local).
   Weights are GGUF rows of `cols` values (matrix.h). The KV cache is float16, a kv
   head's keys in blocks of 8 positions, dimension-major, its values a row per
   position (see attend); the query heads sharing a kv head are served in one
   pass over it.
   Needs AVX2, FMA and F16C; uses AVX512-VNNI where the CPU has it, and with
   AVX-512 BW too reads 4-bit rows two blocks a step, four rows a tile (see
   PAIRED). Keys are blocked and fetched ahead so that long contexts stream
   the cache quickly (see attend). */
#define _GNU_SOURCE     /* gettid through syscall, for pinning the pool's threads (pool.h) */
#include <math.h>

#include "window.h"


typedef struct {
    hs_mat wq, wk, wv, wo, gate, up, down;
    const float *attn_norm, *ffn_norm;
    const float *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm;   /* Gemma 3; NULL for Llama */
    int sliding;      /* attends to the last `window` positions, rope at the local base */
    const float *bq, *bk, *bv;   /* Qwen2's query, key and value biases; NULL elsewhere */
} hs_layer;

typedef struct {
    int n_layer, n_embd, n_head, n_kv, head_dim, n_ff, n_vocab, n_ctx;
    float eps, rope_base;
    hs_mat embd, out;
    const float *out_norm;
    const hs_layer *layers;
    uint16_t *kcache, *vcache;    /* float16, see attend: keys [layer][kv head][blocks of 8 positions],
                                     values [layer][kv head][position][head_dim] */
    float *work;                  /* hs_work_floats(model) floats */
    int neox_rope, gelu, window;  /* rope over halves; GELU (tanh) instead of SiLU; sliding window */
    float embd_scale, rope_base_local;
    hs_mat out_fast;              /* a Q4_1 copy of a Q8_0 output layer (see head); qs NULL: none */
    const float *rope_freqs;      /* Llama 3's per-pair divisors of the global rope's angles; NULL: none */
    float rope_scale;             /* linear rope scaling: angles times this (1: none) */
    const volatile int *halt;     /* a step (hs_forward) stops at its next product once it is not 0
                                     (the draft's extension, halted by the scheduler); NULL: never */
} hs_model;

/* ---- activations rounded per block ------------------------------------------ */

/* With AVX-512 (BW and VNNI), 4-bit rows are read two blocks per 512-bit
   step: the activations are kept a second time, each pair of blocks as
   [first 16 of block b, of b+1, last 16 of b, of b+1], the order in which a
   pair's nibbles unpack, so the step needs no shuffle but its scales'. */
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define PAIRED 1
#else
#define PAIRED 0
#endif

typedef struct {
    int16_t *q;      /* n values */
    int16_t *pairs;  /* n values, pairs of blocks reordered (PAIRED only) */
    float *scale;    /* per block: x ~ scale * q */
    float *sum;      /* per block: the exact sum of x */
    int32_t *qsum;   /* per block: the sum of q */
} quantized;

/* Two vectors of int32 as 16 int16, in order. */
static inline __m256i pack16(__m256i a, __m256i b) {
    return _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);
}

static void quantize(const float *x, int n, quantized *out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < n / BLOCK; b++) {
        const float *xb = x + b * BLOCK;
        __m256 v[4];
        for (int c = 0; c < 4; c++) v[c] = _mm256_loadu_ps(xb + 8 * c);
        const __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                          _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        const float top = hmax8(amax);
        const float inv = top > 0.0f ? 32767.0f / top : 0.0f;
        const __m256 scale = _mm256_set1_ps(inv);
        __m256i q[4];
        for (int c = 0; c < 4; c++) q[c] = _mm256_cvtps_epi32(_mm256_mul_ps(v[c], scale));   /* nearest, ties to even */
        const __m256i lo = pack16(q[0], q[1]), hi = pack16(q[2], q[3]);
        _mm256_storeu_si256((__m256i *)(out->q + b * BLOCK), lo);
        _mm256_storeu_si256((__m256i *)(out->q + b * BLOCK + 16), hi);
        if (PAIRED) {
            int16_t *pair = out->pairs + (b & ~1) * BLOCK;
            const int second = (b & 1) * 16, partnered = (b | 1) < n / BLOCK;   /* else a last block, kept in order */
            _mm256_storeu_si256((__m256i *)(pair + (partnered ? second : 0)), lo);
            _mm256_storeu_si256((__m256i *)(pair + (partnered ? 32 + second : 16)), hi);
        }
        const __m256i ones = _mm256_set1_epi16(1);
        const __m256i qs = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(qs), _mm256_extracti128_si256(qs, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
        out->scale[b] = top / 32767.0f;
        out->sum[b] = hsum8(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
        out->qsum[b] = _mm_cvtsi128_si32(t);
    }
}

/* ---- one token: a weight row times 16-bit rounded activations -------------------- */

/* Per row, first the blocks' scales times the activations' (into `scale`) and
   the Q4_1 offsets' share, m * sum(x), eight blocks at a time. */
static float row_scales(const uint16_t *d, const uint16_t *m, int nb, const quantized *x, float *scale) {
    __m256 off = _mm256_setzero_ps();
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b)));
        _mm256_storeu_ps(scale + b, _mm256_mul_ps(dw, _mm256_loadu_ps(x->scale + b)));
        if (m) off = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + b))),
                                     _mm256_loadu_ps(x->sum + b), off);
    }
    float offsets = hsum8(off);
    for (; b < nb; b++) {
        scale[b] = _cvtsh_ss(d[b]) * x->scale[b];
        if (m) offsets += _cvtsh_ss(m[b]) * x->sum[b];
    }
    return offsets;
}

static inline __m256i dot16(__m256i acc, __m256i w, const int16_t *xq) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, w, _mm256_loadu_si256((const __m256i *)xq));
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, _mm256_loadu_si256((const __m256i *)xq)));
#endif
}

/* One row of 4-bit quants: sum over blocks of scale * sum(q * xq). */
static float row_q4(const uint8_t *qs, int nb, const int16_t *xq, const float *scale) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m128i mask = _mm_set1_epi8(15);
    int b = 0;
    for (; b + 2 <= nb; b += 2, qs += 32, xq += 64) {
        const __m128i r0 = _mm_loadu_si128((const __m128i *)qs), r1 = _mm_loadu_si128((const __m128i *)(qs + 16));
        __m256i s0 = dot16(_mm256_setzero_si256(), _mm256_cvtepu8_epi16(_mm_and_si128(r0, mask)), xq);
        __m256i s1 = dot16(_mm256_setzero_si256(), _mm256_cvtepu8_epi16(_mm_and_si128(r1, mask)), xq + 32);
        s0 = dot16(s0, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(r0, 4), mask)), xq + 16);
        s1 = dot16(s1, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(r1, 4), mask)), xq + 48);
        acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + b), _mm256_cvtepi32_ps(s0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + b + 1), _mm256_cvtepi32_ps(s1), acc1);
    }
    for (; b < nb; b++, qs += 16, xq += 32) {
        const __m128i r = _mm_loadu_si128((const __m128i *)qs);
        __m256i s = dot16(_mm256_setzero_si256(), _mm256_cvtepu8_epi16(_mm_and_si128(r, mask)), xq);
        s = dot16(s, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(r, 4), mask)), xq + 16);
        acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + b), _mm256_cvtepi32_ps(s), acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

static float row_q8_0(const uint8_t *qs, int nb, const int16_t *xq, const float *scale) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, qs += 32, xq += 32) {
        __m256i s = dot16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qs)), xq);
        s = dot16(s, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16))), xq + 16);
        if (b & 1) acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + b), _mm256_cvtepi32_ps(s), acc1);
        else acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + b), _mm256_cvtepi32_ps(s), acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* A row of int8 quants with a scale per 16 weights and an offset per 32 (FMT_I8,
   K-quants' exact values): sum over halves of scale * dx * sum(q * xq), plus
   offset * sum(x) per block. */
static float row_i8(const int8_t *qs, int nb, const quantized *x, const float *sc, const float *off) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float offsets = 0.0f;
    for (int b = 0; b < nb; b++, qs += 32) {
        const int16_t *xq = x->q + b * BLOCK;
        const __m256i lo = dot16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qs)), xq);
        const __m256i hi = dot16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16))),
                                 xq + 16);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(sc[2 * b] * x->scale[b]), _mm256_cvtepi32_ps(lo), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(sc[2 * b + 1] * x->scale[b]), _mm256_cvtepi32_ps(hi), acc1);
        if (off) offsets = fmaf(off[b], x->sum[b], offsets);
    }
    return hsum8(_mm256_add_ps(acc0, acc1)) + offsets;
}

/* Q4_K's and Q6_K's scales (FMT_K4, FMT_K6): per 256 weights a float d (and dmin),
   per 32 (16 for Q6_K) an integer multiple of it. Each block's scale times the
   activations' goes into `scale` (FMT_K6: two a block); the mins' share,
   -dmin * m * sum(x) per block, is returned. d * sc is exact in float32, as in
   the file's own values. */
static float row_scales_k(const hs_mat *w, int r, int nb, const quantized *x, float *scale) {
    const int supers = nb / 8;
    __m256 off = _mm256_setzero_ps();
    if (w->fmt == FMT_K4) {
        const uint8_t *sub = w->sub + (size_t)r * supers * 16;
        const float *dd = w->scales + (size_t)r * supers * 2;
        for (int s = 0; s < supers; s++, sub += 16) {
            const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sub)));
            const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sub + 8))));
            _mm256_storeu_ps(scale + 8 * s, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(dd[2 * s]), sc),
                                                          _mm256_loadu_ps(x->scale + 8 * s)));
            off = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dd[2 * s + 1]), mn), _mm256_loadu_ps(x->sum + 8 * s), off);
        }
        return hsum8(off);
    }
    const int8_t *sub = (const int8_t *)w->sub + (size_t)r * nb * 2;
    const float *d = w->scales + (size_t)r * supers;
    const __m256i twice = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0);   /* each block's activation scale, twice */
    for (int s = 0; s < supers; s++, sub += 16) {
        for (int h = 0; h < 2; h++) {
            const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sub + 8 * h))));
            const __m256 xs = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(x->scale + 8 * s + 4 * h)), twice);
            _mm256_storeu_ps(scale + 16 * s + 8 * h, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d[s]), sc), xs));
        }
    }
    return 0.0f;
}

/* One row of FMT_Q5 blocks, as row_q8_0 once they are unpacked. */
static float row_q5(const uint8_t *qs, int nb, const int16_t *xq, const float *scale) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, qs += 20, xq += 32) {
        const __m256i q = q5_quants(qs);
        __m256i s = dot16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), xq);
        s = dot16(s, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), xq + 16);
        if (b & 1) acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + b), _mm256_cvtepi32_ps(s), acc1);
        else acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + b), _mm256_cvtepi32_ps(s), acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* A row of FMT_K6 blocks: per block 16 bytes of low nibbles (Q4_0's order) and 8
   bytes of top bits, byte j holding weights j, j + 8, j + 16, j + 24 (two bits
   each, lowest first); a weight is (nibble | top << 4) - 32, with a scale per 16. */
static float row_k6(const uint8_t *qs, int nb, const int16_t *xq, const float *scale) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i bias = _mm256_set1_epi16(32);
    for (int b = 0; b < nb; b++, qs += 24, xq += 32) {
        __m128i qa, qb;
        k6_quants(qs, &qa, &qb);
        const __m256i sa = dot16(_mm256_setzero_si256(), _mm256_sub_epi16(_mm256_cvtepu8_epi16(qa), bias), xq);
        const __m256i sb = dot16(_mm256_setzero_si256(), _mm256_sub_epi16(_mm256_cvtepu8_epi16(qb), bias), xq + 16);
        acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + 2 * b), _mm256_cvtepi32_ps(sa), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + 2 * b + 1), _mm256_cvtepi32_ps(sb), acc1);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* Each row's scales and offsets, Q4_0's 8 * scale * sum(xq) per block folded in. */
static inline __attribute__((always_inline)) float row_setup(const hs_mat *w, int r, int nb, const quantized *x, float *scale) {
    float offsets = row_scales(w->d + (size_t)r * nb, w->m ? w->m + (size_t)r * nb : NULL, nb, x, scale);
    if (w->fmt == FMT_Q4_0)
        for (int b = 0; b < nb; b++) offsets -= 8.0f * scale[b] * (float)x->qsum[b];
    return offsets;
}
#if PAIRED
/* Rows are taken four at a time: short rows (SmolLM2's are 18 blocks) spent a
   large share of their time folding their sums; four fold together in a few adds. */
enum { TILE = 4 };

/* n rows of 4-bit quants, two blocks a step (see PAIRED): int32 lanes 0-7 sum
   block b, lanes 8-15 block b + 1, so the scales go in as [s_b x8, s_b+1 x8].
   A last block without a partner is left to the caller. Row after row, not
   step after step across the rows: interleaving four rows' reads was much
   slower (measured: e7e822d:docs/kernels.md). */
static inline __attribute__((always_inline)) void tile_q4(const uint8_t *qs, int row_bytes, int nb,
                                                          const int16_t *xp, const float *scale, int n, __m512 *acc) {
    const __m512i low = _mm512_set1_epi16(15);
    const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int i = 0; i < n; i++) {
        const uint8_t *row = qs + (size_t)i * row_bytes;
        for (int b = 0; b + 2 <= nb; b += 2) {
            const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(row + 16 * b)));
            __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_and_si512(w, low),
                                            _mm512_loadu_si512(xp + 32 * b));
            s = _mm512_dpwssd_epi32(s, _mm512_srli_epi16(w, 4), _mm512_loadu_si512(xp + 32 * b + 32));
            const __m512 pair = _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)(scale + i * nb + b))));
            acc[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(spread, pair), _mm512_cvtepi32_ps(s), acc[i]);
        }
    }
}

/* 4-bit rows r..r+n (n <= TILE). */
static inline __attribute__((always_inline)) void rows_q4_wide(const hs_mat *w, int r, int n, const quantized *x,
                                                               float *scale, float *y) {
    const int nb = w->cols / BLOCK, row_bytes = nb * 16;
    const uint8_t *qs = w->qs + (size_t)r * row_bytes;
    float offsets[TILE] = {0}, sums[TILE];
    __m512 acc[TILE];
    for (int i = 0; i < TILE; i++) acc[i] = _mm512_setzero_ps();
    for (int i = 0; i < n; i++) offsets[i] = row_setup(w, r + i, nb, x, scale + i * nb);
    tile_q4(qs, row_bytes, nb, x->pairs, scale, n, acc);
    if (nb & 1)    /* the last block, in its own order */
        for (int i = 0; i < n; i++)
            offsets[i] += row_q4(qs + (size_t)i * row_bytes + 16 * (nb - 1), 1, x->pairs + 32 * (nb - 1),
                                 scale + i * nb + nb - 1);
    _mm_storeu_ps(sums, _mm_add_ps(fold4(acc), _mm_loadu_ps(offsets)));
    for (int i = 0; i < n; i++) y[r + i] = sums[i];
}
#endif

/* Row r of W times x already rounded (scale: the row's nb block scales, scratch). */
static float one_row(const hs_mat *w, int r, int nb, const quantized *x, float *scale) {
    if (w->fmt == FMT_I8)
        return row_i8((const int8_t *)w->qs + (size_t)r * nb * 32, nb, x, w->scales + (size_t)r * nb * 2,
                      w->offsets ? w->offsets + (size_t)r * nb : NULL);
    if (w->fmt == FMT_K4 || w->fmt == FMT_K6) {
        const float offsets = row_scales_k(w, r, nb, x, scale);
        const uint8_t *qs = w->qs + (size_t)r * nb * block_bytes(w->fmt);
        return (w->fmt == FMT_K4 ? row_q4(qs, nb, x->q, scale) : row_k6(qs, nb, x->q, scale)) + offsets;
    }
    const float offsets = row_setup(w, r, nb, x, scale);
    const uint8_t *qs = w->qs + (size_t)r * nb * block_bytes(w->fmt);
    if (w->fmt == FMT_Q8_0) return row_q8_0(qs, nb, x->q, scale) + offsets;
    return (w->fmt == FMT_Q5 ? row_q5(qs, nb, x->q, scale) : row_q4(qs, nb, x->q, scale)) + offsets;
}

/* Rows r..r+n of w fetched early while they are a part's own (below r1), or past w's
   end the first rows of `next` (the last part only is given it): a part fetches no
   other part's rows. */
static inline __attribute__((always_inline)) void prefetch_part(const hs_mat *w, const hs_mat *next, int r, int n,
                                                                int r1) {
    if (r + n <= r1) prefetch_rows(w, r, n);
    else if (next && r >= w->rows && r - w->rows + n <= next->rows) prefetch_rows(next, r - w->rows, n);
}

/* Rows r0..r1-1 of Y = W X for T tokens already rounded, token t's outputs at
   y + t * ystride. Each tile of rows comes from memory once for the window, and each
   token's rows are computed as a one-token pass computes them: a window's products
   are one-token passes', bit for bit, and a row is the same whichever rows share
   its call. */
static void matmat_rows(const hs_mat *w, const quantized *x, int T, float *y, int ystride, const hs_mat *next,
                        int r0, int r1) {
    const int nb = w->cols / BLOCK;
    int r = r0;
#if PAIRED
    float scale[TILE * nb];
    if (w->fmt == FMT_Q4_0 || w->fmt == FMT_Q4_1) {
        for (; r + TILE <= r1; r += TILE) {
            prefetch_part(w, next, r + AHEAD, TILE, r1);
            for (int t = 0; t < T; t++) rows_q4_wide(w, r, TILE, x + t, scale, y + (size_t)t * ystride);
        }
        for (; r < r1; r++)
            for (int t = 0; t < T; t++) rows_q4_wide(w, r, 1, x + t, scale, y + (size_t)t * ystride);
        return;
    }
#else
    float scale[2 * nb];    /* FMT_K6: two a block */
#endif
    for (; r < r1; r++) {
        prefetch_part(w, next, r + AHEAD, 1, r1);
        for (int t = 0; t < T; t++) y[(size_t)t * ystride + r] = one_row(w, r, nb, x + t, scale);
    }
}

/* ---- the pool's threads (pool.h) ------------------------------------------------ */

/* A product's rows are split among the pool's threads (hs_set_threads): the draft's
   step where it has cores for several, the target's windows when it runs alone on
   borrowed cores. */
#include "pool.h"

enum { PART_ROWS = 16 };   /* a part starts at a multiple of this: whole tiles, whole cache lines of y */

/* The first row of part `part` of `parts` (parts: past the last row). */
static int part_start(int rows, int part, int parts) {
    if (part >= parts) return rows;
    const int r = (int)((long)rows * part / parts);
    return r - r % PART_ROWS;
}

typedef struct {
    const hs_mat *w, *next;
    const quantized *x;
    float *y;
    int r0, r1;          /* the rows split among the parts */
} step_job;

static void step_part(void *arg, int part, int parts) {
    const step_job *j = arg;
    const int rows = j->r1 - j->r0;
    matmat_rows(j->w, j->x, 1, j->y, 0, part == parts - 1 ? j->next : NULL, j->r0 + part_start(rows, part, parts),
                j->r0 + part_start(rows, part + 1, parts));
}

/* Rows r0..r1-1 of y = W x for x already rounded, on the pool's threads: each row is
   computed as on one, so the logits do not depend on the thread count. */
static void matvec_rows(const hs_mat *w, const quantized *x, float *y, const hs_mat *next, int r0, int r1) {
    step_job job = {w, next, x, y, r0, r1};
    pool_run(step_part, &job);
}

static void matvec(const hs_mat *w, const quantized *x, float *y, const hs_mat *next) {
    matvec_rows(w, x, y, next, 0, w->rows);
}

/* ---- a window of tokens (window.h's products) ------------------------------------ */

typedef struct {
    const hs_mat *w, *next;
    const window_act *x;
    int T, ystride;
    float *y;
} rows_job;

static void rows_part(void *arg, int part, int parts) {
    const rows_job *j = arg;
    const int r0 = part_start(j->w->rows, part, parts), r1 = part_start(j->w->rows, part + 1, parts);
    window_rows(j->w, j->x, j->T, j->y, j->ystride, part == parts - 1 ? j->next : NULL, r0, r1);
}

/* Y = W X for the window's rounded activations, on the pool's threads. */
static void window_matmat(const hs_mat *w, const window_act *x, int T, float *y, int ystride, const hs_mat *next) {
    rows_job job = {w, next, x, T, ystride, y};
    pool_run(rows_part, &job);
}

/* Whether the window products read Q8_0 in window_avx512.c's pair layout (FMT_W8): AVX-512
   VNNI. Elsewhere they read Q4_K and Q6_K in FMT_K4 and FMT_K6. */
int hs_pair_layout(void) { return WINDOW_AVX512; }

/* The instruction set these kernels were built for (build.py, HETSPEC_ISA), for the kernels line. */
const char *hs_isa(void) { return WINDOW_AVX512 ? "AVX-512 VNNI" : "AVX2"; }

/* Whether the window products read w's format: window_avx512.c reads neither the K-quants'
   own layouts (FMT_K4, FMT_K6) nor FMT_Q5, which only a draft holding them exactly has;
   its pair layouts (FMT_W8, FMT_N4, FMT_N6) only window_avx512.c reads; both read the
   row tiles (FMT_T*). */
static int window_reads(const hs_mat *w) {
    return WINDOW_AVX512 ? !(w->fmt == FMT_K4 || w->fmt == FMT_K6 || w->fmt == FMT_Q5)
                         : !(w->fmt == FMT_N4 || w->fmt == FMT_N6 || w->fmt == FMT_W8);
}

/* A float matrix's (FMT_F16, FMT_F32) row r times n <= 4 tokens of x (stride floats
   apart), in float32: each activation rounded to float16 first for an F16 matrix, as
   llama.cpp rounds them (its vec_dot_type), kept for F32. Each token's sums take the
   same order in any window: the tokens share only the weights' loads. */
static inline __attribute__((always_inline)) void float_tile(const hs_mat *w, const int fmt, int r, const float *x,
                                                             int stride, const int n, float *y, int ystride) {
    const int cols = w->cols;
    __m256 lo[4], hi[4];
    for (int t = 0; t < n; t++) lo[t] = hi[t] = _mm256_setzero_ps();
    for (int j = 0; j < cols; j += 16) {
        __m256 w0, w1;
        if (fmt == FMT_F16) {
            const uint16_t *row = (const uint16_t *)w->qs + (size_t)r * cols + j;
            w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)row));
            w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8)));
        } else {
            const float *row = (const float *)w->qs + (size_t)r * cols + j;
            w0 = _mm256_loadu_ps(row);
            w1 = _mm256_loadu_ps(row + 8);
        }
        for (int t = 0; t < n; t++) {
            __m256 a = _mm256_loadu_ps(x + (size_t)t * stride + j), b = _mm256_loadu_ps(x + (size_t)t * stride + j + 8);
            if (fmt == FMT_F16) {
                a = _mm256_cvtph_ps(_mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
                b = _mm256_cvtph_ps(_mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT));
            }
            lo[t] = _mm256_fmadd_ps(w0, a, lo[t]);
            hi[t] = _mm256_fmadd_ps(w1, b, hi[t]);
        }
    }
    for (int t = 0; t < n; t++) y[(size_t)t * ystride + r] = hsum8(_mm256_add_ps(lo[t], hi[t]));
}

static inline __attribute__((always_inline)) void float_rows_fmt(const hs_mat *w, const int fmt, const float *x,
                                                                 int stride, int T, float *y, int ystride, int r0, int r1) {
    for (int r = r0; r < r1; r++)
        for (int t = 0; t < T; t += 4) {
            const float *xt = x + (size_t)t * stride;
            float *yt = y + (size_t)t * ystride;
            switch (T - t < 4 ? T - t : 4) {
            case 1: float_tile(w, fmt, r, xt, stride, 1, yt, ystride); break;
            case 2: float_tile(w, fmt, r, xt, stride, 2, yt, ystride); break;
            case 3: float_tile(w, fmt, r, xt, stride, 3, yt, ystride); break;
            default: float_tile(w, fmt, r, xt, stride, 4, yt, ystride); break;
            }
        }
}

typedef struct {
    const hs_mat *w;
    const float *x;
    int stride, T, ystride;
    float *y;
} float_job;

static void float_part(void *arg, int part, int parts) {
    const float_job *j = arg;
    const int r0 = (int)((long)j->w->rows * part / parts), r1 = (int)((long)j->w->rows * (part + 1) / parts);
    if (j->w->fmt == FMT_F16) float_rows_fmt(j->w, FMT_F16, j->x, j->stride, j->T, j->y, j->ystride, r0, r1);
    else float_rows_fmt(j->w, FMT_F32, j->x, j->stride, j->T, j->y, j->ystride, r0, r1);
}

/* Y = W X for the window's T rows of x (stride floats apart). *held says how xq
   holds x already (-1: not at all, a new x); it is rounded again only when w
   needs another rounding. Float matrices read x itself. */
static void window_products(const hs_mat *w, const float *x, int stride, int T, window_act *xq, int *held,
                            float *y, int ystride, const hs_mat *next) {
    if (w->fmt == FMT_F16 || w->fmt == FMT_F32) {
        float_job job = {w, x, stride, T, ystride, y};
        pool_run(float_part, &job);
        return;
    }
    const int kind = window_act_kind(w);
    if (*held != kind) {
        for (int t = 0; t < T; t++) window_quantize(x + (size_t)t * stride, w->cols, kind, xq + t);
        *held = kind;
    }
    window_matmat(w, xq, T, y, ystride, next);
}

/* Block b of row r of an FMT_K4 or FMT_K6 matrix, as float32 values. */
static void dequantize_k(const hs_mat *w, int r, int b, float *y) {
    const int nb = w->cols / BLOCK, s = b / 8;
    const uint8_t *q = w->qs + ((size_t)r * nb + b) * block_bytes(w->fmt);
    for (int j = 0; j < BLOCK; j++) {
        const int nibble = j < 16 ? q[j] & 15 : q[j - 16] >> 4;
        if (w->fmt == FMT_K4) {
            const uint8_t *sub = w->sub + ((size_t)r * (nb / 8) + s) * 16;
            const float *dd = w->scales + ((size_t)r * (nb / 8) + s) * 2;
            y[j] = (dd[0] * (float)sub[b % 8]) * (float)nibble - dd[1] * (float)sub[8 + b % 8];
        } else {
            const int top = (q[16 + j % 8] >> (2 * (j / 8))) & 3;
            const int8_t sc = (int8_t)w->sub[((size_t)r * nb + b) * 2 + j / 16];
            y[j] = (w->scales[(size_t)r * (nb / 8) + s] * (float)sc) * (float)((nibble | top << 4) - 32);
        }
    }
}

/* Block b of row r of a row-tile matrix (formats.h, FMT_T*), as float32 values: row r is
   lane r % 16 of its tile, value j byte j % 4 of its dword vector. */
static void dequantize_tile(const hs_mat *w, int r, int b, float *y) {
    const int nb = w->cols / BLOCK, lane = 4 * (r % 16);
    const size_t tile = (size_t)(r / 16) * nb + b;
    if (w->fmt == FMT_T8_0) {
        const uint8_t *q = w->qs + tile * 512 + lane;
        const float d = _cvtsh_ss(w->d[tile * 16 + r % 16]);
        for (int j = 0; j < BLOCK; j++) y[j] = d * (float)(q[64 * (j / 4) + j % 4] - 128);
        return;
    }
    const uint8_t *q = w->qs + tile * (w->fmt == FMT_T6_K ? 384 : 256) + lane;
    for (int j = 0; j < BLOCK; j++) {
        const int at = 64 * (j % 16 / 4) + j % 4, nibble = j < 16 ? q[at] & 15 : q[at] >> 4;
        if (w->fmt == FMT_T4_1) {
            y[j] = fmaf(_cvtsh_ss(w->d[tile * 16 + r % 16]), (float)nibble, _cvtsh_ss(w->m[tile * 16 + r % 16]));
        } else if (w->fmt == FMT_T4_K) {
            y[j] = fmaf(w->scales[tile * 16 + r % 16], (float)nibble, w->offsets[tile * 16 + r % 16]);
        } else {    /* FMT_T6_K: value j's top bits in vector j / 16, at 2 (j % 16 / 4) */
            const int bits = (q[256 + 64 * (j / 16) + j % 4] >> (2 * (j % 16 / 4))) & 3;
            y[j] = fmaf(w->scales[tile * 32 + 16 * (j / 16) + r % 16], (float)((nibble | bits << 4) - 32), 0.0f);
        }
    }
}

/* Row r of W, as float32 values (the token embedding). */
static void dequantize_row(const hs_mat *w, int r, float *y) {
    const int nb = w->cols / BLOCK;
    for (int b = 0; b < nb; b++) {
        float *yb = y + b * BLOCK;
        const size_t at = (size_t)r * nb + b;
        if (w->fmt == FMT_W8) {     /* value j: dword j / 4 of block b, interleaved with b's partner */
            const size_t pair = w8_pair(w, r, b / 2);
            for (int j = 0; j < BLOCK; j++)
                yb[j] = w->scales[2 * pair + (b & 1)] * (float)(w->qs[64 * pair + 8 * (j / 4) + 4 * (b & 1) + j % 4] - 128);
            continue;
        }
        if (w->fmt == FMT_K4 || w->fmt == FMT_K6) {
            dequantize_k(w, r, b, yb);
            continue;
        }
        if (w->fmt == FMT_F16) {
            for (int j = 0; j < BLOCK; j++) yb[j] = _cvtsh_ss(((const uint16_t *)w->qs)[at * BLOCK + j]);
            continue;
        }
        if (w->fmt == FMT_F32) {
            memcpy(yb, (const float *)w->qs + at * BLOCK, sizeof(float) * BLOCK);
            continue;
        }
        if (w->fmt == FMT_N4) {
            const uint8_t *q = w->qs + at * 16;
            for (int j = 0; j < 16; j++) {
                yb[j] = fmaf(w->scales[at], (float)(q[j] & 15), w->offsets[at]);
                yb[j + 16] = fmaf(w->scales[at], (float)(q[j] >> 4), w->offsets[at]);
            }
            continue;
        }
        if (w->fmt == FMT_N6) {     /* FMT_I8's q: the nibble, its top bits (formats.h), less 32 */
            const uint8_t *q = w->qs + at * 16, *top = w->sub + 16 * ((size_t)r * ((nb + 1) / 2) + b / 2);
            for (int j = 0; j < BLOCK; j++) {
                const int nibble = j < 16 ? q[j] & 15 : q[j - 16] >> 4, bits = (top[j % 16] >> (2 * (b & 1) + 4 * (j / 16))) & 3;
                yb[j] = fmaf(w->scales[2 * at + j / 16], (float)((nibble | bits << 4) - 32), 0.0f);
            }
            continue;
        }
        if (is_tile(w->fmt)) {
            dequantize_tile(w, r, b, yb);
            continue;
        }
        if (w->fmt == FMT_I8) {
            const int8_t *q = (const int8_t *)w->qs + at * 32;
            const float off = w->offsets ? w->offsets[at] : 0.0f;
            for (int j = 0; j < BLOCK; j++) yb[j] = fmaf(w->scales[2 * at + j / 16], (float)q[j], off);
            continue;
        }
        const float d = _cvtsh_ss(w->d[at]);
        if (w->fmt == FMT_Q5) {
            int8_t q[BLOCK];
            _mm256_storeu_si256((__m256i *)q, q5_quants(w->qs + at * 20));
            for (int j = 0; j < BLOCK; j++) yb[j] = d * (float)q[j];
            continue;
        }
        if (w->fmt == FMT_Q8_0) {
            const int8_t *q = (const int8_t *)w->qs + at * 32;
            for (int j = 0; j < BLOCK; j++) yb[j] = d * (float)q[j];
            continue;
        }
        const uint8_t *q = w->qs + at * 16;
        const float m = w->fmt == FMT_Q4_0 ? -8.0f * d : _cvtsh_ss(w->m[at]);
        for (int j = 0; j < 16; j++) {
            yb[j] = fmaf(d, (float)(q[j] & 15), m);
            yb[j + 16] = fmaf(d, (float)(q[j] >> 4), m);
        }
    }
}

/* The same, exported: a layout's values, which tests compare between layouts. */
void hs_dequantize_row(const hs_mat *w, int r, float *y) { dequantize_row(w, r, y); }

/* ---- the output layer ------------------------------------------------------------ */

/* Logits with a Q8_0 output layer, read mostly in its Q4_1 copy: all of them
   from the copy, then the REFINE largest again from the Q8_0 rows, exactly as
   the full layer gives them. The copy reads fewer bytes (20 per block of 32
   weights against 34), and the output layer is much of a step (most of
   Gemma 3's). The copy's own argmax is often not the full layer's, but the
   full layer's has been among the copy's few largest logits: greedy drafts
   are the full layer's wherever it is among the REFINE. The other logits are
   the copy's, coarser, and sampling sees them: 64 recomputed keep seeded
   sampling acceptance where the full layer has it, 16 did not (measured:
   e7e822d:docs/kernels.md). */
enum { REFINE = 64 };

enum { HEAD_CHUNK = 4096 };   /* rows of the output layer between two looks at the halt flag */

static int halted(const volatile int *halt) { return halt && *halt != 0; }

/* Logits from the output layer w, HEAD_CHUNK rows at a time: 1 where m->halt stopped it
   (a large vocabulary's layer is much of a step), else 0. A row-tile layer (a draft's
   Q4_1 copy) at once through the window products, from xw. */
static int head_rows(const hs_model *m, const hs_mat *w, const quantized *x, const window_act *xw, float *logits) {
    if (is_tile(w->fmt)) {
        if (halted(m->halt)) return 1;
        window_matmat(w, xw, 1, logits, w->rows, NULL);
        return 0;
    }
    for (int r = 0; r < w->rows; r += HEAD_CHUNK) {
        if (halted(m->halt)) return 1;
        matvec_rows(w, x, logits, NULL, r, r + HEAD_CHUNK < w->rows ? r + HEAD_CHUNK : w->rows);
    }
    return 0;
}

/* The logits (see above); 1 where m->halt stopped it before they were all computed. */
static int head(const hs_model *m, const quantized *x, const window_act *xw, float *logits) {
    if (!m->out_fast.qs) return head_rows(m, &m->out, x, xw, logits);
    if (head_rows(m, &m->out_fast, x, xw, logits)) return 1;
    for (int i = m->out_fast.rows; i < m->n_vocab; i++) logits[i] = -INFINITY;   /* a draft's vocabulary cut */
    int top[REFINE], kept = 0, lowest = 0;
    float floor = -INFINITY;              /* the smallest kept logit once REFINE are kept */
    const int n = m->n_vocab;
    for (int i = 0; i < n; i += 8) {
        int mask = i + 8 <= n ? _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(logits + i), _mm256_set1_ps(floor),
                                                                 _CMP_GT_OQ))
                              : (1 << (n - i)) - 1;
        for (; mask; mask &= mask - 1) {
            const int j = i + __builtin_ctz(mask);
            if (!(logits[j] > floor)) continue;
            if (kept < REFINE) top[kept++] = j;
            else top[lowest] = j;
            if (kept == REFINE) {
                lowest = 0;
                for (int k = 1; k < REFINE; k++) if (logits[top[k]] < logits[top[lowest]]) lowest = k;
                floor = logits[top[lowest]];
            }
        }
    }
    const int nb = m->out.cols / BLOCK;
    float scale[2 * nb];
    for (int k = 0; k < kept; k++) logits[top[k]] = one_row(&m->out, top[k], nb, x, scale);
    return 0;
}

/* A Q4_1 copy of Q8_0 blocks (blocks of 32 values): per block the step
   (max - min) / 15 and the minimum, in float16, and the values rounded to the
   nearest of the 16 levels. */
void hs_q4_1_from_q8_0(const int8_t *qs, const uint16_t *d, long blocks, uint8_t *q4, uint16_t *d4, uint16_t *m4) {
    for (long b = 0; b < blocks; b++) {
        const float scale = _cvtsh_ss(d[b]);
        float w[BLOCK], lo = INFINITY, hi = -INFINITY;
        for (int j = 0; j < BLOCK; j++) {
            w[j] = scale * (float)qs[b * BLOCK + j];
            lo = fminf(lo, w[j]);
            hi = fmaxf(hi, w[j]);
        }
        d4[b] = _cvtss_sh((hi - lo) / 15.0f, 0);
        m4[b] = _cvtss_sh(lo, 0);
        const float step = _cvtsh_ss(d4[b]), low = _cvtsh_ss(m4[b]), inv = step > 0.0f ? 1.0f / step : 0.0f;
        for (int j = 0; j < 16; j++) {
            const int a = (int)lrintf((w[j] - low) * inv), c = (int)lrintf((w[j + 16] - low) * inv);
            q4[b * 16 + j] = (uint8_t)((a < 0 ? 0 : a > 15 ? 15 : a) | (c < 0 ? 0 : c > 15 ? 15 : c) << 4);
        }
    }
}

/* n Q4_K superblocks (d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles: four
   runs of 32 bytes, low nibbles one sub-block's 32 weights, high the next's) in FMT_K4's
   layout (formats.h): at load, where numpy took seconds for a 1.5B model. */
void hs_pack_q4_k(const uint8_t *blocks, long n, uint8_t *qs, uint8_t *sub, float *scales) {
    for (long s = 0; s < n; s++, blocks += 144, qs += 128, sub += 16, scales += 2) {
        uint16_t d[2];
        memcpy(d, blocks, 4);
        scales[0] = _cvtsh_ss(d[0]);
        scales[1] = _cvtsh_ss(d[1]);
        const uint8_t *sc = blocks + 4, *q = blocks + 16;
        for (int j = 0; j < 8; j++) {      /* sub-block j's scale and min, 6 bits each */
            sub[j] = j < 4 ? sc[j] & 63 : (sc[j + 4] & 15) | (sc[j - 4] >> 6) << 4;
            sub[8 + j] = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
        }
        for (int b = 0; b < 8; b++) {      /* weight j of sub-block b: nibble b % 2 of q[32 (b / 2) + j] */
            const uint8_t *run = q + 32 * (b / 2);
            const int shift = 4 * (b % 2);
            for (int j = 0; j < 16; j++)
                qs[16 * b + j] = (uint8_t)(((run[j] >> shift) & 15) | ((run[j + 16] >> shift) & 15) << 4);
        }
    }
}

/* n Q6_K superblocks (ql[128], qh[64], 16 int8 scales, d) in FMT_K6's layout: per block
   of 32 the low nibbles as Q4_0 orders them, then byte j holding the top two bits of
   weights j, j + 8, j + 16, j + 24. Block 4h + c's weight j is ql's nibble c / 2 of
   byte 64h + 32 (c % 2) + j, with bits 2c of qh[32h + j] above it (llama.cpp's order). */
void hs_pack_q6_k(const uint8_t *blocks, long n, uint8_t *qs, uint8_t *sub, float *scales) {
    for (long s = 0; s < n; s++, blocks += 210, qs += 8 * 24, sub += 16, scales++) {
        uint16_t d;
        memcpy(&d, blocks + 208, 2);
        *scales = _cvtsh_ss(d);
        memcpy(sub, blocks + 192, 16);
        for (int b = 0; b < 8; b++) {
            const int h = b / 4, c = b % 4;
            uint8_t q[BLOCK];
            for (int j = 0; j < BLOCK; j++)
                q[j] = (uint8_t)(((blocks[64 * h + 32 * (c % 2) + j] >> (4 * (c / 2))) & 15) |
                                 ((blocks[128 + 32 * h + j] >> (2 * c)) & 3) << 4);
            uint8_t *out = qs + 24 * b;
            for (int j = 0; j < 16; j++) out[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
            for (int j = 0; j < 8; j++)
                out[16 + j] = (uint8_t)(q[j] >> 4 | (q[j + 8] >> 4) << 2 | (q[j + 16] >> 4) << 4 | (q[j + 24] >> 4) << 6);
        }
    }
}

/* ---- the rest of a layer -------------------------------------------------------- */

static void rms_norm(const float *x, const float *weight, int n, float eps, float *y) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * weight[i];
}

/* Turn adjacent pairs (2i, 2i + 1) of every head by the angles of this position. */
static void rope(float *v, int heads, int head_dim, const float *cos_t, const float *sin_t) {
    for (int h = 0; h < heads; h++) {
        float *p = v + h * head_dim;
        for (int i = 0; i < head_dim / 2; i++) {
            const float a = p[2 * i], b = p[2 * i + 1];
            p[2 * i] = a * cos_t[i] - b * sin_t[i];
            p[2 * i + 1] = a * sin_t[i] + b * cos_t[i];
        }
    }
}

/* Turn dimensions (i, i + head_dim/2) of every head: rope over halves, as transformers does. */
static void rope_halves(float *v, int heads, int head_dim, const float *cos_t, const float *sin_t) {
    const int half = head_dim / 2;
    for (int h = 0; h < heads; h++) {
        float *p = v + h * head_dim;
        for (int i = 0; i < half; i++) {
            const float a = p[i], b = p[i + half];
            p[i] = a * cos_t[i] - b * sin_t[i];
            p[i + half] = b * cos_t[i] + a * sin_t[i];
        }
    }
}

/* The angles of position pos, pair i turned by pos * base^(-2i/head_dim), times `scale`,
   divided by freqs[i] where given (llama.cpp's freq_factors: Llama 3's rope scaling). */
static void rope_angles(int pos, float base, int head_dim, const float *freqs, float scale, float *cos_t,
                        float *sin_t) {
    for (int i = 0; i < head_dim / 2; i++) {
        float angle = scale * ((float)pos * powf(base, -2.0f * (float)i / (float)head_dim));
        if (freqs) angle /= freqs[i];
        cos_t[i] = cosf(angle);
        sin_t[i] = sinf(angle);
    }
}

/* exp(x) for x <= 0 (softmax after subtracting the maximum), to ~2 ulp. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* gate = act(gate) * up, act(g) = g * sigmoid(z) with exp of -|z| only: SiLU is
   z = g, GELU's tanh form z = 2 sqrt(2/pi) (g + 0.044715 g^3)
   (0.5 (1 + tanh(u)) = sigmoid(2u)). */
static void gated(float *gate, const float *up, int n, int gelu) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 c1 = _mm256_set1_ps(1.5957691216f), c3 = _mm256_set1_ps(0.0713548163f);  /* 2 sqrt(2/pi) (1, 0.044715) */
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 z = gelu ? _mm256_mul_ps(g, _mm256_fmadd_ps(_mm256_mul_ps(g, g), c3, c1)) : g;
        const __m256 e = exp8(_mm256_or_ps(z, sign));                       /* exp(-|z|) */
        const __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, e));
        const __m256 sig = _mm256_blendv_ps(r, _mm256_mul_ps(e, r), z);     /* z < 0: e / (1 + e) */
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) {
        const float g = gate[i], z = gelu ? g * (1.5957691216f + 0.0713548163f * g * g) : g;
        gate[i] = g / (1.0f + expf(-z)) * up[i];
    }
}

/* Keys are kept in blocks of KEY_BLOCK positions, each block dimension-major
   ([block][dim][position in block]): a query's scores for a block's positions
   are then the lanes of one FMA chain, with no horizontal sum per position.
   Values stay position-major, a row per position, as weighing them reads. */
enum { KEY_BLOCK = 8 };
enum { KEYS_AHEAD = 8, VALUES_AHEAD = 16 };   /* key blocks, value rows a stream is fetched ahead */

/* Key values per kv head: n_ctx rounded up to whole blocks. */
static inline size_t key_stride(const hs_model *m) {
    return (size_t)((m->n_ctx + KEY_BLOCK - 1) / KEY_BLOCK) * KEY_BLOCK * m->head_dim;
}

/* Floats of attention scores a part of attend_positions takes: a group's heads over the context. */
static inline size_t scores_floats(const hs_model *m) {
    return (size_t)(m->n_head / m->n_kv) * (m->n_ctx + KEY_BLOCK);
}

/* out = sum over t of p[t] * v[t] (float16 rows `stride` apart), 32 values at a
   time kept in registers while the rows stream past. */
static void weigh_values(const uint16_t *v, int stride, const float *p, int n, int hd, float *out) {
    for (int i = 0; i < hd; i += 32) {
        const int parts = hd - i < 32 ? (hd - i) / 8 : 4;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int t = 0; t < n; t++) {
            const __m256 w = _mm256_broadcast_ss(p + t);
            const uint16_t *row = v + (size_t)t * stride + i;
            for (int c = 0; c < parts; c++)
                acc[c] = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8 * c))), acc[c]);
        }
        for (int c = 0; c < parts; c++) _mm256_storeu_ps(out + i + 8 * c, acc[c]);
    }
}

/* The same for three heads sharing the rows (their p p_stride apart, out hd
   apart; hd a multiple of 32): each row is read once per 32 values. */
static void weigh_values3(const uint16_t *v, int stride, const float *p, int p_stride, int n, int hd, float *out) {
    for (int i = 0; i < hd; i += 32) {
        __m256 acc[3][4];
        for (int h = 0; h < 3; h++)
            for (int c = 0; c < 4; c++) acc[h][c] = _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            const uint16_t *row = v + (size_t)t * stride + i;
            if (i == 0 && t + VALUES_AHEAD < n)    /* the later passes find the rows in cache */
                for (int j = 0; j < hd; j += 32)
                    _mm_prefetch((const char *)(row + (size_t)VALUES_AHEAD * stride + j), _MM_HINT_T0);
            __m256 vv[4];
            for (int c = 0; c < 4; c++) vv[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8 * c)));
            for (int h = 0; h < 3; h++) {
                const __m256 w = _mm256_broadcast_ss(p + (size_t)h * p_stride + t);
                for (int c = 0; c < 4; c++) acc[h][c] = _mm256_fmadd_ps(w, vv[c], acc[h][c]);
            }
        }
        for (int h = 0; h < 3; h++)
            for (int c = 0; c < 4; c++) _mm256_storeu_ps(out + h * hd + i + 8 * c, acc[h][c]);
    }
}

/* Position pos's key into its place in its block. */
static void store_key(const float *k, int hd, uint16_t *keys, int pos) {
    uint16_t *dst = keys + (size_t)(pos / KEY_BLOCK) * hd * KEY_BLOCK + pos % KEY_BLOCK, half[8];
    for (int i = 0; i < hd; i += 8) {
        _mm_storeu_si128((__m128i *)half, _mm256_cvtps_ph(_mm256_loadu_ps(k + i), _MM_FROUND_TO_NEAREST_INT));
        for (int j = 0; j < 8; j++) dst[(size_t)(i + j) * KEY_BLOCK] = half[j];
    }
}

/* s[h * stride + i] = scale * q_h . key of position b0 * KEY_BLOCK + i, for the
   blocks b0..b1-1 and nh (a constant after inlining) query heads: two blocks
   at a time, so 2 * nh independent chains keep the FMA units busy. */
static inline __attribute__((always_inline)) void key_scores(const uint16_t *keys, int hd, const float *q, int nh,
                                                             int b0, int b1, float scale, float *s, int stride) {
    const __m256 sc = _mm256_set1_ps(scale);
    for (int b = b0; b < b1; b += 2) {
        const int pair = b + 1 < b1;
        const uint16_t *k0 = keys + (size_t)b * hd * KEY_BLOCK, *k1 = pair ? k0 + (size_t)hd * KEY_BLOCK : k0;
        __m256 a0[4], a1[4];
        for (int h = 0; h < nh; h++) a0[h] = a1[h] = _mm256_setzero_ps();
        if (b + KEYS_AHEAD < b1)       /* a single core streams the cache faster when asked ahead */
            for (int i = 0; i < 2 * hd * KEY_BLOCK; i += 32)
                _mm_prefetch((const char *)(k0 + (size_t)KEYS_AHEAD * hd * KEY_BLOCK + i), _MM_HINT_T0);
        for (int d = 0; d < hd; d++) {
            const __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k0 + d * KEY_BLOCK)));
            const __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k1 + d * KEY_BLOCK)));
            for (int h = 0; h < nh; h++) {
                const __m256 w = _mm256_broadcast_ss(q + (size_t)h * hd + d);
                a0[h] = _mm256_fmadd_ps(w, x0, a0[h]);
                a1[h] = _mm256_fmadd_ps(w, x1, a1[h]);
            }
        }
        float *out = s + (size_t)(b - b0) * KEY_BLOCK;
        for (int h = 0; h < nh; h++) {
            _mm256_storeu_ps(out + (size_t)h * stride, _mm256_mul_ps(a0[h], sc));
            if (pair) _mm256_storeu_ps(out + (size_t)h * stride + KEY_BLOCK, _mm256_mul_ps(a1[h], sc));
        }
    }
}

/* Scores into probabilities, in place, over n values. */
static void softmax(float *s, int n) {
    __m256 top8 = _mm256_set1_ps(-INFINITY), sum8 = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= n; t += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(s + t));
    float top = hmax8(top8), total;
    for (; t < n; t++) top = s[t] > top ? s[t] : top;
    for (t = 0; t + 8 <= n; t += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), _mm256_set1_ps(top)));
        _mm256_storeu_ps(s + t, e);
        sum8 = _mm256_add_ps(sum8, e);
    }
    total = hsum8(sum8);
    for (; t < n; t++) {
        s[t] = expf(s[t] - top);
        total += s[t];
    }
    const float inv = 1.0f / total;
    for (t = 0; t < n; t++) s[t] *= inv;
}

/* Attention of query heads h0..h1-1 of kv head g's group over positions first..end-1 of
   one layer's cache; each key and value is read once for the heads together. A head's
   float steps do not depend on which heads share the pass, so the heads may be split
   among threads (attend_positions) without changing a bit. */
static void attend(const hs_model *m, const float *q, const uint16_t *kc, const uint16_t *vc, int first, int end,
                   int g, int h0, int h1, float *scores, float *out) {
    const int hd = m->head_dim, group = m->n_head / m->n_kv, n = end - first;
    const int b0 = first / KEY_BLOCK, b1 = (end + KEY_BLOCK - 1) / KEY_BLOCK, stride = (b1 - b0) * KEY_BLOCK;
    const int skip = first - b0 * KEY_BLOCK;             /* positions of the first block before `first` */
    const float scale = 1.0f / sqrtf((float)hd);
    const uint16_t *keys = kc + (size_t)g * key_stride(m), *values = vc + (size_t)g * m->n_ctx * hd + (size_t)first * hd;
    const float *qg = q + (size_t)g * group * hd;
    for (int h = h0; h < h1; h += 4) {
        float *s = scores + (size_t)(h - h0) * stride;
        switch (h1 - h < 4 ? h1 - h : 4) {
        case 1: key_scores(keys, hd, qg + h * hd, 1, b0, b1, scale, s, stride); break;
        case 2: key_scores(keys, hd, qg + h * hd, 2, b0, b1, scale, s, stride); break;
        case 3: key_scores(keys, hd, qg + h * hd, 3, b0, b1, scale, s, stride); break;
        default: key_scores(keys, hd, qg + h * hd, 4, b0, b1, scale, s, stride); break;
        }
    }
    for (int h = h0; h < h1; h++) softmax(scores + (size_t)(h - h0) * stride + skip, n);
    int h = h0;
    if (hd % 32 == 0)
        for (; h + 3 <= h1; h += 3)
            weigh_values3(values, hd, scores + (size_t)(h - h0) * stride + skip, stride, n, hd, out + (g * group + h) * hd);
    for (; h < h1; h++)
        weigh_values(values, hd, scores + (size_t)(h - h0) * stride + skip, n, hd, out + (g * group + h) * hd);
}

static void to_half(const float *x, int n, uint16_t *y) {
    for (int i = 0; i < n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
}

/* ---- the model ------------------------------------------------------------------ */

/* Qwen2's biases, added to a token's query, key and value. */
static void add_biases(const hs_layer *L, float *q, float *k, float *v, int heads, int kv_dim) {
    if (!L->bq) return;
    for (int i = 0; i < heads; i++) q[i] += L->bq[i];
    for (int i = 0; i < kv_dim; i++) k[i] += L->bk[i];
    for (int i = 0; i < kv_dim; i++) v[i] += L->bv[i];
}

static int widest(const hs_model *m) {
    const int heads = m->n_head * m->head_dim, w = m->n_ff > m->n_embd ? m->n_ff : m->n_embd;
    return heads > w ? heads : w;
}

/* Logits an output layer's Q4_1 copy leaves to its Q8_0 rows (see head), for the description. */
int hs_refined_logits(void) { return REFINE; }

/* Positions per block of the key cache, for the caller that allocates it. */
int hs_key_block(void) { return KEY_BLOCK; }

/* y = W x as a forward pass computes it, x rounded per block first: for the
   kernel tests. work: hs_matvec_work_floats(W's cols) floats. */
long hs_matvec_work_floats(int cols) {
    return cols + 3L * (cols / BLOCK) + 16;
}

/* The 16-bit rounded activations of up to `cols` values, placed in `work`
   (hs_matvec_work_floats(cols) floats). */
static quantized quantized_at(float *work, int cols) {
    quantized xq;
    xq.q = (int16_t *)work;
    xq.pairs = xq.q + cols;
    xq.scale = work + cols;
    xq.sum = xq.scale + cols / BLOCK;
    xq.qsum = (int32_t *)(xq.sum + cols / BLOCK);
    return xq;
}

void hs_matvec(const hs_mat *w, const float *x, float *y, float *work) {
    quantized xq = quantized_at(work, w->cols);
    quantize(x, w->cols, &xq);
    matvec(w, &xq, y, NULL);
}

enum { MAX_WINDOW = 64, MAX_HALF = 128 };   /* tokens a window; rope angles per head, at most */

int hs_max_window(void) { return MAX_WINDOW; }

/* How a pass multiplies a matrix: one token through the 16-bit one-token kernels
   (matvec: the draft's step; a row-tile matrix, which only the window products read,
   through those), or a window of tokens through the 8-bit window products (the
   target, and the draft filling its cache). */
enum { HELD_ONE = -2 };  /* products.held: x in the one-token rounding (the same for every matrix) */
typedef struct {
    int window;          /* 0: one token, 16-bit activations; 1: the window products */
    quantized one;       /* the token's rounded activations (one token) */
    window_act *acts;    /* each token's (a window, or a step's one token for row tiles) */
    int held;            /* how the activations hold the current x (-1: not yet; HELD_ONE; or
                            the window products' rounding, ACT_*) */
    const volatile int *halt;   /* a step stops at its next product once *halt is not 0 (NULL: never) */
    int stopped;         /* it has: the pass's other products are skipped, its results are void */
} products;

/* Y = W X for T rows of x (stride floats apart), token t's outputs at y + t * ystride.
   x is rounded only where the activations do not hold it as w needs it already. */
static void product(products *p, const hs_mat *w, const float *x, int stride, int T, float *y, int ystride,
                    const hs_mat *next) {
    if (p->stopped || (p->stopped = halted(p->halt))) return;
    if ((p->window || is_tile(w->fmt)) && window_reads(w)) {
        window_products(w, x, stride, T, p->acts, &p->held, y, ystride, next);
        return;
    }
    if (!p->window && p->held != HELD_ONE) {
        quantize(x, w->cols, &p->one);
        p->held = HELD_ONE;
    }
    for (int t = 0; t < T; t++) {   /* a window's matrix its products cannot read: token by token */
        if (p->window) quantize(x + (size_t)t * stride, w->cols, &p->one);
        matvec(w, &p->one, y + (size_t)t * ystride, next);
    }
}

/* A pass's scratch in the model's work memory: per token x, h, q, att, k, v, gate and up
   (as a layer names them) and four rope tables (global cos and sin, then local); then the
   rounded activations and the attention scores. */
typedef struct {
    float *x, *h, *q, *att, *k, *v, *gate, *up, *angles, *acts, *scores;
} scratch;

/* Where each token of a pass sits: its position, and the cache whose keys and values it
   reads and extends. One request's window: positions pos.. in the model's own cache; a
   batch (hs_forward_batch): each request's tokens at their positions, in its own cache. */
typedef struct {
    const int *pos;
    uint16_t *const *kcache, *const *vcache;
} placed;

/* Floats the rounded activations of T tokens take: the window's, then a single token's
   16-bit ones (a window takes those for the matrices its products cannot read). */
static long acts_floats(const hs_model *m, int T) {
    return T * window_act_floats(widest(m)) + hs_matvec_work_floats(widest(m));
}

static scratch scratch_at(const hs_model *m, int T) {
    const size_t E = m->n_embd, heads = (size_t)m->n_head * m->head_dim, kv = (size_t)m->n_kv * m->head_dim;
    scratch s;
    s.x = m->work;
    s.h = s.x + T * E;
    s.q = s.h + T * E;
    s.att = s.q + T * heads;
    s.k = s.att + T * heads;
    s.v = s.k + T * kv;
    s.gate = s.v + T * kv;
    s.up = s.gate + (size_t)T * m->n_ff;
    s.angles = s.up + (size_t)T * m->n_ff;
    s.acts = s.angles + (size_t)T * 4 * MAX_HALF;
    s.scores = s.acts + acts_floats(m, T);
    return s;
}

/* Floats of scratch memory a pass of up to `tokens` tokens needs (one: a step). */
long hs_window_work_floats(const hs_model *m, int tokens) {
    const long heads = (long)m->n_head * m->head_dim, kv = (long)m->n_kv * m->head_dim;
    const long per_token = 2L * m->n_embd + 2 * heads + 2 * kv + 2L * m->n_ff + 4 * MAX_HALF;
    return tokens * per_token + acts_floats(m, tokens) + (long)POOL_MAX * (long)scores_floats(m) + 64;
}

/* Each token's embedding (scaled, for Gemma 3) into x, and its rope angles, global
   then local (sliding layers), into its tables. */
static void embed(const hs_model *m, const int *tokens, int T, const placed *at, const scratch *s) {
    const int E = m->n_embd, hd = m->head_dim;
    for (int t = 0; t < T; t++) {
        float *a = s->angles + (size_t)t * 4 * MAX_HALF, *x = s->x + (size_t)t * E;
        rope_angles(at->pos[t], m->rope_base, hd, m->rope_freqs, m->rope_scale, a, a + MAX_HALF);
        if (m->window > 0) rope_angles(at->pos[t], m->rope_base_local, hd, NULL, 1.0f, a + 2 * MAX_HALF, a + 3 * MAX_HALF);
        dequantize_row(&m->embd, tokens[t], x);
        if (m->embd_scale != 1.0f)
            for (int i = 0; i < E; i++) x[i] *= m->embd_scale;
    }
}

/* Each token's query and key made ready (biases, head norms, rope), its key and value
   stored at its position: every key and value of the window first, as later tokens
   attend to them. */
static void store_positions(const hs_model *m, const hs_layer *L, int l, int T, const placed *at, const scratch *s) {
    const int hd = m->head_dim, heads = m->n_head * hd, kv_dim = m->n_kv * hd;
    void (*turn)(float *, int, int, const float *, const float *) = m->neox_rope ? rope_halves : rope;
    for (int t = 0; t < T; t++) {
        uint16_t *kc = at->kcache[t] + (size_t)l * m->n_kv * key_stride(m), *vc = at->vcache[t] + (size_t)l * m->n_ctx * kv_dim;
        float *qt = s->q + (size_t)t * heads, *kt = s->k + (size_t)t * kv_dim, *vt = s->v + (size_t)t * kv_dim;
        add_biases(L, qt, kt, vt, heads, kv_dim);
        const float *a = s->angles + (size_t)t * 4 * MAX_HALF + (L->sliding ? 2 * MAX_HALF : 0);
        if (L->q_norm)
            for (int i = 0; i < m->n_head; i++) rms_norm(qt + i * hd, L->q_norm, hd, m->eps, qt + i * hd);
        if (L->k_norm)
            for (int i = 0; i < m->n_kv; i++) rms_norm(kt + i * hd, L->k_norm, hd, m->eps, kt + i * hd);
        turn(qt, m->n_head, hd, a, a + MAX_HALF);
        turn(kt, m->n_kv, hd, a, a + MAX_HALF);
        for (int g = 0; g < m->n_kv; g++) {
            store_key(kt + g * hd, hd, kc + (size_t)g * key_stride(m), at->pos[t]);
            to_half(vt + g * hd, hd, vc + ((size_t)g * m->n_ctx + at->pos[t]) * hd);
        }
    }
}

typedef struct {
    const hs_model *m;
    const hs_layer *L;
    const placed *at;
    const scratch *s;
    int l, T, split;     /* each kv head's group of query heads in `split` pieces */
} attend_job;

/* The pieces (token, kv head, piece of its group) from part's share of them on: a token's
   attention reads its kv head's keys and values once for the piece's heads. */
static void attend_part(void *arg, int part, int parts) {
    const attend_job *j = arg;
    const hs_model *m = j->m;
    const int heads = m->n_head * m->head_dim, kv_dim = m->n_kv * m->head_dim, group = m->n_head / m->n_kv;
    const int units = j->T * m->n_kv * j->split;
    for (int u = (int)((long)units * part / parts); u < (int)((long)units * (part + 1) / parts); u++) {
        const int t = u / (m->n_kv * j->split), g = u / j->split % m->n_kv, piece = u % j->split;
        const uint16_t *kc = j->at->kcache[t] + (size_t)j->l * m->n_kv * key_stride(m);
        const uint16_t *vc = j->at->vcache[t] + (size_t)j->l * m->n_ctx * kv_dim;
        const int end = j->at->pos[t] + 1, first = j->L->sliding && end > m->window ? end - m->window : 0;
        attend(m, j->s->q + (size_t)t * heads, kc, vc, first, end, g, group * piece / j->split,
               group * (piece + 1) / j->split, j->s->scores + (size_t)part * scores_floats(m), j->s->att + (size_t)t * heads);
    }
}

/* Each token's attention over the positions up to its own (the last `window` of them in
   a sliding layer), into att, on the pool's threads: the tokens' kv heads split among
   them, and where there are fewer than threads (a step), their groups of query heads too. */
static void attend_positions(const hs_model *m, const hs_layer *L, int l, int T, const placed *at, const scratch *s) {
    const int parts = pool_width(), group = m->n_head / m->n_kv, units = T * m->n_kv;
    int split = (parts + units - 1) / units;
    split = split > group ? group : split;
    attend_job job = {m, L, at, s, l, T, split};
    pool_run(attend_part, &job);
}

/* x += post_norm(h) for each token (no norm where post_norm is NULL); then, where
   `norm` is given, h = norm(x), the next block's input. */
static void add_residual(const hs_model *m, int T, const float *post_norm, const float *norm, const scratch *s) {
    const int E = m->n_embd;
    for (int t = 0; t < T; t++) {
        float *ht = s->h + (size_t)t * E, *xt = s->x + (size_t)t * E;
        if (post_norm) rms_norm(ht, post_norm, E, m->eps, ht);
        for (int i = 0; i < E; i++) xt[i] += ht[i];
        if (norm) rms_norm(xt, norm, E, m->eps, ht);
    }
}

/* Layer l for T tokens, each where `at` places it: every architecture's difference is a field
   that is NULL or 0 where unused. `next` is the matrix read after the layer's last. */
static void layer(const hs_model *m, int l, int T, const placed *at, const scratch *s, products *p, const hs_mat *next) {
    const hs_layer *L = m->layers + l;
    const int E = m->n_embd, F = m->n_ff, heads = m->n_head * m->head_dim, kv_dim = m->n_kv * m->head_dim;
    for (int t = 0; t < T; t++) rms_norm(s->x + (size_t)t * E, L->attn_norm, E, m->eps, s->h + (size_t)t * E);
    p->held = -1;
    product(p, &L->wq, s->h, E, T, s->q, heads, &L->wk);
    product(p, &L->wk, s->h, E, T, s->k, kv_dim, &L->wv);
    product(p, &L->wv, s->h, E, T, s->v, kv_dim, &L->wo);
    if (p->stopped) return;          /* halted: no attention over what the products did not make */
    store_positions(m, L, l, T, at, s);
    attend_positions(m, L, l, T, at, s);
    p->held = -1;
    product(p, &L->wo, s->att, heads, T, s->h, E, &L->gate);
    add_residual(m, T, L->post_attn_norm, L->ffn_norm, s);
    p->held = -1;
    product(p, &L->gate, s->h, E, T, s->gate, F, &L->up);
    product(p, &L->up, s->h, E, T, s->up, F, &L->down);
    for (int t = 0; t < T; t++) gated(s->gate + (size_t)t * F, s->up + (size_t)t * F, F, m->gelu);
    p->held = -1;
    product(p, &L->down, s->gate, F, T, s->h, E, next);
    add_residual(m, T, L->post_ffn_norm, NULL, s);
}

/* Whether tokens[0..T) at their positions can be run (each position within the context). */
static int fits(const hs_model *m, const int *tokens, int T, const int *pos) {
    if (m->head_dim > 2 * MAX_HALF) return 0;
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= m->n_vocab || pos[t] < 0 || pos[t] >= m->n_ctx) return 0;
    return 1;
}

/* T tokens at positions pos.. of the model's own cache, placed: the arrays are the caller's. */
static placed in_own_cache(const hs_model *m, int T, int pos, int *positions, uint16_t **kc, uint16_t **vc) {
    for (int t = 0; t < T; t++) positions[t] = pos + t, kc[t] = m->kcache, vc[t] = m->vcache;
    return (placed){positions, kc, vc};
}

/* Every layer for T tokens, each where `at` places it; `last` is the matrix read after the last
   layer. 1 where p->halt stopped it (at a product), else 0. */
static int run_layers(const hs_model *m, const int *tokens, int T, const placed *at, const scratch *s, products *p,
                      const hs_mat *last) {
    embed(m, tokens, T, at, s);
    for (int l = 0; l < m->n_layer && !p->stopped; l++)
        layer(m, l, T, at, s, p, l + 1 < m->n_layer ? &m->layers[l + 1].wq : last);
    return p->stopped;
}

/* Evaluate `token` at position `pos` through the one-token kernels (the cache holds
   0..pos-1 and gets pos); logits (n_vocab floats) when not NULL. 0 on success, -1 for
   bad input, 1 where it stopped early, at a product (a layer's, or a chunk of the output
   layer's) because m->halt was set: the cache then holds some layers' entries at pos,
   which the next pass there overwrites (the cache is positional), and the logits are
   not whole. */
int hs_forward(const hs_model *m, int token, int pos, float *logits) {
    int position;
    uint16_t *kc, *vc;
    const placed at = in_own_cache(m, 1, pos, &position, &kc, &vc);
    if (!fits(m, &token, 1, at.pos)) return -1;
    const scratch s = scratch_at(m, 1);
    window_act act;         /* for row-tile matrices (a draft's with AVX-512 VNNI) */
    window_act_at(&act, s.acts, widest(m));
    products p = {.window = 0, .one = quantized_at(s.acts + window_act_floats(widest(m)), widest(m)), .acts = &act,
                  .halt = m->halt};
    if (run_layers(m, &token, 1, &at, &s, &p, m->out_fast.qs ? &m->out_fast : &m->out)) return 1;
    if (!logits) return 0;
    rms_norm(s.x, m->out_norm, m->n_embd, m->eps, s.h);
    quantize(s.h, m->n_embd, &p.one);
    if (is_tile(m->out_fast.fmt)) window_quantize(s.h, m->n_embd, window_act_kind(&m->out_fast), &act);
    return head(m, &p.one, &act, logits);
}

/* A batch of requests' tokens through the window products in one pass: token t at
   position pos[t] of the cache kcache[t], vcache[t] (its request's own; a request's
   tokens in order, each after the positions its cache holds). Every step but the
   products is a token's own, and the products give each token the same float steps
   whatever its neighbours: a token's rows are the bits it gets in its own window. Each
   token's state after the final norm into norms (T x n_embd). 0 on success, -1 for bad
   input. */
int hs_forward_batch(const hs_model *m, const int *tokens, int T, const int *pos, uint16_t *const *kcache,
                     uint16_t *const *vcache, float *norms) {
    const placed at = {pos, kcache, vcache};
    if (T < 1 || T > MAX_WINDOW || !fits(m, tokens, T, at.pos)) return -1;
    const scratch s = scratch_at(m, T);
    const int E = m->n_embd, W = widest(m);
    window_act acts[MAX_WINDOW];
    for (int t = 0; t < T; t++) window_act_at(acts + t, s.acts + t * window_act_floats(W), W);
    products p = {.window = 1, .one = quantized_at(s.acts + T * window_act_floats(W), W), .acts = acts};
    run_layers(m, tokens, T, &at, &s, &p, NULL);
    for (int t = 0; t < T; t++) rms_norm(s.x + (size_t)t * E, m->out_norm, E, m->eps, norms + (size_t)t * E);
    return 0;
}

/* Evaluate tokens[0..T) at positions pos.. of the model's own cache (it holds 0..pos-1
   and gets the window) through the window products: a batch of one request. */
int hs_forward_window(const hs_model *m, const int *tokens, int T, int pos, float *norms) {
    if (T < 1 || T > MAX_WINDOW) return -1;
    int positions[MAX_WINDOW];
    uint16_t *kc[MAX_WINDOW], *vc[MAX_WINDOW];
    const placed at = in_own_cache(m, T, pos, positions, kc, vc);
    return hs_forward_batch(m, tokens, T, at.pos, at.kcache, at.vcache, norms);
}

/* Logits of T final-norm rows through the whole output layer with the window's
   products (for an output layer that is not Q8_0; output_head.c takes those). */
void hs_window_logits(const hs_model *m, const float *norms, int T, float *logits) {
    window_act xq[MAX_WINDOW];
    int held = -1;
    for (int t = 0; t < T; t++) window_act_at(xq + t, m->work + t * window_act_floats(m->n_embd), m->n_embd);
    window_products(&m->out, norms, m->n_embd, T, xq, &held, logits, m->n_vocab, NULL);
}

/* Y = W X for T tokens (T x cols, row by row) as the target's window computes it,
   each token rounded as W's activations are: for the kernel tests. work:
   T * window_act_floats(cols) floats. -1 for a bad T. */
int hs_window_matmat(const hs_mat *w, const float *x, int T, float *y, float *work) {
    if (T < 1 || T > MAX_WINDOW) return -1;
    window_act xq[MAX_WINDOW];
    int held = -1;
    for (int t = 0; t < T; t++) window_act_at(xq + t, work + t * window_act_floats(w->cols), w->cols);
    window_products(w, x, w->cols, T, xq, &held, y, w->rows, NULL);
    return 0;
}

long hs_window_act_floats(int cols) { return window_act_floats(cols); }
