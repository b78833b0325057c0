"""Engine configuration: TOML or dict in, validated frozen dataclasses out.

Every key is checked here, before any process starts, so that a typo or a
missing file fails in a second with a message naming it rather than minutes
later inside a worker.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import psutil

from hetspec.core.errors import ConfigError
from hetspec.core.params import SPECULATION
from hetspec.models import resolve_model

SHIPPED_CONFIGS = {"smollm2": "smollm2.toml", "gemma3-270m": "gemma3-270m.toml", "gemma3-smollm2": "gemma3-smollm2.toml"}
DEFAULT_CONFIG = "smollm2"
MODES = ("duodec", "sequential", "target")
DRAFT_WEIGHTS = ("as-is", "f16", "bf16", "f32", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")
CPU_KERNELS = ("gguf", "onednn", "torch")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class DraftConfig:
    backend: str = "native"             # "native" (a Llama or Gemma 3 GGUF file's blocks, workers/kernels/native_draft.c;
                                        # where it cannot run, llama.cpp does), "llama.cpp" (a GGUF file) or "torch"
    model: str = "builtin:smollm2"
    cores: tuple[int, ...] | str = "auto"
    threads: int = 0                    # 0: one thread per pinned core
    n_ctx: int = 0                      # 0: [server] max_context + max_gamma + 1 (twice max_context
                                        # for a draft that is not the target's own model)
    weights: str = "q8_0"               # llama.cpp (and native's fallback): "as-is", or a type to convert to at load
    prefill_weights: str = "bf16"       # ditto: "same", or a type for a second copy that prefills long prompts
    prefill_borrows_target_cores: bool = True
    prompt_kv: str = "auto"             # "auto": take the target's KV cache of a long prompt when the
                                        # models' caches have one layout (a quantized copy), else prefill it


@dataclass(frozen=True)
class TargetConfig:
    model: str = "builtin:smollm2"
    device: str = "auto"                # "auto", "cpu", "cuda", "cuda:N"
    dtype: str = "float32"
    cores: tuple[int, ...] | str = "auto"
    threads: int = 0
    prefill_borrows_draft_cores: bool = True
    cpu_kernels: str = "gguf"           # "gguf" (windows read a GGUF target's blocks, else as "onednn"),
                                        # "onednn" (prepacked linear weights, shared GQA heads) or "torch"


@dataclass(frozen=True)
class DecodingConfig:
    gamma: int | str = "auto"
    sequences: int | str = "dynamic"
    max_sequences: int = 4
    max_gamma: int = 32
    keep_drafting: bool | str = "auto"  # the draft grows the next window while the target still verifies;
                                        # "auto": only for a GPU target (on a CPU one it slows verification)
    speculation: str = "auto"           # "auto": target-only rounds while speculating does not pay; "always"


@dataclass(frozen=True)
class ServerConfig:
    transport: str = "ipc"              # "ipc" (unix socket in a private directory) or "tcp"
    host: str = "127.0.0.1"
    port: int = 0                       # 0: pick a free port
    max_context: int = 4096             # prompt + new tokens
    max_queue: int = 64                 # requests waiting behind the running one; past it: EngineBusyError
    startup_timeout_s: float = 600.0
    api_key: str = ""                   # clients must send it ("" : none needed); hetspec-launch --api-key sets it
    cores: tuple[int, ...] | str = "auto"   # the scheduler's; "auto": the target's (see assign_cores)


@dataclass(frozen=True)
class ReplicasConfig:
    """Ray Serve (hetspec.http.ray_serve): how many engines, and what each asks Ray for."""
    num: int = 1                        # replicas, when not autoscaling
    cpus: int = 0                       # Ray CPUs per replica; 0: the draft's and the target's cores
    gpus: int | str = "auto"            # GPUs per replica; "auto": 1 for a CUDA target, else 0
    min_replicas: int = 1               # autoscaling, when max_replicas > min_replicas
    max_replicas: int = 1
    target_ongoing_requests: float = 2.0
    max_ongoing_requests: int = 8       # per replica; one decodes at a time, the rest queue in its engine


@dataclass(frozen=True)
class EngineConfig:
    draft: DraftConfig = field(default_factory=DraftConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = {"draft": DraftConfig, "target": TargetConfig, "decoding": DecodingConfig, "server": ServerConfig,
             "replicas": ReplicasConfig}
_WORD_OR_NUMBERS = {"cores", "gamma", "sequences", "keep_drafting", "gpus"}   # "auto"/"dynamic" or others: see _validated
_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _check_types(name: str, cls, section: dict) -> None:
    """Each value has its field's type, so a wrong one fails here rather than deep inside the engine."""
    for f in dataclasses.fields(cls):
        if f.name not in section or f.name in _WORD_OR_NUMBERS:
            continue
        value, kind = section[f.name], type(f.default)
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise ConfigError(f"[{name}] {f.name} must be {_KIND_NAMES[kind]}, got {value!r}")


