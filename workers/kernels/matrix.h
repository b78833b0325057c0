/* A weight matrix as the native model's kernels hold it (workers/common/native_weights.py
   lays it out at load), and the small inline helpers that native_model.c and the window
   products (window_avx512.c, window_avx2.c) share to read it. */
#ifndef HS_MATRIX_H
#define HS_MATRIX_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "formats.h"

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the native model needs AVX2, FMA and F16C"
#endif

/* A weight matrix, its blocks taken apart (workers/common/native_weights.py): per row,
   the blocks' quants one after the other (16 bytes of nibbles or 32 int8 a
   block), their scales d and, for Q4_1, their offsets m (float16). */
typedef struct {
    const uint8_t *qs;
    const uint16_t *d, *m;
    int fmt, rows, cols;
    const float *scales, *offsets;   /* FMT_I8: per 16 weights, per 32 (NULL: none); FMT_W8: per 32;
                                        FMT_N4: both per 32; FMT_N6: per 16, none;
                                        FMT_K4: d and dmin per 256 weights; FMT_K6: d per 256 */
    const uint8_t *sub;              /* FMT_K4: per 256 weights 8 scales then 8 mins (uint8);
                                        FMT_K6: a scale per 16 weights (int8);
                                        FMT_N6: 16 bytes of top bits a pair of blocks */
} hs_mat;

/* FMT_W8: where row r's pair of blocks p starts, in pairs (a row holds (blocks + 1) / 2). */
static inline size_t w8_pair(const hs_mat *w, int r, int p) { return (size_t)r * ((w->cols / BLOCK + 1) / 2) + p; }

static inline float hsum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float hmax8(__m256 a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* An FMT_K6 block's 32 quants, unsigned (0-63): values 0-15 in *lo, 16-31 in *hi. */
static inline __attribute__((always_inline)) void k6_quants(const uint8_t *qs, __m128i *lo, __m128i *hi) {
    const __m128i mask = _mm_set1_epi8(15), two = _mm_set1_epi8(3);
    const __m128i low = _mm_loadu_si128((const __m128i *)qs);
    const __m128i top = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(qs + 16)),
                                           _mm_loadl_epi64((const __m128i *)(qs + 16)));
    const __m128i top_a = _mm_blend_epi16(_mm_and_si128(top, two), _mm_and_si128(_mm_srli_epi16(top, 2), two), 0xF0);
    const __m128i top_b = _mm_blend_epi16(_mm_and_si128(_mm_srli_epi16(top, 4), two),
                                          _mm_and_si128(_mm_srli_epi16(top, 6), two), 0xF0);
    *lo = _mm_or_si128(_mm_and_si128(low, mask), _mm_slli_epi16(top_a, 4));
    *hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(low, 4), mask), _mm_slli_epi16(top_b, 4));
}

/* An FMT_Q5 block's 32 values q - 16 as int8, in order: the nibbles as Q4_0's, then
   each weight whose fifth bit is clear has 16 taken off (its byte's top four bits set). */
static inline __attribute__((always_inline)) __m256i q5_quants(const uint8_t *qs) {
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(15);
    uint32_t fifth;
    memcpy(&fifth, qs + 16, 4);
    /* byte j: byte j / 8 of the fifth bits, then whether its bit j % 8 is set */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)fifth),
                                               _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                                                  0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mask), _mm_and_si128(v, mask));
    return _mm256_or_si256(q, _mm256_andnot_si256(set, _mm256_set1_epi8((char)0xF0)));
}

/* A row's quants and scales are fetched this many rows before they are
   multiplied, past a matrix's end from the next one's first rows. Fetching
   ahead made steps faster; 16 rows did better than 4, and 32 or 64 no better
   (measured: e7e822d:docs/kernels.md). */
#ifndef AHEAD
#define AHEAD 16
#endif

/* Whether fmt holds its rows in tiles of 16 (formats.h, FMT_T*). */
static inline int is_tile(int fmt) { return fmt == FMT_T4_1 || fmt == FMT_T8_0 || fmt == FMT_T4_K || fmt == FMT_T6_K; }

