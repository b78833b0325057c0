"""llama.cpp's own C++ programs as the benchmark's llama.cpp rows: what users compare against.
scripts/build_llama_cpp.sh builds them; each row runs once per prompt on the target's GGUF file and
the benchmark process's cores: `llama-bench` (the prompt's new tokens after a context of its length)
or `llama-speculative-simple` (the draft's GGUF file, or n-grams). The report's "vs llama.cpp"
divides by llama-bench's decode tok/s."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from hetspec.models import cache_home
from hetspec.workers.kernels.build import isa

TOOLS = ("llama-bench", "llama-completion", "llama-speculative-simple")
SERVER = "llama-server"              # opt-in: `scripts/build_llama_cpp.sh --server` (benchmarks/concurrency.py)
BENCH_REPS = 3                       # llama-bench repetitions per prompt (their mean)
DRAFT_LENGTH = 3                     # the draft-model row's --spec-draft-n-max: of 3, 8 and 16 the fastest in
                                     # every committed run (reports/qwen2.5-coder-epyc)
TIMEOUT_S = 600


def _home() -> Path | None:
    """hetspec's cache folder of the installed llama-cpp-python's llama.cpp (None: not installed)."""
    from importlib.util import find_spec

    return cache_home() / f"llama.cpp-{__import__('llama_cpp').__version__}" if find_spec("llama_cpp") else None


def bin_folder() -> Path | None:
    """HETSPEC_LLAMA_BIN, else where build_llama_cpp.sh puts the binaries for HETSPEC_ISA (`bin`, or `bin-avx2`
    for llama.cpp built for AVX2 alone), so that a run compares hetspec and llama.cpp built for the same one."""
    home = _home()
    folder = os.environ.get("HETSPEC_LLAMA_BIN") or (home and home / ("bin" if isa() == "native" else f"bin-{isa()}"))
    return Path(folder) if folder else None


def find_binaries() -> Path | None:
    """bin_folder(), None when a tool is missing there."""
    folder = bin_folder()
    return folder if folder and all(os.access(folder / t, os.X_OK) for t in TOOLS) else None


def find_server() -> Path | None:
    """llama-server in bin_folder(), where `build_llama_cpp.sh --server` puts it; None when absent."""
    folder = bin_folder()
    return folder / SERVER if folder and os.access(folder / SERVER, os.X_OK) else None


def kept_tree() -> Path | None:
    """llama-cpp-python's CMake tree kept by `scripts/setup.sh --dev`: the binaries build there in a minute."""
    home = _home()
    tree = home / "python-build" if home else None
    return tree if tree and (tree / "CMakeCache.txt").is_file() else None


def _build(*flags: str) -> str:
    """The build script's command line for this run's instruction set."""
    return " ".join(["scripts/build_llama_cpp.sh", *flags, *(["--isa", isa()] if isa() != "native" else [])])


def missing_line() -> str:
    cost = "a minute, in llama-cpp-python's kept build tree" if kept_tree() and isa() == "native" else "16 CPU-minutes"
    return f"llama.cpp's own binaries are not built ({_build()} builds them: {cost}); the report has no llama.cpp rows"


def server_missing_line() -> str:
    cost = ("about 2.5 minutes on 2 cores, in llama-cpp-python's kept build tree" if kept_tree() and isa() == "native"
            else "llama.cpp whole: some 20 CPU-minutes")
    where = os.environ.get("HETSPEC_LLAMA_BIN") or "llama-cpp-python's llama.cpp build folder"
    return f"llama-server is not built ({where}): `{_build('--server')}` builds it ({cost})"


def repack_note(repack: bool) -> str:
    """How llama.cpp ran, for the methods table (llama_handles.repacked_weights_run says why)."""
    return "llama.cpp defaults" + ("" if repack else
                                   " but its repacked (AMX) weights, which die of an illegal instruction here")


def repacks(path: str) -> bool:
    """Whether llama.cpp's repacked weights run here (llama_handles probes a CPU with AMX, with
    llama-cpp-python's own build). The binaries built for AVX2 alone have no AMX kernels: their
    repacked weights are the AVX2 ones (q4_K_8x8 and the like), llama.cpp's fastest there."""
    if isa() != "native":
        return True
    try:
        from hetspec.workers.common.llama_handles import repacked_weights_run
    except ImportError:            # no llama-cpp-python: no probe (and no AMX build of it to probe)
        return True
    return repacked_weights_run(path)


