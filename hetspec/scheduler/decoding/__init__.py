"""The decoding round and its policy, apart from the scheduler's process shell.

decoder.py   one request's rounds in its mode (duodec, sequential, target, lookup)
round.py     what a round passes around: windows, drafts, the target's verdicts
links.py     the handles on the two workers: commands out, replies and shared memory in
bridge.py    a draft of another vocabulary, through text
budget.py    what drafting and verifying cost, and so each round's window
gate.py      whether speculating pays, learnt online
output.py    committed tokens, stop conditions, streamed text
stats.py     a request's counters
request.py   what the decoder is given: a resolved request, the engine's capabilities
lookup.py    free guesses for the target's solo steps (prompt lookup)
acceptance_prior.py   where a request's acceptance estimate starts
"""
