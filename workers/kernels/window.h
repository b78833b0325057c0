/* The native model's window products: a weight matrix times a window of tokens, the
   activations rounded to int8 per block of 32 as llama.cpp rounds them, each block of
   weights unpacked once for several tokens (hs_forward_window in native_model.c: the
   native target, and the draft filling its cache from a long feed).

   Two implementations of these declarations, one per instruction set: window_avx512.c
   on CPUs with AVX-512 BW and VNNI (which reads Q8_0 in its own pair layout, FMT_W8),
   window_avx2.c elsewhere. build.py compiles both into the library; each holds code
   only where its instructions are there. A token's float steps are the same in any
   window, so its rows do not depend on the window it came in. */
#ifndef HS_WINDOW_H
#define HS_WINDOW_H

#include "matrix.h"

#define HS_INTERNAL __attribute__((visibility("hidden")))

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define WINDOW_AVX512 1
/* A token's activations in the pair layout (window_avx512.c). A last block without a
   partner is paired with zeros (its weights are masked, its scale is 0). */
typedef struct {
    uint8_t *qc;     /* 128 bytes a pair, 64-aligned: xq (interleaved), then -128 times
                        each lane's sum of xq (16 int32), which FMT_W8's quants + 128 add */
    uint8_t *u;      /* 64 bytes a pair: xq + 128 */
    float *scale;    /* per block (x ~ scale * xq), a pair's two side by side */
    float *sum;      /* per block: what the weights' offsets multiply (see window_quantize) */
    int8_t *q;       /* 32 bytes a block: xq in order (the row tiles, FMT_T*, broadcast its dwords) */
    int *qsum;       /* per 16 values: sum(xq) (FMT_T8_0's and FMT_T6_K's biased quants add it) */
} window_act;
#else
#define WINDOW_AVX512 0
typedef struct {
    int8_t *q;       /* the n values rounded, in order */
    uint8_t *aq;     /* |q|, which FMT_T8_0's row tiles meet with q's signs on their quants */
    float *scale;    /* per block (x ~ scale * q) */
    float *sum;      /* per block: what the weights' offsets multiply (see window_quantize) */
    int16_t *sum16;  /* per 16 values: the sum of q (Q8_K only: FMT_K6 takes 32 off its quants with it) */
} window_act;
#endif

/* How llama.cpp rounds the activations a matrix meets (its vec_dot_type), so that the
   logits stay close to the file's in llama.cpp: Q8_0 blocks for Q8_0, Q5_0 and Q4_0
   weights; Q8_1 blocks, which add a float16 sum, for Q4_1; Q8_K blocks, one float32
   scale per 256 values, for K-quants. */
enum { ACT_Q8_0, ACT_Q8_1, ACT_Q8_K };

/* The rounding (ACT_*) matrix w's activations take. */
HS_INTERNAL int window_act_kind(const hs_mat *w);

/* x's n values rounded as `kind` says, into out. */
HS_INTERNAL void window_quantize(const float *x, int n, int kind, window_act *out);

/* Rows r0..r1-1 of Y = W X for T tokens rounded for W (token t's outputs at y + t * ystride);
   `next`, the matrix multiplied after W, has its first rows fetched early. */
HS_INTERNAL void window_rows(const hs_mat *w, const window_act *x, int T, float *y, int ystride, const hs_mat *next,
                             int r0, int r1);

/* Floats of scratch a token's rounded activations (of up to `widest` values) take, and
   their place in `work` (window_act_floats(widest) floats). */
HS_INTERNAL long window_act_floats(int widest);
HS_INTERNAL void window_act_at(window_act *a, float *work, int widest);

#endif
