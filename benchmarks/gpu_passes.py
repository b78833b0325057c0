"""What benchmarks/gpu_profile.py measures of a target's passes: wall and kernel time of a pass at
each window size, a captured pass against the context it holds, several requests' windows in one
pass, and the paced profile drawn from the captured curve."""
from __future__ import annotations

import time

CONTEXTS = {"cuda": (512, 4096), "cpu": (64, 512)}   # the context step's positions held
CONTEXT_SIZES = (1, 8)                               # ...and its windows
SIZES = (1, 2, 4, 8, 16, 32)     # the windows timed after the context (the engine pads to these)
BATCHES = (1, 2, 4, 8)           # requests in a packed pass (batch_curve)
BATCH_WINDOW = 5                 # each one's window: a speculative round's of gamma 4
FLAT = 1.10                      # a size costs "the same" as one token within 10%


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def wall_ms(run, device: str, repeats: int) -> list[float]:
    """[median, fastest] ms of `run`, each synchronised: what the host waits for a pass."""
    import numpy as np

    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        times.append(1e3 * (time.perf_counter() - start))
    return [round(float(np.median(times)), 3), round(min(times), 3)]


def kernel_ms(run, device: str) -> float:
    """ms of GPU kernels (on a CPU: of ops) in one run of `run`: self times summed as torch.profiler's
    table totals them, the time the device itself computed, launches and Python aside."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    gpu = device == "cuda"
    sync(device)
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu) as prof:
        run()
        sync(device)
    kind = DeviceType.CUDA if gpu else DeviceType.CPU
    return round(sum(e.self_device_time_total if gpu else e.self_cpu_time_total
                     for e in prof.events() if e.device_type == kind and not e.is_user_annotation) / 1e3, 3)


def curve(kv, device: str, context: list[int], repeats: int, eager: dict | None = None) -> dict:
    """Per window size after `context`: wall ms [median, fastest], kernel ms and their ratio; and
    the prompt pass's wall ms. Where the profiler sees no kernels (a CUDA graph's replay on some
    versions), the eager pass's of the same size stand in, and kernel_source says so."""
    kv.use(0)
    prompt = lambda: kv.forward(context, 0, all_logits=False)
    prompt()                             # warm-up (and a static cache's allocation)
    out = {"prompt_ms": wall_ms(prompt, device, 3)}
    for n in SIZES:
        window = lambda n=n: kv.forward(list(range(1, n + 1)), len(context), all_logits=True)
        for _ in range(2):               # warm-up: cuBLAS's choices, a captured size's recording
            window()
        wall, kernels, source = wall_ms(window, device, repeats), kernel_ms(window, device), "profiled"
        if kernels == 0:
            kernels, source = ((eager[str(n)]["kernel_ms"], "the eager pass's (the profiler saw no kernels)")
                               if eager else (None, "none: the profiler saw no kernels"))
        out[str(n)] = {"wall_ms": wall, "kernel_ms": kernels, "kernel_source": source,
                       "wall_per_kernel": round(wall[0] / kernels, 2) if kernels else None}
    return out


def context_curve(lm, args) -> dict:
    """A captured pass of CONTEXT_SIZES tokens after each of CONTEXTS positions, in a target
    whose capacity is the longest: wall ms [median, fastest], kernel ms, their ratio, the span
    attended over. Attention reads what is held (to within a span), so a short context costs less."""
    from hetspec.workers.target.captured import CapturedKVModel

    contexts = CONTEXTS[args.device]
    kv = CapturedKVModel(lm, args.device, contexts[-1] + CONTEXT_SIZES[-1], CONTEXT_SIZES[-1])
    vocab = lm.config.get_text_config().vocab_size
    out = {"spans": list(kv.spans)}
    for held in contexts:
        kv.use(0)
        kv.forget()
        kv.forward([i % vocab for i in range(1, held + 1)], 0, all_logits=False)     # the prompt: eager
        for n in CONTEXT_SIZES:
            window = lambda n=n, held=held: kv.forward([i % vocab for i in range(1, n + 1)], held, all_logits=True)
            for _ in range(2):
                window()
            wall, kernels = wall_ms(window, args.device, args.repeats), kernel_ms(window, args.device)
            out[f"{held}x{n}"] = {"wall_ms": wall, "kernel_ms": kernels,
                                  "wall_per_kernel": round(wall[0] / kernels, 2) if kernels else None,
                                  "span": next(s for s in kv.spans if s >= held + n)}
    return out


def batch_curve(lm, args, context: list[int]) -> dict:
    """Per batch size: wall ms [median, fastest] of that many requests' BATCH_WINDOW-token windows
    after `context`, as one packed pass over their eager caches (workers/target/packed_pass.py),
    as their captured passes replayed one after another, and as the captured batch pass (over
    their caches' rows: what a captured target runs for a batch)."""
    from hetspec.workers.common.kv_model import KVModel
    from hetspec.workers.target.captured import CapturedKVModel
    from hetspec.workers.target.packed_pass import forward_batch

    eager = KVModel(lm, args.device)
    captured = CapturedKVModel(lm, args.device, len(context) + 2 * SIZES[-1], SIZES[-1], caches=BATCHES[-1])
    window, keep = list(range(1, BATCH_WINDOW + 1)), len(context)
    for kv in (eager, captured):
        for cache in range(BATCHES[-1]):
            kv.use(cache)
            kv.forward(context, 0, all_logits=False)
    out = {"window": BATCH_WINDOW}
    for batch in BATCHES:
        windows = [(cache, window, keep, BATCH_WINDOW) for cache in range(batch)]
        packed = lambda windows=windows: forward_batch(eager, windows)
        replays = lambda windows=windows: [(captured.use(c), captured.forward(t, k)) for c, t, k, _ in windows]
        batched = lambda windows=windows: captured.forward_batch(windows)
        for run in (packed, replays, batched, packed, replays, batched):   # warm-up: recordings, cuBLAS's choices
            run()
        out[str(batch)] = {"packed_ms": wall_ms(packed, args.device, args.repeats),
                           "replays_ms": wall_ms(replays, args.device, args.repeats),
                           "captured_batch_ms": wall_ms(batched, args.device, args.repeats)}
    return out


def paced_profile(captured: dict, context: int, name: str, where: str) -> dict:
    """A GpuProfile's fields from the captured curve. A pass can be padded to a longer one, so a size
    costs at most what any longer one does (that evens out noise); flat_to is the largest size within
    FLAT of one token's cost, window_ms their mean, per_token_ms the least-squares slope past it (no
    size past it: the prompt's cost a token), prefill_ms_per_token the prompt pass's beyond window_ms."""
    ms = {n: min(captured[str(m)]["wall_ms"][0] for m in SIZES if m >= n) for n in SIZES}
    flat = [n for n in SIZES if ms[n] <= FLAT * ms[1]]
    window = sum(ms[n] for n in flat) / len(flat)
    prefill = max(0.0, (captured["prompt_ms"][0] - window) / context)
    past = [n - flat[-1] for n in SIZES if n > flat[-1]]
    slope = sum((ms[n + flat[-1]] - window) * n for n in past) / sum(n * n for n in past) if past else prefill
    return {"name": name, "window_ms": round(window, 3), "flat_to": flat[-1], "per_token_ms": round(max(0.0, slope), 4),
            "prefill_ms_per_token": round(prefill, 4),
            "source": (f"measured: benchmarks/gpu_profile.py, captured passes after {context} tokens, {where}; "
                       f"flat within {round(100 * (FLAT - 1))}% to {flat[-1]} tokens, per token beyond: "
                       + ("the slope past it" if past else "the prompt's (no size past it)"))}
