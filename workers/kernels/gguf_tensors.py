"""The tensors of a GGUF file, as numpy views of its bytes, and its scalar metadata.

gguf's GGUFReader turns every metadata value (a tokenizer's 49k strings and
merges among them) into numpy objects first, which is slow (measured:
e7e822d:docs/kernels.md); the tensors need only the header walked past. Layout (GGUF
versions 2 and 3): magic, version, tensor count, metadata count; the metadata
key/value pairs; per tensor its name, dimensions, type and offset; then,
aligned, the data. The block types are hetspec.workers.kernels.formats'.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from hetspec.workers.kernels.formats import GGML_TYPES, GGMLType

# value type -> struct format of a scalar; 8 is a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")
_UNREAD = GGMLType("", 0, 0)


@dataclass
class GGUFTensor:
    name: str
    type_name: str        # "Q4_1", ...; "" for a type this module does not read
    ggml_type: int
    shape: tuple[int, ...]  # GGUF order: the row length first
    data: np.ndarray | None  # rows x bytes per row (uint8), None for an unread type


def read_tensors(path: str) -> dict[str, GGUFTensor]:
    return read_gguf(path)[1]


def read_gguf(path: str) -> tuple[dict, dict[str, GGUFTensor]]:
    """(the file's scalar and string metadata, arrays such as the tokenizer's left
    out; its tensors), from one walk of the header."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    header = _Header(data)
    tensors = {}
    start = -(-header.end // header.alignment) * header.alignment
    for name, dims, ggml_type, offset in header.tensors:
        type_name, per_block, block_bytes = GGML_TYPES.get(ggml_type, _UNREAD)
        view = None
        if type_name:
            rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
            row_bytes = dims[0] // per_block * block_bytes
            view = data[start + offset:start + offset + rows * row_bytes].reshape(rows, row_bytes)
        tensors[name] = GGUFTensor(name, type_name, ggml_type, tuple(dims), view)
    return header.metadata, tensors


class _Header:
    """Walks the header, in place in the file's memory map."""

    def __init__(self, buf: np.ndarray):
        self.buf, self.pos = memoryview(buf), 0
        magic, version = self._take("<4sI")
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"not a GGUF file of version 2 or 3 (magic {magic!r}, version {version})")
        n_tensors, n_values = self._take("<QQ")
        self.alignment = 32
        self.metadata = {}
        for _ in range(n_values):
            key = self._string()
            value = self._value(self._take("<I")[0])
            if value is not None:
                self.metadata[key] = value
            if key == "general.alignment":
                self.alignment = int(value)
        self.tensors = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._take("<I")
            dims = list(self._take(f"<{n_dims}Q"))
            ggml_type, offset = self._take("<IQ")
            self.tensors.append((name, dims, ggml_type, offset))
        self.end = self.pos

    def _take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ValueError("the GGUF header ends early")
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return values

    def _string(self) -> str:
        (length,) = self._take("<Q")
        return self._take(f"<{length}s")[0].decode("utf-8", errors="replace")

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item_kind, count = self._take("<IQ")
            if item_kind in _SCALARS:              # arrays are skipped whole
                self._skip(count * struct.calcsize(_SCALARS[item_kind]))
            elif item_kind == _STRING:             # a tokenizer's: each string's length, then past it
                length, pos = _LENGTH.unpack_from, self.pos
                try:
                    for _ in range(count):
                        pos += 8 + length(self.buf, pos)[0]
                except struct.error:
                    raise ValueError("the GGUF header ends early") from None
                self._skip(pos - self.pos)
            else:
                for _ in range(count):
                    self._value(item_kind)
            return None
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF metadata type {kind}")
        return self._take(f"<{_SCALARS[kind]}")[0]

    def _skip(self, size: int) -> None:
        if self.pos + size > len(self.buf):
            raise ValueError("the GGUF header ends early")
        self.pos += size