def load_config(source: None | str | os.PathLike | dict = None) -> EngineConfig:
    """Build a validated EngineConfig from None (the embedded default), a shipped
    config name, a TOML path, or a dict shaped like the TOML file."""
    if isinstance(source, EngineConfig):
        return source
    if source is None:
        source = DEFAULT_CONFIG
    if isinstance(source, dict):
        data = source
    else:
        text = _read_config_text(str(source))
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {source}: invalid TOML: {exc}") from None
    return _build(data)


def _read_config_text(source: str) -> str:
    if source in SHIPPED_CONFIGS:
        return resources.files("hetspec.configs").joinpath(SHIPPED_CONFIGS[source]).read_text()
    path = Path(source)
    if not path.is_file():
        shipped = ", ".join(SHIPPED_CONFIGS)
        raise ConfigError(f"config file not found: {source} (shipped configs: {shipped})")
    return path.read_text()


def _build(data: dict) -> EngineConfig:
    unknown = set(data) - set(_SECTIONS)
    if unknown:
        raise ConfigError(f"unknown config section(s): {', '.join(sorted(unknown))}; known: {', '.join(_SECTIONS)}")
    parts = {}
    for name, cls in _SECTIONS.items():
        section = data.get(name, {})
        if not isinstance(section, dict):
            raise ConfigError(f"config section [{name}] must be a table")
        known = {f.name for f in dataclasses.fields(cls)}
        bad = set(section) - known
        if bad:
            raise ConfigError(f"unknown key(s) in [{name}]: {', '.join(sorted(bad))}; known: {', '.join(sorted(known))}")
        _check_types(name, cls, section)
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in section.items()}
        parts[name] = cls(**values)
    config = EngineConfig(**parts)
    return _validated(config, set(data.get("draft", {})))


