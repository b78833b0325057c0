"""The pure rules both sides share: request parameters, errors, sampling, the
acceptance rule, branch allocation and choice, GGUF block formats, pinning.

Imported by the engine side (hetspec.*), the workers (hetspec.workers) and the
transport (hetspec.ipc); it imports none of them.
"""
