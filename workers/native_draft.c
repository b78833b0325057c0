/* A Llama-architecture draft model, one token per call, read straight from a
   GGUF file's blocks.

   Why: drafting is one row at a time, so it is bound by reading the weights
   and by per-token overheads. llama.cpp runs the default draft (SmolLM2-135M)
   in ~10 ms a token as Q8_0, ~12 ms in the file's own Q4_1 blocks; this file
   reads the Q4_1 blocks (about two thirds of Q8_0's bytes) with integer dot
   products, and attends over the cache with every query head of a group at
   once.

   Activations are rounded to int16 per 32-value block (llama.cpp rounds them
   to int8), so with the target's own weights the draft agrees with the
   target nearly everywhere. A weight row of format
     Q8_0: d * q        Q4_0: d * (q - 8)        Q4_1: d * q + m
   times a block of activations x ~ dx * xq is d * dx * sum(q * xq) (minus
   8 * d * dx * sum(xq) for Q4_0), plus m * sum(x) for Q4_1.

   Conventions are llama.cpp's for the "llama" architecture: rope turns
   adjacent pairs (GGUF conversion permuted the query and key rows for it),
   weights are GGUF rows of `cols` values. The KV cache is float16,
   [layer][position][kv head][head_dim]. Needs AVX2, FMA and F16C. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the native draft needs AVX2, FMA and F16C"
#endif

enum { FMT_Q8_0 = 0, FMT_Q4_0 = 1, FMT_Q4_1 = 2 };
enum { BLOCK = 32 };

typedef struct {
    const uint8_t *data;
    int fmt, rows, cols;
} hs_mat;

typedef struct {
    hs_mat wq, wk, wv, wo, gate, up, down;
    const float *attn_norm, *ffn_norm;
} hs_layer;

typedef struct {
    int n_layer, n_embd, n_head, n_kv, head_dim, n_ff, n_vocab, n_ctx;
    float eps, rope_base;
    hs_mat embd, out;
    const float *out_norm;
    const hs_layer *layers;
    uint16_t *kcache, *vcache;    /* n_layer x n_ctx x n_kv * head_dim, float16 */
    float *work;                  /* hs_work_floats(model) floats */
} hs_model;

static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline float hsum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline int hsum8i(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* ---- activations rounded per block ------------------------------------------ */

typedef struct {
    int16_t *q;      /* n values */
    float *scale;    /* per block: x ~ scale * q */
    float *sum;      /* per block: the exact sum of x */
    int32_t *qsum;   /* per block: the sum of q */
} quantized;

static void quantize(const float *x, int n, quantized *out) {
    for (int b = 0; b < n / BLOCK; b++) {
        const float *xb = x + b * BLOCK;
        float amax = 0.0f, sum = 0.0f;
        for (int j = 0; j < BLOCK; j++) {
            amax = fmaxf(amax, fabsf(xb[j]));
            sum += xb[j];
        }
        const float scale = amax / 32767.0f, inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        int32_t qsum = 0;
        for (int j = 0; j < BLOCK; j++) {
            const int q = (int)lrintf(xb[j] * inv);
            out->q[b * BLOCK + j] = (int16_t)q;
            qsum += q;
        }
        out->scale[b] = scale;
        out->sum[b] = sum;
        out->qsum[b] = qsum;
    }
}

/* ---- one weight row times rounded activations -------------------------------- */

/* 32 unsigned 4-bit weights (low nibbles are weights 0-15, high ones 16-31) as
   two vectors of 16 int16. */
static inline void nibbles16(const uint8_t *qs, __m256i *lo, __m256i *hi) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m128i mask = _mm_set1_epi8(15);
    *lo = _mm256_cvtepu8_epi16(_mm_and_si128(raw, mask));
    *hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), mask));
}

static inline __m256i block_dot(__m256i w_lo, __m256i w_hi, const int16_t *xq) {
    const __m256i a = _mm256_madd_epi16(w_lo, _mm256_loadu_si256((const __m256i *)xq));
    return _mm256_add_epi32(a, _mm256_madd_epi16(w_hi, _mm256_loadu_si256((const __m256i *)(xq + 16))));
}

static float row_q4_1(const uint8_t *row, int nb, const quantized *x) {
    __m256 acc = _mm256_setzero_ps();
    float offsets = 0.0f;
    for (int b = 0; b < nb; b++, row += 20) {
        __m256i lo, hi;
        nibbles16(row + 4, &lo, &hi);
        const __m256 dot = _mm256_cvtepi32_ps(block_dot(lo, hi, x->q + b * BLOCK));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(row) * x->scale[b]), dot, acc);
        offsets += half(row + 2) * x->sum[b];
    }
    return hsum8(acc) + offsets;
}

