"""What one benchmark run does: the engine config (a shipped name or a TOML path, so the suite runs on
any machine and model pair), prompts, methods, decodings. A TOML file's [bench] table holds this suite's
defaults, as command-line arguments that the command line's own override; it never reaches the engine."""
from __future__ import annotations

from pathlib import Path

from hetspec.config import SHIPPED_CONFIGS, load_config, read_config

# The paper's two settings: greedy, and nucleus sampling.
DECODINGS = {"greedy": {"temperature": 0.0, "top_p": 1.0}, "sampling": {"temperature": 0.7, "top_p": 0.9}}
DTYPES = ("float32", "bfloat16", "float16")
BENCH_KEYS = ("limit", "methods", "categories", "decodings", "dtype", "max_new_tokens", "baseline_threads")  # options


def split_config(source: str | None) -> tuple[dict, dict]:
    """(engine config dict, [bench] table) from a shipped name, a TOML path or None: as
    written, its autos unresolved (a paced run's max_running is the paced target's)."""
    if source is not None and source not in SHIPPED_CONFIGS and not Path(source).is_file():
        raise FileNotFoundError(f"config file not found: {source} (shipped configs: {', '.join(SHIPPED_CONFIGS)})")
    data = read_config(source)
    bench = data.pop("bench", {})
    if set(bench) - set(BENCH_KEYS):
        raise ValueError(f"unknown key(s) in [bench]: {', '.join(sorted(set(bench) - set(BENCH_KEYS)))}; "
                         f"known: {', '.join(sorted(BENCH_KEYS))}")
    load_config(data)   # validate the engine part now, before anything is loaded
    return data, bench


def bench_arguments(bench: dict) -> list[str]:
    """A [bench] table as hetspec-bench's arguments (a string for a one-item list)."""
    return [arg for key, value in bench.items()
            for arg in (f"--{key.replace('_', '-')}", *map(str, value if isinstance(value, list) else [value]))]


def engine_config(config: dict, dtype: str | None) -> dict:
    """The engine config with the benchmark's dtype applied to the target."""
    config = {section: dict(values) for section, values in config.items()}
    if dtype:
        config.setdefault("target", {})["dtype"] = dtype
    return config
