"""The scheduler process (python -m hetspec.scheduler RUN_FILE, started by hetspec.launcher):
scheduler.py's loop, its start-up, clients, slots and batch steps; decoding/ holds a
request's rounds and their policy."""
