"""The decoding round and its policy, apart from the scheduler's process shell.

decoder.py   one request's rounds in its mode (duodec, sequential, target)
links.py     the handles on the two workers: commands out, replies and shared memory in
bridge.py    a draft of another vocabulary, through text
budget.py    what drafting and verifying cost, and so each round's window
gate.py      whether speculating pays, learnt online
output.py    committed tokens, stop conditions, streamed text
stats.py     a request's counters
acceptance_prior.py   where a request's acceptance estimate starts
"""
