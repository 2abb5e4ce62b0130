"""Typed failures that cross spadekit's boundaries.

Everything that can go wrong while running an untrusted environment program is reported as one of
the ``SandboxError`` subclasses below, never as a bare exception from inside the worker. Each error
has a short stable ``reason`` code (used by the validator, the designer reward and the database) and
a JSON-safe ``to_dict()`` so that failures can be stored and shown.

Standard library only: sandbox workers import this package.
"""

from __future__ import annotations

from typing import Any


class SpadekitError(Exception):
    """Base class of every error spadekit raises on purpose."""

    reason = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "reason": self.reason, "message": self.message,
                **{k: v for k, v in self.details.items() if _jsonable(v)}}


class ConfigError(SpadekitError, ValueError):
    """A setting or argument is invalid."""

    reason = "config"


class SandboxError(SpadekitError):
    """Base class of failures while running an environment program in a sandbox."""

    reason = "sandbox_error"


class InsecureSandboxError(SandboxError):
    """The detected isolation tier is below the minimum for untrusted code."""

    reason = "insecure_sandbox"


class SandboxStartError(SandboxError):
    """A worker process could not be started or did not become ready."""

    reason = "worker_start_failed"


class ProgramLoadError(SandboxError):
    """The program did not load: syntax error, exception at import, wrong number of Env classes,
    or a constructor that fails. ``reason`` is one of ``syntax``, ``load_error``, ``no_env_class``,
    ``multiple_env_classes``, ``construct_failed``."""

    def __init__(self, message: str, reason: str = "load_error", **details: Any) -> None:
        super().__init__(message, **details)
        self.reason = reason


class EnvRaised(SandboxError):
    """The environment's own code raised an exception; the worker is still alive.

    ``exc_type`` is the exception class name and ``traceback`` the formatted traceback from inside
    the worker (paths are the sandbox's, never the host's)."""

    reason = "env_raised"

    def __init__(self, message: str, exc_type: str = "Exception", traceback: str = "",
                 **details: Any) -> None:
        super().__init__(message, exc_type=exc_type, traceback=traceback, **details)
        self.exc_type = exc_type
        self.traceback = traceback


class SandboxTimeout(SandboxError):
    """A call exceeded its wall-clock deadline; the worker and everything it started were killed."""

    reason = "timeout"

    def __init__(self, message: str, op: str = "", seconds: float = 0.0, **details: Any) -> None:
        super().__init__(message, op=op, seconds=seconds, **details)
        self.op = op
        self.seconds = seconds


class WorkerDied(SandboxError):
    """The worker process ended unexpectedly (signal or exit code); ``stderr_tail`` holds the end
    of what it printed (a faulthandler traceback for crashes)."""

    reason = "worker_died"

    def __init__(self, message: str, returncode: int | None = None, signal: str | None = None,
                 stderr_tail: str = "", **details: Any) -> None:
        super().__init__(message, returncode=returncode, signal=signal, stderr_tail=stderr_tail,
                         **details)
        self.returncode = returncode
        self.signal = signal
        self.stderr_tail = stderr_tail


class ProtocolViolation(SandboxError):
    """The worker sent something that is not a valid reply: oversized, not JSON, too deep, not
    valid Unicode, a non-finite number, the wrong id, the wrong shape for its message type, a
    result the worker itself refuses, a second reply (see ``spadekit.sandbox.replies``). The
    worker is killed: its protocol channel can no longer be trusted."""

    reason = "protocol_violation"


class ResourceLimit(SandboxError):
    """The program hit a resource limit (``kind``: memory, cpu, file_size, processes, recursion)."""

    reason = "resource_limit"

    def __init__(self, message: str, kind: str = "", **details: Any) -> None:
        super().__init__(message, kind=kind, **details)
        self.kind = kind


class InvalidResult(SandboxError):
    """The environment returned a value that breaks the contract. ``reason`` is a stable code:
    ``bad_reset_type``, ``bad_step_type``, ``reward_not_finite``, ``reward_out_of_range``,
    ``observation_too_large``, ``bad_text`` (an observation with a lone surrogate), ``bad_info``
    or ``bad_result``."""

    def __init__(self, message: str, reason: str = "bad_result", **details: Any) -> None:
        super().__init__(message, **details)
        self.reason = reason


class SandboxClosed(SandboxError):
    """The sandbox was already closed (or killed by an earlier failure) when it was called."""

    reason = "sandbox_closed"


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool, list, dict, tuple))


ERROR_TYPES: dict[str, type[SandboxError]] = {
    cls.__name__: cls
    for cls in (EnvRaised, ProgramLoadError, ResourceLimit, InvalidResult, ProtocolViolation)
}
