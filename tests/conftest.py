"""Shared fixtures: tiny random models (no files) and engines built on them."""
import numpy as np
import pytest

from helpers import TARGET, load_reference


@pytest.fixture(scope="session")
def target_model():
    return load_reference(TARGET)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
