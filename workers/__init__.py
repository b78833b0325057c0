"""The worker processes, installed as hetspec.workers: the draft, the target,
their kernels, and the process plumbing both share. They talk to the scheduler
only through hetspec.ipc messages and never import the engine side.
"""
