"""Replicas of a whole engine on Ray Serve, behind one OpenAI-compatible ingress.

A draft and its target share one host's cores and memory, so hetspec scales
out by replicas of the whole engine: each Ray Serve replica launches its own
engine (scheduler, draft, target) and serves the same API as hetspec-launch
--http. Ray routes requests among replicas; nothing here balances load.

    hetspec-ray [CONFIG] --replicas 2 --http 127.0.0.1:8000     (needs: pip install hetspec[ray])

or, from Python, serve.run(hetspec.http.ray_serve.application(config, replicas=2)).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from ray import serve

from hetspec.client import launch
from hetspec.config import AUTO, load_config
from hetspec.core.errors import EngineDeadError
from hetspec.http.app import build_app

_replica = None   # this process's replica: Ray calls the app builder right after __init__


def _app():
    return build_app(_replica.engine, _replica.model, _replica.api_key)


@serve.ingress(_app)
class EngineReplica:
    """One engine per replica process. Its draft and target are pinned within the
    cores this process may use (Ray's CPU counts are logical: give each replica
    a CPU set of its own with taskset or cgroups when several share a host)."""

    def __init__(self, config: dict, model: str, api_key: str | None):
        global _replica
        self.model, self.api_key = model, api_key
        self.engine = launch(config)
        _replica = self

    def check_health(self):
        """Ray Serve calls this now and then; raising replaces the replica. The engine
        restarts its own workers; a dead scheduler or a given-up target is the end."""
        self.engine.check_alive()
        if dead := self.engine.get_info(timeout_s=30).get("dead"):
            raise EngineDeadError(dead)

    def __del__(self):
        self.engine.close()


def application(config=None, *, model: str = "smollm2", api_key: str | None = None):
    """The Serve application for `config` (a shipped name, a TOML path or a dict): its
    [replicas] section sets the replica count or autoscaling and each replica's resources."""
    engine_config = load_config(config)
    r = engine_config.replicas
    cpus = r.cpus or len(set(engine_config.draft.cores) | set(engine_config.target.cores))
    gpus = r.gpus if r.gpus != AUTO else (1 if engine_config.target.device.startswith("cuda") else 0)
    options = dict(ray_actor_options={"num_cpus": cpus, "num_gpus": gpus}, max_ongoing_requests=r.max_ongoing_requests)
    if r.max_replicas > r.min_replicas:
        options["autoscaling_config"] = {"min_replicas": r.min_replicas, "max_replicas": r.max_replicas,
                                         "target_ongoing_requests": r.target_ongoing_requests}
    else:
        options["num_replicas"] = r.num
    as_dict = config if isinstance(config, dict) else engine_config.to_dict()
    return serve.deployment(EngineReplica, name="hetspec", **options).bind(as_dict, model, api_key)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hetspec-ray", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=None)
    parser.add_argument("--replicas", type=int, help="override [replicas] num")
    parser.add_argument("--http", default="127.0.0.1:8000", metavar="HOST:PORT")
    parser.add_argument("--api-key", default=os.environ.get("HETSPEC_API_KEY"))
    parser.add_argument("--served-model-name")
    args = parser.parse_args(argv)
    host, _, port = args.http.rpartition(":")
    config = load_config(args.config).to_dict()
    if args.replicas:
        config["replicas"] = {**config["replicas"], "num": args.replicas, "min_replicas": 1, "max_replicas": 1}
    model = args.served_model_name or (os.path.splitext(os.path.basename(args.config))[0] if args.config else "smollm2")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):          # first: a signal during start-up stops cleanly too
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": int(port)})
        serve.run(application(config, model=model, api_key=args.api_key), name="hetspec", route_prefix="/")
        print(f"hetspec: OpenAI API at http://{host}:{port}/v1 on Ray Serve; Ctrl-C stops", file=sys.stderr, flush=True)
        stop.wait()
    finally:
        serve.shutdown()                                 # each replica closes its engine
    return 0


if __name__ == "__main__":
    sys.exit(main())
