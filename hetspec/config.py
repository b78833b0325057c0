"""Engine configuration: TOML or dict in, validated frozen dataclasses out.

Every key is checked here, before any process starts, so that a typo or a
missing file fails in a second with a message naming it rather than minutes
later inside a worker. Each section checks its own values (its `checked`
method, beside its fields); what spans sections (the draft's context, the
cores) is resolved last (_resolved).
"""
from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Literal

from hetspec.core.branches import DYNAMIC, Dynamic
from hetspec.core.cores import assign_cores
from hetspec.core.devices import gpu_driver_present
from hetspec.core.errors import ConfigError
from hetspec.core.gpu_profiles import PROFILES
from hetspec.core.gpu_profiles import profile as gpu_profile
from hetspec.core.params import Speculation, show
from hetspec.core.running import MAX_RUNNING, auto_running
from hetspec.ipc.specs import GGUF_TARGET_BACKENDS
from hetspec.models import cache_home, resolve_model

Auto = Literal["auto"]              # a value the engine chooses: at load (cores), or at start-up (gamma)
AUTO: Auto = "auto"
SHIPPED_CONFIGS = {name: f"{name}.toml" for name in
                   ("smollm2", "gemma3-270m", "gemma3-smollm2", "qwen2.5-coder", "qwen2.5-coder-smollm2")}
