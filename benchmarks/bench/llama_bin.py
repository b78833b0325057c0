"""llama.cpp's own C++ binaries as the benchmark's llama.cpp peer.

The llama-cpp-python peer (llama_peer.py) drives llama.cpp from a Python loop,
which costs llama.cpp part of its speed; users compare against llama.cpp's own
programs. `scripts/build_llama_cpp.sh` builds them from the llama.cpp that the
installed llama-cpp-python vendors, into the cache folder (hetspec.models.cache_home()); each
row below runs one of them on the target's GGUF file, per prompt, on the
benchmark process's cores (`taskset`), while the engine's processes sit idle:

- `llama-bench -p 0 -n N -d DEPTH -o json`: decoding N tokens after a DEPTH-token
  context (DEPTH = the prompt's tokens, N = its new tokens: the positions the
  engine decodes after its first token), llama.cpp's defaults, the mean of
  BENCH_REPS repetitions. On 1 thread and on every core.
- `llama-speculative-simple` with the draft's GGUF file (a draft of the target's
  vocabulary), greedy, `--spec-draft-n-max` 3, 8 and 16; the row is the draft
  length fastest on average over the run, the others are kept.
- `llama-speculative-simple --spec-type ngram-simple` and `ngram-mod`: llama.cpp's
  n-gram (prompt lookup) speculation, no draft model, greedy.

Their statistic is decode tok/s (llama-bench's tg rate; speculative-simple's
"decoded N tokens in S seconds", which starts at the prompt's last token), and
the engine's is its decode tok/s after the first token (metrics.py), so the
report's "vs llama.cpp" divides the one by the other.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from hetspec.benchmarks.bench.methods import CPP_PEER
from hetspec.models import cache_home

TOOLS = ("llama-bench", "llama-completion", "llama-speculative-simple")
BUILD = "scripts/build_llama_cpp.sh"
BENCH_REPS = 3                       # llama-bench repetitions per prompt (their mean)
DRAFT_LENGTHS = (3, 8, 16)           # --spec-draft-n-max tried for the draft-model row
REFERENCE = CPP_PEER                 # the row the report's "vs llama.cpp" divides by (every core)
TIMEOUT_S = 600


def llama_cpp_version() -> str | None:
    """The installed llama-cpp-python's version (None: not installed)."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.__version__


def find_binaries() -> Path | None:
    """The folder holding every tool: HETSPEC_LLAMA_BIN, else what build_llama_cpp.sh
    built for the installed llama-cpp-python; None when a tool is missing."""
    folder = os.environ.get("HETSPEC_LLAMA_BIN")
    if not folder:
        version = llama_cpp_version()
        if version is None:
            return None
        folder = cache_home() / f"llama.cpp-{version}" / "bin"
    folder = Path(folder)
    return folder if all(os.access(folder / t, os.X_OK) for t in TOOLS) else None


def kept_tree() -> Path | None:
    """The installed llama-cpp-python's CMake build tree, where `scripts/setup.sh --dev`
    kept it: there the binaries take a minute to build, not llama.cpp whole."""
    version = llama_cpp_version()
    tree = cache_home() / f"llama.cpp-{version}" / "python-build"
    return tree if version and (tree / "CMakeCache.txt").is_file() else None


def missing_line() -> str:
    cost = "a minute, in llama-cpp-python's kept build tree" if kept_tree() else "16 CPU-minutes"
    return (f"llama.cpp's own binaries are not built ({BUILD} builds them: {cost}); the llama.cpp rows "
            "are llama-cpp-python's Python loop only")


# ---- commands ---------------------------------------------------------------------

def pinned(cores: list[int]) -> list[str]:
    """`taskset -c CORES`, where taskset exists (a child inherits the affinity anyway)."""
    return ["taskset", "-c", ",".join(map(str, cores))] if cores and shutil.which("taskset") else []


def bench_command(bin_dir: Path, model: str, threads: int, depth: int, tokens: int, cores: list[int],
                  reps: int = BENCH_REPS, repack: bool = True) -> list[str]:
    command = [*pinned(cores), str(Path(bin_dir) / "llama-bench"), "-m", model, "-t", str(threads), "-p", "0",
               "-n", str(tokens), "-d", str(depth), "-r", str(reps), "-o", "json"]
    return command + ([] if repack else ["--repack", "0"])


