"""hetspec-chaos: clients stream requests while the draft, the target and clients are killed with
SIGKILL at random; then count what survived (benchmarks/README.md, "hetspec-chaos").

    hetspec-chaos                              30 kills, 8 clients, the embedded default
    hetspec-chaos --kills 0 --requests 1000    a soak: memory after --settle requests against the end

Exits 1 if a request hung or was lost to a draft kill, a greedy completion differed from the
target's own output, memory grew (soak), or anything was left behind."""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

import hetspec
from hetspec.benchmarks.bench.tables import write_outputs

# (prompt, max_new_tokens, temperature): greedy ones are checked token for token
JOBS = [("The capital of France is", 16, 0.0), ("Write a haiku about the sea.", 48, 0.0),
        ("1, 2, 3, 4, 5,", 96, 0.0), ("Explain photosynthesis in one paragraph.", 64, 0.7),
        ("def fibonacci(n):", 32, 0.7)]
HANG_S = 120           # a request open this long has hung
RUNTIME_FILES = {"run.json", "ready", "scheduler.log", "draft.log", "target.log", "client.sock", "draft.sock", "target.sock"}
COUNTS = ("requests", "exact", "sampled", "cancelled", "client killed", "inexact", "aborted (target killed)",
          "other errors", "lost to a draft kill", "hung", "finished target-only")


def client_main(endpoint: str, seed: int, stop_file: str, cancel_p: float) -> None:
    """One client process: stream random jobs until the stop file appears; one JSON line per event."""
    rng, engine = random.Random(seed), hetspec.connect(endpoint)
    while not os.path.exists(stop_file):
        job = rng.randrange(len(JOBS))
        prompt, max_new, temperature = JOBS[job]
        print(json.dumps({"event": "start", "job": job}), flush=True)
        cancel_after = 2 if rng.random() < cancel_p else None
        try:
            stream = engine.stream(prompt, max_new_tokens=max_new,
                                   **({"temperature": temperature, "top_p": 0.9} if temperature else {}))
            for i, _ in enumerate(stream):
                if cancel_after is not None and i + 1 >= cancel_after:
                    stream.close()
                    break
            result = stream.result
            event = {"event": "cancelled"} if result is None else {
                "event": "done", "ids": result.token_ids, "finish": result.finish_reason,
                "fallback": result.stats.get("fallback")}
        except hetspec.HetspecError as exc:
            event = {"event": "error", "type": type(exc).__name__, "message": str(exc)}
        print(json.dumps({**event, "job": job}), flush=True)


