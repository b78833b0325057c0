"""Serving an engine over HTTP: OpenAI's API (app.py, protocol.py), Prometheus
metrics (metrics.py), and replicas on Ray Serve (ray_serve.py)."""
from __future__ import annotations

import sys
import threading

WATCH_S = 0.5


def say_restart(engine, said: str | None) -> str | None:
    """Print (once) that the engine's scheduler is being started again; returns what was said."""
    why = engine.restarting()
    if why and why != said:
        print(f"hetspec: {why}", file=sys.stderr, flush=True)
    return why or said


def serve(engine, host: str, port: int, model: str, api_key: str | None = None) -> None:
    """Serve `engine` on host:port until SIGINT or SIGTERM (uvicorn's graceful shutdown),
    or until the engine can serve no more (its scheduler kept dying: it is started
    again after a death, see hetspec.launcher): then raise its EngineDeadError."""
    import uvicorn

    from hetspec.core.errors import EngineDeadError
    from hetspec.http.app import build_app

    server = uvicorn.Server(uvicorn.Config(build_app(engine, model, api_key), host=host, port=port,
                                           log_level="warning", timeout_graceful_shutdown=5))
    died: list[EngineDeadError] = []
    done = threading.Event()

    def watch():
        said = None
        while not done.wait(WATCH_S):
            try:
                engine.check_alive()
            except EngineDeadError as exc:
                died.append(exc)
                server.should_exit = True
                return
            said = say_restart(engine, said)

    watcher = threading.Thread(target=watch, daemon=True, name="hetspec-watch")
    watcher.start()
    try:
        server.run()
    finally:
        done.set()
        watcher.join()
    if died:
        raise died[0]
