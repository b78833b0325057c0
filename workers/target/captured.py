"""Captured passes: a static-cache target whose verify windows replay recorded CUDA graphs.

An eager pass of a 7B model on a GPU launches some 600 kernels from Python, and the host
takes longer to launch them than the GPU to run them (docs/performance.md, "On a GPU").
Recorded once as a CUDA graph, the pass is one launch. A recording holds fixed shapes at
fixed addresses, so each (cache, padded size) gets its own, reading its inputs from one
staged device buffer: the pass's start position, which every layer's length is set to
first (a rollback is that), then the padded ids. Off CUDA the same function runs as it
is, so the CPU tests run what a GPU replays.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from hetspec.workers.common.kv_model import StaticKVModel

WARM_UP = 2      # eager runs of a pass before it is recorded (cuBLAS picks and allocates its kernels then)


class CapturedKVModel(StaticKVModel):
    def __init__(self, lm, device: str, n_ctx: int, max_window: int):
        super().__init__(lm, device, n_ctx, max_window)
        self.graphs = self.device.type == "cuda"
        self.fallback = ""                      # why passes run eagerly after all ("": they do not)
        longest = self.sizes[-1]
        self._staged = torch.zeros(1 + longest, dtype=torch.long, device=self.device)    # [start, ids...]
        self._host = torch.zeros(1 + longest, dtype=torch.long, pin_memory=self.graphs)
        self._recorded: dict[tuple[int, int], Callable[[], torch.Tensor]] = {}          # (cache, size) -> replay
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None             # one pool: passes take turns

    def forget(self) -> None:
        self._recorded = {key: replay for key, replay in self._recorded.items() if key[0] != self.number}
        super().forget()

    @torch.inference_mode()
    def forward(self, tokens, pos: int, all_logits: bool = True) -> torch.Tensor:
        n, first = len(tokens), self.cache is None
        size = self._size(tokens, pos)
        if n > self.sizes[-1] or first:         # a prompt, or the cache's first pass (it allocates the cache)
            return super().forward(tokens, pos, all_logits)
        self._host[0] = pos
        self._host[1:1 + n] = torch.as_tensor(tokens, dtype=torch.long)
        self._host[1 + n:1 + size] = 0          # the padding: any token, after the window where the mask hides it
        self._staged[:1 + size].copy_(self._host[:1 + size])
        key = (self.number, size)
        if key not in self._recorded:
            self._recorded[key] = self._record(size)
        logits = self._recorded[key]()[:n]
        self.length = pos + n
        return logits if all_logits else logits[-1:]

    def _pass(self, size: int) -> torch.Tensor:
        """What is recorded: a padded pass from the staged start and ids, its rows' float32 logits."""
        self._rewind(self._staged[0])
        ids = self._staged[1:1 + size].view(1, size)
        return self.lm(input_ids=ids, use_cache=True, logits_to_keep=0, **{self.cache_arg: self.cache}).logits[0].float()

    def _record(self, size: int) -> Callable[[], torch.Tensor]:
        """The replay of a pass of `size` over the current cache: a CUDA graph where one can
        be recorded, else the pass itself (the kernels line says why)."""
        if not self.graphs:
            return lambda: self._pass(size)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):           # warm-up runs write what the replay will: the same start and ids
            for _ in range(WARM_UP):
                self._pass(size)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                logits = self._pass(size)
        except RuntimeError as exc:             # a host sync or an op a graph cannot hold: eager from now on
            self.graphs, self.fallback = False, f"passes eager: recording one failed ({str(exc).splitlines()[0]})"
            self._recorded.clear()
            return lambda: self._pass(size)

        def replay() -> torch.Tensor:
            graph.replay()
            return logits
        return replay
