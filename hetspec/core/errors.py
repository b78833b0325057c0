"""The exceptions a hetspec user can catch; all derive from HetspecError."""


class HetspecError(Exception):
    """Base class of every error hetspec raises on purpose."""


class ConfigError(HetspecError, ValueError):
    """The engine configuration is invalid (unknown key, bad value, missing model file...)."""


class RequestError(HetspecError, ValueError):
    """One request was invalid; the engine keeps serving others."""


class EngineBusyError(RequestError):
    """The engine's queue is full ([server] max_queue): try again later."""


class EngineDeadError(HetspecError, RuntimeError):
    """A process of the engine died; requests cannot complete any more."""


class RequestAbortedError(HetspecError, RuntimeError):
    """The target worker died under this request; the engine restarted it and keeps
    serving, so the request may be sent again."""


class EngineStartError(HetspecError, RuntimeError):
    """The engine could not start (a worker failed while loading its model)."""


class InternalError(HetspecError, RuntimeError):
    """The engine failed on this request by a fault of its own, not of the request's;
    the request ended, the engine keeps serving, and the scheduler's log has the traceback."""


class AuthError(HetspecError, PermissionError):
    """The engine wants an API key ([server] api_key) and the client sent none, or another."""


ERROR_KINDS = {
    "auth": AuthError,
    "busy": EngineBusyError,
    "config": ConfigError,
    "request": RequestError,
    "dead": EngineDeadError,
    "aborted": RequestAbortedError,
    "start": EngineStartError,
    "internal": InternalError,
}


def error_from_kind(kind: str, message: str) -> HetspecError:
    """Rebuild an error that crossed a process boundary as (kind, message)."""
    return ERROR_KINDS.get(kind, HetspecError)(message)
