"""A GGUF file's token embeddings read a row per token from the file's own blocks, for a
native model whose output layer is a tensor of its own (native_weights.describe)."""
from __future__ import annotations

import functools
import mmap

import numpy as np

from hetspec.workers.common.native_weights import HsMat
from hetspec.workers.kernels import formats


class FileEmbedding:
    """Token embeddings dequantized from the file's own blocks, a row per token as it
    comes (gguf's dequantize, as llama.cpp's get_rows reads them), into rows the C side
    reads as its embedding table (FMT_F32), the tokens renumbered to those rows. Only
    where the output layer is a tensor of its own: nothing else reads the table, so a
    converted copy of it would be memory for one row a token (e7e822d:docs/kernels.md)."""

    def __init__(self, tensor, rows: int):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        self.data = tensor.data
        self.dequantize = functools.partial(dequantize, qtype=GGMLQuantizationType[tensor.type_name])
        self.buffer = np.zeros((rows, tensor.shape[0]), np.float32)
        self.local = np.arange(rows, dtype=np.int32)

    @classmethod
    def of(cls, tensors: dict, rows: int) -> FileEmbedding | None:
        embedding = tensors.get("token_embd.weight")
        if "output.weight" not in tensors or embedding is None or not embedding.type_name or embedding.data is None:
            return None
        return cls(embedding, rows)

    def drop_pages(self) -> None:
        """Loading read every block through the file's memory map, which the rows keep
        open: without this all of them would count as resident. They stay in the page
        cache; a row read again comes back from there."""
        mapping = getattr(self.data, "_mmap", None)
        if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
            mapping.madvise(mmap.MADV_DONTNEED)

    def mat(self) -> HsMat:
        return HsMat(self.buffer.ctypes.data, None, None, formats.FLOAT_FORMATS["F32"], *self.buffer.shape)

    def rows(self, tokens) -> np.ndarray:
        """Fills a row per token (at most len(buffer)); returns the tokens' row numbers."""
        self.buffer[:len(tokens)] = self.dequantize(self.data[np.asarray(tokens, np.int64)])
        return self.local[:len(tokens)]
