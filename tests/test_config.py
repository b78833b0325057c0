"""The configuration's defaults are the embedded default, so an empty config, a
config that sets one key and the shipped smollm2 file all mean the same engine."""
from hetspec.config import load_config


def test_an_empty_config_is_the_embedded_default():
    assert load_config({}) == load_config(None) == load_config("smollm2")


def test_a_partial_config_changes_only_what_it_sets():
    config = load_config({"decoding": {"gamma": 5}})
    assert config.decoding.gamma == 5
    default = load_config(None)
    assert (config.draft, config.target, config.server) == (default.draft, default.target, default.server)