def spec_command(bin_dir: Path, model: str, threads: int, prompt_file: str, tokens: int, context: int,
                 cores: list[int], draft: str | None = None, n_max: int | None = None, spec_type: str | None = None,
                 repack: bool = True) -> list[str]:
    """llama-speculative-simple, greedy: with a draft model (`draft`, up to `n_max` tokens a
    round) or by n-grams (`spec_type` ngram-simple or ngram-mod, no draft model)."""
    command = [*pinned(cores), str(Path(bin_dir) / "llama-speculative-simple"), "-m", model, "-f", prompt_file,
               "-n", str(tokens), "-c", str(context), "-b", str(context), "-t", str(threads), "--temp", "0",
               "--seed", "0"]
    if draft:
        command += ["-md", draft, "-td", str(threads), "--spec-draft-n-max", str(n_max)]
    command += ["--spec-type", spec_type or "draft-simple"]
    return command + ([] if repack else ["--no-repack"])


def completion_command(bin_dir: Path, model: str, threads: int, cores: list[int], repack: bool = True) -> list[str]:
    """One token after a short prompt: for llama.cpp's own `load time` line."""
    command = [*pinned(cores), str(Path(bin_dir) / "llama-completion"), "-m", model, "-p", "Hello", "-n", "1",
               "-t", str(threads), "--temp", "0", "-no-cnv"]
    return command + ([] if repack else ["--no-repack"])


# ---- parsers (of the real outputs: tests/data/llama_cpp/) --------------------------

def parse_bench_json(text: str) -> list[dict]:
    """llama-bench -o json: one dict per test, the fields the report uses."""
    out = []
    for test in json.loads(text):
        out.append({"n_depth": int(test["n_depth"]), "n_gen": int(test["n_gen"]), "n_prompt": int(test["n_prompt"]),
                    "threads": int(test["n_threads"]), "tokens_per_s": float(test["avg_ts"]),
                    "stddev": float(test["stddev_ts"]), "samples_ts": [float(x) for x in test["samples_ts"]],
                    "build": f"{test.get('build_commit', '?')} ({test.get('build_number', '?')})",
                    "backends": test.get("backends", ""), "flash_attn": test.get("flash_attn"),
                    "model_type": test.get("model_type", "")})
    if not out:
        raise ValueError("llama-bench printed no test")
    return out


_FLOAT = r"([0-9.]+|nan|-?inf)"
_SPEC = {"prompt_tokens": rf"encoded\s+(\d+) tokens in\s+{_FLOAT} seconds",
         "decoded": rf"decoded\s+(\d+) tokens in\s+{_FLOAT} seconds",
         "n_draft": r"n_draft\s+=\s+(\d+)", "n_drafted": r"n_drafted\s+=\s+(\d+)", "n_accept": r"n_accept\s+=\s+(\d+)"}


def parse_spec_output(text: str) -> dict:
    """llama-speculative-simple's closing lines: prompt and decoded tokens and seconds,
    tokens drafted and accepted."""
    found = {}
    for key, pattern in _SPEC.items():
        match = re.search(pattern, text)
        if match is None:
            raise ValueError(f"no {key} line in llama-speculative-simple's output")
        found[key] = match.groups()
    decoded, seconds = int(found["decoded"][0]), float(found["decoded"][1])
    return {"prompt_tokens": int(found["prompt_tokens"][0]), "prompt_s": float(found["prompt_tokens"][1]),
            "new_tokens": decoded, "decode_s": seconds,
            "decode_tokens_per_s": decoded / seconds if seconds > 0 else None,
            "n_max": int(found["n_draft"][0]), "drafted": int(found["n_drafted"][0]),
            "accepted": int(found["n_accept"][0])}


_TIMINGS = {"load_ms": rf"load time =\s+{_FLOAT} ms",
            "prompt": rf"prompt eval time =\s+{_FLOAT} ms /\s+(\d+) tokens",
            "eval": rf"\beval time =\s+{_FLOAT} ms /\s+(\d+) runs"}


