"""The architecture's walls, checked: the engine side never imports worker code,
the workers never import the engine side, the transport imports neither, and
the shared core imports nothing of hetspec's but itself. Also what a wheel
installs: everything under the project's own name, no package left out."""
import ast
import configparser
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Folder in the checkout -> the package it installs as (setup.cfg's package_dir).
FOLDERS = {"hetspec": "hetspec", "workers": "hetspec.workers", "ipc": "hetspec.ipc", "benchmarks": "hetspec.benchmarks"}
CORE, IPC, WORKERS, BENCH = "hetspec.core", "hetspec.ipc", "hetspec.workers", "hetspec.benchmarks"


def _modules():
    """(module name, path) of every Python module of the package."""
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            yield ".".join([package, *parts]).removesuffix(".__init__"), path


def _side(module: str) -> str:
    for prefix, side in ((CORE, "core"), (IPC, "ipc"), (WORKERS, "workers"), (BENCH, "benchmarks")):
        if module == prefix or module.startswith(prefix + "."):
            return side
    return "engine"


# What each side may import of hetspec's own modules.
ALLOWED = {
    "core": {"core"},
    "ipc": {"core", "ipc"},
    "workers": {"core", "ipc", "workers"},
    "engine": {"core", "ipc", "engine"},
    "benchmarks": {"core", "ipc", "workers", "engine", "benchmarks"},   # it measures every part
}


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            yield node.module


@pytest.mark.parametrize("module, path", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_each_side_imports_only_what_it_may(module, path):
    side = _side(module)
    for name in _imports(path):
        top = name.split(".")[0]
        assert top not in ("workers", "ipc", "benchmarks"), f"{module} imports {name}: use hetspec.{name}"
        if top == "hetspec" and name != "hetspec":
            assert _side(name) in ALLOWED[side], f"{module} ({side}) may not import {name} ({_side(name)})"


def test_a_worker_process_loads_no_engine_code(tmp_path):
    """Importing a worker must not run the client (hetspec/__init__.py is lazy); from
    outside the checkout, as a worker process runs once installed."""
    code = ("import sys, hetspec.workers.draft.worker, hetspec.workers.target.worker; "
            "print(' '.join(m for m in sys.modules if m.startswith('hetspec')))")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                            cwd=tmp_path).stdout.split()
    assert "hetspec.workers.draft.worker" in loaded
    engine = [m for m in loaded if m != "hetspec" and _side(m) not in ("core", "ipc", "workers")]
    assert engine == []


def test_a_transformers_target_needs_no_llama_cpp(tmp_path):
    """A GPU machine need not have llama.cpp: the target worker and the benchmark's runner
    bring it in only for a GGUF target or a llama.cpp peer."""
    code = ("import sys, hetspec.workers.target.worker, hetspec.benchmarks.bench.runner; "
            "print('llama_cpp' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.split() == ["False"]


def test_a_gguf_target_worker_and_the_scheduler_need_no_torch(tmp_path):
    """torch takes seconds to import: the target worker brings it in only for the
    transformers backend (transformers_target.py), and the scheduler's kept tokenizer loads
    without it."""
    code = ("import sys, hetspec.workers.target.worker, hetspec.workers.target.gguf_target, "
            "hetspec.workers.draft.worker, hetspec.scheduler.service; print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.split() == ["False"]


def test_the_wheel_installs_every_package_under_hetspec():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    declared = set(config["options"]["packages"].split())
    on_disk = {module for module, path in _modules() if path.name == "__init__.py"}
    assert declared == on_disk
    assert all(p == "hetspec" or p.startswith("hetspec.") for p in declared)
    mapping = dict(line.split(" = ") for line in config["options"]["package_dir"].strip().splitlines())
    assert {folder: mapping[package] for folder, package in FOLDERS.items()} == {f: f for f in FOLDERS}


def test_no_function_is_too_complex_to_read():
    """ruff's C901, McCabe's count of the paths through a function, at the bound
    pyproject.toml sets (10: McCabe's own, and ruff's default): past it a function is
    seldom read, or tested, whole. Nested functions count toward the one around them."""
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "C901", "--output-format", "concise",
                           "hetspec", "workers", "ipc"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_module_is_a_monolith():
    """A loose bound, well above every module (the largest are near 320 lines): only a
    module that has become several concepts in one crosses it."""
    sizes = {path.relative_to(ROOT): len(path.read_text().splitlines()) for module, path in _modules()
             if _side(module) != "benchmarks"}
    assert {str(p): n for p, n in sizes.items() if n > 500} == {}


def test_the_public_names_all_resolve():
    import hetspec

    assert sorted(hetspec.__all__) == sorted(hetspec._EXPORTS)
    assert all(getattr(hetspec, name) is not None for name in hetspec.__all__)
