"""Transport between hetspec's processes: message schema, zmq channels, shared
memory, and the typed specs a worker is started with.

Installed as hetspec.ipc. It imports only hetspec.core (the parameter types that
messages carry), never the engine side or the workers.
"""