def parse_timings(text: str) -> dict:
    """llama.cpp's perf lines (common_perf_print, or llama_perf_context_print: load, prompt eval
    and eval time)."""
    body = "\n".join(line for line in text.splitlines() if "perf_" in line and "print" in line) or text
    out: dict = {}
    load = re.search(_TIMINGS["load_ms"], body)
    if load is None:
        raise ValueError("no load time line in llama.cpp's output")
    out["load_ms"] = float(load.group(1))
    for key in ("prompt", "eval"):
        match = re.search(_TIMINGS[key], body)
        if match:
            ms, n = float(match.group(1)), int(match.group(2))
            out[f"{key}_ms"], out[f"{key}_tokens"] = ms, n
            out[f"{key}_tokens_per_s"] = 1000 * n / ms if ms > 0 else None
    return out


# ---- the peer ---------------------------------------------------------------------

@dataclass
class CppRow:
    """What one C++ row runs (methods.py names them; kind "cpp")."""
    tool: str                   # "llama-bench" or "llama-speculative-simple"
    threads: int
    draft: str | None = None    # the draft's GGUF file (speculative rows)
    spec_type: str | None = None


class LlamaBinaries:
    """Runs the rows for the runner: one prompt at a time, a record each."""

    def __init__(self, bin_dir: Path, target_file: str, draft_file: str | None, cores: list[int], detokenize,
                 repack: bool = True):
        self.bin_dir, self.target, self.draft, self.cores = Path(bin_dir), target_file, draft_file, cores
        self.detokenize = detokenize            # prompt ids -> the text llama.cpp tokenizes back to them
        self.repack = repack
        self.tmp = tempfile.TemporaryDirectory(prefix="hetspec-llama-")
        info = self.bin_dir / "BUILD_INFO"
        self.build_info = info.read_text().strip() if info.exists() else ""

    def row(self, mode: str, threads: int | None) -> CppRow:
        threads = threads or len(self.cores)
        if mode == "bench":
            return CppRow("llama-bench", threads)
        if mode == "spec":
            return CppRow("llama-speculative-simple", threads, draft=self.draft)
        return CppRow("llama-speculative-simple", threads, spec_type=mode)     # ngram-simple, ngram-mod

    def resources(self, mode: str, threads: int | None) -> dict:
        row = self.row(mode, threads)
        out = {"device": "cpu", "cores": self.cores, "threads": row.threads, "dtype": "gguf", "tool": row.tool,
               "binaries": str(self.bin_dir), "settings": "llama.cpp defaults" if self.repack else
               "llama.cpp defaults but its repacked (AMX) weights, which die of an illegal instruction here"}
        if mode == "spec":
            out.update(draft=self.draft, draft_lengths=list(DRAFT_LENGTHS))
        return out

    def skip_reason(self, mode: str, shared_vocabulary: bool) -> str | None:
        if mode == "spec" and (not self.draft or not shared_vocabulary):
            return "the draft is no GGUF file of the target's vocabulary"
        return None

    def run(self, mode: str, threads: int | None, ids: list[int], max_new_tokens: int) -> dict:
        row = self.row(mode, threads)
        if row.tool == "llama-bench":
            return self._bench(row, len(ids), max_new_tokens)
        prompt = Path(self.tmp.name) / "prompt.txt"
        prompt.write_text(self.detokenize(ids) + "\n")      # llama.cpp's -f drops one final newline
        context = len(ids) + max_new_tokens + 64
        if mode != "spec":
            return self._spec(spec_command(self.bin_dir, self.target, row.threads, str(prompt), max_new_tokens,
                                           context, self.cores, spec_type=mode, repack=self.repack))
        tries = {n: self._spec(spec_command(self.bin_dir, self.target, row.threads, str(prompt), max_new_tokens,
                                            context, self.cores, draft=self.draft, n_max=n, repack=self.repack))
                 for n in DRAFT_LENGTHS}
        return {**tries[DRAFT_LENGTHS[0]], "by_draft_length": tries}

    def _bench(self, row: CppRow, depth: int, tokens: int) -> dict:
        command = bench_command(self.bin_dir, self.target, row.threads, depth, tokens, self.cores,
                                repack=self.repack)
        test = parse_bench_json(_run(command))[0]
        rate = test["tokens_per_s"]
        return {"depth": depth, "new_tokens": tokens, "decode_s": tokens / rate, "decode_tokens_per_s": rate,
                "stddev": test["stddev"], "samples_ts": test["samples_ts"], "command": _show(command)}

    def _spec(self, command: list[str]) -> dict:
        done = parse_spec_output(_run(command, stderr=True))
        return {"depth": done["prompt_tokens"], **done, "command": _show(command)}

    def load_time(self, file: str) -> dict:
        """llama.cpp's own `load time` of a GGUF file (llama-completion, every core):
        from the start of the load to the end of the first evaluation, its warm-up."""
        command = completion_command(self.bin_dir, file, len(self.cores), self.cores, self.repack)
        return {"file": file, **parse_timings(_run(command, stderr=True)), "command": _show(command)}

    def close(self) -> None:
        self.tmp.cleanup()


