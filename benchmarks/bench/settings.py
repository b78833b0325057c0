"""What one benchmark run does: the engine config (a shipped name or a TOML path, so the suite runs on
any machine and model pair), prompts, methods, decodings. A TOML file's [bench] table holds this suite's
defaults; it never reaches the engine, and command-line options override it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from hetspec.benchmarks.bench.data import ALL_CATEGORIES, CATEGORIES
from hetspec.benchmarks.bench.methods import select_methods
from hetspec.config import SHIPPED_CONFIGS, load_config, read_config

# The paper's two settings: greedy, and nucleus sampling.
DECODINGS = {"greedy": {"temperature": 0.0, "top_p": 1.0},
             "sampling": {"temperature": 0.7, "top_p": 0.9}}
PROMPT_FORMATS = ("auto", "chat", "plain")
DTYPES = ("float32", "bfloat16", "float16")
QUICK_LIMIT = 1            # prompts per category in the default (quick, ~10 minutes on 2 cores) run


@dataclass
class BenchSettings:
    config: str | None = None                 # engine config: shipped name or TOML path (None: the default pair)
    dtype: str | None = None                  # target dtype for engine and baselines (None: the config's)
    limit: int = QUICK_LIMIT                  # prompts per category; 0 = all 80
    categories: list[str] = field(default_factory=lambda: list(CATEGORIES))
    methods: list[str] = field(default_factory=lambda: ["all"])
    max_new_tokens: int | None = None         # override the per-category budget (CI smoke)
    decodings: list[str] = field(default_factory=lambda: list(DECODINGS))
    prompt_format: str = "auto"               # auto: chat template if the tokenizer has one
    baseline_threads: int = 0                 # 0: the faster of every core and one (measured)
    out: str = "bench-out"
    warmup: bool = True
    ceiling: bool = True                      # time the draft model alone (its configured backend)
    progress: bool = True

    def validate(self) -> BenchSettings:
        for name in ("categories", "methods", "decodings"):     # a TOML string for a one-item list
            if isinstance(getattr(self, name), str):
                setattr(self, name, [getattr(self, name)])
        select_methods(self.methods)                              # raises on an unknown name
        for name, known in (("categories", ALL_CATEGORIES), ("decodings", DECODINGS)):
            bad = [v for v in getattr(self, name) if v not in known]
            if bad:
                raise ValueError(f"unknown {name} {bad}; known: {', '.join(known)}")
        rules = ((self.prompt_format not in PROMPT_FORMATS,
                  f"prompt_format must be one of {', '.join(PROMPT_FORMATS)}"),
                 (self.baseline_threads < 0, "baseline_threads must be >= 0 (0: choose)"),
                 (self.limit < 0 or (self.max_new_tokens is not None and self.max_new_tokens < 1),
                  "limit must be >= 0 and max_new_tokens >= 1"),
                 (self.dtype not in (None, *DTYPES), f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}"))
        for broken, message in rules:
            if broken:
                raise ValueError(message)
        return self


def split_config(source: str | None) -> tuple[dict, dict]:
    """(engine config dict, [bench] table) from a shipped name, a TOML path or None: as
    written, its autos unresolved (a paced run's max_running is the paced target's)."""
    if source is not None and source not in SHIPPED_CONFIGS and not Path(source).is_file():
        raise FileNotFoundError(f"config file not found: {source} (shipped configs: {', '.join(SHIPPED_CONFIGS)})")
    data = read_config(source)
    bench, known = data.pop("bench", {}), {f.name for f in fields(BenchSettings)} - {"config", "out", "progress"}
    if set(bench) - known:
        raise ValueError(f"unknown key(s) in [bench]: {', '.join(sorted(set(bench) - known))}; "
                         f"known: {', '.join(sorted(known))}")
    load_config(data)   # validate the engine part now, before anything is loaded
    return data, bench


def engine_config(config: dict, dtype: str | None) -> dict:
    """The engine config with the benchmark's dtype applied to the target."""
    config = {section: dict(values) for section, values in config.items()}
    if dtype:
        config.setdefault("target", {})["dtype"] = dtype
    return config
