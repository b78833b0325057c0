"""A GGUF file shaped like a real one, with random weights, for timing on a machine the real
file cannot reach: the header whole, the weights random with small scales (activations stay
finite, and a pass's time does not depend on the values). Outputs are meaningless.

    python -m hetspec.benchmarks.shaped_gguf header REAL.gguf OUT.header    # the header's bytes
    python -m hetspec.benchmarks.shaped_gguf expand OUT.header SHAPED.gguf  # header + random weights
"""
from __future__ import annotations

import argparse
import gzip
import os

import numpy as np

from hetspec.workers.kernels.formats import GGML_TYPES
from hetspec.workers.kernels.gguf_tensors import _Header

# per block type: the byte offsets of its float16 scales (d, and dmin or m where it has one)
SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
                 "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
SCALE = np.float16(2e-5).view(np.uint16)     # |w| stays under about 0.05 in every type


def header_bytes(path: str) -> bytes:
    """The file's bytes up to its tensor data (the header and its alignment padding)."""
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(64 << 20), dtype=np.uint8)
    header = _Header(data)
    start = -(-header.end // header.alignment) * header.alignment
    return data[:start].tobytes()


def random_tensor(type_name: str, n_elements: int, name: str, rng: np.random.Generator) -> bytes:
    if type_name == "F32":
        if "norm" in name:
            return np.ones(n_elements, np.float32).tobytes()
        return (rng.standard_normal(n_elements, np.float32) * 0.02).tobytes()
    if type_name in ("F16", "BF16"):
        values = (rng.standard_normal(n_elements, np.float32) * 0.02)
        if type_name == "F16":
            return values.astype(np.float16).tobytes()
        return (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    _, per_block, block_bytes = next(t for t in GGML_TYPES.values() if t.name == type_name)
    blocks = np.frombuffer(bytearray(rng.bytes(n_elements // per_block * block_bytes)), np.uint8)
    blocks = blocks.reshape(-1, block_bytes)
    for offset in SCALE_OFFSETS[type_name]:
        blocks[:, offset:offset + 2] = np.frombuffer(SCALE.tobytes(), np.uint8)
    return blocks.tobytes()


def expand(header: bytes, out: str, seed: int = 0) -> None:
    """Writes OUT: HEADER, then every tensor's random blocks at its offset."""
    parsed = _Header(np.frombuffer(header, dtype=np.uint8))
    rng = np.random.default_rng(seed)
    with open(out + ".part", "wb") as f:
        f.write(header)
        for name, dims, ggml_type, offset in sorted(parsed.tensors, key=lambda t: t[3]):
            if ggml_type not in GGML_TYPES:
                raise ValueError(f"tensor {name}: GGML type {ggml_type} is not one this tool writes")
            f.seek(len(header) + offset)
            f.write(random_tensor(GGML_TYPES[ggml_type].name, int(np.prod(dims)), name, rng))
    os.replace(out + ".part", out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    h = sub.add_parser("header", help="write a GGUF file's header (gzip-compressed) to OUT")
    h.add_argument("gguf")
    h.add_argument("out")
    e = sub.add_parser("expand", help="write a shaped GGUF file from a header written by `header`")
    e.add_argument("header")
    e.add_argument("out")
    args = parser.parse_args(argv)
    if args.verb == "header":
        with gzip.open(args.out, "wb", compresslevel=6) as f:
            f.write(header_bytes(args.gguf))
    else:
        with gzip.open(args.header, "rb") as f:
            expand(f.read(), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
