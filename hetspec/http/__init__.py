"""Serving an engine over HTTP: OpenAI's API (app.py, protocol.py), Prometheus
metrics (metrics.py), and replicas on Ray Serve (ray_serve.py)."""
from __future__ import annotations


def serve(engine, host: str, port: int, model: str, api_key: str | None = None) -> None:
    """Serve `engine` on host:port until SIGINT or SIGTERM (uvicorn's graceful shutdown)."""
    import uvicorn

    from hetspec.http.app import build_app

    uvicorn.run(build_app(engine, model, api_key), host=host, port=port, log_level="warning",
                timeout_graceful_shutdown=5)
