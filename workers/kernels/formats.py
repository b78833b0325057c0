"""GGML's block types as a GGUF file stores them, and the ones hetspec's C
kernels read, defined once for the Python side.

A GGUF tensor names its type by GGML's code; a type packs its weights in
blocks of a fixed count and size. The C kernels (workers/kernels/gguf_kernels.c
and native_model.c) take a format as a small code of their own, declared in
workers/kernels/formats.h: KERNEL_FORMATS must match that header (the kernel
tests check it).
"""
from __future__ import annotations

from typing import NamedTuple


class GGMLType(NamedTuple):
    name: str
    per_block: int     # weights per block
    block_bytes: int   # bytes per block


# GGML type code -> its block layout, for the types read from GGUF files here.
GGML_TYPES = {
    0: GGMLType("F32", 1, 4), 1: GGMLType("F16", 1, 2), 2: GGMLType("Q4_0", 32, 18), 3: GGMLType("Q4_1", 32, 20),
    6: GGMLType("Q5_0", 32, 22), 7: GGMLType("Q5_1", 32, 24), 8: GGMLType("Q8_0", 32, 34),
    10: GGMLType("Q2_K", 256, 84), 11: GGMLType("Q3_K", 256, 110), 12: GGMLType("Q4_K", 256, 144),
    13: GGMLType("Q5_K", 256, 176), 14: GGMLType("Q6_K", 256, 210), 30: GGMLType("BF16", 1, 2),
}
BY_NAME = {t.name: t for t in GGML_TYPES.values()}


class KernelFormat(NamedTuple):
    code: int          # the C kernels' FMT_* value (formats.h)
    block_bytes: int   # bytes per block, as the GGUF file stores it


BLOCK = 32   # weights per block of every kernel format (formats.h's BLOCK)
# The block types the C kernels read, by name: formats.h's FMT_Q8_0, FMT_Q4_0, FMT_Q4_1.
KERNEL_FORMATS = {name: KernelFormat(code, BY_NAME[name].block_bytes)
                  for name, code in (("Q8_0", 0), ("Q4_0", 1), ("Q4_1", 2))}
# formats.h's FMT_I8: K-quant blocks laid out again with their exact values (int8 quants, a
# float32 scale per 16 weights and offset per 32), which the native kernels read.
EXPANDED_FORMAT = 3
# formats.h's FMT_W8: Q8_0 values laid out for the target's window products (pairs of blocks
# interleaved, quants + 128, float32 scales), made at load where those products use VNNI.
WINDOW_INT8 = 4
# formats.h's FMT_K4 and FMT_K6: Q4_K and Q6_K blocks at their own size, laid out for the
# 16-bit kernels (the native target where the CPU lacks AVX-512 VNNI).
K_FORMATS = {"Q4_K": 5, "Q6_K": 6}
# formats.h's FMT_Q5: Q5_0 blocks at their own size (nibbles, then fifth bits; float16
# scales apart), where K_FORMATS are read.
Q5_FORMAT = 7
# formats.h's FMT_F16 and FMT_F32: float matrices as the file stores them (the target's
# window products only).
FLOAT_FORMATS = {"F16": 8, "F32": 9}
# formats.h's FMT_N4 and FMT_N6: Q4_K and Q6_K as FMT_I8's exact values in 4 and 6 bits
# (the target's window products with AVX-512 VNNI).
NIBBLE_FORMATS = {"Q4_K": 10, "Q6_K": 11}
# formats.h's FMT_T4_1, FMT_T8_0, FMT_T4_K and FMT_T6_K: those blocks' values in tiles of 16
# rows (a row a lane of the VNNI products), for the target's window products with AVX-512 VNNI.
ROW_TILED = {"Q4_1": 12, "Q8_0": 13, "Q4_K": 14, "Q6_K": 15}
