/* The output layer of a llama.cpp target, computed here for a whole window at once.

   llama.cpp's batch-invariant settings multiply a window by the output layer one
   token column at a time, so verifying w tokens of Gemma 3 270M (262,144 x 640
   weights in Q8_0) costs nearly w one-token output layers. Here a row of weights is
   read once for every token of the window, and each logit is still computed by the
   same instructions whatever the window: the logits of a token do not depend on the
   tokens beside it.

   The arithmetic is llama.cpp's for a Q8_0 matrix: each token's activations are
   quantized to Q8_0 blocks (d = max|x| / 127 kept as float16, q = x * 127 / max|x|
   rounded to nearest even), and a logit is the sum over blocks of
   d_w * d_x * (integer dot product of the two blocks' q).

   hs_capture_norm is the llama.cpp eval callback that hands over the final-norm
   activations ("result_norm") and stops the graph before llama.cpp's own output layer.

   Built at run time by build.py with -march=native; needs AVX2, FMA and F16C, and uses
   AVX-512 VNNI where the CPU has it. */
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats.h"

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the output-layer kernel needs AVX2, FMA and F16C"
#endif

enum { MAX_TOKENS = 64, MAX_THREADS = 64 };

static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

/* One token's activations as Q8_0: q (cols int8) and d (cols / 32 floats, float16 values). */
static void quantize_q8_0(const float *x, int cols, int8_t *q, float *d) {
    for (int b = 0; b < cols / BLOCK; b++) {
        const float *v = x + b * BLOCK;
        __m256 amax = _mm256_setzero_ps();
        const __m256 sign = _mm256_set1_ps(-0.0f);
        for (int j = 0; j < BLOCK; j += 8)
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + j)));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float top = _mm_cvtss_f32(m);
        d[b] = half_to_float(_cvtss_sh(top / 127.f, 0));
        const __m256 scale = _mm256_set1_ps(top != 0.0f ? 127.f / top : 0.0f);
        for (int j = 0; j < BLOCK; j += 8) {   /* nearest, ties to even */
            const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + j), scale), _MM_ROUND_NEAREST);
            const __m256i i32 = _mm256_cvtps_epi32(r);
            const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
            _mm_storel_epi64((__m128i *)(q + b * BLOCK + j), _mm_packs_epi16(i16, i16));
        }
    }
}

/* The integer dot product of two 32-value blocks, as 8 lanes of 4 products each
   (llama.cpp's grouping): exact, so every way of computing it gives the same lanes. */
static inline __m256i dot_block(__m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
#else
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

static inline float sum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

enum { MAX_BLOCKS = 512 };   /* blocks a row: cols <= 16384 */

typedef struct {
    const uint8_t *w;       /* rows x (cols / 32) Q8_0 blocks of 34 bytes */
    int rows, cols, tokens;
    const int8_t *xq;       /* tokens x cols */
    const float *xd;        /* tokens x (cols / 32) */
    const uint8_t *xu;      /* VNNI: pairs x blocks x (2 x 32) bytes, xq + 128, two tokens side by side */
    const float *xd2;       /* VNNI: pairs x blocks x (2 x 8) floats: each token's block scale 8 times */
    float *out;             /* tokens x rows */
    int first, last;        /* this thread's rows */
} head_job;

/* One row against one token, llama.cpp's loop: per block acc += (d_w * d_x) * lanes. */
static float row_token(const uint8_t *row, int nb, const int8_t *xq, const float *xd) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * Q8_0_BYTES;
        const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
        const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + b * BLOCK));
        const __m256 d = _mm256_set1_ps(half_to_float((uint16_t)(blk[0] | blk[1] << 8)) * xd[b]);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_block(w, x)), acc);
    }
    return sum8(acc);
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
enum { PAIRS = 8 };   /* token pairs sharing a row's loads */

/* One row against pairs p0..p0+n-1, two tokens a 512-bit vector: each half takes
   exactly row_token's steps for its token. The block's weights are made unsigned
   work once: sum((x + 128) w) - 128 sum(w) = sum(x w), exactly, in integers. */
static void row_pairs(const head_job *j, const uint8_t *row, int nb, int p0, int n, float *sums) {
    __m512 acc[PAIRS];
    for (int p = 0; p < PAIRS; p++) acc[p] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * Q8_0_BYTES;
        const __m512i w = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 2)));
        const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(),
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)128), w));
        const __m512 dw = _mm512_set1_ps(half_to_float((uint16_t)(blk[0] | blk[1] << 8)));
        for (int p = 0; p < n; p++) {
            const size_t at = (size_t)(p0 + p) * nb + b;
            const __m512i x = _mm512_loadu_si512(j->xu + at * 2 * BLOCK);
            const __m512 d = _mm512_mul_ps(dw, _mm512_loadu_ps(j->xd2 + at * 16));
            acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, x, w)), acc[p]);
        }
    }
    for (int p = 0; p < n; p++) {
        sums[2 * p] = sum8(_mm512_castps512_ps256(acc[p]));
        sums[2 * p + 1] = sum8(_mm512_extractf32x8_ps(acc[p], 1));
    }
}
#define HAVE_PAIRS 1
#endif

