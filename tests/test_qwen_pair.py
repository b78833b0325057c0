"""The shipped Qwen2.5-Coder configs on the real files, where `hetspec-models fetch
qwen2.5-coder` has fetched them (skipped otherwise: CI never downloads 1.6 GB).
Both run native on the CPU, chat through the models' own template, and speculate
to exactly the target alone's greedy tokens."""
from __future__ import annotations

import pytest

from hetspec.core.errors import ConfigError
from hetspec.models import resolve_model

pytestmark = pytest.mark.integration

STUB = 'def running_max(numbers: list[int]) -> list[int]:\n    """Return the running maxima of numbers."""\n'


def _fetched(*names):
    try:
        for name in names:
            resolve_model(f"builtin:{name}")
    except ConfigError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("config, shared", [("qwen2.5-coder", True), ("qwen2.5-coder-smollm2", False)])
def test_the_shipped_qwen_configs_are_native_exact_and_chat(config, shared):
    import hetspec

    _fetched("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    with hetspec.launch(config) as engine:
        info = engine.get_info()
        assert info["target"]["kernels"].startswith("native") and info["draft"]["kernels"].startswith("native")
        assert info["vocabulary"]["shared"] is shared
        alone = engine.generate(STUB, max_new_tokens=24, mode="target")
        for mode in ("duodec", "sequential"):
            got = engine.generate(STUB, max_new_tokens=24, mode=mode, speculation="always")
            assert got.token_ids == alone.token_ids, mode
            assert got.stats["spec_rounds"] > 0
        chat = engine.generate(messages=[{"role": "user", "content": "Say hello in French."}], max_new_tokens=8)
        assert chat.token_ids and "<|im_start|>" not in chat.text
