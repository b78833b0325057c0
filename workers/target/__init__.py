"""The target worker: a transformers model behind a position-indexed KV cache,
with CPU kernels that read a GGUF file's blocks."""
