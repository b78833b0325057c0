"""hetspec-launch: start an engine and serve it, or run one prompt and exit.

    hetspec-launch                      serve the embedded default; prints the endpoint
    hetspec-launch gemma3-270m          a shipped config by name, or a path to a TOML file
    hetspec-launch --prompt "Hi"        run one request, stream its text, print the stats
    hetspec-launch --http 127.0.0.1:8000 [--api-key KEY]
                                        serve an OpenAI-compatible HTTP API (and /metrics)
"""
from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import os
import signal
import sys
import threading
from pathlib import Path

from hetspec.client import launch
from hetspec.config import load_config
from hetspec.core.errors import HetspecError
from hetspec.core.params import SamplingParams, check_prompt
from hetspec.http import say_restart


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """A bad argument is one line on stderr (not argparse's usage block), like every other error."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    http = _host_port(parser, args.http) if args.http else None
    signals = _Signals()
    try:
        if args.prompt is not None:
            request = _request(args)               # a bad request fails before the engine starts
            check_prompt(request.get("prompt"), request.get("messages"))
        config = load_config(args.config)
        if args.api_key:
            config = dataclasses.replace(config, server=dataclasses.replace(config.server, api_key=args.api_key))
        with launch(config) as engine:
            if args.prompt is not None:
                return _one_shot(engine, args)
            signals.serving = True
            print(engine.endpoint, flush=True)
            return _serve_http(engine, args, *http) if http else _serve(engine, signals.stop)
    except HetspecError as exc:
        print(f"hetspec-launch: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> _Parser:
    parser = _Parser(prog="hetspec-launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=None,
                        help="TOML config path or shipped config name (default: the embedded SmolLM2 pair)")
    parser.add_argument("--prompt", help="run this one prompt, print the result and exit")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--mode", default="duodec", help="duodec (default), sequential, target or lookup")
    parser.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--http", metavar="HOST:PORT", help="serve OpenAI's HTTP API there (e.g. 127.0.0.1:8000)")
    parser.add_argument("--api-key", default=os.environ.get("HETSPEC_API_KEY"),
                        help="clients must send it (HTTP: 'Authorization: Bearer KEY'; zmq: the token); "
                             "default $HETSPEC_API_KEY")
    parser.add_argument("--served-model-name", help="the model name of the HTTP API (default: the config's)")
    return parser


class _Signals:
    """SIGINT and SIGTERM. Serving: stop. Starting, or running one prompt: unwind once
    (closing the engine on the way out); a second signal must not interrupt that cleanup."""

    def __init__(self):
        self.stop, self.serving, self.interrupted = threading.Event(), False, False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, *_):
        if self.serving or self.interrupted:
            self.stop.set()
            return
        self.interrupted = True
        raise KeyboardInterrupt


def _serve(engine, stop: threading.Event) -> int:
    """Serve the zmq endpoint until stopped; saying so when the scheduler is started again."""
    print(f"hetspec: serving (gamma={engine.info['gamma']}); Ctrl-C stops", file=sys.stderr, flush=True)
    said = None
    while not stop.wait(0.5):
        engine.check_alive()               # the scheduler kept dying: exit non-zero, saying why
        said = say_restart(engine, said)   # it died: its launcher (this process) starts it again
    return 0


def _host_port(parser, value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        parser.error(f"--http takes HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _serve_http(engine, args, host: str, port: int) -> int:
    from hetspec.http import serve

    if not args.api_key and not _loopback(host):
        print(f"hetspec-launch: warning: serving {host} without --api-key: anyone who can reach this "
              "address can use the engine", file=sys.stderr, flush=True)
    name = args.served_model_name or (Path(args.config).stem if args.config else "smollm2")
    print(f"hetspec: OpenAI API at http://{host}:{port}/v1 (model {name!r}, gamma={engine.info['gamma']}); "
          "Ctrl-C stops", file=sys.stderr, flush=True)
    serve(engine, host, port, name, args.api_key)
    return 0


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _request(args) -> dict:
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            seed=args.seed, mode=args.mode)
    request = dict(params=params)
    if args.chat:
        request["messages"] = [{"role": "user", "content": args.prompt}]
    else:
        request["prompt"] = args.prompt
    return request


def _one_shot(engine, args) -> int:
    request = _request(args)
    if args.json:
        result = engine.generate(**request)
        print(json.dumps({"text": result.text, "token_ids": result.token_ids,
                          "finish_reason": result.finish_reason, "stats": result.stats}))
        return 0
    for piece in engine.stream(**request):
        print(piece, end="", flush=True)
    stats = engine.last_result.stats
    print()
    rested = f", {stats['rested']} tokens by the target alone (drafting did not pay)" if stats["rested"] else ""
    if stats.get("fallback"):
        rested += f", the target alone: {stats['fallback']}"
    print(f"[{stats['new_tokens']} tokens in {stats['total_s']:.2f} s: {stats['tokens_per_s']:.1f} tok/s, "
          f"ttft {stats['ttft_s'] * 1000:.0f} ms, mode {stats['mode']}, gamma {stats['gamma']}, "
          f"acceptance {stats['acceptance_rate']:.1%}, {stats['mean_accepted_per_round']:.2f} tokens/round{rested}]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
