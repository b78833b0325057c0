"""Property-based fuzzing of every input surface, the short form (hetspec-fuzz runs the
long one; its report is benchmarks/reports/fuzz/).

For every input, over HTTP (every endpoint), through Engine.generate and stream,
as raw zmq frames, and as a config: an answer within a bound, either a
completion or an error in the documented shape. After each surface the engine
is alive, nothing restarted, and a greedy request gives the tokens it gave
before any fuzzing. Derandomized, so that CI runs the same inputs every time.
"""
import pytest

from hetspec.benchmarks.robustness import fuzz

EXAMPLES = {"http": 150, "client": 100, "wire": 100, "config": 150}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = fuzz.Served(str(tmp_path_factory.mktemp("fuzz")))
    yield served
    served.close()


@pytest.mark.parametrize("surface", ["http", "client", "wire"])
def test_every_input_is_answered_and_the_engine_lives_on(served, surface):
    tally = fuzz.run_surface(surface, served, EXAMPLES[surface], derandomize=True)
    assert tally.summary()["inputs"] >= EXAMPLES[surface]
    assert max(tally.seconds) < fuzz.BOUND_S
    health = served.health()
    assert health["ok"], health


def test_every_config_is_an_engine_config_or_a_config_error():
    tally = fuzz.run_surface("config", None, EXAMPLES["config"], derandomize=True)
    assert set(tally.outcomes) <= {"EngineConfig", "ConfigError"} and tally.outcomes["ConfigError"] > 0
