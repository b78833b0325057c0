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


def test_a_random_model_drawn_on_its_device_is_the_same_model_there():
    """init=device draws the weights where the model runs (a large shape on a GPU in
    seconds); on the CPU that is the CPU's draw, so the model is the default one."""
    import torch

    from hetspec.models import resolve_model
    from hetspec.workers.common.hf_loading import load_causal_lm

    spec = resolve_model("random:init=device,seed=4")
    assert spec.random["init"] == "device" and resolve_model("random:seed=4").random["init"] == "cpu"
    drawn = load_causal_lm(spec, "float32", "cpu").state_dict()
    default = load_causal_lm(resolve_model("random:seed=4"), "float32", "cpu").state_dict()
    assert drawn.keys() == default.keys() and all(torch.equal(drawn[k], default[k]) for k in drawn)