class Clients:
    """The client processes, their events counted as they come, and the requests each has open; for a soak, the
    engine's memory when the count of requests reaches each of `soak_at`."""

    def __init__(self, engine, args, references: dict, workdir: str, soak_at: tuple[int, ...]):
        self.engine, self.args, self.references, self.soak_at = engine, args, references, soak_at
        self.stop_file = os.path.join(workdir, "stop")
        self.events: queue.Queue = queue.Queue()
        self.procs: dict[int, subprocess.Popen] = {}
        self.open: dict[int, float] = {}     # client index -> when its request started
        self.counts, self.errors, self.memory = dict.fromkeys(COUNTS, 0), [], {}
        for _ in range(args.clients):
            self.spawn()

    def spawn(self) -> None:
        index = len(self.procs)
        self.procs[index] = proc = subprocess.Popen(
            [sys.executable, "-m", "hetspec.benchmarks.robustness.chaos", "--client", self.engine.endpoint, "--seed",
             str(self.args.seed * 1000 + index), "--stop-file", self.stop_file, "--cancel-p", str(self.args.cancel_p)],
            stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, args=(index, proc), daemon=True).start()

    def _read(self, index: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.events.put((index, json.loads(line)))

    def hung(self) -> bool:
        return any(time.monotonic() - t > HANG_S for t in self.open.values())

    def kill_one(self, rng: random.Random) -> None:
        index = rng.choice([i for i, p in self.procs.items() if p.poll() is None])
        self.procs[index].kill()
        self.procs[index].wait()
        self.events.put((index, {"event": "client killed"}))
        self.spawn()

    def pump(self, seconds: float) -> None:
        """Count events for `seconds`, or until a request hangs."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0 and not self.hung():
            with contextlib.suppress(queue.Empty):
                self.handle(*self.events.get(timeout=min(left, 0.5)))

    def stop(self) -> None:
        """Let every client finish its request and leave (a client stuck in one is killed); then the events left,
        a request still open having hung."""
        Path(self.stop_file).touch()
        deadline = time.monotonic() + HANG_S
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        while not self.events.empty():
            self.handle(*self.events.get())
        self.counts["hung"] = len(self.open)

    def handle(self, index: int, event: dict) -> None:
        if event["event"] == "start":
            self.open[index] = time.monotonic()
            return
        self.open.pop(index, None)
        self.counts["requests"] += 1
        self.counts[self._outcome(event)] += 1
        if self.counts["requests"] in self.soak_at:
            info = self.engine.get_info()
            pids = {"scheduler": info["pid"], **{role: info["workers"][role]["pid"] for role in ("draft", "target")}}
            self.memory[self.counts["requests"]] = {role: psutil.Process(pid).memory_info().rss for role, pid in pids.items()}

    def _outcome(self, event: dict) -> str:
        kind = event["event"]
        if kind in ("cancelled", "client killed"):
            return kind
        if kind == "done":
            self.counts["finished target-only"] += bool(event["fallback"])
            reference, ids = self.references.get(event["job"]), event["ids"]
            if reference is None:
                return "sampled"
            whole = len(ids) == len(reference) or event["finish"] in ("eos", "stop")   # or its start, ended early
            return "exact" if ids == reference[:len(ids)] and whole else "inexact"
        if event["type"] == "RequestAbortedError" and "target worker" in event["message"]:
            return "aborted (target killed)"
        self.errors.append(event)
        return "lost to a draft kill" if "draft" in event["message"] else "other errors"


def run(args) -> dict:
    rng, workdir = random.Random(args.seed), tempfile.mkdtemp(prefix="hetspec-chaos-")
    engine = hetspec.launch(args.config)
    references = {j: engine.generate(p, max_new_tokens=n, mode="target").token_ids
                  for j, (p, n, t) in enumerate(JOBS) if t == 0}
    clients = Clients(engine, args, references, workdir, () if args.kills else (args.settle, args.requests))
    started, kills = time.monotonic(), _kill_at_random(args, rng, engine, clients)
    while args.kills == 0 and clients.counts["requests"] < args.requests and not clients.hung():
        clients.pump(1)
    clients.pump(5 if args.kills else 0)
    clients.stop()
    info = engine.get_info()
    live, leaks = _left_behind(engine, clients)
    shutil.rmtree(workdir, ignore_errors=True)
    return {"config": args.config or "(embedded default)", "kills": kills, "clients": args.clients,
            "seconds": round(time.monotonic() - started, 1), "counts": clients.counts, "restarts": info["restarts"],
            "engine_requests": info["requests"], "memory": clients.memory, "while_running": live, "leaks": leaks,
            "errors": clients.errors[:20]}


def _left_behind(engine, clients: Clients) -> tuple[dict, dict]:
    """The engine's segments and runtime files while it runs; then, closed, what is left of it and of the clients."""
    runtime_dir, run_id = engine._launcher.runtime_dir, engine._launcher.run_id
    segments = lambda: glob.glob(f"/dev/shm/hetspec-{run_id}-*")
    live = {"segments": sorted(segments()), "runtime_dir": sorted(os.listdir(runtime_dir))}
    foreign = [s for s in glob.glob("/dev/shm/hetspec-*") if f"hetspec-{run_id}-" not in s]
    engine.close()
    mentioning = [p.pid for p in psutil.process_iter(["cmdline", "status"])     # the engine's runtime directory
                  if p.info["status"] != psutil.STATUS_ZOMBIE and runtime_dir in " ".join(p.info["cmdline"] or [])]
    return live, {"processes": mentioning + [p.pid for p in clients.procs.values() if p.poll() is None],
                  "segments": segments(), "runtime_dir": os.path.exists(runtime_dir),
                  "other engines' segments": foreign}


def _kill_at_random(args, rng: random.Random, engine, clients: Clients) -> dict:
    """--kills SIGKILLs, --min-gap to --max-gap seconds apart, of the draft, the target or a client."""
    kills = dict.fromkeys(("draft", "target", "client"), 0)
    for _ in range(args.kills):
        clients.pump(rng.uniform(args.min_gap, args.max_gap))
        victim = rng.choices(list(kills), weights=[0.4, 0.3, 0.3])[0]
        if victim == "client":
            clients.kill_one(rng)
        else:
            _kill_when_ready(engine, victim)
        kills[victim] += 1
    return kills


def _kill_when_ready(engine, role: str) -> None:
    """SIGKILL the worker once it is up: killing one still loading, again and again, is a crash loop, which the
    engine rightly gives up on."""
    deadline = time.monotonic() + HANG_S
    while (worker := engine.get_info()["workers"][role])["state"] != "ready" and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(worker["pid"], signal.SIGKILL)


def verdict(report: dict, max_growth: float) -> list[str]:
    """What failed, if anything."""
    c = report["counts"]
    problems = [f"{c[key]} request(s) {key}" for key in ("hung", "lost to a draft kill", "inexact") if c[key]]
    if any(report["leaks"][k] for k in ("processes", "segments", "runtime_dir")):
        problems.append(f"left behind: {report['leaks']}")
    if extra := set(report["while_running"]["runtime_dir"]) - RUNTIME_FILES:
        problems.append(f"the runtime directory held more than the live engine's files: {sorted(extra)}")
    first, last = _soak_ends(report)
    return problems + [f"{role} memory grew {last[role] / first[role] - 1:.1%}" for role in first
                       if last[role] > first[role] * (1 + max_growth)]


def _soak_ends(report: dict) -> tuple[dict, dict]:
    """Each process's RSS at the soak's two points (empty where this was no soak)."""
    memory = report["memory"]
    return tuple(memory[k] for k in sorted(memory)) if len(memory) == 2 else ({}, {})


def table(report: dict) -> str:
    rows = [("kills (draft / target / client)", " / ".join(map(str, report["kills"].values()))),
            ("restarts (draft / target)", f"{report['restarts']['draft']} / {report['restarts']['target']}"),
            *report["counts"].items(), ("leaked processes", len(report["leaks"]["processes"])),
            ("leaked segments", len(report["leaks"]["segments"])), ("seconds", report["seconds"])]
    first, last = _soak_ends(report)
    rows += [(f"{role} RSS after {min(report['memory'])} / {max(report['memory'])} requests",
              f"{first[role] / 2**20:.1f} / {last[role] / 2**20:.1f} MiB") for role in first]
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hetspec-chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="engine config (default: the embedded SmolLM2 pair)")
    p.add_argument("--kills", type=int, default=30)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=1000, help="with --kills 0: run this many requests")
    p.add_argument("--settle", type=int, default=100,
                   help="with --kills 0: memory is compared with where it stood after this many requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-gap", type=float, default=0.5, help="seconds between kills, at least")
    p.add_argument("--max-gap", type=float, default=4.0)
    p.add_argument("--cancel-p", type=float, default=0.1, help="share of requests a client cancels midway")
    p.add_argument("--max-growth", type=float, default=0.05, help="soak: allowed memory growth")
    p.add_argument("--out", help="directory for chaos.json and chaos.md")
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--stop-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        client_main(args.client, args.seed, args.stop_file, args.cancel_p)
        return 0
    report = run(args)
    report["problems"] = problems = verdict(report, args.max_growth)
    text = table(report) + "\n\n" + ("\n".join(f"FAIL: {x}" for x in problems) or "PASS") + "\n"
    print(text)
    if args.out:
        write_outputs(args.out, report, f"`hetspec-chaos {' '.join(argv or sys.argv[1:])}`\n\n{text}",
                      ("chaos.json", "chaos.md"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
