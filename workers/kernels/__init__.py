"""C kernels (compiled on first use) and their Python bindings: the native draft
step and the GGUF block matrix products the target uses."""