# ---- commands ---------------------------------------------------------------------

def pinned(cores: list[int]) -> list[str]:
    """`taskset -c CORES`, where taskset exists (a child inherits the affinity anyway)."""
    return ["taskset", "-c", ",".join(map(str, cores))] if cores and shutil.which("taskset") else []


def _tool(binary: Path, model: str, threads: int, cores: list[int], *args: str) -> list[str]:
    return [*pinned(cores), str(binary), "-m", model, *args, "-t", str(threads)]


def bench_command(bin_dir: Path, model: str, threads: int, depth: int, tokens: int, cores: list[int],
                  reps: int = BENCH_REPS, repack: bool = True) -> list[str]:
    return _tool(Path(bin_dir) / "llama-bench", model, threads, cores) + [
        "-p", "0", "-n", str(tokens), "-d", str(depth), "-r", str(reps), "-o", "json",
        *([] if repack else ["--repack", "0"])]


def spec_command(bin_dir: Path, model: str, threads: int, prompt_file: str, tokens: int, context: int,
                 cores: list[int], draft: str | None = None, n_max: int = DRAFT_LENGTH, spec_type: str | None = None,
                 repack: bool = True) -> list[str]:
    """llama-speculative-simple, greedy: with a `draft` model (up to `n_max` tokens a round) or by n-grams."""
    drafting = ["-md", draft, "-td", str(threads), "--spec-draft-n-max", str(n_max)] if draft else []
    return _tool(Path(bin_dir) / "llama-speculative-simple", model, threads, cores, "-f", prompt_file,
                 "-n", str(tokens), "-c", str(context), "-b", str(context), "--temp", "0", "--seed", "0", *drafting,
                 "--spec-type", spec_type or "draft-simple") + ([] if repack else ["--no-repack"])


def completion_command(bin_dir: Path, model: str, threads: int, cores: list[int], repack: bool = True) -> list[str]:
    """One token after a short prompt: for llama.cpp's own `load time` line."""
    return (_tool(Path(bin_dir) / "llama-completion", model, threads, cores, "-p", "Hello", "-n", "1", "--temp", "0",
                  "-no-cnv") + ([] if repack else ["--no-repack"]))


def server_command(binary: Path, model: str, slots: int, slot_context: int, threads: int, cores: list[int],
                   port: int, repack: bool = True) -> list[str]:
    """llama-server with `slots` parallel slots sharing a context of slots x slot_context, on loopback;
    repack False where llama.cpp's repacked weights die (repacks())."""
    return (_tool(binary, model, threads, cores, "-np", str(slots), "-c", str(slots * slot_context), "--host",
                  "127.0.0.1", "--port", str(port)) + ([] if repack else ["--no-repack"]))


# ---- parsers (of the real outputs: tests/data/llama_cpp/) --------------------------

def parse_bench_json(text: str) -> list[dict]:
    """llama-bench -o json: one dict per test, the fields the report uses."""
    out = [{"n_depth": int(t["n_depth"]), "n_gen": int(t["n_gen"]), "n_prompt": int(t["n_prompt"]),
            "threads": int(t["n_threads"]), "tokens_per_s": float(t["avg_ts"]), "stddev": float(t["stddev_ts"]),
            "samples_ts": [float(x) for x in t["samples_ts"]]} for t in json.loads(text)]
    if not out:
        raise ValueError("llama-bench printed no test")
    return out


_FLOAT = r"([0-9.]+|nan|-?inf)"
_SPEC = {"prompt_tokens": rf"encoded\s+(\d+) tokens in\s+{_FLOAT} seconds",
         "decoded": rf"decoded\s+(\d+) tokens in\s+{_FLOAT} seconds",
         "n_draft": r"n_draft\s+=\s+(\d+)", "n_drafted": r"n_drafted\s+=\s+(\d+)", "n_accept": r"n_accept\s+=\s+(\d+)"}


def parse_spec_output(text: str) -> dict:
    """llama-speculative-simple's closing lines: prompt and decoded tokens and seconds, drafted, accepted."""
    found = {key: re.search(pattern, text) for key, pattern in _SPEC.items()}
    if missing := [key for key, match in found.items() if match is None]:
        raise ValueError(f"no {missing[0]} line in llama-speculative-simple's output")
    found = {key: match.groups() for key, match in found.items()}
    decoded, seconds = int(found["decoded"][0]), float(found["decoded"][1])
    return {"prompt_tokens": int(found["prompt_tokens"][0]), "prompt_s": float(found["prompt_tokens"][1]),
            "new_tokens": decoded, "decode_s": seconds,
            "decode_tokens_per_s": decoded / seconds if seconds > 0 else None,
            "n_max": int(found["n_draft"][0]), "drafted": int(found["n_drafted"][0]),
            "accepted": int(found["n_accept"][0])}


