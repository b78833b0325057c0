"""hetspec-bench: the benchmark suite in one command.

    hetspec-bench                                  quick default: 1 prompt per category, every method
    hetspec-bench --limit 0 --out bench-out/full   all 80 prompts per category
    hetspec-bench --config my-gpu.toml             any engine config (a [bench] table may set defaults)

Writes OUT/report.md and OUT/results.json. Exits 1 if the results fail their
consistency checks (token counts, positive rates), 2 on bad usage."""
from __future__ import annotations

import argparse
import sys

from hetspec.benchmarks.bench import paced
from hetspec.benchmarks.bench.checks import check_results
from hetspec.benchmarks.bench.data import ALL_CATEGORIES, CATEGORIES
from hetspec.benchmarks.bench.machine import parse_isa
from hetspec.benchmarks.bench.methods import GROUPS, METHODS, select_methods
from hetspec.benchmarks.bench.report import render
from hetspec.benchmarks.bench.runner import run_suite
from hetspec.benchmarks.bench.settings import DECODINGS, DTYPES, bench_arguments, split_config
from hetspec.benchmarks.bench.tables import write_outputs
from hetspec.core.errors import HetspecError


def _at_least(low: int):
    def parse(text: str) -> int:
        if int(text) < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}")
        return int(text)
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hetspec-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="engine config: shipped name (smollm2, gemma3-270m, gemma3-smollm2, "
                                    "qwen2.5-coder, ...) or TOML path (default: the embedded SmolLM2 pair)")
    p.add_argument("--limit", type=_at_least(0), default=1, help="prompts per category, 0 = all (default 1)")
    p.add_argument("--methods", nargs="+", default=["all"], help=f"methods or groups ({', '.join(GROUPS)}); "
                   f"methods: {', '.join(METHODS)} (vanilla is always run)")
    p.add_argument("--categories", nargs="+", choices=ALL_CATEGORIES, default=list(CATEGORIES),
                   help="default: the six Spec-Bench ones; code, continuation and stubs are hetspec's own")
    p.add_argument("--decodings", nargs="+", choices=list(DECODINGS), default=list(DECODINGS))
    p.add_argument("--dtype", choices=DTYPES, help="target dtype for the engine and the baseline (default: the config's)")
    p.add_argument("--max-new-tokens", type=_at_least(1), help="override the per-category budget (128; 32 for QA, RAG)")
    p.add_argument("--baseline-threads", type=_at_least(0), default=0,
                   help="torch threads of vanilla (default 0: every core of this process)")
    p.add_argument("--out", default="bench-out", help="output directory (default: bench-out)")
    p.add_argument("--quiet", dest="progress", action="store_false", help="no progress bars")
    p.add_argument("--paced", metavar="PROFILE",
                   help="the engine's modes against a paced target (simulated GPU) of this profile "
                        "(h100-7b-eager, h100-7b-captured, gpu-40ms), greedy; records missing traces first")
    p.add_argument("--traces", default="", help="--paced: the folder of recorded traces (default: hetspec's cache)")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """The config's [bench] table first, then the command line on top."""
    parser = build_parser()
    bench = split_config(parser.parse_known_args(argv)[0].config)[1]
    args = parse_isa(parser, [*bench_arguments(bench), *argv])
    select_methods(args.methods)                              # raises on an unknown name
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse(argv)
        if args.paced:
            return paced.main(args, argv)
    except (ValueError, OSError, KeyError, HetspecError) as exc:
        print(f"hetspec-bench: error: {exc}", file=sys.stderr)
        return 2
    doc = run_suite(args, ["hetspec-bench", *argv])
    doc["checks"] = check_results(doc)
    report = write_outputs(args.out, doc, render(doc))
    print(f"\nwrote {report} and results.json (gamma {doc['chosen_gamma']}, {doc['duration_s']:.0f} s)", file=sys.stderr)
    for decoding, by_method in doc["results"].items():
        print(f"{decoding}: " + "; ".join(f"{m} {c['average']['tokens_per_s']:.1f} tok/s ({c['average']['speedup'] or 0:.2f}x)"
                                          for m, c in by_method.items() if c.get("average")), file=sys.stderr)
    if doc["checks"]:
        print(f"{len(doc['checks'])} consistency problem(s), first: {doc['checks'][0]}", file=sys.stderr)
    return 1 if doc["checks"] else 0


if __name__ == "__main__":
    sys.exit(main())
