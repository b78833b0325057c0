"""The transformers target's CPU tests on every transformers it meets. The rest of the suite
runs the venv's own (the newest scripts/setup.sh installs); `setup.sh --dev` puts the oldest
setup.cfg admits and the GPU machine's image's (GPU_IMAGE_TRANSFORMERS) beside it, each in
.venv/transformers-V with what it needs of its own (torch and the rest shared). On each: the
static, captured (as recorded), packed and grouped-attention tests and a batched engine; on the
GPU image's, the engines over every mode (CI's short form: the captured one) and the GPU check's
CPU rehearsal too (scripts/gpu_check.sh), as a lent machine runs it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import FULL_TESTS

ROOT = Path(__file__).resolve().parents[1]
BESIDE = sorted((ROOT / ".venv").glob("transformers-*/.complete"))
TARGET_TESTS = ["tests/test_packed_pass.py", "tests/test_static_cache.py", "tests/test_grouped_attention.py",
                "tests/test_batch.py::test_a_static_cache_target_steps_a_batch_in_one_pass_each_output_alone"]


def _image_version() -> str:
    return re.search(r"^GPU_IMAGE_TRANSFORMERS=(\S+)", (ROOT / "scripts/setup.sh").read_text(), re.MULTILINE).group(1)


def _run(command: list[str], folder: Path, timeout: int, **env) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "PYTHONPATH": str(folder), **env})


@pytest.mark.skipif(not BESIDE, reason="no transformers beside the venv's (scripts/setup.sh --dev installs them)")
@pytest.mark.parametrize("folder", [mark.parent for mark in BESIDE], ids=[mark.parent.name for mark in BESIDE])
def test_the_transformers_targets_tests_pass_on(folder):
    version = folder.name.removeprefix("transformers-")
    seen = _run([sys.executable, "-c", "import transformers; print(transformers.__version__)"], folder, 60)
    assert seen.stdout.strip().removesuffix(".0") == version.removesuffix(".0"), seen.stderr[-2000:]
    image = version == _image_version()
    # the engines over every mode run on the image's in the full form; CI's short form runs its captured engine with
    # the disagreeing draft (the GPU's passes), and the floor none
    only = [] if image and FULL_TESTS else ["-k", "not seed and (not engine or captured-weak-draft)" if image
                                             else "not engine and not seed"]
    done = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "300", *only, *TARGET_TESTS],
                folder, 600)
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-2000:])
    assert re.search(r"\d+ passed", done.stdout) and "failed" not in done.stdout.splitlines()[-1]
    if image:
        rehearsal = _run(["scripts/gpu_check.sh"], folder, 120, GPU_CHECK_REHEARSE="1", PYTHON=sys.executable,
                         OUT=str(folder / "gpu-rehearsal"))
        assert rehearsal.returncode == 0, rehearsal.stdout[-4000:]
        assert "| captured |" in rehearsal.stdout and "== profile: exit 0" in rehearsal.stdout


def test_the_image_and_the_floor_are_both_set_up_where_tests_run_beside_them():
    """setup.sh --dev installs the floor setup.cfg states and the image's version, nothing else."""
    floor = re.search(r"transformers>=(\S+)", (ROOT / "setup.cfg").read_text()).group(1)
    if BESIDE:
        assert {mark.parent.name for mark in BESIDE} == {f"transformers-{floor}", f"transformers-{_image_version()}"}
