/* A weight matrix times a window of tokens with activations rounded to int8 per
   block of 32: the native target's products (hs_forward_window in native_draft.c),
   on CPUs with AVX-512 BW and VNNI. Included by native_draft.c only.

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
   them for each weight type (quantize8).

   Batch invariance: a token's float operations are the same sequence whatever
   the window, chunk or token next to it; only the integer sums and the unpacking
   are shared, and integers are exact. */

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define WINDOW8 1

/* A token's activations in the pair layout. A last block without a partner is
   paired with zeros (its weights are masked, its scale is 0). */
typedef struct {
    int8_t *q;       /* 64 bytes a pair: xq, interleaved as above */
    uint8_t *u;      /* the same, xq + 128 */
    float *scale;    /* per block (x ~ scale * xq), a pair's two side by side */
    float *sum;      /* per block: what the weights' offsets multiply (see quantize8) */
} act8;

/* How llama.cpp rounds the activations a matrix meets (its vec_dot_type), so that the
   logits stay close to the file's in llama.cpp: Q8_0 blocks for Q8_0, Q5_0 (held as
   Q8_0) and Q4_0 weights; Q8_1 blocks, which add a float16 sum, for Q4_1; Q8_K
   blocks, one float32 scale per 256 values, for K-quants (FMT_I8). */
enum { ACT_Q8_0, ACT_Q8_1, ACT_Q8_K };

static inline int act_kind(const hs_mat *w) {
    return w->fmt == FMT_I8 ? ACT_Q8_K : w->fmt == FMT_Q4_1 ? ACT_Q8_1 : ACT_Q8_0;
}

static inline float round_half(float x) { return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)); }

/* Lane k of a pair's natural dwords (block b: 0-7, block b + 1: 8-15), interleaved. */
#define INTERLEAVE _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0)

/* x's n values rounded as `kind` says: xq = x * 127 / max|x| to nearest even, the
   max taken per block (Q8_0, Q8_1) or per 256 values (Q8_K). The scale is
   max / 127 in float16 (Q8_0, Q8_1) or 1 / (127 / max) in float32 (Q8_K); sum is
   scale * sum(xq), except Q8_1's, float16(max / 127 * sum(xq)). */
static void quantize8(const float *x, int n, int kind, act8 *out) {
    const int nb = n / BLOCK;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    float top[nb];
    for (int b = 0; b < nb; b++)
        top[b] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + b * BLOCK)),
                                                    _mm512_andnot_ps(sign, _mm512_loadu_ps(x + b * BLOCK + 16))));
    if (kind == ACT_Q8_K)           /* n is a multiple of 256: FMT_I8 holds K-quants only */
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
            const float qsum = (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            const float d = top[b] / 127.0f;
            out->scale[b] = kind == ACT_Q8_K ? (inv > 0.0f ? 1.0f / inv : 0.0f) : round_half(d);
            out->sum[b] = kind == ACT_Q8_1 ? round_half(d * qsum) : out->scale[b] * qsum;
        }
        __m512i pair = _mm512_castsi128_si512(bytes[0]);
        pair = _mm512_inserti32x4(pair, bytes[1], 1);
        pair = _mm512_inserti32x4(pair, bytes[2], 2);
        pair = _mm512_inserti32x4(pair, bytes[3], 3);
        pair = _mm512_permutexvar_epi32(INTERLEAVE, pair);
        _mm512_storeu_si512(out->q + 64 * p, pair);
        _mm512_storeu_si512(out->u + 64 * p, _mm512_xor_si512(pair, _mm512_set1_epi8((char)0x80)));
    }
}

/* Two blocks' float16 scales (the second 0 when there is none), b's in the even lanes. */
static inline __m512 block_scales(const uint16_t *d, int both) {
    uint32_t two = d[0];
    if (both) memcpy(&two, d, 4);
    return _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_castps_pd(_mm_cvtph_ps(_mm_cvtsi32_si128((int)two)))));
}

/* Row r's pair p as signed bytes in the pair layout, and its per-lane weight scales. */
static inline __attribute__((always_inline)) __m512i pair_weights(const hs_mat *w, int r, int nb, int p, __m512 *scales) {
    const int b = 2 * p, whole = b + 1 < nb;
    const size_t at = (size_t)r * nb + b;
    if (w->fmt == FMT_Q4_0 || w->fmt == FMT_Q4_1) {
        /* a block's byte j holds values j and j + 16: the low nibbles in the lower
           half, the high ones in the upper, then dwords b 0-15, b+1 0-15, b 16-31, b+1 16-31 */
        const __m512i v = whole ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w->qs + at * 16)))
                                : _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(w->qs + at * 16)));
        const __m512i shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
        __m512i q = _mm512_and_si512(_mm512_srlv_epi64(v, shift), _mm512_set1_epi8(15));
        q = _mm512_permutexvar_epi32(_mm512_set_epi32(15, 11, 14, 10, 13, 9, 12, 8, 7, 3, 6, 2, 5, 1, 4, 0), q);
        if (!whole) q = _mm512_maskz_mov_epi32(0x5555, q);
        *scales = block_scales(w->d + at, whole);
        return q;
    }
    const int8_t *qs = (const int8_t *)w->qs + at * 32;      /* Q8_0 and FMT_I8: 32 int8 a block */
    const __m512i q = _mm512_permutexvar_epi32(INTERLEAVE, whole ? _mm512_loadu_si512(qs)
                                                                 : _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)qs)));
    if (w->fmt == FMT_I8) {         /* a scale per 16 values: lanes 0-7 even/odd cover the two halves of b, b + 1 */
        const __m128 s = whole ? _mm_loadu_ps(w->scales + 2 * at) : _mm_castpd_ps(_mm_load_sd((const double *)(w->scales + 2 * at)));
        *scales = _mm512_permutexvar_ps(_mm512_set_epi32(3, 1, 3, 1, 3, 1, 3, 1, 2, 0, 2, 0, 2, 0, 2, 0),
                                        _mm512_castps128_ps512(s));
    } else {
        *scales = block_scales(w->d + at, whole);
    }
    return whole ? q : _mm512_maskz_mov_epi32(0x5555, q);
}

