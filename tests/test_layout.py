"""The architecture's walls, checked: the engine side never imports worker code,
the workers never import the engine side, the transport imports neither, and
the shared core imports nothing of hetspec's but itself; the draft and the target
worker share code only through workers/common, and no modules import each other in
a circle. Also what a wheel installs (everything under the project's own name, no
package left out), and the bounds on a function's and a module's size, everywhere."""
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
TREE = ("hetspec", "workers", "ipc", "benchmarks", "tests")   # every Python folder of the checkout
MAX_LINES = 400      # a module past this is several concepts in one
MAX_RADON = 15       # radon's cyclomatic count, which also counts boolean operators and comprehensions


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
            "hetspec.workers.draft.worker, hetspec.scheduler.scheduler; print('torch' in sys.modules)")
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


def _tree_files():
    for folder in TREE:
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_function_is_too_complex_to_read():
    """ruff's C901, McCabe's count of the paths through a function, at the bound
    pyproject.toml sets (10: McCabe's own, and ruff's default), and radon's count at 15:
    past them a function is seldom read, or tested, whole. Nested functions count toward
    the one around them. The whole tree: benchmarks and tests are read too."""
    from radon.complexity import cc_visit
    from radon.visitors import Function

    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "C901", "--output-format", "concise",
                           *TREE], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

    def functions(blocks):
        for block in blocks:
            if isinstance(block, Function):
                yield block
            else:
                yield from block.methods
    over = {f"{path.relative_to(ROOT)}:{block.lineno} {block.name}": block.complexity for path in _tree_files()
            for block in functions(cc_visit(path.read_text())) if block.complexity > MAX_RADON}
    assert over == {}


def test_no_module_is_a_monolith():
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in _tree_files()}
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}


def _import_graph():
    """module -> the modules of the package it imports, at any depth of its code."""
    modules = dict(_modules())
    graph = {}
    for module, path in modules.items():
        named = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):     # `from package import module` names the module
                inner = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                named.update(inner if len(inner) == len(node.names) else inner | {node.module})
        graph[module] = {name for name in named if name in modules and name != module}
    return graph


def test_no_import_circle():
    """Two modules that import each other, however indirectly, are one concept in two files
    (or a load order that works by luck)."""
    graph, done, circles = _import_graph(), set(), []

    def visit(module, path):
        if module in path:
            circles.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        for name in sorted(graph[module]):
            visit(name, path + [module])
        done.add(module)
    for module in sorted(graph):
        visit(module, [])
    assert circles == []


def test_the_workers_import_one_way():
    """The draft and the target worker share code only through workers/common."""
    draft, target = "hetspec.workers.draft", "hetspec.workers.target"
    crossing = [(module, name) for module, names in _import_graph().items() for name in names
                for side, other in ((draft, target), (target, draft))
                if module.startswith(side) and name.startswith(other)]
    assert crossing == []


def test_the_public_names_all_resolve():
    import hetspec

    assert sorted(hetspec.__all__) == sorted(hetspec._EXPORTS)
    assert all(getattr(hetspec, name) is not None for name in hetspec.__all__)
