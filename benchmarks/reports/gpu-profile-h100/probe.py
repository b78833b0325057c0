"""The probe behind probe.log (2026-11-26, one H100): how one bfloat16 linear layer and one
pass of a Llama-2-7B-shaped target through the engine's KV cache cost by row count under
cuBLAS and cuBLASLt, and torch's profile of the GPU's kernels in a one-token pass.
Run from the repository root on a GPU machine: python benchmarks/reports/gpu-profile-h100/probe.py"""
import json
import time

import torch

from hetspec.models import resolve_model
from hetspec.workers.target.hf_loading import load_causal_lm
from hetspec.workers.target.kv_model import KVModel


def med(f, n=12):
    f(); torch.cuda.synchronize(); ts = []
    for _ in range(n):
        s = time.perf_counter(); f(); torch.cuda.synchronize(); ts.append(time.perf_counter() - s)
    ts.sort(); return round(ts[len(ts) // 2] * 1e3, 3)

out = {}
W = torch.randn(11008, 4096, device="cuda", dtype=torch.bfloat16)
H = torch.randn(32000, 4096, device="cuda", dtype=torch.bfloat16)
for lib in ["cublas", "cublaslt"]:
    torch.backends.cuda.preferred_blas_library(lib)
    xs = {m: torch.randn(1, m, 4096, device="cuda", dtype=torch.bfloat16) for m in (1, 2, 3, 4, 8)}
    out[f"{lib} mlp linear"] = {m: med(lambda x=x: torch.nn.functional.linear(x, W)) for m, x in xs.items()}
    out[f"{lib} head linear"] = {m: med(lambda x=x: torch.nn.functional.linear(x, H)) for m, x in xs.items()}
print(json.dumps(out), flush=True)
model = load_causal_lm(resolve_model("random:vocab=32000,hidden=4096,layers=32,heads=32,intermediate=11008,seed=0,init=device"), "bfloat16", "cuda")
kv = KVModel(model, "cuda")
prompt = list(range(1, 129))
for lib in ["cublas", "cublaslt"]:
    torch.backends.cuda.preferred_blas_library(lib)
    kv.forward(prompt, 0, all_logits=False)
    r = {}
    for n in (1, 2, 3, 4, 8):
        for keep in (False, True):
            r[f"{n}{'all' if keep else 'last'}"] = med(lambda n=n, keep=keep: kv.forward(list(range(5, 5 + n)), len(prompt), all_logits=keep)[-1, 0].item(), 8)
    out[f"{lib} 7B pass ms"] = r
    print(lib, r, flush=True)
torch.backends.cuda.preferred_blas_library("cublas")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        kv.forward([5], len(prompt), all_logits=False)[-1, 0].item()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8), flush=True)
with open("/tmp/probe.json", "w") as f:
    json.dump(out, f)
