"""benchmarks/shaped_gguf.py: a file shaped like a real one (its header whole, random
weights) loads and runs like it, for timing where the real file cannot travel."""
from __future__ import annotations

import gzip
import os

import numpy as np

from hetspec.benchmarks import shaped_gguf
from hetspec.models import resolve_model
from hetspec.workers.kernels.gguf_tensors import read_gguf
from hetspec.workers.target.native_target import NativeTarget


def test_a_shaped_file_has_the_real_files_header_and_tensors_and_random_finite_weights(tmp_path):
    real = resolve_model("builtin:smollm2").file
    header = tmp_path / "smollm2.header.gz"
    shaped = tmp_path / "shaped.gguf"
    assert shaped_gguf.main(["header", real, str(header)]) == 0
    assert shaped_gguf.main(["expand", str(header), str(shaped)]) == 0

    head = gzip.decompress(header.read_bytes())
    assert len(head) < 4 << 20 and shaped.stat().st_size == os.path.getsize(real)
    with open(shaped, "rb") as f:
        assert f.read(len(head)) == head
    real_meta, real_tensors = read_gguf(real)
    meta, tensors = read_gguf(str(shaped))
    assert meta == real_meta
    assert [(t.name, t.type_name, t.shape) for t in tensors.values()] == \
        [(t.name, t.type_name, t.shape) for t in real_tensors.values()]
    q = "blk.0.attn_q.weight"
    assert not np.array_equal(tensors[q].data, real_tensors[q].data)

    model = NativeTarget(str(shaped), n_ctx=64, caches=1, threads=1)
    try:
        logits = model.forward(0, list(range(100, 120)), 0, 4)
    finally:
        model.close()
    assert logits.shape[0] == 4
    assert np.isfinite(logits).all() and logits.std() > 0
