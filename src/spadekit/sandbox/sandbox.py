"""The parent side of one sandbox: a worker hosting one program, driven over JSON lines.

``Sandbox`` sends one request at a time (thread-safe), enforces a
wall-clock deadline on every call and turns every failure into a typed
``spadekit.common.errors.SandboxError``: nothing else leaves this module. Replies are untrusted:
each line is checked against its schema (``spadekit.sandbox.replies``), reset and step results
are re-checked with the worker's own checks, and a second reply to one request is a forgery;
each is a ``ProtocolViolation``. A timeout, a dead worker or a violation kills the worker and
its whole process tree; later calls raise ``SandboxClosed``. ``RemoteEnv`` is one environment
instance with the Gymnasium-style API (``areset``/``astep`` for asyncio) plus ``solution()``
and ``tools()``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import select
import json.encoder
import selectors
import signal
import threading
import time
from typing import Any

from spadekit.common.errors import (ERROR_TYPES, EnvRaised, InvalidResult, ProgramLoadError,
                             ProtocolViolation, ResourceLimit, SandboxClosed, SandboxError,
                             SandboxStartError, SandboxTimeout, WorkerDied)
from spadekit.common.safe_text import terminal_text
from spadekit.envs import refstyle
from spadekit.sandbox import replies
from spadekit.sandbox import worker_replies as checks
from spadekit.sandbox.config import SandboxConfig
from spadekit.sandbox.launch import Plan, WorkerProcess, spawn


_encode_str = json.encoder.encode_basestring_ascii


class _Tail:
    """Drains the worker's stderr (its prints and tracebacks) into a bounded ring buffer."""

    def __init__(self, stream, limit: int) -> None:
        self.limit = limit
        self.chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.total = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, args=(stream,), daemon=True,
                                       name="spadekit-sandbox-stderr")
        self.thread.start()

    def _run(self, stream) -> None:
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self.lock:
                self.chunks.append(chunk)
                self.size += len(chunk)
                self.total += len(chunk)
                while self.size - len(self.chunks[0]) >= self.limit:
                    self.size -= len(self.chunks.popleft())

    def text(self, wait: float = 0.0) -> str:
        if wait:
            self.thread.join(wait)
        with self.lock:
            data = b"".join(self.chunks)[-self.limit:]
        return data.decode("utf-8", "replace")


CLOSE_LOCK_S = 5.0
"""How long ``Sandbox.close`` waits for the request lock before it kills the worker anyway."""