/* Bytes of quants a block of 32 weights takes in a matrix of format fmt (not FMT_W8). */
static inline int block_bytes(int fmt) {
    return fmt == FMT_Q8_0 || fmt == FMT_I8 || fmt == FMT_T8_0 ? 32 : fmt == FMT_K6 || fmt == FMT_T6_K ? 24
         : fmt == FMT_Q5 ? 20 : 16;
}

static inline __attribute__((always_inline)) void prefetch_rows(const hs_mat *w, int r, int n) {
    const int nb = w->cols / BLOCK, row_bytes = nb * block_bytes(w->fmt);
    if (w->fmt == FMT_W8) {
        const int pairs = (nb + 1) / 2;
        const char *rows = (const char *)(w->qs + 64 * w8_pair(w, r, 0)), *scales = (const char *)(w->scales + 2 * w8_pair(w, r, 0));
        for (int i = 0; i < n * pairs * 64; i += 64) _mm_prefetch(rows + i, _MM_HINT_T0);
        for (int i = 0; i < n * pairs * 8; i += 64) _mm_prefetch(scales + i, _MM_HINT_T0);
        return;
    }
    const char *rows = (const char *)(w->qs + (size_t)r * row_bytes);
    for (int i = 0; i < n * row_bytes; i += 64) _mm_prefetch(rows + i, _MM_HINT_T0);
    if (is_tile(w->fmt)) return;        /* the tiles' scales are few: a tile's kernel fetches ahead */
    if (w->fmt == FMT_I8) {
        for (int i = 0; i < n * nb * 8; i += 64) _mm_prefetch((const char *)(w->scales + (size_t)r * nb * 2) + i, _MM_HINT_T0);
        return;
    }
    if (w->fmt == FMT_N6) {
        for (int i = 0; i < n * nb * 8; i += 64) {
            _mm_prefetch((const char *)(w->scales + (size_t)r * nb * 2) + i, _MM_HINT_T0);
            _mm_prefetch((const char *)(w->sub + (size_t)r * nb * 8) + i, _MM_HINT_T0);
        }
        return;
    }
    if (w->fmt == FMT_N4) {
        for (int i = 0; i < n * nb * 4; i += 64) {
            _mm_prefetch((const char *)(w->scales + (size_t)r * nb) + i, _MM_HINT_T0);
            _mm_prefetch((const char *)(w->offsets + (size_t)r * nb) + i, _MM_HINT_T0);
        }
        return;
    }
    if (w->fmt == FMT_K4 || w->fmt == FMT_K6) {     /* 2 bytes of sub-block scales a block; the floats are few */
        for (int i = 0; i < n * nb * 2; i += 64) _mm_prefetch((const char *)(w->sub + (size_t)r * nb * 2) + i, _MM_HINT_T0);
        return;
    }
    for (int i = 0; i < n * nb * 2; i += 64) _mm_prefetch((const char *)(w->d + (size_t)r * nb) + i, _MM_HINT_T0);
    if (w->m)
        for (int i = 0; i < n * nb * 2; i += 64) _mm_prefetch((const char *)(w->m + (size_t)r * nb) + i, _MM_HINT_T0);
}

/* Rows r..r+n of w fetched early, or past its end the first rows of `next`,
   the matrix multiplied after it: a forward's matrices are small (SmolLM2's
   wk has 192 rows), and each one's first rows would come in cold. */
static inline __attribute__((always_inline)) void prefetch_ahead(const hs_mat *w, const hs_mat *next, int r, int n) {
    if (r + n <= w->rows) prefetch_rows(w, r, n);
    else if (next && r >= w->rows && r - w->rows + n <= next->rows) prefetch_rows(next, r - w->rows, n);
}

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
/* Four rows' accumulators folded together in a few adds. */
static inline __m128 fold4(const __m512 *acc) {
    __m256 h[4];
    for (int i = 0; i < 4; i++)
        h[i] = _mm256_add_ps(_mm512_castps512_ps256(acc[i]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i]), 1)));
    const __m256 all = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    return _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
}
#endif

#endif
