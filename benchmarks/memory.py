"""The engine's memory against its model files: each process's resident set (RSS) and
proportional share (PSS: pages shared between processes, such as a GGUF file mapped by
both workers, counted once) after one request, and their totals over the sizes of the
GGUF files the config names.

    python -m hetspec.benchmarks.memory [--config NAME_OR_TOML]
"""
from __future__ import annotations

import argparse
import os

import psutil

import hetspec
from hetspec.config import load_config
from hetspec.models import resolve_model


def measure(config: str | None) -> dict:
    settings = load_config(config)
    found = [resolve_model(settings.target.model, "target"), resolve_model(settings.draft.model, "draft")]
    files = {model.file for model in found if model.gguf_file}
    with hetspec.launch(config) as engine:
        engine.generate("def quicksort(arr):", max_new_tokens=32)
        info = engine.get_info()
        pids = {"scheduler": info["pid"], **{role: w["pid"] for role, w in info["workers"].items()}}
        memory = {role: psutil.Process(pid).memory_full_info() for role, pid in pids.items()}
    return {"files_bytes": sum(os.path.getsize(f) for f in files), "files": sorted(files),
            "rss": {role: m.rss for role, m in memory.items()}, "pss": {role: m.pss for role, m in memory.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="a shipped config or a TOML path (default: the embedded default)")
    args = parser.parse_args(argv)
    result = measure(args.config)
    mb = 1e6
    print(f"GGUF files: {result['files_bytes'] / mb:.0f} MB ({', '.join(os.path.basename(f) for f in result['files'])})")
    for role in result["rss"]:
        print(f"{role}: RSS {result['rss'][role] / mb:.0f} MB, PSS {result['pss'][role] / mb:.0f} MB")
    for kind in ("rss", "pss"):
        total = sum(result[kind].values())
        print(f"total {kind.upper()}: {total / mb:.0f} MB, {total / result['files_bytes']:.2f}x the files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