static float row_q4_0(const uint8_t *row, int nb, const quantized *x) {
    __m256 acc = _mm256_setzero_ps();
    float offsets = 0.0f;
    for (int b = 0; b < nb; b++, row += 18) {
        __m256i lo, hi;
        nibbles16(row + 2, &lo, &hi);
        const float d = half(row) * x->scale[b];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(block_dot(lo, hi, x->q + b * BLOCK)), acc);
        offsets -= 8.0f * d * (float)x->qsum[b];
    }
    return hsum8(acc) + offsets;
}

static float row_q8_0(const uint8_t *row, int nb, const quantized *x) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, row += 34) {
        const __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(row + 2)));
        const __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(row + 18)));
        const __m256 dot = _mm256_cvtepi32_ps(block_dot(lo, hi, x->q + b * BLOCK));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(row) * x->scale[b]), dot, acc);
    }
    return hsum8(acc);
}

static int row_bytes(const hs_mat *w) {
    const int nb = w->cols / BLOCK;
    return nb * (w->fmt == FMT_Q8_0 ? 34 : w->fmt == FMT_Q4_0 ? 18 : 20);
}

/* y = W x for x already rounded. */
static void matvec(const hs_mat *w, const quantized *x, float *y) {
    const int nb = w->cols / BLOCK, stride = row_bytes(w);
    const uint8_t *row = w->data;
    switch (w->fmt) {
    case FMT_Q8_0: for (int r = 0; r < w->rows; r++, row += stride) y[r] = row_q8_0(row, nb, x); break;
    case FMT_Q4_0: for (int r = 0; r < w->rows; r++, row += stride) y[r] = row_q4_0(row, nb, x); break;
    default:       for (int r = 0; r < w->rows; r++, row += stride) y[r] = row_q4_1(row, nb, x); break;
    }
}

/* Row r of W, as float32 values (the token embedding). */
static void dequantize_row(const hs_mat *w, int r, float *y) {
    const uint8_t *b = w->data + (size_t)r * row_bytes(w);
    for (int k = 0; k < w->cols / BLOCK; k++) {
        float *yb = y + k * BLOCK;
        if (w->fmt == FMT_Q8_0) {
            const float d = half(b);
            for (int j = 0; j < BLOCK; j++) yb[j] = d * (float)(int8_t)b[2 + j];
            b += 34;
        } else {
            const int first = w->fmt == FMT_Q4_0 ? 2 : 4;
            const float d = half(b), m = w->fmt == FMT_Q4_0 ? -8.0f * d : half(b + 2);
            for (int j = 0; j < 16; j++) {
                yb[j] = fmaf(d, (float)(b[first + j] & 15), m);
                yb[j + 16] = fmaf(d, (float)(b[first + j] >> 4), m);
            }
            b += first + 16;
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

/* gate = silu(gate) * up, silu(g) = g * sigmoid(g) with exp of -|g| only. */
static void swiglu(float *gate, const float *up, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp8(_mm256_or_ps(g, sign));                       /* exp(-|g|) */
        const __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, e));
        const __m256 sig = _mm256_blendv_ps(r, _mm256_mul_ps(e, r), g);     /* g < 0: e / (1 + e) */
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* Attention of the query heads over positions 0..n-1 of one layer's cache;
   each key and value row is read once for the whole group sharing it. */
static void attend(const hs_model *m, const float *q, const uint16_t *kc, const uint16_t *vc, int n,
                   float *scores, float *out) {
    const int hd = m->head_dim, group = m->n_head / m->n_kv, kv_dim = m->n_kv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int g = 0; g < m->n_kv; g++) {
        for (int t = 0; t < n; t++) {
            const uint16_t *k = kc + (size_t)t * kv_dim + g * hd;
            for (int h = 0; h < group; h++) {
                const float *qh = q + (g * group + h) * hd;
                __m256 acc = _mm256_setzero_ps();
                for (int i = 0; i < hd; i += 8)
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i),
                                          _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))), acc);
                scores[(size_t)h * n + t] = hsum8(acc) * scale;
            }
        }
        for (int h = 0; h < group; h++) {
            float *s = scores + (size_t)h * n, top = -INFINITY, total = 0.0f;
            for (int t = 0; t < n; t++) top = fmaxf(top, s[t]);
            int t = 0;
            __m256 sum8 = _mm256_setzero_ps();
            for (; t + 8 <= n; t += 8) {
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
        for (int h = 0; h < group; h++) memset(out + (g * group + h) * hd, 0, sizeof(float) * hd);
        for (int t = 0; t < n; t++) {
            const uint16_t *v = vc + (size_t)t * kv_dim + g * hd;
            for (int i = 0; i < hd; i += 8) {
                const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
                for (int h = 0; h < group; h++) {
                    float *o = out + (g * group + h) * hd + i;
                    _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_set1_ps(scores[(size_t)h * n + t]), vv,
                                                        _mm256_loadu_ps(o)));
                }
            }
        }
    }
}