def _run(command: list[str], stderr: bool = False) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{Path(command[command.index('-m') - 1]).name} exited {done.returncode}: {tail}")
    return done.stdout + "\n" + done.stderr if stderr else done.stdout


def _show(command: list[str]) -> str:
    return " ".join(command)


# ---- figures from the records (results.json "llama_cpp") ----------------------------

def summarize(runs: list[dict], categories: list[str]) -> dict:
    """Per C++ row: decode tok/s per category, pooled over its prompts (tokens / seconds),
    and their mean ("average"); the speculative row is the draft length fastest on average."""
    out: dict = {}
    for method in dict.fromkeys(r["method"] for r in runs if "error" not in r):
        mine = [r for r in runs if r["method"] == method and "error" not in r]
        if "by_draft_length" in mine[0]:
            by_length = {n: _pooled([{**r["by_draft_length"][n], "category": r["category"]} for r in mine],
                                    categories)
                         for n in mine[0]["by_draft_length"]}
            best = max(by_length, key=lambda n: by_length[n]["average"]["decode_tokens_per_s"] or 0)
            out[method] = {**by_length[best], "draft_length": int(best),
                           "by_draft_length": {str(n): v["average"] for n, v in by_length.items()}}
        else:
            out[method] = _pooled(mine, categories)
    return out


def _pooled(runs: list[dict], categories: list[str]) -> dict:
    cells = {}
    for category in categories:
        chosen = [r for r in runs if r["category"] == category]
        if chosen:
            tokens, seconds = sum(r["new_tokens"] for r in chosen), sum(r["decode_s"] for r in chosen)
            drafted = sum(r.get("drafted", 0) for r in chosen)
            cells[category] = {"prompts": len(chosen), "new_tokens": tokens, "decode_s": seconds,
                               "decode_tokens_per_s": tokens / seconds if seconds > 0 else None,
                               "drafted": drafted if "drafted" in chosen[0] else None,
                               "acceptance_rate": sum(r["accepted"] for r in chosen) / drafted if drafted else None}
    rates = [c["decode_tokens_per_s"] for c in cells.values() if c["decode_tokens_per_s"]]
    accepted = [c["acceptance_rate"] for c in cells.values() if c["acceptance_rate"] is not None]
    drafted = [c["drafted"] for c in cells.values() if c["drafted"] is not None]
    cells["average"] = {"decode_tokens_per_s": mean(rates) if rates else None,
                        "acceptance_rate": mean(accepted) if accepted else None,
                        "drafted": sum(drafted) if drafted else None,
                        "prompts": sum(c["prompts"] for c in cells.values())}
    return cells


def versus(doc: dict, reference: str = REFERENCE) -> dict | None:
    """{decoding: {method: {category: ratio, "average": mean}}}: each method's decode tok/s
    after its first token over the C++ `reference` row's decode tok/s at the same prompts;
    None when that row did not run (the report then divides by the llama-cpp-python row)."""
    section = doc.get("llama_cpp") or {}
    ref = summarize(section.get("runs", []), doc["settings"]["categories"]).get(reference)
    if not ref:
        return None
    out: dict = {}
    for decoding, by_method in doc["results"].items():
        out[decoding] = {}
        for method, cells in by_method.items():
            ratios = {}
            for category, cell in cells.items():
                base = ref.get(category, {}).get("decode_tokens_per_s")
                if category != "average" and base and cell.get("decode_tokens_per_s"):
                    ratios[category] = cell["decode_tokens_per_s"] / base
            if ratios:
                ratios["average"] = mean(ratios.values())
            out[decoding][method] = ratios
    return out
