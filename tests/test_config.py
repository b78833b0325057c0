"""The configuration's defaults are the embedded default, so an empty config, a
config that sets one key and the shipped smollm2 file all mean the same engine."""
from pathlib import Path

import pytest

from hetspec.config import load_config
from hetspec.core.errors import ConfigError


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


def test_a_cuda_target_owns_a_core_beside_the_schedulers_and_the_drafts(monkeypatch):
    """[target] device "cuda": the target drives its GPU from its own first core, the scheduler
    takes the second, the draft the rest; on two cores the scheduler shares the target's."""
    import psutil

    from hetspec.config import assign_cores

    for cores, want in [(list(range(16)), (tuple(range(2, 16)), (0,), (1,))), ([4, 5], ((5,), (4,), (4,)))]:
        monkeypatch.setattr(psutil.Process, "cpu_affinity", lambda self, cores=cores: cores)
        assert assign_cores("auto", "auto", "auto", target_on="cuda") == want
    config = load_config({"target": {"backend": "transformers", "model": "random:seed=0", "device": "cuda"}})
    assert config.target.cores == (4,) and config.draft.cores == (5,) and config.server.cores == (4,)


def test_dtype_auto_is_float32_on_a_cpu_and_the_models_own_or_bfloat16_on_cuda():
    from hetspec.models import resolve_model
    from hetspec.workers.common.hf_loading import resolve_dtype

    assert load_config({}).target.dtype == "auto"
    gguf, random = resolve_model("builtin:smollm2"), resolve_model("random:seed=0")
    assert resolve_dtype("auto", gguf, "cpu") == resolve_dtype("auto", random, "cpu") == "float32"
    assert resolve_dtype("auto", gguf, "cuda:1") == resolve_dtype("auto", random, "cuda") == "bfloat16"
    assert resolve_dtype("float16", gguf, "cuda") == "float16"
    with pytest.raises(ConfigError, match=r"\[target\] dtype must be one of auto, float32, bfloat16, float16"):
        load_config({"target": {"dtype": "fp8"}})


def test_max_running_auto_is_resolved_here_but_on_cuda_where_the_target_fits_it():
    """[server] max_running "auto": 4 for a target on the CPU, 8 for the paced one, resolved
    by the config once; on CUDA left to the target worker (its memory), whose answer the
    scheduler adopts (startup.with_running)."""
    assert load_config({}).server.max_running == 4
    assert load_config({"server": {"max_running": 3}}).server.max_running == 3
    paced = {"backend": "paced", "profile": "gpu-40ms", "model": "builtin:smollm2"}
    assert load_config({"target": paced}).server.max_running == 8
    cuda = {"backend": "transformers", "model": "random:seed=0", "device": "cuda"}
    assert load_config({"target": cuda}).server.max_running == "auto"


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "benchmarks" / "configs").glob("*.toml")),
                         ids=lambda p: p.name)
def test_a_config_the_bench_takes_the_engine_takes(path):
    """hetspec-launch reads a benchmark's config too, leaving its [bench] table to
    hetspec-bench; only a model not fetched on this machine may stop it."""
    try:
        load_config(path)
    except ConfigError as exc:
        assert "is not fetched yet" in str(exc), exc


def test_a_benchmark_changes_a_config_as_written():
    """read_config leaves "auto" as it is, so that a shipped config paced by a benchmark gets
    the paced target's max_running (8), not the CPU's (4) resolved before pacing."""
    from hetspec.benchmarks.bench.paced import paced_config
    from hetspec.benchmarks.bench.settings import split_config
    from hetspec.config import read_config

    assert "max_running" not in read_config("smollm2").get("server", {})
    config, bench = split_config("smollm2")
    assert bench == {} and load_config(config).server.max_running == 4
    assert load_config(paced_config(config, "gpu-40ms")).server.max_running == 8
