"""Shared fixtures: tiny random models (no files) and engines built on them."""
import os

import numpy as np
import pytest

from helpers import FULL_TESTS, TARGET, load_reference


@pytest.fixture(scope="session")
def target_model():
    return load_reference(TARGET)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def cores_as_they_were():
    """A test that pins pytest's own threads must put them back: one that did not left
    every later test on one core (a borrowed core then had nothing to lend)."""
    before = os.sched_getaffinity(0)
    yield
    assert os.sched_getaffinity(0) == before, "this test left pytest's main thread on fewer cores"


# Files that run longest, started first: pytest-xdist (-n 2 --dist loadfile) hands files out in collection order,
# and this one (4.6 to 5.4 minutes under -n 2 on 2 cores, its tests the two slowest) is last but one
# alphabetically: started last, it would end the run with the other worker idle.
LONGEST_FIRST = ("test_transformers_versions.py",)


def pytest_collection_modifyitems(config, items):
    """The longest files first; the short form (CI's) skips the tests marked full (helpers.FULL)."""
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)    # (stable: each file keeps its order)
    if FULL_TESTS:
        return
    skip = pytest.mark.skip(reason="the full form only: scripts/full_tests.sh")
    for item in items:
        if item.get_closest_marker("full"):
            item.add_marker(skip)