DEFAULT_CONFIG = "smollm2"
DRAFT_BACKENDS = ("native", "llama.cpp", "torch")
TARGET_BACKENDS = ("auto", "transformers", *GGUF_TARGET_BACKENDS, "paced")
DRAFT_WEIGHTS = ("as-is", "f16", "bf16", "f32", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_1", "q4_0")
CPU_KERNELS = ("gguf", "onednn", "torch")
PASSES = ("auto", "eager", "static", "captured")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class DraftConfig:
    backend: str = "native"             # "native" (a Llama, Qwen2, Qwen3 or Gemma 3 GGUF file's blocks, native_model.c;
                                        # where it cannot run, llama.cpp does), "llama.cpp" (a GGUF file) or "torch"
    model: str = "builtin:smollm2"
    cores: tuple[int, ...] | Auto = AUTO
    threads: int = 0                    # 0: the native draft times 1, 2, 4, ... up to one per pinned core at
                                        # start-up and keeps the fastest; the others take one per core
    n_ctx: int = 0                      # 0: [server] max_context + max_gamma + 1 (twice max_context
                                        # for a draft that is not the target's own model)
    weights: str = "q8_0"               # llama.cpp (and native's fallback): "as-is", or a type to convert to at load;
                                        # native: "q4_1" holds its layers in 4 bits, any other its file's blocks
    prefill_weights: str = "bf16"       # ditto: "same", or a type for a second copy that prefills long prompts
    prefill_borrows_target_cores: bool = True
    prompt_kv: str = "auto"             # "auto": take the target's KV cache of a long prompt when the
                                        # models' caches have one layout (a quantized copy), else prefill it
    vocab: int = 0                      # native: > 0 scores only the first `vocab` token ids (a BPE vocabulary's
                                        # commonest), a smaller output layer read a step; 0: all

    BOUNDS: ClassVar[dict] = {"threads": (0, 1024), "n_ctx": (0, 2**24), "vocab": (0, 2**24)}

    def checked(self, keys: set[str]) -> DraftConfig:
        """keys: the [draft] keys the config sets (llama.cpp's weight options are refused
        with another backend only when set, not at their defaults)."""
        _choice("draft", "backend", self.backend, DRAFT_BACKENDS)
        model = resolve_model(self.model, "draft")      # a ConfigError for a missing file
        if self.backend != "torch" and not model.gguf_file:
            raise ConfigError(f"[draft] backend {self.backend!r} needs a GGUF file, got model {self.model!r} "
                              "(backend = \"torch\" runs a transformers checkpoint or a random model)")
        _choice("draft", "weights", self.weights, DRAFT_WEIGHTS)
        if self.prefill_weights != "same" and self.prefill_weights not in DRAFT_WEIGHTS:
            raise ConfigError(f"[draft] prefill_weights must be 'same' or one of {', '.join(DRAFT_WEIGHTS)}, "
                              f"got {show(self.prefill_weights)}")
        _choice("draft", "prompt_kv", self.prompt_kv, ("own", "auto"))
        if self.vocab and self.backend != "native":
            raise ConfigError(f"[draft] vocab = {self.vocab} needs backend 'native' (its output layer is cut short), "
                              f"got {self.backend!r}")
        if self.backend != "torch":
            return self
        if "weights" in keys and self.weights != "as-is":
            raise ConfigError(f"[draft] weights = {self.weights!r} needs backend 'llama.cpp' (it converts the GGUF file)")
        if "prefill_weights" in keys and self.prefill_weights != "same":
            raise ConfigError(f"[draft] prefill_weights = {self.prefill_weights!r} needs backend 'llama.cpp'")
        return dataclasses.replace(self, weights="as-is", prefill_weights="same")   # they do not apply


@dataclass(frozen=True)
class TargetConfig:
    backend: str = "auto"               # "transformers" (any dtype; CPU or CUDA), "llama.cpp" or "native" (a GGUF
                                        # file's own weights on the CPU, batch-invariant: docs/design.md); "auto": native
                                        # for a GGUF file in float32 on the CPU, else transformers (resolve_backend)
    model: str = "builtin:smollm2"
    device: str = "auto"                # "auto", "cpu", "cuda", "cuda:N"
    dtype: str = "auto"                 # transformers: "auto" is float32 on a CPU; on CUDA a checkpoint's own
                                        # dtype, bfloat16 for a GGUF file or a random model (resolve_dtype)
    cores: tuple[int, ...] | Auto = AUTO
    threads: int = 0
    prefill_borrows_draft_cores: bool = True
    alone_borrows_draft_cores: bool | Auto = AUTO   # decoding alone (mode "target", a rest, a fallback): the draft's
                                                    # cores too; auto: if one token is faster so, timed at start-up
    cpu_kernels: str = "gguf"           # "gguf" (windows read a GGUF target's blocks, else as "onednn"),
                                        # "onednn" (prepacked linear weights, shared GQA heads) or "torch"
    profile: str = ""                   # backend "paced": its GPU profile (hetspec.core.gpu_profiles.PROFILES)
    traces: str = ""                    # backend "paced": the folder of its recorded traces ("": hetspec's cache)
    passes: str | Auto = AUTO           # transformers: "eager" (a growing cache), "static" (each request's cache allocated
                                        # once, windows padded to a few sizes), "captured" (those replayed as CUDA
                                        # graphs); auto: captured on CUDA, eager on a CPU

    BOUNDS: ClassVar[dict] = {"threads": (0, 1024)}

    @property
    def runs_on(self) -> str:
        """Where the target computes: "host" (the CPU's cores), "cuda", or "paced" (as a GPU,
        on no core). Device "auto" is CUDA where a GPU driver is present (as the worker resolves it)."""
        if self.backend == "paced":
            return "paced"
        if self.backend in GGUF_TARGET_BACKENDS or self.device == "cpu":
            return "host"
        return "cuda" if self.device.startswith("cuda") or gpu_driver_present() else "host"

    def checked(self) -> TargetConfig:
        _choice("target", "backend", self.backend, TARGET_BACKENDS)
        model = resolve_model(self.model, "target")
        if self.backend in (*GGUF_TARGET_BACKENDS, "paced") and not model.gguf_file:
            raise ConfigError(f"[target] backend {self.backend!r} needs a GGUF file, got model {self.model!r} "
                              "(backend = \"transformers\" runs a checkpoint or a random model)")
        if self.backend in GGUF_TARGET_BACKENDS and self.device.startswith("cuda"):
            raise ConfigError(f"[target] backend {self.backend!r} runs on the CPU, got device {self.device!r} "
                              "(a CUDA target is backend = \"transformers\")")
        _choice("target", "cpu_kernels", self.cpu_kernels, CPU_KERNELS)
        _choice("target", "passes", self.passes, PASSES)
        if self.passes != AUTO and self.backend not in ("transformers", "auto"):
            raise ConfigError(f"[target] passes = {self.passes!r} is the transformers target's, "
                              f"got backend {self.backend!r}")
        if (self.backend == "paced") != bool(self.profile):
            raise ConfigError("[target] backend 'paced' needs a profile, and only it takes one: profile = one of "
                              f"{', '.join(PROFILES)}, got backend {show(self.backend)}, profile {show(self.profile)}")
        if self.profile:
            _gpu_profile(self.profile)
        if not (self.alone_borrows_draft_cores == AUTO or isinstance(self.alone_borrows_draft_cores, bool)):
            raise ConfigError("[target] alone_borrows_draft_cores must be 'auto', true or false, got "
                              f"{show(self.alone_borrows_draft_cores)}")
        _choice("target", "dtype", self.dtype, DTYPES)
        if not (self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d{1,3}", self.device)):
            raise ConfigError(f"[target] device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {show(self.device)}")
        return self


@dataclass(frozen=True)
class DecodingConfig:
    gamma: int | Auto = AUTO            # auto: measured at start-up (drafting matches verifying), then per round
    sequences: int | Dynamic = DYNAMIC
    max_sequences: int = 4
    max_gamma: int = 32
    keep_drafting: bool | Auto = AUTO  # the draft grows the next window while the target still verifies;
                                        # "auto": only for a GPU target (on a CPU one it slows verification)
    speculation: Speculation = Speculation.AUTO   # auto: target-only rounds while speculating does not pay
    lookup: int = 4                     # tokens a target-only round of a speculative mode may guess by prompt
                                        # lookup (the costs pick fewer where that pays); 0: none
    batch_drafts: bool = True           # requests stepped together draft too, where it pays (scheduler/batch.py)

    BOUNDS: ClassVar[dict] = {"max_sequences": (1, 64), "max_gamma": (1, 256), "lookup": (0, 64)}

    def checked(self) -> DecodingConfig:
        _auto_or_in("decoding", "gamma", self.gamma, 1, self.max_gamma)
        if not (self.keep_drafting == AUTO or isinstance(self.keep_drafting, bool)):
            raise ConfigError(f"[decoding] keep_drafting must be 'auto', true or false, got {show(self.keep_drafting)}")
        _choice("decoding", "speculation", self.speculation, Speculation.values())
        if self.lookup > self.max_gamma:
            raise ConfigError(f"[decoding] lookup ({self.lookup}) must not exceed max_gamma ({self.max_gamma}): "
                              "a guess is verified as a window")
        if self.sequences != DYNAMIC and not (_is_int(self.sequences) and 1 <= self.sequences <= self.max_sequences):
            raise ConfigError("[decoding] sequences must be 'dynamic' or an integer in 1..max_sequences, "
                              f"got {show(self.sequences)}")
        return dataclasses.replace(self, speculation=Speculation(self.speculation))


@dataclass(frozen=True)
class ServerConfig:
    transport: str = "ipc"              # "ipc" (unix socket in a private directory) or "tcp"
    host: str = "127.0.0.1"
    port: int = 0                       # 0: pick a free port
    max_context: int = 4096             # prompt + new tokens
    max_new_tokens: int = 0             # a request's new tokens at most (a larger max_new_tokens is capped to it);
                                        # 0: [server] max_context
    max_running: int | Auto = AUTO      # requests stepped together, a cache each; auto: 4 on a CPU, on CUDA what fits
    batch_tokens: int = 64              # tokens a step of several requests holds: their next tokens and guesses,
                                        # then prompt chunks (vLLM's max_num_batched_tokens)
    turn_s: float = 0.05                # a request alone keeps the engine this long at least once another waits
                                        # (then the other joins it, and they step together)
    max_queue: int = 64                 # requests waiting to be admitted; past it: EngineBusyError
    startup_timeout_s: float = 600.0
    api_key: str = ""                   # clients must send it ("" : none needed); hetspec-launch --api-key sets it
    cores: tuple[int, ...] | Auto = AUTO   # the scheduler's; "auto": the target's (see assign_cores)

    BOUNDS: ClassVar[dict] = {"port": (0, 65535), "max_context": (16, 2**24), "max_new_tokens": (0, 2**31 - 1),
                              "batch_tokens": (1, 2**20), "turn_s": (0.001, 3600), "max_queue": (0, 10**6),
                              "startup_timeout_s": (0.001, 86400)}

    def checked(self) -> ServerConfig:
        _choice("server", "transport", self.transport, ("ipc", "tcp"))
        _auto_or_in("server", "max_running", self.max_running, 1, MAX_RUNNING)
        return dataclasses.replace(self, max_new_tokens=self.max_new_tokens or self.max_context)


@dataclass(frozen=True)
class ReplicasConfig:
    """Ray Serve (hetspec.http.ray_serve): how many engines, and what each asks Ray for."""
    num: int = 1                        # replicas, when not autoscaling
    cpus: int = 0                       # Ray CPUs per replica; 0: the draft's and the target's cores
    gpus: int | Auto = AUTO            # GPUs per replica; "auto": 1 for a CUDA target, else 0
    min_replicas: int = 1               # autoscaling, when max_replicas > min_replicas
    max_replicas: int = 1
    target_ongoing_requests: float = 2.0
    max_ongoing_requests: int = 8       # per replica; the engine queues them and they take turns

    BOUNDS: ClassVar[dict] = {"num": (1, 4096), "cpus": (0, 1 << 16), "min_replicas": (1, 4096),
                              "max_replicas": (1, 4096), "target_ongoing_requests": (0.001, 10**6),
                              "max_ongoing_requests": (1, 10**6)}

    def checked(self) -> ReplicasConfig:
        if self.max_replicas < self.min_replicas:
            raise ConfigError(f"[replicas] max_replicas ({self.max_replicas}) is below min_replicas "
                              f"({self.min_replicas})")
        _auto_or_in("replicas", "gpus", self.gpus, 0, 64)
        return self


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
OTHERS_SECTIONS = ("bench",)   # a table the engine leaves to another command (hetspec-bench's settings)
_WORD_OR_NUMBERS = {"cores", "gamma", "sequences", "keep_drafting", "gpus", "speculation", "alone_borrows_draft_cores",
                    "max_running"}   # each section's checked() checks these
_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def load_config(source: None | str | os.PathLike | dict = None) -> EngineConfig:
    """Build a validated EngineConfig from None (the embedded default), a shipped
    config name, a TOML path, or a dict shaped like the TOML file."""
    if isinstance(source, EngineConfig):
        return source
    return _build(source if isinstance(source, dict) else read_config(source))


def read_config(source: str | os.PathLike | None = None) -> dict:
    """A config as written (a shipped name or a TOML path): its tables, nothing resolved
    ("auto" stays "auto"), for a tool that changes it before the engine loads it."""
    text = _read_config_text(str(DEFAULT_CONFIG if source is None else source))
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {source}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config {source}: invalid TOML: nested too deeply") from None


def _read_config_text(source: str) -> str:
    if source in SHIPPED_CONFIGS:
        return resources.files("hetspec.configs").joinpath(SHIPPED_CONFIGS[source]).read_text()
    try:
        if not Path(source).is_file():
            raise ConfigError(f"config file not found: {source} (shipped configs: {', '.join(SHIPPED_CONFIGS)})")
        return Path(source).read_text()
    except (OSError, ValueError) as exc:        # unreadable, not UTF-8, or a path no file system takes
        raise ConfigError(f"config file {show(source)} cannot be read: {exc}") from None


def _build(data: dict) -> EngineConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a table (a dict), got {type(data).__name__}")
    unknown = set(data) - set(_SECTIONS) - set(OTHERS_SECTIONS)
    if unknown:
        names = ", ".join(sorted(map(_key, unknown)))
        raise ConfigError(f"unknown config section(s): {names}; known: {', '.join(_SECTIONS)}")
    parts = {}
    for name, cls in _SECTIONS.items():
        section = data.get(name, {})
        if not isinstance(section, dict):
            raise ConfigError(f"config section [{name}] must be a table")
        known = {f.name for f in dataclasses.fields(cls)}
        bad = set(section) - known
        if bad:
            raise ConfigError(f"unknown key(s) in [{name}]: {', '.join(sorted(map(_key, bad)))}; "
                              f"known: {', '.join(sorted(known))}")
        _check_types(name, cls, section)
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in section.items()}
        parts[name] = cls(**values)
    config = EngineConfig(draft=parts["draft"].checked(set(data.get("draft", {}))), target=parts["target"].checked(),
                          decoding=parts["decoding"].checked(), server=parts["server"].checked(),
                          replicas=parts["replicas"].checked())
    return _resolved(config)


def _check_types(name: str, cls, section: dict) -> None:
    """Each value has its field's type and lies in its range (cls.BOUNDS), so that a
    wrong one fails here rather than deep inside the engine."""
    for f in dataclasses.fields(cls):
        if f.name not in section or f.name in _WORD_OR_NUMBERS:
            continue
        value, kind = section[f.name], type(f.default)
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise ConfigError(f"[{name}] {f.name} must be {_KIND_NAMES[kind]}, got {show(value)}")
        low, high = cls.BOUNDS.get(f.name, (None, None))
        if low is not None and not low <= value <= high:   # (NaN fails both comparisons)
            raise ConfigError(f"[{name}] {f.name} must be in {low}..{high}, got {show(value)}")


def _resolved(c: EngineConfig) -> EngineConfig:
    """What spans sections: the draft's context, every process's cores, and max_running "auto"
    but on CUDA (hetspec.core.running)."""
    d, s, max_gamma = c.draft, c.server, c.decoding.max_gamma
    if d.n_ctx == 0:   # another model may need more tokens for the same text (a draft of another vocabulary)
        d = dataclasses.replace(d, n_ctx=s.max_context * (1 if d.model == c.target.model else 2) + max_gamma + 1)
    if d.n_ctx < s.max_context + max_gamma + 1:
        raise ConfigError(f"[draft] n_ctx ({d.n_ctx}) must be at least [server] max_context + max_gamma + 1 "
                          f"({s.max_context + max_gamma + 1})")
    draft_cores, target_cores, scheduler_cores = assign_cores(d.cores, c.target.cores, s.cores, c.target.runs_on)
    running = s.max_running if s.max_running != AUTO else auto_running(c.target.runs_on) or AUTO   # CUDA: the worker
    traces = c.target.traces or (str(cache_home() / "traces") if c.target.backend == "paced" else "")
    return dataclasses.replace(
        c,
        draft=dataclasses.replace(d, cores=draft_cores),      # threads 0 stays: the launcher's DraftSpec says
        target=dataclasses.replace(c.target, cores=target_cores, threads=c.target.threads or len(target_cores),
                                   traces=traces),
        server=dataclasses.replace(s, cores=scheduler_cores, max_running=running),
    )


def _choice(section: str, key: str, value, choices: tuple) -> None:
    if not (isinstance(value, str) and value in choices):
        allowed = " or ".join(map(repr, choices)) if len(choices) == 2 else f"one of {', '.join(choices)}"
        raise ConfigError(f"[{section}] {key} must be {allowed}, got {show(value)}")


def _gpu_profile(value) -> None:
    """A built-in profile's name, or a gpu_profile report (FILE.json) checked here, not in the worker."""
    if not (isinstance(value, str) and value.endswith(".json")):
        _choice("target", "profile", value, (*PROFILES, "a gpu_profile report (FILE.json)"))
        return
    try:
        gpu_profile(value)
    except ValueError as exc:
        raise ConfigError(f"[target] profile: {exc}") from None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _auto_or_in(section: str, key: str, value, low: int, high: int) -> None:
    if not (value == AUTO or (_is_int(value) and low <= value <= high)):
        raise ConfigError(f"[{section}] {key} must be 'auto' or an integer in {low}..{high}, got {show(value)}")


def _key(key) -> str:
    """A key as a message names it: as written, its odd characters escaped."""
    return show(key)[1:-1] if isinstance(key, str) and len(key) < 60 else show(key)
