"""hetspec: heterogeneous speculative decoding (DuoDecoding, arXiv 2503.00784).

A draft model on CPU cores drafts the next window while the target model
verifies the current one, each in its own process; output is exactly the
target's own.

    import hetspec
    with hetspec.launch() as engine:          # the embedded SmolLM2 default
        print(engine.generate("Hello", max_new_tokens=32).text)
"""
from hetspec.client import Engine, Result, connect, launch
from hetspec.errors import ConfigError, EngineDeadError, EngineStartError, HetspecError, RequestError

__all__ = ["ConfigError", "Engine", "EngineDeadError", "EngineStartError", "HetspecError", "RequestError",
           "Result", "connect", "launch"]
