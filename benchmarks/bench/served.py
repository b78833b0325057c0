"""Real servers for the concurrency benchmark (benchmarks/concurrency.py), each in its own process
group, and a streaming OpenAI client: `hetspec-launch CONFIG --http` and llama.cpp's `llama-server`,
started on a free loopback port, ready once `GET /health` answers 200, stopped whole (their processes
and hetspec's shared-memory segments checked gone), and one request's server-sent events timed as
they arrive.
"""
from __future__ import annotations

import glob
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

START_TIMEOUT_S = 600           # a first start compiles hetspec's kernels; a 1.5B model loads in seconds
STOP_TIMEOUT_S = 60
REQUEST_TIMEOUT_S = 1800


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A server process on 127.0.0.1:port; its log in `log` (stderr and stdout but a first line kept)."""

    name = "server"

    def __init__(self, command: list[str], log: Path, first_line: bool = False):
        self.port = int(command[command.index("--port") + 1]) if "--port" in command else None
        self.command, self.log_path = command, log
        log.write_text("")
        self.log = open(log, "a")  # noqa: SIM115 - closed by stop(); appending, as the server's own writes do
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE if first_line else self.log, stderr=self.log,
                                        stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        self.processes: list[psutil.Process] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.process.returncode} while starting: {self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    self.processes = [psutil.Process(self.process.pid),
                                      *psutil.Process(self.process.pid).children(recursive=True)]
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer /health within {START_TIMEOUT_S} s: {self.tail()}")

    def tail(self, lines: int = 8) -> str:
        self.log.flush()
        return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])

    def stop(self) -> list[str]:
        """SIGINT, then SIGKILL to the group past STOP_TIMEOUT_S; what was left behind (killed, removed)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_S)
        _, alive = psutil.wait_procs(self.processes, timeout=STOP_TIMEOUT_S)
        left = [f"process {p.pid} ({p.name()})" for p in alive if _running(p)]
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        left += self._left_segments()
        self.log.close()
        return left

    def _left_segments(self) -> list[str]:
        return []


class HetspecServer(Served):
    """`hetspec-launch CONFIG --http 127.0.0.1:PORT`; `info` is the engine's get_info() once ready."""

    name = "hetspec-launch"

    def __init__(self, config: str, log: Path):
        command = [sys.executable, "-m", "hetspec.cli", *([config] if config else []), "--http",
                   f"127.0.0.1:{free_port()}"]
        super().__init__(command, log, first_line=True)
        self.port = int(command[-1].rsplit(":", 1)[1])
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_stdout, args=(lines,), daemon=True).start()
        try:
            self.endpoint = lines.get(timeout=START_TIMEOUT_S).strip()     # the zmq endpoint comes first
        except queue.Empty:
            self.endpoint = ""
        if not self.endpoint.startswith(("ipc://", "tcp://")):
            self.stop()
            raise RuntimeError(f"hetspec-launch printed no endpoint: {self.tail()}")
        self.wait_ready()
        import hetspec

        engine = hetspec.connect(self.endpoint, token=os.environ.get("HETSPEC_API_KEY", ""))
        try:
            self.info = engine.get_info()
        finally:
            engine.close()

    def _read_stdout(self, lines: queue.Queue) -> None:
        """The first line to `lines`, the rest to the log (a pipe nobody reads would block the server)."""
        lines.put(self.process.stdout.readline())
        try:
            for line in self.process.stdout:
                self.log.write(line)
                self.log.flush()
        except (ValueError, OSError):       # the log closed by stop()
            pass

    def _left_segments(self) -> list[str]:
        """hetspec-launch's run ids begin with its pid: its segments and runtime folders."""
        prefix = f"hetspec-{self.process.pid}-"
        left = glob.glob(f"/dev/shm/{prefix}*") + glob.glob(os.path.join(tempfile.gettempdir(), f"{prefix}*"))
        for path in left:
            subprocess.run(["rm", "-rf", path], check=False)
        return left


class LlamaServer(Served):
    """llama.cpp's llama-server (llama_bin.server_command)."""

    name = "llama-server"

    def __init__(self, command: list[str], log: Path):
        super().__init__(command, log)
        self.wait_ready()


class CpuWatch:
    """CPU seconds the whole machine spent busy over a span, and how much of it was not the server's
    processes' or this one's: on a shared machine, someone else's load shows here; and the time the
    hypervisor gave to other guests (steal)."""

    def __init__(self, processes: list[psutil.Process]):
        self.processes = [psutil.Process(), *processes]
        self.start = (time.perf_counter(), *_machine_s(), self._ours())

    def _ours(self) -> float:
        total = 0.0
        for p in self.processes:
            try:
                times = p.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return total

    def done(self) -> dict:
        now = (time.perf_counter(), *_machine_s(), self._ours())
        wall, busy, steal, ours = (a - b for a, b in zip(now, self.start))
        return {"wall_s": round(wall, 3), "machine_busy_s": round(busy, 3), "ours_s": round(ours, 3),
                "others_cores": round(max(0.0, busy - ours) / wall, 3) if wall > 0 else None,
                "steal_cores": round(steal / wall, 3) if wall > 0 else None}


def _machine_s() -> tuple[float, float]:
    """/proc/stat, every core, in seconds: busy (user, nice, system, irq, softirq) and stolen by the
    hypervisor (a VM's neighbours); zeros elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return sum(fields[i] for i in (0, 1, 2, 5, 6)) / tick, (fields[7] if len(fields) > 7 else 0) / tick


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ---- one streamed request -----------------------------------------------------------------------

def stream_request(url: str, api: str, body: dict, start: threading.Barrier | None = None,
                   api_key: str = "") -> dict:
    """POST one streaming request (after `start`, when given) and time its events: the send, every
    chunk with text (perf_counter seconds, its text), the final usage, llama-server's `timings`,
    hetspec's statistics, the finish reason, or the error."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    record: dict = {"chunks": [], "text": "", "finish_reason": None, "usage": None, "timings": None,
                    "hetspec": None, "error": None}
    with httpx.Client(timeout=REQUEST_TIMEOUT_S, headers=headers) as client:
        if start is not None:
            start.wait()
        record["sent"] = time.perf_counter()
        try:
            with client.stream("POST", url + path, json=body) as response:
                if response.status_code != 200:
                    record["error"] = f"HTTP {response.status_code}: {response.read().decode(errors='replace')[:300]}"
                else:
                    _read_events(response, record)
        except httpx.HTTPError as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
    record["done"] = time.perf_counter()
    record["text"] = "".join(text for _, text in record["chunks"])
    return record


def _read_events(response, record: dict) -> None:
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        if payload.strip() == "[DONE]":
            return
        at, event = time.perf_counter(), json.loads(payload)
        if "error" in event:
            record["error"] = str(event["error"])
            return
        record["usage"] = event.get("usage") or record["usage"]
        record["timings"] = event.get("timings") or record["timings"]
        record["hetspec"] = event.get("hetspec") or record["hetspec"]
        for choice in event.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
            if text:
                record["chunks"].append((at, text))
            record["finish_reason"] = choice.get("finish_reason") or record["finish_reason"]