static void to_half(const float *x, int n, uint16_t *y) {
    for (int i = 0; i < n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
}

/* ---- the model ------------------------------------------------------------------ */

static int widest(const hs_model *m) { return m->n_ff > m->n_embd ? m->n_ff : m->n_embd; }

/* Floats of scratch memory a forward pass needs. */
long hs_work_floats(const hs_model *m) {
    const long w = widest(m), heads = (long)m->n_head * m->head_dim;
    /* x, h, q, att, k, v, gate, up; quantized q (as floats, 2 int16 each), scale, sum, qsum; scores */
    return 2L * m->n_embd + 2 * heads + 2L * m->n_kv * m->head_dim + 2L * m->n_ff + w / 2 + 3 * (w / BLOCK)
           + (long)(m->n_head / m->n_kv) * m->n_ctx + 64;
}

/* Evaluate `token` at position `pos` (the cache holds 0..pos-1 and gets pos);
   logits (n_vocab floats) when not NULL. 0 on success, -1 for bad input. */
int hs_forward(const hs_model *m, int token, int pos, float *logits) {
    if (token < 0 || token >= m->n_vocab || pos < 0 || pos >= m->n_ctx || m->head_dim > 256) return -1;
    const int E = m->n_embd, hd = m->head_dim, kv_dim = m->n_kv * hd, heads = m->n_head * hd;
    float *x = m->work, *h = x + E, *q = h + E, *att = q + heads, *k = att + heads, *v = k + kv_dim;
    float *gate = v + kv_dim, *up = gate + m->n_ff;
    quantized xq;
    xq.q = (int16_t *)(up + m->n_ff);
    xq.scale = up + m->n_ff + widest(m) / 2;
    xq.sum = xq.scale + widest(m) / BLOCK;
    xq.qsum = (int32_t *)(xq.sum + widest(m) / BLOCK);
    float *scores = (float *)(xq.qsum + widest(m) / BLOCK);

    float cos_t[128], sin_t[128];
    for (int i = 0; i < hd / 2; i++) {
        const float angle = (float)pos * powf(m->rope_base, -2.0f * (float)i / (float)hd);
        cos_t[i] = cosf(angle);
        sin_t[i] = sinf(angle);
    }
    dequantize_row(&m->embd, token, x);
    for (int l = 0; l < m->n_layer; l++) {
        const hs_layer *L = m->layers + l;
        uint16_t *kc = m->kcache + (size_t)l * m->n_ctx * kv_dim, *vc = m->vcache + (size_t)l * m->n_ctx * kv_dim;
        rms_norm(x, L->attn_norm, E, m->eps, h);
        quantize(h, E, &xq);
        matvec(&L->wq, &xq, q);
        matvec(&L->wk, &xq, k);
        matvec(&L->wv, &xq, v);
        rope(q, m->n_head, hd, cos_t, sin_t);
        rope(k, m->n_kv, hd, cos_t, sin_t);
        to_half(k, kv_dim, kc + (size_t)pos * kv_dim);
        to_half(v, kv_dim, vc + (size_t)pos * kv_dim);
        attend(m, q, kc, vc, pos + 1, scores, att);
        quantize(att, heads, &xq);
        matvec(&L->wo, &xq, h);
        for (int i = 0; i < E; i++) x[i] += h[i];

        rms_norm(x, L->ffn_norm, E, m->eps, h);
        quantize(h, E, &xq);
        matvec(&L->gate, &xq, gate);
        matvec(&L->up, &xq, up);
        swiglu(gate, up, m->n_ff);
        quantize(gate, m->n_ff, &xq);
        matvec(&L->down, &xq, h);
        for (int i = 0; i < E; i++) x[i] += h[i];
    }
    if (logits) {
        rms_norm(x, m->out_norm, E, m->eps, h);
        quantize(h, E, &xq);
        matvec(&m->out, &xq, logits);
    }
    return 0;
}