class Sandbox:
    """One worker process; load exactly one program into it with ``load`` (the pool does)."""

    def __init__(self, worker: WorkerProcess, config: SandboxConfig) -> None:
        self.config = config
        self.worker = worker
        self.plan: Plan = worker.plan
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._buf = bytearray()
        self._tail = _Tail(worker.proc.stderr, config.stderr_tail_bytes)
        self._poll = select.poll()
        self._out_fd = worker.proc.stdout.fileno()
        self._in_fd = worker.proc.stdin.fileno()
        os.set_blocking(self._out_fd, False)
        os.set_blocking(self._in_fd, False)
        self._poll.register(self._out_fd, select.POLLIN)
        self.failure: SandboxError | None = None
        self.program: dict | None = None
        self.layers: dict = {}
        self.compat_used: set[str] = set()  # run-time compatibility features (envs.refstyle)
        self._deadlines = {op: config.deadline(op) for op in ("load", "create", "reset", "step")}

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def start(cls, config: SandboxConfig, plan: Plan) -> "Sandbox":
        """Spawn a worker and wait until it has applied its isolation layers."""
        worker = spawn(config, plan)
        sb = cls(worker, config)
        try:
            hello = sb._receive(0, "start", config.start_timeout)
            hello = sb._checked(replies.check_hello, hello, "start")
        except SandboxError as exc:
            sb.close()
            # nothing untrusted has run yet: what the worker printed is the launcher's (bwrap,
            # setpriv, the interpreter) and names the cause
            tail = (getattr(exc, "stderr_tail", "") or sb._tail.text(wait=0.2)).strip()
            said = terminal_text(tail[-400:], markup=False) if tail else ""
            raise SandboxStartError(f"sandbox worker did not start: {exc.message}"
                                    + (f"; it printed: {said}" if said else ""),
                                    tier=plan.tier, cause=exc.to_dict()) from exc
        sb.layers = hello["layers"]
        worker.hello = hello
        worker.adopt_tree()
        return sb

    @property
    def alive(self) -> bool:
        return self.failure is None and not self.worker.closed

    def close(self) -> None:
        """Kill the worker and everything it started; idempotent. Never waits more than
        ``CLOSE_LOCK_S`` for a request in flight on another thread (or a lock an interrupt
        left held): the worker is killed anyway, and that request fails as a dead worker."""
        got = self._lock.acquire(timeout=CLOSE_LOCK_S)
        try:
            if not self.worker.closed:
                self.worker.kill()
        finally:
            if got:
                self._lock.release()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def output_tail(self) -> str:
        """The last ``stderr_tail_bytes`` of what the program printed. A background thread drains
        the worker's output, so text printed during a call may show up a moment after its reply."""
        return self._tail.text()

    # -- program and instances -------------------------------------------------------------

    def load(self, code: str, filename: str = "env.py") -> dict:
        """Execute the program; returns {class_name, has_solution, has_tools, doc}."""
        if self.program is not None:
            raise ProgramLoadError("this sandbox already hosts a program; one program per worker",
                                   reason="load_error")
        if not isinstance(code, str) or not code.strip():
            raise ProgramLoadError("the program is empty", reason="syntax")
        if len(code) > self.config.max_program_chars:
            raise ProgramLoadError(f"the program has {len(code)} characters (limit "
                                   f"{self.config.max_program_chars})", reason="syntax")
        info = self.request("load", {"code": code, "filename": os.path.basename(filename)})
        self.program = self._checked(replies.check_load, info, "load")
        return self.program

    def new_env(self, max_turns: int | None = None, **kwargs: Any) -> "RemoteEnv":
        """Construct one instance of the program's Env class (``max_turns=`` first, then no args).
        ``max_turns`` is also the cap: the instance's ``max_turns`` is what the program reports,
        clamped to it (see ``replies.check_create``)."""
        if max_turns is not None:
            kwargs["max_turns"] = max_turns
        return self.created(self.request("create", {"kwargs": kwargs}), max_turns)

    def created(self, info: Any, cap: int | None) -> "RemoteEnv":
        """The ``RemoteEnv`` of a raw create reply (checked; ``max_turns`` clamped to ``cap``)."""
        instance, turns = self._checked(replies.check_create, info, "create", cap)
        return RemoteEnv(self, instance, turns)

    def _checked(self, check, value: Any, op: str, *args: Any) -> Any:
        """``check(value, *args)``; a ``BadReply`` kills the worker as a ``ProtocolViolation``."""
        try:
            return check(value, *args)
        except replies.BadReply as exc:
            raise self.violation(f"bad {op} reply: {exc}", op) from None
        except Exception as exc:  # a gap in a check must not let a foreign exception out
            raise self.violation(f"bad {op} reply ({type(exc).__name__})", op) from None

    def violation(self, message: str, op: str) -> ProtocolViolation:
        """Record a ``ProtocolViolation`` (the worker is killed) and return it for raising."""
        return self._fail(ProtocolViolation(message + "; worker killed", op=op))

    # -- protocol --------------------------------------------------------------------------

    def request(self, op: str, payload: dict, timeout: float | None = None) -> Any:
        """Send one request and return its result, or raise a typed ``SandboxError``."""
        with self._lock:
            if self.failure is not None or self.worker.closed:
                self._check_open()  # raises
            self.check_quiet(op)
            rid = next(self._ids)
            deadline = timeout if timeout is not None else self.deadline(op)
            data = self._encode(rid, op, payload)
            end = time.monotonic() + deadline
            self.worker.wake()  # continue a worker stopped while idle (launch.py)
            try:
                self._send(data, op, deadline, end)
                return self._receive(rid, op, deadline, end)
            finally:
                self.worker.rest()

    def check_quiet(self, op: str) -> None:
        """Between requests the reply pipe is silent: bytes waiting there (a reply nobody asked
        for, sent late or from a thread of the program) are a forgery."""
        events = self._poll.poll(0)  # [] on the hot path: no generator to build
        if self._buf or (events and any(ev & select.POLLIN for _fd, ev in events)):
            raise self.violation(f"the worker wrote to the protocol pipe before {op} was sent",
                                 op)

    def deadline(self, op: str) -> float:
        return self._deadlines.get(op, self.config.call_timeout)

    def _check_open(self) -> None:
        if self.failure is not None:
            raise SandboxClosed(f"the sandbox is dead after an earlier failure: "
                                f"{self.failure.message}", cause=self.failure.reason)
        if self.worker.closed:
            raise SandboxClosed("the sandbox was closed")

    @staticmethod
    def _encode(rid: int, op: str, payload: dict) -> bytes:
        try:
            if op == "step":  # the hot path: only the action string needs encoding
                return b'{"id":%d,"op":"step","instance":%d,"action":%s}\n' % (
                    rid, payload["instance"], _encode_str(payload["action"]).encode())
            return json.dumps({"id": rid, "op": op, **payload}).encode() + b"\n"
        except (TypeError, ValueError) as exc:
            raise InvalidResult(f"request is not JSON-serialisable: {exc}",
                                reason="bad_request") from exc

    def _fail(self, exc: SandboxError) -> SandboxError:
        self.failure = exc
        self.close()
        return exc

    def _send(self, data: bytes, op: str, deadline: float, end: float) -> None:
        try:  # the usual case: the request fits in the pipe at once
            sent = os.write(self._in_fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            raise self._fail(self._died(op)) from None
        if sent == len(data):
            return
        view = memoryview(data)[sent:]
        with selectors.DefaultSelector() as sel:
            sel.register(self._in_fd, selectors.EVENT_WRITE)
            while view:
                left = end - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise self._fail(SandboxTimeout(
                        f"{op} timed out after {deadline:g}s (worker not reading)", op=op,
                        seconds=deadline))
                try:
                    n = os.write(self._in_fd, view)
                except BlockingIOError:
                    continue
                except OSError:
                    raise self._fail(self._died(op)) from None
                view = view[n:]

    def _receive(self, rid: int, op: str, deadline: float, end: float | None = None) -> Any:
        end = end if end is not None else time.monotonic() + deadline
        limit = self.config.max_reply_bytes
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[:nl + 1]
                value = self._decode(line, rid, op)
                if self._buf:
                    raise self.violation(f"more than one reply to {op}", op)
                return value
            if len(self._buf) > limit:
                raise self._fail(self._oversized(op))
            left = end - time.monotonic()
            if left <= 0 or not self._poll.poll(left * 1000.0):
                raise self._fail(SandboxTimeout(f"{op} timed out after {deadline:g}s; worker "
                                                "killed", op=op, seconds=deadline))
            chunk = self._read_chunk()
            if chunk is None:
                continue
            if not chunk:
                raise self._fail(self._died(op))
            if not self._buf and chunk.find(b"\n") == len(chunk) - 1:
                return self._decode(chunk, rid, op)  # the usual case: exactly one whole reply
            self._buf += chunk

    def _read_chunk(self) -> bytes | None:
        """Up to 64 KiB from the reply pipe; None if nothing is there yet, b"" at its end."""
        try:
            return os.read(self._out_fd, 1 << 16)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def _oversized(self, op: str) -> ProtocolViolation:
        return ProtocolViolation(f"reply to {op} exceeds {self.config.max_reply_bytes} bytes; "
                                 "worker killed", op=op)

    def _died(self, op: str) -> WorkerDied:
        proc = self.worker.proc
        try:
            code = proc.wait(timeout=1.0)
        except Exception:
            code = None
        sig = None
        if code is not None and code < 0:
            sig = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        elif code is not None and code > 128 and self.plan.bwrap:
            # bwrap reports the sandboxed process's death by signal as 128 + N
            sig = signal.Signals(code - 128).name if code - 128 in signal.valid_signals() else None
        tail = self._tail.text(wait=0.2)
        how = f"signal {sig}" if sig else f"exit code {code}"
        return WorkerDied(f"worker died during {op} ({how})", returncode=code, signal=sig,
                          stderr_tail=tail, op=op)

    def _decode(self, line: bytes, rid: int, op: str) -> Any:
        """One reply line -> the result, or the typed error it reports; a line that breaks the
        reply schema kills the worker (``ProtocolViolation``)."""
        try:
            ok, value = replies.envelope(replies.decode_line(line), rid)
            if ok:
                return value
            err = replies.check_error(value)
        except replies.BadReply as exc:
            raise self.violation(f"bad reply to {op}: {exc}", op) from None
        except Exception as exc:  # a gap in a check must not let a foreign exception out
            raise self.violation(f"bad reply to {op} ({type(exc).__name__})", op) from None
        raise self._error(err, op)

    def _error(self, err: dict, op: str) -> SandboxError:
        """The typed error of a checked error object (``replies.check_error``)."""
        kind = err["type"]
        message = err["message"]
        if kind == "SandboxStartError":
            if op != "start":
                return self.violation(f"a start error in reply to {op}", op)
            return SandboxStartError(message)
        if kind == "ProtocolViolation":
            return self.violation(message, op)
        if kind == "EnvRaised":
            return EnvRaised(message, exc_type=err.get("exc_type", "Exception"),
                             traceback=err.get("traceback", ""), op=op)
        if kind in ("ProgramLoadError", "InvalidResult"):
            extra = {k: err[k] for k in ("line", "traceback") if k in err}
            default = "load_error" if kind == "ProgramLoadError" else "bad_result"
            return ERROR_TYPES[kind](message, reason=err.get("reason", default), **extra, op=op)
        return ResourceLimit(message, kind=err.get("kind", ""),
                             traceback=err.get("traceback", ""), op=op)


class RemoteEnv:
    """One environment instance living in a sandbox; results are re-validated here."""

    def __init__(self, sandbox: Sandbox, instance: int, max_turns: int | None) -> None:
        self.sandbox = sandbox
        self.instance = instance
        self.max_turns = max_turns

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        raw = self.sandbox.request("reset", {"instance": self.instance, "seed": seed,
                                             "options": options})
        return self.checked_reset(raw)

    def checked_reset(self, raw: Any) -> tuple[str, dict]:
        """Re-validate a raw reset reply with the worker's own checks: the worker refuses such
        results itself, so one arriving as a success is forged (``ProtocolViolation``)."""
        value, err = checks.check_reset(tuple(raw) if type(raw) is list else raw,
                                        self.sandbox.config.max_observation_chars)
        if err:
            raise self.sandbox.violation(f"forged reset result ({err['reason']}: "
                                         f"{err['message']})", "reset")
        return value[0], value[1]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if not isinstance(action, str):
            raise TypeError(f"action must be str, got {type(action).__name__}")
        raw = self.sandbox.request("step", {"instance": self.instance, "action": action})
        return self.checked_step(raw)

    def checked_step(self, raw: Any) -> tuple[str, float, bool, bool, dict]:
        """Re-validate a raw step reply from the worker (never trust the child): one the worker
        should have refused is forged (``ProtocolViolation``)."""
        value, err = checks.check_step(tuple(raw) if type(raw) is list else raw,
                                       self.sandbox.config.max_observation_chars)
        if err:
            raise self.sandbox.violation(f"forged step result ({err['reason']}: "
                                         f"{err['message']})", "step")
        return value[0], value[1], value[2], value[3], value[4]

    def solution(self) -> list[str]:
        value = self.sandbox.request("call", {"instance": self.instance, "method": "solution"})
        if isinstance(value, str) and self.sandbox.config.compat:  # a reference-style string
            tools = self.tools() if (self.sandbox.program or {}).get("has_tools") else []
            value = refstyle.solution_of(value, tools, self.sandbox.compat_used)
        if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
            raise InvalidResult("solution() must return a list of action strings",
                                reason="bad_solution", op="solution")
        return value

    def tools(self) -> list[dict]:
        raw = self.sandbox.request("call", {"instance": self.instance, "method": "tools"})
        return self.checked_tools(raw, self.sandbox)

    @staticmethod
    def checked_tools(value: Any, sandbox: "Sandbox | None" = None) -> list[dict]:
        """A program's tool schemas, checked. From a sandbox with ``compat`` on, flat, nested
        and ``_tools``-dict schemas are normalised to nested ones first (``envs.refstyle``)."""
        if sandbox is not None and sandbox.config.compat:
            where = f"program {(sandbox.program or {}).get('class_name', '?')}"
            value = refstyle.tools_of(value, where, sandbox.compat_used)
        if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
            raise InvalidResult("tools() must return a list of schema dicts", reason="bad_tools",
                                op="tools")
        return value

    def close(self) -> None:
        if self.sandbox.alive:
            try:
                self.sandbox.request("drop", {"instance": self.instance})
            except SandboxError:
                pass

    async def areset(self, *, seed: int | None = None, options: dict | None = None):
        return await asyncio.to_thread(lambda: self.reset(seed=seed, options=options))

    async def astep(self, action: str):
        return await asyncio.to_thread(self.step, action)
