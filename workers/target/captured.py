"""Captured passes: a static-cache target whose windows replay recorded CUDA graphs.

An eager pass of a 7B model on a GPU launches some 600 kernels from Python, and the host
takes longer to launch them than the GPU to run them (e7e822d:docs/performance.md, "On a GPU").
Recorded once as a CUDA graph, the pass is one launch. A recording holds fixed shapes at
fixed addresses, so:

- every cache is a row of one tensor a layer, keys and values (caches, kv_heads, capacity,
  head_dim), and every window, a lone request's or a batch's, runs as one pass over the
  first R rows, reading each row's start position and padded ids from one staged device
  buffer. Before a pass its requests are moved to the lowest rows (place: a swap of two
  rows' keys and values), so a lone request runs at R = 1, on any cache;
- attention reads each row's first S positions, S a span just past the longest context in
  the pass, not the capacity: held context, not room, sets its cost;
- (R, S, padded size) picks the recording: a ladder of each (row_counts, spans) of at most
  GRAPHS_PER_SIZE recordings a padded size, shared by every cache, recorded at start-up
  (record_all), and counted in the kernels line;
- a recording writes its rows' final hidden states only; the output layer runs after the
  replay on the rows the scheduler reads (float32 logits for every row of every recording
  would hold gigabytes).

A row not in the pass starts past n_ctx, where nothing is kept, and sees every slot (a
fully masked row would be NaN). Off CUDA the same functions run as they are, so the CPU
tests run what a GPU replays.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

from hetspec.workers.common.hf_compat import cache_keyword, decoder
from hetspec.workers.common.kv_model import StaticKVModel
from hetspec.workers.target.attention import NAME as GROUPED
from hetspec.workers.target.attention import grouped_rows
from hetspec.workers.target.packed_pass import forward_batch

WARM_UP = 2            # eager runs of a pass before it is recorded (cuBLAS picks and allocates its kernels then)
GRAPHS_PER_SIZE = 8    # recordings a padded size: row counts x spans
MIN_SPAN = 64          # the shortest span attended over (positions)
UNKNOWN_HEADS = ("logit_scale", "logits_scaling")   # output layers scaled otherwise than _head does


class CaptureFailed(RuntimeError):
    """Recording a pass failed: CUDA's allocator may be left unusable, so the worker starts afresh, eager."""


