"""llama-cpp-python is hetspec's extra "llama": only the llama.cpp backends (the target's,
the draft's, the native draft's fallback) and the benchmark's llama.cpp peer load it.
The one message for its absence."""
from __future__ import annotations

LLAMA_EXTRA = "pip install 'hetspec[llama]'"


def require_llama_cpp(what: str):
    """The llama_cpp module; if it cannot be imported, an ImportError in one line saying
    that `what` needs it and how to install it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise ImportError(f"{what} needs llama-cpp-python: {LLAMA_EXTRA} ({exc})") from exc
    return llama_cpp
