/* The GGUF block formats the C kernels read, shared by gguf_kernels.c and
   native_model.c. workers/kernels/formats.py (KERNEL_FORMATS, BLOCK) holds
   the same values for the Python side; the kernel tests check they agree. */
#ifndef HS_FORMATS_H
#define HS_FORMATS_H

enum { FMT_Q8_0 = 0, FMT_Q4_0 = 1, FMT_Q4_1 = 2 };         /* a matrix's `fmt` */
/* Not a GGUF type: K-quant blocks laid out again with their exact values, int8
   quants with a float32 scale per 16 and offset per 32 (native_model.c only). */
enum { FMT_I8 = 3 };
/* Nor this: Q8_0 values laid out for the target's window products (window_avx512.c), each
   pair of blocks' dwords interleaved, quants + 128 (unsigned), scales in float32. */
enum { FMT_W8 = 4 };
/* Nor these: Q4_K and Q6_K blocks at their own size, laid out for the 16-bit kernels
   (native_model.c, row_q4 and row_k6): per 32 weights 16 bytes of nibbles as Q4_0
   lays them out (FMT_K6: then 8 bytes of the values' top two bits), the sub-blocks'
   integer scales (and Q4_K's mins) in `sub`, the superblocks' float scales in `scales`. */
enum { FMT_K4 = 5, FMT_K6 = 6 };
/* Nor this: Q5_0 blocks at their own size for the target where the CPU lacks AVX-512
   VNNI: per block 16 bytes of nibbles as Q4_0 lays them out, then the 4 bytes of fifth
   bits (bit j: weight j's), the float16 scale in `d`. A weight is d * (q - 16). */
enum { FMT_Q5 = 7 };
/* Float matrices as the file stores them, row after row (F16 and F32 files): read by
   the target's window products only, never rounded to blocks. */
enum { FMT_F16 = 8, FMT_F32 = 9 };
/* Nor these: Q4_K and Q6_K for the target's window products with AVX-512 VNNI
   (window_avx512.c), FMT_I8's exact values in fewer bytes. Their quants' low four bits
   as Q4_0 lays them out (16 bytes a block). FMT_N4 (Q4_K): a float32 scale per 32
   weights in `scales` (a sub-block's two 16-halves share one), a float32 offset per 32
   in `offsets`. FMT_N6 (Q6_K, its quants q - 32 stored as q): in `sub` 16 bytes a pair
   of blocks b, b + 1 of each value's top two bits, byte k holding those of b's value k,
   b + 1's k, b's 16 + k and b + 1's 16 + k from its low bits up; FMT_I8's float32
   scale per 16 in `scales`. */
enum { FMT_N4 = 10, FMT_N6 = 11 };
/* Nor these: Q4_1, Q8_0, Q4_K and Q6_K for the target's window products with AVX-512 VNNI,
   their rows in tiles of 16, a row a lane of the products (window_avx512.c, tiles16), the
   file's values. Per tile and block of 32 (a tile's block), the rows' dwords side by side:
   FMT_T4_1, FMT_T4_K: 4 x 64 bytes, the j-th holding each row's bytes 4j..4j+3 of the
   block's nibbles (Q4_0's order: values 4j.. low, 16 + 4j.. high; row i's in dword i);
   FMT_T6_K: those nibbles of its quants q + 32, then 2 x 64 bytes of their top two bits,
   vector h's byte holding those of nibble vector j's same byte (j = 4h..4h+3) at bit
   2 (j - 4h); FMT_T8_0: 8 x 64 bytes of quants + 128 (unsigned), the j-th values 4j..4j+3.
   Scales a tile's block: 16 float16 d (and FMT_T4_1's m) in `d` (`m`); FMT_T4_K 16 float32
   scales and offsets in `scales` and `offsets` (as FMT_N4's); FMT_T6_K 2 x 16 float32, the
   rows' first 16 values' scales then the last 16's, in `scales`. */
enum { FMT_T4_1 = 12, FMT_T8_0 = 13, FMT_T4_K = 14, FMT_T6_K = 15 };
enum { BLOCK = 32 };                                          /* weights per block */
enum { Q8_0_BYTES = 34, Q4_0_BYTES = 18, Q4_1_BYTES = 20 };   /* bytes per block in a GGUF file */

#endif
