"""Real servers for the concurrency benchmark and hetspec-fuzz, each in its own process group:
`hetspec-launch CONFIG --http` and llama.cpp's `llama-server` on a free loopback port, ready once
`GET /health` answers 200, stopped whole (what was left behind is killed, removed and named); and
one streaming OpenAI request, its server-sent events timed as they arrive."""
from __future__ import annotations

import contextlib
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

import hetspec

START_TIMEOUT_S = 600           # a first start compiles hetspec's kernels; a 1.5B model loads in seconds
STOP_TIMEOUT_S = 60
REQUEST_TIMEOUT_S = 1800


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A server process on 127.0.0.1:port, logging to `log` (its stdout piped instead where `first_line`), such as
    llama.cpp's llama-server (llama_bin.server_command)."""

    def __init__(self, command: list[str], log: Path, first_line: bool = False, name: str = "llama-server"):
        self.port = int(command[command.index("--port") + 1]) if "--port" in command else None
        self.command, self.log_path, self.name = command, log, name
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
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    root = psutil.Process(self.process.pid)
                    self.processes = [root, *root.children(recursive=True)]
                    return
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
        left = []
        for p in psutil.wait_procs(self.processes, timeout=STOP_TIMEOUT_S)[1]:
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"process {p.pid} ({p.name()})")
                p.kill()
        self.log.close()
        return left + self._left_segments()

    def _left_segments(self) -> list[str]:
        return []


class HetspecServer(Served):
    """`hetspec-launch CONFIG --http 127.0.0.1:PORT [ARGS]`; `info` is the engine's get_info() once ready."""

    def __init__(self, config: str, log: Path, *args: str, api_key: str | None = None):
        port = free_port()
        super().__init__([sys.executable, "-m", "hetspec.cli", *([config] if config else []), "--http",
                          f"127.0.0.1:{port}", *args], log, first_line=True, name="hetspec-launch")
        self.port = port
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_stdout, args=(lines,), daemon=True).start()
        self.endpoint = ""
        with contextlib.suppress(queue.Empty):
            self.endpoint = lines.get(timeout=START_TIMEOUT_S).strip()     # the zmq endpoint comes first
        if not self.endpoint.startswith(("ipc://", "tcp://")):
            self.stop()
            raise RuntimeError(f"hetspec-launch printed no endpoint: {self.tail()}")
        self.wait_ready()
        with hetspec.connect(self.endpoint, token=os.environ.get("HETSPEC_API_KEY", "") if api_key is None
                             else api_key) as engine:
            self.info = engine.get_info()

    def _read_stdout(self, lines: queue.Queue) -> None:
        """The first line to `lines`, the rest to the log (a pipe nobody reads would block the server)."""
        lines.put(self.process.stdout.readline())
        with contextlib.suppress(ValueError, OSError):       # the log closed by stop()
            for line in self.process.stdout:
                self.log.write(line)
                self.log.flush()

    def _left_segments(self) -> list[str]:
        """hetspec-launch's run ids begin with its pid: its segments and runtime folders."""
        prefix = f"hetspec-{self.process.pid}-"
        left = glob.glob(f"/dev/shm/{prefix}*") + glob.glob(os.path.join(tempfile.gettempdir(), f"{prefix}*"))
        for path in left:
            subprocess.run(["rm", "-rf", path], check=False)
        return left


def stream_request(url: str, api: str, body: dict, start: threading.Barrier | None = None, api_key: str = "") -> dict:
    """POST one streaming request (after `start`, when given) and time its events: the send, every chunk with text
    (perf_counter seconds, its text), the final usage, llama-server's `timings`, hetspec's statistics, the finish
    reason, or the error."""
    record: dict = {"chunks": [], "text": "", "finish_reason": None, "usage": None, "timings": None,
                    "hetspec": None, "error": None}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
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
        if not line.startswith("data: ") or line[6:].strip() == "[DONE]":
            continue
        at, event = time.perf_counter(), json.loads(line[6:])
        if "error" in event:
            record["error"] = str(event["error"])
            return
        for key in ("usage", "timings", "hetspec"):
            record[key] = event.get(key) or record[key]
        for choice in event.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
            if text:
                record["chunks"].append((at, text))
            record["finish_reason"] = choice.get("finish_reason") or record["finish_reason"]