/* Sixteen of row r's per-block offsets from block b (fewer at the row's end; zeros past it). */
static inline __attribute__((always_inline)) __m512 block_offsets(const hs_mat *w, int r, int nb, int b) {
    const __mmask16 keep = nb - b >= 16 ? 0xffff : (__mmask16)((1u << (nb - b)) - 1);
    const size_t at = (size_t)r * nb + b;
    if (w->fmt == FMT_Q4_1) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(keep, w->m + at));
    if (w->fmt == FMT_Q4_0) return _mm512_mul_ps(_mm512_set1_ps(-8.0f), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(keep, w->d + at)));
    return _mm512_maskz_loadu_ps(keep, w->offsets + at);
}

enum { CHUNK = 8 };     /* tokens whose accumulators stay in registers */

/* Rows r of W for n tokens of x (n a constant at each call, so the loops unroll). */
static inline __attribute__((always_inline)) void row_chunk(const hs_mat *w, int r, const act8 *x, int n, float *y,
                                                            int ystride) {
    const int nb = w->cols / BLOCK, pairs = (nb + 1) / 2;
    const int nibbles = w->fmt == FMT_Q4_0 || w->fmt == FMT_Q4_1;
    const int has_offsets = nibbles || (w->fmt == FMT_I8 && w->offsets);
    __m512 acc[CHUNK];
    for (int t = 0; t < n; t++) acc[t] = _mm512_setzero_ps();
    for (int p = 0; p < pairs; p++) {
        __m512 ws;
        const __m512i q = pair_weights(w, r, nb, p, &ws);
        const __m512i start = nibbles ? _mm512_setzero_si512()
                                      : _mm512_sub_epi32(_mm512_setzero_si512(),
                                                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), q));
        for (int t = 0; t < n; t++) {
            const __m512i s = nibbles ? _mm512_dpbusd_epi32(start, q, _mm512_loadu_si512(x[t].q + 64 * p))
                                      : _mm512_dpbusd_epi32(start, _mm512_loadu_si512(x[t].u + 64 * p), q);
            const __m512 xs = _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_load_sd((const double *)(x[t].scale + 2 * p))));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(ws, xs), acc[t]);
        }
    }
    if (has_offsets)
        for (int b = 0; b < nb; b += 16) {
            const __m512 o = block_offsets(w, r, nb, b);
            const __mmask16 keep = nb - b >= 16 ? 0xffff : (__mmask16)((1u << (nb - b)) - 1);
            for (int t = 0; t < n; t++) acc[t] = _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(keep, x[t].sum + b), acc[t]);
        }
    for (int t0 = 0; t0 < n; t0 += 4) {
        __m512 four[4];
        for (int i = 0; i < 4; i++) four[i] = t0 + i < n ? acc[t0 + i] : _mm512_setzero_ps();
        float sums[4];
        _mm_storeu_ps(sums, fold4(four));
        for (int i = 0; i < 4 && t0 + i < n; i++) y[(size_t)(t0 + i) * ystride + r] = sums[i];
    }
}

/* Rows r0..r1-1 of Y = W X for T tokens (token t's outputs at y + t * ystride), a
   row at a time, its tokens CHUNK at a time. */
static void matmat8(const hs_mat *w, const act8 *x, int T, float *y, int ystride, const hs_mat *next, int r0, int r1) {
    for (int r = r0; r < r1; r++) {
        prefetch_ahead(w, next, r + AHEAD, 1);
        int t = 0;
        for (; t + CHUNK <= T; t += CHUNK) row_chunk(w, r, x + t, CHUNK, y + (size_t)t * ystride, ystride);
        if (T - t >= 4) { row_chunk(w, r, x + t, 4, y + (size_t)t * ystride, ystride); t += 4; }
        if (T - t >= 2) { row_chunk(w, r, x + t, 2, y + (size_t)t * ystride, ystride); t += 2; }
        if (T - t >= 1) row_chunk(w, r, x + t, 1, y + (size_t)t * ystride, ystride);
    }
}

#else
#define WINDOW8 0
#endif