def whole_64s(positions: int) -> int:
    """Positions rounded up to a multiple of 64: a span or capacity SDPA's masks need no padding for."""
    return -(-positions // 64) * 64


def row_counts(caches: int) -> tuple[int, ...]:
    """The passes' row counts R: powers of four below `caches`, then `caches`."""
    counts = [1]
    while 4 * counts[-1] < caches:
        counts.append(4 * counts[-1])
    return tuple(counts) + ((caches,) if caches > 1 else ())


def spans(capacity: int, counts: int) -> tuple[int, ...]:
    """Positions attended over: the capacity, and below it quarters of it (multiples of 64,
    at least MIN_SPAN), as many as GRAPHS_PER_SIZE recordings a size allow beside `counts` row counts."""
    out = [capacity]
    for _ in range(max(1, GRAPHS_PER_SIZE // counts) - 1):
        shorter = max(MIN_SPAN, whole_64s(-(-out[0] // 4)))      # a quarter, rounded up
        if shorter >= out[0]:
            break
        out.insert(0, shorter)
    return tuple(out)


def outputs_bytes(caches: int, capacity: int, sizes: tuple[int, ...], hidden: int, itemsize: int) -> int:
    """What every recording's outputs hold at `caches` (reserved before the KV caches are sized)."""
    counts = row_counts(caches)
    return sum(counts) * sum(sizes) * len(spans(whole_64s(capacity), len(counts))) * hidden * itemsize


class Rows:
    """A pass's cache: each layer's (keys, values), (caches, kv_heads, capacity, head_dim),
    every row written at its own positions (rows, size); attention reads the first `span`."""

    def __init__(self, storage: list[tuple[torch.Tensor, torch.Tensor]], positions: torch.Tensor, span: int):
        self.storage, self.positions, self.span = storage, positions, span
        self.rows = torch.arange(len(positions), device=positions.device)[:, None]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.storage[layer_idx]
        keys[self.rows, :, self.positions] = key_states.transpose(1, 2)       # (rows, size, kv_heads, head_dim)
        values[self.rows, :, self.positions] = value_states.transpose(1, 2)
        return keys[:, :, :self.span], values[:, :, :self.span]


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
        self.capacity = whole_64s(self.capacity)
        self.storage, self.fallback = self._shared_rows(caches)    # fallback: why passes run eagerly ("": they do not)
        rows = caches if self.storage else 0
        self.row_counts = row_counts(rows) if rows else ()
        self.spans = spans(self.capacity, len(self.row_counts)) if rows else ()
        self.row_of, self.cache_at = list(range(rows)), list(range(rows))    # cache -> its row, row -> its cache
        pinned = self.graphs
        self._staged = torch.zeros((rows, 1 + self.sizes[-1]), dtype=torch.long, device=self.device)  # [start, ids...]
        self._host = torch.zeros((rows, 1 + self.sizes[-1]), dtype=torch.long, pin_memory=pinned)
        self._recorded: dict[tuple, Callable[[], torch.Tensor]] = {}     # (rows, span, size) -> replay
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None   # one pool: passes take turns
        self._decoder, config = decoder(lm), lm.config.get_text_config()
        self._decoder_arg = cache_keyword(self._decoder)
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self._groups = config.num_attention_heads // kv_heads if config._attn_implementation == GROUPED else 1
        self.record_s, self.output_bytes = 0.0, 0

    def _shared_rows(self, caches: int) -> tuple[list, str]:
        """Each layer's keys and values for all caches, (caches, kv_heads, capacity, head_dim);
        none, and why, where the layers' caches are not all of one shape or the output layer is unknown."""
        geometry, config = self.geometry(), self.lm.config.get_text_config()
        if not geometry or getattr(config, "use_bidirectional_attention", False):
            return [], "passes static, not recorded: the layers' caches differ in shape"
        if any(getattr(config, name, None) not in (None, 1, 1.0) for name in UNKNOWN_HEADS):
            return [], "passes static, not recorded: an output layer scaled otherwise"
        layers, kv_heads, head_dim, _ = geometry
        shape, dtype = (caches, kv_heads, self.capacity, head_dim), self.lm.dtype
        return [(torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))
                for _ in range(layers)], ""

    def _new_cache(self):
        cache = super()._new_cache()
        if self.number < len(self.row_of):
            self._adopt(cache, self.row_of[self.number])
        return cache

    def _adopt(self, cache, row: int) -> None:
        for layer, (keys, values) in zip(cache.layers, self.storage):
            adopt(layer, keys[row:row + 1], values[row:row + 1])

    def _held(self, number: int):
        return self.cache if number == self.number else self._kept.get(number, (None, 0))[0]

    def _place(self, caches: list[int]) -> int:
        """The row count R of a pass over `caches`, each moved first into a row below R."""
        count = next(r for r in self.row_counts if r >= len(caches))
        free = [row for row in range(count) if self.cache_at[row] not in caches]
        for cache in caches:
            if self.row_of[cache] >= count:
                self._swap(self.row_of[cache], free.pop())
        return count

    def _swap(self, a: int, b: int) -> None:
        """Rows a and b trade their keys and values, and their caches."""
        for keys, values in self.storage:
            keys[[a, b]] = keys[[b, a]]
            values[[a, b]] = values[[b, a]]
        first, second = self.cache_at[a], self.cache_at[b]
        self.cache_at[a], self.cache_at[b] = second, first
        self.row_of[first], self.row_of[second] = b, a
        for cache in (first, second):
            if (held := self._held(cache)) is not None:
                self._adopt(held, self.row_of[cache])

    @torch.inference_mode()
    def forward(self, tokens, pos: int, all_logits: bool = True) -> torch.Tensor:
        if not self._recordable([(self.number, tokens, pos, 1)]):   # a prompt, or the cache's first pass
            return super().forward(tokens, pos, all_logits)
        return self.forward_batch([(self.number, tokens, pos, len(tokens) if all_logits else 1)])[0]

    @torch.inference_mode()
    def forward_batch(self, windows: list[tuple]) -> list[torch.Tensor]:
        """Each window's (cache, tokens, keep, rows): the float32 logits of its last rows, all in
        one recorded pass; one packed eager pass (packed_pass.py) where a window is a prompt or
        a cache's first pass."""
        if not self._recordable(windows):
            return forward_batch(self, windows)
        count = self._place([window[0] for window in windows])
        host, size, reach = self._host, 0, 0
        host[:count, 0] = self.n_ctx            # rows outside the pass: padding where nothing is kept
        host[:count, 1:] = 0
        for cache, tokens, keep, _ in windows:
            self.use(cache)
            size, reach = max(size, self._size(tokens, keep)), max(reach, keep + len(tokens))
            host[self.row_of[cache], 0] = keep
            host[self.row_of[cache], 1:1 + len(tokens)] = torch.as_tensor(tokens, dtype=torch.long)
        span = next(s for s in self.spans if s >= reach)
        self._staged[:count].copy_(host[:count], non_blocking=True)
        hidden = self._replay(count, span, size)
        picked = torch.cat([hidden[self.row_of[c], len(t) - rows:len(t)] for c, t, _, rows in windows])
        logits = self._head(picked)
        for cache, tokens, keep, _ in windows:
            self.use(cache)
            self.length = keep + len(tokens)
        return list(torch.split(logits, [window[3] for window in windows]))

    def _recordable(self, windows: list[tuple]) -> bool:
        """Whether windows fit the recorded passes: windows, not prompts, in caches past their first pass."""
        rows = len(self.row_of)
        return all(c < rows and len(t) <= self.sizes[-1] and self._held(c) is not None for c, t, _, _ in windows)

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer on final hidden states, as the model's own forward applies it: float32 logits."""
        logits = self.lm.lm_head(hidden)
        cap = getattr(self.lm.config.get_text_config(), "final_logit_softcapping", None)
        return (torch.tanh(logits / cap) * cap if cap else logits).float()

    def _rows_pass(self, count: int, span: int, size: int) -> torch.Tensor:
        """What is recorded: the first `count` rows from their staged starts and padded ids,
        attending over `span` positions with the masks each row's own pass would have; their
        final hidden states (count, size, hidden)."""
        ids, starts = self._staged[:count, 1:1 + size], self._staged[:count, :1]
        positions = starts + torch.arange(size, device=self.device)                   # (rows, size)
        slots, query = torch.arange(span, device=self.device), positions[..., None]
        outside, seen = starts[..., None] >= self.n_ctx, slots <= query                 # (rows, size, span)
        masks = {"full_attention": seen | outside}
        types = self.layer_types()
        if "sliding_attention" in types:
            window = self.lm.config.get_text_config().sliding_window
            masks["sliding_attention"] = (seen & (slots > query - window)) | outside
        masks = {kind: self._additive(m[:, None]) for kind, m in masks.items()}
        mask = masks if len(set(types)) > 1 else masks[types[0]]
        storage = [(keys[:count], values[:count]) for keys, values in self.storage]
        out = self._decoder(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                            **{self._decoder_arg: Rows(storage, positions, span)})
        return out.last_hidden_state

    def _additive(self, seen: torch.Tensor) -> torch.Tensor:
        """A (rows, 1, size, span) mask as SDPA takes it without converting it in every layer:
        0 where seen, the dtype's least elsewhere, in the model's dtype; its rows stacked for
        grouped-query attention (attention.py)."""
        mask = torch.zeros(seen.shape, dtype=self.lm.dtype, device=self.device)
        mask.masked_fill_(~seen, torch.finfo(self.lm.dtype).min)
        return grouped_rows(self._groups, mask) if self._groups > 1 else mask

    def _replay(self, count: int, span: int, size: int) -> torch.Tensor:
        key = (count, span, size)
        if key not in self._recorded:
            self._recorded[key] = self._record(lambda: self._rows_pass(count, span, size))
        return self._recorded[key]()

    def record_all(self) -> None:
        """Every recording, now: no request's window waits for one, and a failure shows at start-up."""
        start = time.perf_counter()
        self._host[:, 0], self._host[:, 1:] = self.n_ctx, 0
        self._staged.copy_(self._host)
        for count in self.row_counts:
            for span in self.spans:
                for size in self.sizes:
                    self._replay(count, span, size)
        if self.graphs:
            torch.cuda.synchronize(self.device)
        self.record_s = time.perf_counter() - start

    def describe(self) -> str:
        """The kernels line's words for the recordings."""
        if self.fallback:
            return self.fallback
        held = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.storage)
        how = "CUDA graphs" if self.graphs else "passes run eagerly (no CUDA)"
        return (f"{len(self._recorded)} recordings shared by every cache, as {how}: {len(self.row_counts)} row counts "
                f"({'/'.join(map(str, self.row_counts))}) x {len(self.spans)} spans ({'/'.join(map(str, self.spans))})"
                f" x {len(self.sizes)} sizes, recorded in {self.record_s:.1f} s; their outputs "
                f"{self.output_bytes / 2**20:.1f} MiB beside {held / 2**30:.2f} GiB of KV caches")

    def _record(self, run: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """The replay of `run` (a pass over fixed buffers): a CUDA graph, or off CUDA the pass
        itself. CaptureFailed where a graph cannot be recorded."""
        if not self.graphs:
            return run
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):           # warm-up runs write what the replay will: the same starts and ids
            for _ in range(WARM_UP):
                run()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                out = run()
        except RuntimeError as exc:             # a host sync, or an op a graph cannot hold
            raise CaptureFailed(f"recording a pass failed ({str(exc).splitlines()[0]})") from exc
        self.output_bytes += out.numel() * out.element_size()

        def replay() -> torch.Tensor:
            graph.replay()
            return out
        return replay