def parse_load_ms(text: str) -> float:
    """llama.cpp's load time, ms, from its perf lines (common_perf_print or llama_perf_context_print)."""
    body = "\n".join(line for line in text.splitlines() if "perf_" in line and "print" in line) or text
    load = re.search(rf"load time =\s+{_FLOAT} ms", body)
    if load is None:
        raise ValueError("no load time line in llama.cpp's output")
    return float(load.group(1))


# ---- the rows ---------------------------------------------------------------------

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

    def resources(self, mode: str, threads: int | None) -> dict:
        return {"device": "cpu", "cores": self.cores, "threads": threads or len(self.cores), "dtype": "gguf",
                "tool": "llama-bench" if mode == "bench" else "llama-speculative-simple",
                "binaries": str(self.bin_dir), "settings": repack_note(self.repack),
                **({"draft": self.draft, "draft_length": DRAFT_LENGTH} if mode == "spec" else {})}

    def run(self, mode: str, threads: int | None, ids: list[int], max_new_tokens: int) -> dict:
        """One prompt: mode "bench", "spec" (the draft model) or an n-gram spec type."""
        threads = threads or len(self.cores)
        if mode == "bench":
            command = bench_command(self.bin_dir, self.target, threads, len(ids), max_new_tokens, self.cores,
                                    repack=self.repack)
            test = parse_bench_json(_run(command))[0]
            return {"depth": len(ids), "new_tokens": max_new_tokens, "decode_s": max_new_tokens / test["tokens_per_s"],
                    "decode_tokens_per_s": test["tokens_per_s"], "stddev": test["stddev"],
                    "samples_ts": test["samples_ts"], "command": " ".join(command)}
        prompt = Path(self.tmp.name) / "prompt.txt"
        prompt.write_text(self.detokenize(ids) + "\n")      # llama.cpp's -f drops one final newline
        how = {"draft": self.draft} if mode == "spec" else {"spec_type": mode}
        command = spec_command(self.bin_dir, self.target, threads, str(prompt), max_new_tokens,
                               len(ids) + max_new_tokens + 64, self.cores, repack=self.repack, **how)
        done = parse_spec_output(_run(command, stderr=True))
        return {"depth": done["prompt_tokens"], **done, "command": " ".join(command)}

    def close(self) -> None:
        self.tmp.cleanup()


def _run(command: list[str], stderr: bool = False) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{Path(command[command.index('-m') - 1]).name} exited {done.returncode}: {tail}")
    return done.stdout + "\n" + done.stderr if stderr else done.stdout


def open_binaries(rows: list, target: str, draft: str | None, tokenizer, shared_vocabulary: bool, cores: list[int]):
    """(the binaries, the results.json section they fill) for the C++ `rows`, or (None, {"missing": why, ...});
    a row that cannot run here is listed under "skipped" and dropped from `rows`."""
    bin_dir = find_binaries()
    if bin_dir is None:
        return None, {"missing": missing_line(), "methods": {}, "runs": []}
    start = tokenizer.encode_start()

    def detokenize(ids: list[int]) -> str:     # special tokens spelt out, no start tokens: llama.cpp adds its own
        return tokenizer.decode(ids[len(start):] if start and ids[:len(start)] == start else ids, skip_special_tokens=False)

    cpp = LlamaBinaries(bin_dir, target, draft, cores, detokenize, repack=repacks(target))
    section = {"binaries": str(bin_dir), "build_info": cpp.build_info, "cores": cores, "methods": {}, "skipped": {},
               "runs": []}
    for m in rows:
        if m.mode == "spec" and (not draft or not shared_vocabulary):
            section["skipped"][m.name] = "the draft is no GGUF file of the target's vocabulary"
        else:
            section["methods"][m.name] = {"label": m.label, "kind": m.kind, "mode": m.mode,
                                          **cpp.resources(m.mode, m.threads)}
    rows[:] = [m for m in rows if m.name in section["methods"]]
    return cpp, section
