"""What the engine side, the workers and the transport all import, and so imports none of
them: request parameters and their checks, errors, sampling and the acceptance rules,
branch allocation, pinning a process to its cores, how many cores and requests "auto"
means, whether a GPU driver is present, the paced target's GPU profiles, and files kept
on disk.
"""
