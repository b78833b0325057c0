"""docs/configuration.md documents every config key with the default hetspec/config.py gives it.

The page has a heading per config section (`## [draft]`, ...), each over a table whose rows
start with the key (or keys, comma-separated) and its default (or defaults, in the same
order), written as TOML values. A default that is a word ("auto", "dynamic", a
Speculation) compares by its string form, as a config file would spell it."""
import dataclasses
import re
import tomllib
from pathlib import Path

from hetspec.config import EngineConfig

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def documented() -> dict[tuple[str, str], str]:
    """(section, key) -> the default as written, from every table row under a `## [section]` heading."""
    found, section = {}, None
    for line in PAGE.read_text().splitlines():
        if heading := re.fullmatch(r"## \[(\w+)\].*", line):
            section = heading[1]
        elif section and line.startswith("| `"):
            keys_cell, defaults_cell = line.split("|")[1:3]
            keys = re.findall(r"`(\w+)`", keys_cell)
            defaults = [d.strip().strip("`") for d in defaults_cell.split(", ")]
            assert len(keys) == len(defaults), f"[{section}] {keys}: {len(defaults)} defaults for {len(keys)} keys"
            found.update({(section, k): d for k, d in zip(keys, defaults)})
    return found


def in_code() -> dict[tuple[str, str], object]:
    """(section, key) -> the dataclass default, for every field of every section of EngineConfig."""
    return {(section.name, f.name): f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for section in dataclasses.fields(EngineConfig) for f in dataclasses.fields(section.default_factory())}


def parsed(written: str) -> object:
    """A documented default as TOML reads it (text that is not a TOML value stays text, and differs)."""
    try:
        return tomllib.loads(f"v = {written}")["v"]
    except tomllib.TOMLDecodeError:
        return written


def as_written(default: object) -> object:
    """A default as the page writes it: words (AUTO, DYNAMIC, Speculation.AUTO) by their string form."""
    return str(default) if isinstance(default, str) else default


def test_every_config_key_is_documented():
    missing = sorted(f"[{s}] {k}" for s, k in in_code().keys() - documented().keys())
    unknown = sorted(f"[{s}] {k}" for s, k in documented().keys() - in_code().keys())
    assert not missing, f"docs/configuration.md lacks {', '.join(missing)}"
    assert not unknown, f"docs/configuration.md documents keys config.py does not have: {', '.join(unknown)}"


def test_every_documented_default_is_the_codes():
    docs, code = documented(), in_code()
    wrong = []
    for key in sorted(docs.keys() & code.keys()):
        written, expected = parsed(docs[key]), as_written(code[key])
        if written != expected or type(written) is not type(expected):
            wrong.append(f"[{key[0]}] {key[1]}: documented {docs[key]}, config.py {expected!r}")
    assert not wrong, "docs/configuration.md's defaults differ from hetspec/config.py's: " + "; ".join(wrong)