/* Rows first..last-1 against every token: a row's blocks are read from memory once,
   then from cache for the other tokens. */
static void *head_rows(void *arg) {
    const head_job *j = arg;
    const int nb = j->cols / BLOCK;
    for (int r = j->first; r < j->last; r++) {
        const uint8_t *row = j->w + (size_t)r * nb * Q8_0_BYTES;
        float *out = j->out + r;
#ifdef HAVE_PAIRS
        if (j->tokens > 1) {
            const int pairs = (j->tokens + 1) / 2;
            float sums[2 * PAIRS];
            for (int p0 = 0; p0 < pairs; p0 += PAIRS) {
                const int n = pairs - p0 < PAIRS ? pairs - p0 : PAIRS;
                row_pairs(j, row, nb, p0, n, sums);
                for (int t = 2 * p0; t < 2 * (p0 + n) && t < j->tokens; t++) out[(size_t)t * j->rows] = sums[t - 2 * p0];
            }
            continue;
        }
#endif
        for (int t = 0; t < j->tokens; t++)
            out[(size_t)t * j->rows] = row_token(row, nb, j->xq + (size_t)t * j->cols, j->xd + (size_t)t * nb);
    }
    return NULL;
}

/* out (tokens x rows) = x (tokens x cols, float32) times the Q8_0 matrix w (rows x cols),
   rows split among `threads` threads. 0, or -1 for a shape it does not take. */
int hs_head_q8_0(const uint8_t *w, int rows, int cols, const float *x, int tokens, float *out, int threads) {
    if (cols % BLOCK || cols / BLOCK > MAX_BLOCKS || tokens < 1 || tokens > MAX_TOKENS || rows < 1 || threads < 1)
        return -1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    const int nb = cols / BLOCK, pairs = (tokens + 1) / 2;
    int8_t *xq = calloc((size_t)2 * pairs * cols, 1);                    /* a last odd token's partner is zeros */
    float *xd = calloc((size_t)2 * pairs * nb, sizeof(float));
    uint8_t *xu = malloc((size_t)2 * pairs * cols);
    float *xd2 = malloc(sizeof(float) * (size_t)pairs * nb * 16);
    if (!xq || !xd || !xu || !xd2) { free(xq); free(xd); free(xu); free(xd2); return -1; }
    for (int t = 0; t < tokens; t++) quantize_q8_0(x + (size_t)t * cols, cols, xq + (size_t)t * cols, xd + (size_t)t * nb);
    for (int p = 0; p < pairs; p++)
        for (int b = 0; b < nb; b++)
            for (int h = 0; h < 2; h++) {
                const int t = 2 * p + h;
                for (int i = 0; i < BLOCK; i++)
                    xu[((size_t)p * nb + b) * 2 * BLOCK + h * BLOCK + i] = (uint8_t)(xq[(size_t)t * cols + b * BLOCK + i] + 128);
                for (int i = 0; i < 8; i++) xd2[((size_t)p * nb + b) * 16 + h * 8 + i] = xd[(size_t)t * nb + b];
            }
    head_job jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    bool made[MAX_THREADS] = {false};
    for (int i = 0; i < threads; i++)
        jobs[i] = (head_job){w, rows, cols, tokens, xq, xd, xu, xd2, out, (int)((long)rows * i / threads),
                             (int)((long)rows * (i + 1) / threads)};
    for (int i = 1; i < threads; i++) made[i] = pthread_create(&ids[i], NULL, head_rows, &jobs[i]) == 0;
    head_rows(&jobs[0]);
    for (int i = 1; i < threads; i++) {
        if (made[i]) pthread_join(ids[i], NULL);
        else head_rows(&jobs[i]);       /* no thread to be had: this one does its rows */
    }
    free(xq);
    free(xd);
    free(xu);
    free(xd2);
    return 0;
}

/* The llama.cpp eval callback: stop at "result_norm", copy it out, compute no further. */
typedef const char *(*name_fn)(const void *);
typedef void *(*data_fn)(const void *);
typedef size_t (*nbytes_fn)(const void *);

typedef struct {
    name_fn name;
    data_fn data;
    nbytes_fn nbytes;
    float *out;             /* room for `room` bytes */
    size_t room, got;       /* got: bytes copied by the last pass */
    int reached;            /* whether the last pass came to the norm */
} hs_capture;

bool hs_capture_norm(const void *tensor, bool ask, void *user) {
    hs_capture *c = user;
    if (strcmp(c->name(tensor), "result_norm") != 0) return !ask;   /* not wanted; go on */
    if (ask) return true;
    const size_t n = c->nbytes(tensor);
    c->reached = 1;
    c->got = n <= c->room ? n : 0;
    if (c->got) memcpy(c->out, c->data(tensor), n);
    return false;
}
