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
   w is N rows of K / 32 blocks. Built at run time by gguf_kernels.py (through
   build.py) with -march=native; needs AVX2, FMA and F16C, and works in AVX-512's
   16-wide vectors where the CPU has them. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "formats.h"

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the GGUF kernels need AVX2, FMA and F16C"
#endif

enum { MAX_TILE_ROWS = 8 };

/* Vectors of LANES float32: AVX-512's 16 where the CPU has it, else AVX2's 8.
   A block of 32 weights is PARTS vectors. */
#if defined(__AVX512F__)
typedef __m512 vf;
typedef __m512i vi;
enum { LANES = 16 };
#define VZERO _mm512_setzero_ps
#define VSET1 _mm512_set1_ps
#define VLOAD _mm512_loadu_ps
#define VMUL _mm512_mul_ps
#define VADD _mm512_add_ps
#define VFMA _mm512_fmadd_ps
#define VCVT _mm512_cvtepi32_ps
#define VSUM _mm512_reduce_add_ps
static inline vi widen_i8(const uint8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline vi widen_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline vi and15(vi q) { return _mm512_and_si512(q, _mm512_set1_epi32(15)); }
static inline vi shr4(vi q) { return _mm512_srli_epi32(q, 4); }
static inline vi minus8(vi q) { return _mm512_sub_epi32(q, _mm512_set1_epi32(8)); }
#else
typedef __m256 vf;
typedef __m256i vi;
enum { LANES = 8 };
#define VZERO _mm256_setzero_ps
#define VSET1 _mm256_set1_ps
#define VLOAD _mm256_loadu_ps
#define VMUL _mm256_mul_ps
#define VADD _mm256_add_ps
#define VFMA _mm256_fmadd_ps
#define VCVT _mm256_cvtepi32_ps
static inline float VSUM(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline vi widen_i8(const uint8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline vi widen_u8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline vi and15(vi q) { return _mm256_and_si256(q, _mm256_set1_epi32(15)); }
static inline vi shr4(vi q) { return _mm256_srli_epi32(q, 4); }
static inline vi minus8(vi q) { return _mm256_sub_epi32(q, _mm256_set1_epi32(8)); }
#endif
enum { PARTS = BLOCK / LANES };
/* Each row's block is fetched PREFETCH tiles ahead: the hardware prefetchers
   alone read a large output layer far below the memory's bandwidth
   (measured: e7e822d:docs/kernels.md). */
#ifndef PREFETCH
#define PREFETCH 2
#endif

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* A block's weights LANES * part .. as float32, its scale d (and, for Q4_1, its
   minimum m) broadcast once a block. */
static inline vf q8_0_part(const uint8_t *b, int part, vf d, vf m) {
    (void)m;
    return VMUL(d, VCVT(widen_i8(b + 2 + LANES * part)));
}

/* 4-bit blocks: byte j holds weight j in its low nibble and weight j + 16 in its
   high one, so weight i is in byte i % 16, low nibble if i < 16. */
static inline vi nibbles(const uint8_t *qs, int part) {
    const int first = LANES * part;
    const vi q = widen_u8(qs + first % 16);
    return first < 16 ? and15(q) : shr4(q);
}

static inline vf q4_0_part(const uint8_t *b, int part, vf d, vf m) {
    (void)m;
    return VMUL(d, VCVT(minus8(nibbles(b + 2, part))));
}

static inline vf q4_1_part(const uint8_t *b, int part, vf d, vf m) {
    return VFMA(d, VCVT(nibbles(b + 4, part)), m);
}

static inline vf no_min(const uint8_t *b) { (void)b; return VZERO(); }
static inline vf q4_1_min(const uint8_t *b) { return VSET1(half_at(b + 2)); }

/* One tile: R weight rows by TN activation rows, every accumulator in a register. */
#define TILE_NAME_(NAME, R, TN) NAME##_##R##x##TN
#define TILE_NAME(NAME, R, TN) TILE_NAME_(NAME, R, TN)     /* R may be a macro: expanded first */
#define TILE(NAME, PART, MIN, BYTES, R, TN)                                                    \
    static void TILE_NAME(NAME, R, TN)(const float *x, int K, const uint8_t *w, int n0, float *y, \
                                       int N) {                                                 \
        const int nb = K / BLOCK;                                                               \
        vf acc[R][TN];                                                                          \
        for (int r = 0; r < R; r++)                                                             \
            for (int t = 0; t < TN; t++) acc[r][t] = VZERO();                                   \
        for (int b = 0; b < nb; b++) {                                                          \
            const uint8_t *blk[R];                                                              \
            vf d[R], m[R];                                                                      \
            for (int r = 0; r < R; r++) {                                                       \
                blk[r] = w + ((size_t)(n0 + r) * nb + b) * BYTES;                               \
                _mm_prefetch((const char *)blk[r] + PREFETCH * R * nb * BYTES, _MM_HINT_T0);   \
                d[r] = VSET1(half_at(blk[r]));                                                  \
                m[r] = MIN(blk[r]);                                                             \
            }                                                                                   \
            for (int part = 0; part < PARTS; part++) {                                          \
                const int k = b * BLOCK + LANES * part;                                         \
                for (int r = 0; r < R; r++) {                                                   \
                    const vf wv = PART(blk[r], part, d[r], m[r]);                               \
                    for (int t = 0; t < TN; t++)                                                \
                        acc[r][t] = VFMA(VLOAD(x + (size_t)t * K + k), wv, acc[r][t]);          \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int r = 0; r < R; r++)                                                             \
            for (int t = 0; t < TN; t++) y[(size_t)t * N + n0 + r] = VSUM(acc[r][t]);           \
    }

/* Tiles of R weight rows by TN activation rows keep their R x TN accumulators
   in registers: with AVX-512's 32, four rows for 1-4 activation rows and two
   for 5-8; with AVX2's 16, two. Single rows take what is left over. */
#define SINGLES(NAME, PART, MIN, BYTES)                                                         \
    TILE(NAME, PART, MIN, BYTES, 1, 1) TILE(NAME, PART, MIN, BYTES, 1, 2)                       \
    TILE(NAME, PART, MIN, BYTES, 1, 3) TILE(NAME, PART, MIN, BYTES, 1, 4)                       \
    TILE(NAME, PART, MIN, BYTES, 1, 5) TILE(NAME, PART, MIN, BYTES, 1, 6)                       \
    TILE(NAME, PART, MIN, BYTES, 1, 7) TILE(NAME, PART, MIN, BYTES, 1, 8)                       \
    static const tile_fn NAME##_singles[MAX_TILE_ROWS + 1] = {0, NAME##_1x1, NAME##_1x2,        \
        NAME##_1x3, NAME##_1x4, NAME##_1x5, NAME##_1x6, NAME##_1x7, NAME##_1x8};
#define PAIRS(NAME, PART, MIN, BYTES)                                                           \
    TILE(NAME, PART, MIN, BYTES, 2, 5) TILE(NAME, PART, MIN, BYTES, 2, 6)                       \
    TILE(NAME, PART, MIN, BYTES, 2, 7) TILE(NAME, PART, MIN, BYTES, 2, 8)
#if defined(__AVX512F__)
#define WIDE 4
#else
#define WIDE 2
#endif
#define TILES(NAME, PART, MIN, BYTES)                                                           \
    SINGLES(NAME, PART, MIN, BYTES) PAIRS(NAME, PART, MIN, BYTES)                               \
    TILE(NAME, PART, MIN, BYTES, WIDE, 1) TILE(NAME, PART, MIN, BYTES, WIDE, 2)                 \
    TILE(NAME, PART, MIN, BYTES, WIDE, 3) TILE(NAME, PART, MIN, BYTES, WIDE, 4)                 \
    static const tile NAME##_tiles[MAX_TILE_ROWS + 1] = {{0, 0},                                \
        {TILE_NAME(NAME, WIDE, 1), WIDE}, {TILE_NAME(NAME, WIDE, 2), WIDE},                     \
        {TILE_NAME(NAME, WIDE, 3), WIDE}, {TILE_NAME(NAME, WIDE, 4), WIDE}, {NAME##_2x5, 2},   \
        {NAME##_2x6, 2}, {NAME##_2x7, 2}, {NAME##_2x8, 2}};

typedef void (*tile_fn)(const float *, int, const uint8_t *, int, float *, int);
typedef struct { tile_fn fn; int rows; } tile;

TILES(q8_0, q8_0_part, no_min, Q8_0_BYTES)
TILES(q4_0, q4_0_part, no_min, Q4_0_BYTES)
TILES(q4_1, q4_1_part, q4_1_min, Q4_1_BYTES)

/* 0 on success; -1 for an unknown format or a row length that is not whole blocks. */
int hs_gguf_matmul(int fmt, const float *x, int T, int K, const uint8_t *w, int N, float *y) {
    const tile *tiles;
    const tile_fn *singles;
    switch (fmt) {
    case FMT_Q8_0: tiles = q8_0_tiles; singles = q8_0_singles; break;
    case FMT_Q4_0: tiles = q4_0_tiles; singles = q4_0_singles; break;
    case FMT_Q4_1: tiles = q4_1_tiles; singles = q4_1_singles; break;
    default: return -1;
    }
    if (K <= 0 || K % BLOCK || T < 0 || N < 0) return -1;
    for (int t0 = 0; t0 < T; t0 += MAX_TILE_ROWS) {
        const int tn = T - t0 < MAX_TILE_ROWS ? T - t0 : MAX_TILE_ROWS;
        const float *xt = x + (size_t)t0 * K;
        float *yt = y + (size_t)t0 * N;
        const tile step = tiles[tn];
        int n = 0;
        for (; n + step.rows <= N; n += step.rows) step.fn(xt, K, w, n, yt, N);
        for (; n < N; n++) singles[tn](xt, K, w, n, yt, N);
    }
    return 0;
}
