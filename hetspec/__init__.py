"""hetspec: heterogeneous speculative decoding (DuoDecoding, arXiv 2503.00784).

A draft model on CPU cores drafts the next window while the target model
verifies the current one, each in its own process; output is exactly the
target's own.

    import hetspec
    with hetspec.launch() as engine:          # the embedded SmolLM2 default
        print(engine.generate("Hello", max_new_tokens=32).text)

The names below load on first use: a worker process imports
hetspec.workers.* and must not pull in the client (see tests/test_layout.py).
"""
from importlib import import_module

_EXPORTS = {
    "Engine": "hetspec.client", "Result": "hetspec.client", "connect": "hetspec.client", "launch": "hetspec.client",
    "SamplingParams": "hetspec.core.params",
    "ConfigError": "hetspec.core.errors", "EngineBusyError": "hetspec.core.errors",
    "EngineDeadError": "hetspec.core.errors", "EngineStartError": "hetspec.core.errors",
    "HetspecError": "hetspec.core.errors", "RequestError": "hetspec.core.errors",
    "RequestAbortedError": "hetspec.core.errors", "InternalError": "hetspec.core.errors",
}
__all__ = ["ConfigError", "Engine", "EngineBusyError", "EngineDeadError", "EngineStartError", "HetspecError",
           "InternalError", "RequestAbortedError", "RequestError", "Result", "SamplingParams", "connect", "launch"]


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hetspec' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *__all__])
