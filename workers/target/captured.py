"""Captured passes: a static-cache target whose verify windows replay recorded CUDA graphs.

An eager pass of a 7B model on a GPU launches some 600 kernels from Python, and the host
takes longer to launch them than the GPU to run them (docs/performance.md, "On a GPU").
Recorded once as a CUDA graph, the pass is one launch. A recording holds fixed shapes at
fixed addresses, so each (cache, padded size) gets its own, reading its inputs from one
staged device buffer: the pass's start position, which every layer's length is set to
first (a rollback is that), then the padded ids. Off CUDA the same function runs as it
is, so the CPU tests run what a GPU replays.

A batch (several requests' windows) is one recorded pass too, whichever requests it
holds: every cache's keys and values are rows of one tensor a layer, and the pass runs
the first R rows (R a power of two, or all of them: the scheduler gives out the lowest
free caches), each window padded to the batch's longest. A row not in the batch runs its
padding past n_ctx, where nothing is kept; on a GPU the spare rows cost little beside
the pass's launches (docs/performance.md, "Several requests in one target pass").
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from hetspec.workers.common.kv_model import StaticKVModel, padded_sizes
from hetspec.workers.target.packed_pass import forward_batch

WARM_UP = 2      # eager runs of a pass before it is recorded (cuBLAS picks and allocates its kernels then)


class Rows:
    """A batch pass's cache: each layer's (keys, values), (caches, kv_heads, capacity,
    head_dim), every row written at its own positions (caches, size)."""

    def __init__(self, storage: list[tuple[torch.Tensor, torch.Tensor]], positions: torch.Tensor):
        self.storage, self.positions = storage, positions
        self.rows = torch.arange(len(positions), device=positions.device)[:, None]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.storage[layer_idx]
        keys[self.rows, :, self.positions] = key_states.transpose(1, 2)       # (caches, size, kv_heads, head_dim)
        values[self.rows, :, self.positions] = value_states.transpose(1, 2)
        return keys, values


def adopt(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """A transformers StaticLayer made to keep its keys and values in the given tensors
    (a row of the shared ones) instead of allocating its own on its first update."""
    layer.device, layer.keys, layer.values = keys.device, keys, values
    layer.batch_size, layer.num_heads, layer.k_head_dim = keys.shape[0], keys.shape[1], keys.shape[-1]
    layer.v_head_dim = values.shape[-1]
    layer.cumulative_length = layer.cumulative_length.to(keys.device)
    layer.is_initialized = True


class CapturedKVModel(StaticKVModel):
    def __init__(self, lm, device: str, n_ctx: int, max_window: int, caches: int = 1):
        super().__init__(lm, device, n_ctx, max_window)
        self.graphs = self.device.type == "cuda"
        self.fallback = ""                      # why passes run eagerly after all ("": they do not)
        longest = self.sizes[-1]
        self._staged = torch.zeros(1 + longest, dtype=torch.long, device=self.device)    # [start, ids...]
        self._host = torch.zeros(1 + longest, dtype=torch.long, pin_memory=self.graphs)
        self._recorded: dict[tuple, Callable[[], torch.Tensor]] = {}    # (cache, size), ("rows", R, size) -> replay
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None             # one pool: passes take turns
        self.capacity = n_ctx + longest
        self.storage = self._shared_rows(caches)
        rows = caches if self.storage else 0
        self._rows_staged = torch.zeros((rows, 1 + longest), dtype=torch.long, device=self.device)  # a cache's [start, ids...]
        self._rows_host = torch.zeros((rows, 1 + longest), dtype=torch.long, pin_memory=self.graphs)
        self.row_counts = padded_sizes(rows) if rows else ()                             # the batch passes' R

    def _shared_rows(self, caches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values for all caches, (caches, kv_heads, capacity, head_dim);
        none (no batch pass) where the layers' caches are not all of one shape."""
        geometry = self.geometry()
        if not geometry or getattr(self.lm.config.get_text_config(), "use_bidirectional_attention", False):
            return []
        layers, kv_heads, head_dim, _ = geometry
        shape, dtype = (caches, kv_heads, self.capacity, head_dim), self.lm.dtype
        return [(torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))
                for _ in range(layers)]

    def _new_cache(self):
        cache = super()._new_cache()
        if self.number < len(self._rows_staged):
            for layer, (keys, values) in zip(cache.layers, self.storage):
                adopt(layer, keys[self.number:self.number + 1], values[self.number:self.number + 1])
        return cache

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
            self._recorded[key] = self._record(lambda: self._pass(size))
        logits = self._recorded[key]()[:n]
        self.length = pos + n
        return logits if all_logits else logits[-1:]

    @torch.inference_mode()
    def forward_batch(self, windows: list[tuple]) -> list[torch.Tensor]:
        """Each window's (cache, tokens, keep, rows): the float32 logits of its last rows, all in
        one recorded pass over the first R caches' rows; one packed eager pass (packed_pass.py)
        where a window is a prompt or a cache's first pass."""
        if not self._recordable(windows):
            return forward_batch(self, windows)
        size = 0
        self._rows_host[:, 0] = self.n_ctx      # rows outside the batch: padding where nothing is kept
        self._rows_host[:, 1:] = 0
        for cache, tokens, keep, _ in windows:
            self.use(cache)
            size = max(size, self._size(tokens, keep))
            self._rows_host[cache, 0] = keep
            self._rows_host[cache, 1:1 + len(tokens)] = torch.as_tensor(tokens, dtype=torch.long)
        count = next(r for r in self.row_counts if r > max(window[0] for window in windows))
        self._rows_staged[:count].copy_(self._rows_host[:count])
        key = ("rows", count, size)
        if key not in self._recorded:
            self._recorded[key] = self._record(lambda: self._rows_pass(count, size), batch=True)
        logits = self._recorded[key]()
        out = []
        for cache, tokens, keep, rows in windows:
            self.use(cache)
            self.length = keep + len(tokens)
            out.append(logits[cache, len(tokens) - rows:len(tokens)])
        return out

    def _recordable(self, windows: list[tuple]) -> bool:
        """Whether a batch fits its recorded passes: windows, not prompts, in caches past their first pass."""
        rows = self.row_counts[-1] if self.row_counts else 0
        held = lambda c: (self.cache if c == self.number else self._kept.get(c, (None, 0))[0]) is not None
        return all(c < rows and len(t) <= self.sizes[-1] and held(c) for c, t, _, _ in windows)

    def _pass(self, size: int) -> torch.Tensor:
        """What is recorded: a padded pass from the staged start and ids, its rows' float32 logits."""
        self._rewind(self._staged[0])
        ids = self._staged[1:1 + size].view(1, size)
        return self.lm(input_ids=ids, use_cache=True, logits_to_keep=0, **{self.cache_arg: self.cache}).logits[0].float()

    def _rows_pass(self, count: int, size: int) -> torch.Tensor:
        """What a batch records: the first `count` caches' rows, from their staged starts and
        padded ids, with the masks each row's own pass would have; float32 logits (count, size, vocab)."""
        ids, starts = self._rows_staged[:count, 1:1 + size], self._rows_staged[:count, :1]
        positions = starts + torch.arange(size, device=self.device)                   # (caches, size)
        slots, query = torch.arange(self.capacity, device=self.device), positions[..., None]
        seen = slots <= query                                                           # (caches, size, capacity)
        masks = {"full_attention": seen[:, None]}
        types = self.layer_types()
        if "sliding_attention" in types:
            window = self.lm.config.get_text_config().sliding_window
            masks["sliding_attention"] = (seen & (slots > query - window))[:, None]
        mask = masks if len(set(types)) > 1 else masks[types[0]]
        out = self.lm(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True, logits_to_keep=0,
                      **{self.cache_arg: Rows([(k[:count], v[:count]) for k, v in self.storage], positions)})
        return out.logits.float()

    def _record(self, run: Callable[[], torch.Tensor], batch: bool = False) -> Callable[[], torch.Tensor]:
        """The replay of `run` (a pass over fixed buffers): a CUDA graph where one can be
        recorded, else the pass itself (the kernels line says why; a batch pass that cannot
        be recorded leaves batches to packed eager passes, a request's leaves all eager)."""
        if not self.graphs:
            return run
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):           # warm-up runs write what the replay will: the same start and ids
            for _ in range(WARM_UP):
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                logits = run()
        except RuntimeError as exc:             # a host sync or an op a graph cannot hold: eager from now on
            why = str(exc).splitlines()[0]
            if batch:
                self.row_counts, self.fallback = (), f"batches packed: recording one failed ({why})"
            else:
                self.graphs, self.fallback = False, f"passes eager: recording one failed ({why})"
                self._recorded.clear()
            return run

        def replay() -> torch.Tensor:
            graph.replay()
            return logits
        return replay
