"""Transport between hetspec's processes: message schema, zmq channels, shared memory.

Imports neither hetspec nor workers: it is the only thing they share.
"""
