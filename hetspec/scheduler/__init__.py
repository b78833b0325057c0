"""The scheduler process: queues requests, runs each through the decoding loop,
and drives both workers through their links (ipc messages and shared memory).

python -m hetspec.scheduler RUN_FILE   (started by hetspec.launcher)
"""
