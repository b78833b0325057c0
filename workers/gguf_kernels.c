/* Products of float32 activations with weights kept in a GGUF file's blocks.

   A target loaded from a quantized GGUF file holds float32 weights that are
   exactly the blocks' values (gguf's dequantization, in float32). A verify
   window multiplies a few rows by every weight, which on a CPU is bound by
   reading the weights; reading the blocks instead moves 4-7x fewer bytes.
   Each weight is rebuilt here bit for bit as gguf rebuilds it:
     Q8_0: d * q            Q4_0: d * (q - 8)            Q4_1: d * q + m
   d and m are float16 and q a small integer, so d * q is exact in float32 and
   the one rounding of "+ m" is the same in a fused multiply-add. Only the
   summation order of the dot products differs from torch's, as oneDNN's does.

   y[t, n] = sum_k x[t, k] * w[n, k]; x is T x K, y is T x N, both row-major;
   w is N rows of K / 32 blocks. Built at run time by workers/gguf_kernels.py
   with -march=native; needs AVX2, FMA and F16C. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the GGUF kernels need AVX2, FMA and F16C"
#endif

enum { FMT_Q8_0 = 0, FMT_Q4_0 = 1, FMT_Q4_1 = 2 };
enum { BLOCK = 32, MAX_TILE_ROWS = 8 };

static inline __m256 half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm256_set1_ps(_cvtsh_ss(h));
}

/* Weights 8 * part .. 8 * part + 7 of a block, as float32. */
static inline __m256 q8_0_part(const uint8_t *b, int part) {
    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * part)));
    return _mm256_mul_ps(half_at(b), _mm256_cvtepi32_ps(q));
}

/* 4-bit blocks: byte j holds weight j in its low nibble and weight j + 16 in its high one. */
static inline __m256i nibbles(const uint8_t *qs, int part) {
    __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * (part & 1))));
    return part < 2 ? _mm256_and_si256(q, _mm256_set1_epi32(15)) : _mm256_srli_epi32(q, 4);
}

static inline __m256 q4_0_part(const uint8_t *b, int part) {
    __m256i q = _mm256_sub_epi32(nibbles(b + 2, part), _mm256_set1_epi32(8));
    return _mm256_mul_ps(half_at(b), _mm256_cvtepi32_ps(q));
}

static inline __m256 q4_1_part(const uint8_t *b, int part) {
    return _mm256_fmadd_ps(half_at(b), _mm256_cvtepi32_ps(nibbles(b + 4, part)), half_at(b + 2));
}

static inline float hsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* One tile: R weight rows by TN activation rows, every accumulator in a register. */
#define TILE(NAME, PART, BYTES, R, TN)                                                          \
    static void NAME##_##R##x##TN(const float *x, int K, const uint8_t *w, int n0, float *y,  \
                                  int N) {                                                      \
        const int nb = K / BLOCK;                                                               \
        __m256 acc[R][TN];                                                                      \
        for (int r = 0; r < R; r++)                                                             \
            for (int t = 0; t < TN; t++) acc[r][t] = _mm256_setzero_ps();                       \
        for (int b = 0; b < nb; b++) {                                                          \
            for (int part = 0; part < 4; part++) {                                              \
                __m256 wv[R];                                                                   \
                for (int r = 0; r < R; r++)                                                     \
                    wv[r] = PART(w + ((size_t)(n0 + r) * nb + b) * BYTES, part);                \
                const int k = b * BLOCK + 8 * part;                                             \
                for (int t = 0; t < TN; t++) {                                                  \
                    __m256 xv = _mm256_loadu_ps(x + (size_t)t * K + k);                         \
                    for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(xv, wv[r], acc[r][t]); \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int r = 0; r < R; r++)                                                             \
            for (int t = 0; t < TN; t++) y[(size_t)t * N + n0 + r] = hsum(acc[r][t]);           \
    }

#define TILES(NAME, PART, BYTES)                                                                \
    TILE(NAME, PART, BYTES, 2, 1) TILE(NAME, PART, BYTES, 2, 2) TILE(NAME, PART, BYTES, 2, 3)   \
    TILE(NAME, PART, BYTES, 2, 4) TILE(NAME, PART, BYTES, 2, 5) TILE(NAME, PART, BYTES, 2, 6)   \
    TILE(NAME, PART, BYTES, 2, 7) TILE(NAME, PART, BYTES, 2, 8) TILE(NAME, PART, BYTES, 1, 1)   \
    TILE(NAME, PART, BYTES, 1, 2) TILE(NAME, PART, BYTES, 1, 3) TILE(NAME, PART, BYTES, 1, 4)   \
    TILE(NAME, PART, BYTES, 1, 5) TILE(NAME, PART, BYTES, 1, 6) TILE(NAME, PART, BYTES, 1, 7)   \
    TILE(NAME, PART, BYTES, 1, 8)                                                               \
    static const tile_fn NAME##_pairs[MAX_TILE_ROWS + 1] = {0, NAME##_2x1, NAME##_2x2,          \
        NAME##_2x3, NAME##_2x4, NAME##_2x5, NAME##_2x6, NAME##_2x7, NAME##_2x8};                \
    static const tile_fn NAME##_singles[MAX_TILE_ROWS + 1] = {0, NAME##_1x1, NAME##_1x2,        \
        NAME##_1x3, NAME##_1x4, NAME##_1x5, NAME##_1x6, NAME##_1x7, NAME##_1x8};

typedef void (*tile_fn)(const float *, int, const uint8_t *, int, float *, int);

TILES(q8_0, q8_0_part, 34)
TILES(q4_0, q4_0_part, 18)
TILES(q4_1, q4_1_part, 20)

/* 0 on success; -1 for an unknown format or a row length that is not whole blocks. */
int hs_gguf_matmul(int fmt, const float *x, int T, int K, const uint8_t *w, int N, float *y) {
    const tile_fn *pairs, *singles;
    switch (fmt) {
    case FMT_Q8_0: pairs = q8_0_pairs; singles = q8_0_singles; break;
    case FMT_Q4_0: pairs = q4_0_pairs; singles = q4_0_singles; break;
    case FMT_Q4_1: pairs = q4_1_pairs; singles = q4_1_singles; break;
    default: return -1;
    }
    if (K <= 0 || K % BLOCK || T < 0 || N < 0) return -1;
    for (int t0 = 0; t0 < T; t0 += MAX_TILE_ROWS) {
        const int tn = T - t0 < MAX_TILE_ROWS ? T - t0 : MAX_TILE_ROWS;
        const float *xt = x + (size_t)t0 * K;
        float *yt = y + (size_t)t0 * N;
        int n = 0;
        for (; n + 2 <= N; n += 2) pairs[tn](xt, K, w, n, yt, N);
        if (n < N) singles[tn](xt, K, w, n, yt, N);
    }
    return 0;
}
