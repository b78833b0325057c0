"""The scheduler process: queues requests, runs them through the decoding loop
(alone, or several in one target pass), and drives both workers through their
links (ipc messages and shared memory).

The process shell is here: scheduler.py (the serve loop and each request's fault
boundary), startup.py, clients.py, resolve.py, slots.py, batch.py, supervisor.py and
tokenizer.py. The decoding round and its policy are in decoding/.

python -m hetspec.scheduler RUN_FILE   (started by hetspec.launcher)
"""