def _validated(c: EngineConfig, draft_keys: set[str]) -> EngineConfig:
    """draft_keys: the [draft] keys the config sets (llama.cpp's weight options are
    refused with another backend only when set, not at their defaults)."""
    d, t, dec, s = c.draft, c.target, c.decoding, c.server
    if d.backend not in ("native", "llama.cpp", "torch"):
        raise ConfigError(f"[draft] backend must be 'native', 'llama.cpp' or 'torch', got {d.backend!r}")
    for section, model in (("draft", d.model), ("target", t.model)):
        resolve_model(model, section)   # raises ConfigError for a missing file
    if d.backend in ("native", "llama.cpp") and not resolve_model(d.model, "draft").gguf_file:
        raise ConfigError(f"[draft] backend {d.backend!r} needs a GGUF file, got model {d.model!r} "
                          "(backend = \"torch\" runs a transformers checkpoint or a random model)")
    if d.weights not in DRAFT_WEIGHTS:
        raise ConfigError(f"[draft] weights must be one of {', '.join(DRAFT_WEIGHTS)}, got {d.weights!r}")
    if "weights" in draft_keys and d.weights != "as-is" and d.backend == "torch":
        raise ConfigError(f"[draft] weights = {d.weights!r} needs backend 'llama.cpp' (it converts the GGUF file)")
    if d.prefill_weights != "same" and d.prefill_weights not in DRAFT_WEIGHTS:
        raise ConfigError(f"[draft] prefill_weights must be 'same' or one of {', '.join(DRAFT_WEIGHTS)}, "
                          f"got {d.prefill_weights!r}")
    if "prefill_weights" in draft_keys and d.prefill_weights != "same" and d.backend == "torch":
        raise ConfigError(f"[draft] prefill_weights = {d.prefill_weights!r} needs backend 'llama.cpp'")
    if d.backend == "torch":   # llama.cpp's weight options do not apply: resolved to "no conversion"
        d = dataclasses.replace(d, weights="as-is", prefill_weights="same")
    if d.prompt_kv not in ("own", "auto"):
        raise ConfigError(f"[draft] prompt_kv must be 'own' or 'auto', got {d.prompt_kv!r}")
    if t.cpu_kernels not in CPU_KERNELS:
        raise ConfigError(f"[target] cpu_kernels must be one of {', '.join(CPU_KERNELS)}, got {t.cpu_kernels!r}")
    if t.dtype not in DTYPES:
        raise ConfigError(f"[target] dtype must be one of {', '.join(DTYPES)}, got {t.dtype!r}")
    if not (t.device in ("auto", "cpu", "cuda") or t.device.startswith("cuda:")):
        raise ConfigError(f"[target] device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {t.device!r}")
    for name, value in (("[draft] threads", d.threads), ("[target] threads", t.threads)):
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
    if not isinstance(dec.max_gamma, int) or dec.max_gamma < 1:
        raise ConfigError(f"[decoding] max_gamma must be a positive integer, got {dec.max_gamma!r}")
    if dec.gamma != "auto" and not (isinstance(dec.gamma, int) and 1 <= dec.gamma <= dec.max_gamma):
        raise ConfigError(f"[decoding] gamma must be 'auto' or an integer in 1..{dec.max_gamma}, got {dec.gamma!r}")
    if not (dec.keep_drafting == "auto" or isinstance(dec.keep_drafting, bool)):
        raise ConfigError(f"[decoding] keep_drafting must be 'auto', true or false, got {dec.keep_drafting!r}")
    if not isinstance(dec.max_sequences, int) or dec.max_sequences < 1:
        raise ConfigError(f"[decoding] max_sequences must be a positive integer, got {dec.max_sequences!r}")
    if dec.speculation not in SPECULATION:
        raise ConfigError(f"[decoding] speculation must be one of {', '.join(SPECULATION)}, got {dec.speculation!r}")
    if dec.sequences != "dynamic" and not (isinstance(dec.sequences, int) and 1 <= dec.sequences <= dec.max_sequences):
        raise ConfigError(f"[decoding] sequences must be 'dynamic' or an integer in 1..max_sequences, got {dec.sequences!r}")
    if s.transport not in ("ipc", "tcp"):
        raise ConfigError(f"[server] transport must be 'ipc' or 'tcp', got {s.transport!r}")
    if not isinstance(s.port, int) or not 0 <= s.port <= 65535:
        raise ConfigError(f"[server] port must be in 0..65535, got {s.port!r}")
    if not isinstance(s.max_context, int) or s.max_context < 16:
        raise ConfigError(f"[server] max_context must be an integer >= 16, got {s.max_context!r}")
    if not isinstance(s.max_queue, int) or s.max_queue < 0:
        raise ConfigError(f"[server] max_queue must be an integer >= 0, got {s.max_queue!r}")
    if not s.startup_timeout_s > 0:
        raise ConfigError(f"[server] startup_timeout_s must be positive, got {s.startup_timeout_s!r}")
    r = c.replicas
    for name in ("num", "min_replicas", "max_replicas", "max_ongoing_requests"):
        if getattr(r, name) < 1:
            raise ConfigError(f"[replicas] {name} must be at least 1, got {getattr(r, name)!r}")
    if r.max_replicas < r.min_replicas:
        raise ConfigError(f"[replicas] max_replicas ({r.max_replicas}) is below min_replicas ({r.min_replicas})")
    if r.cpus < 0 or r.target_ongoing_requests <= 0:
        raise ConfigError("[replicas] cpus must be >= 0 and target_ongoing_requests > 0")
    if not (r.gpus == "auto" or (isinstance(r.gpus, int) and not isinstance(r.gpus, bool) and r.gpus >= 0)):
        raise ConfigError(f"[replicas] gpus must be 'auto' or an integer >= 0, got {r.gpus!r}")
    if d.n_ctx < 0:
        raise ConfigError(f"[draft] n_ctx must be 0 (automatic) or a positive integer, got {d.n_ctx!r}")
    if d.n_ctx == 0:   # another model may need more tokens for the same text (a draft of another vocabulary)
        d = dataclasses.replace(d, n_ctx=s.max_context * (1 if d.model == t.model else 2) + dec.max_gamma + 1)
    if d.n_ctx < s.max_context + dec.max_gamma + 1:
        raise ConfigError(f"[draft] n_ctx ({d.n_ctx}) must be at least [server] max_context + max_gamma + 1 "
                          f"({s.max_context + dec.max_gamma + 1})")
    draft_cores, target_cores, scheduler_cores = assign_cores(d.cores, t.cores, s.cores)
    return dataclasses.replace(
        c,
        draft=dataclasses.replace(d, cores=draft_cores, threads=d.threads or len(draft_cores)),
        target=dataclasses.replace(t, cores=target_cores, threads=t.threads or len(target_cores)),
        server=dataclasses.replace(s, cores=scheduler_cores),
    )


def available_cores() -> list[int]:
    return sorted(psutil.Process().cpu_affinity())


def assign_cores(draft: tuple[int, ...] | str, target: tuple[int, ...] | str,
                 scheduler: tuple[int, ...] | str = "auto") -> tuple[tuple[int, ...], ...]:
    """Resolve "auto": the draft owns the first core, the target the rest
    (on a 2-core machine: draft on core 0, target on core 1), and the scheduler
    shares the target's.

    The scheduler's own work (starting both workers, streaming, bookkeeping)
    runs while both compute, so it must sit beside the side with time to
    spare; the budget makes the draft the longer side, so beside the target
    (docs/performance.md, "Where the scheduler sits")."""
    cores = available_cores()
    for name, value in (("draft", draft), ("target", target), ("server", scheduler)):
        if value == "auto":
            continue
        if not isinstance(value, tuple) or not value \
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in value) or len(set(value)) != len(value):
            raise ConfigError(f"[{name}] cores must be 'auto' or a non-empty list of distinct core numbers, "
                              f"got {value!r}")
        missing = sorted(set(value) - set(cores))
        if missing:
            raise ConfigError(f"[{name}] cores {missing} do not exist on this machine (available: {cores})")
    if draft == "auto":
        draft = (cores[0],)
    if target == "auto":
        rest = [x for x in cores if x not in draft]
        target = tuple(rest) if rest else tuple(cores)
    if scheduler == "auto":
        scheduler = target
    return tuple(draft), tuple(target), tuple(scheduler)
