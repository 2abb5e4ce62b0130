"""Many sandbox requests at once, without threads: write them all, read replies as they come.

A rollout turn steps hundreds of environment instances living in dozens of workers. Instead of a
thread per call (GIL hand-offs, a thread pool's bookkeeping), ``request_many`` writes every
request into its worker's pipe and then multiplexes all replies with one ``poll``: workers run
in parallel, requests to one worker queue in order. Every request still gets its own deadline
(``step_timeout`` counted from when its predecessor in the same worker finished) and its own
typed result: an environment that raises fails that request only; a worker that hangs, dies or
breaks the protocol fails its pending requests and is killed, and the other workers go on.
Replies are checked exactly as ``Sandbox.request`` checks them (schema, one reply per request,
a silent pipe between batches); every value out of here is a result or a ``SandboxError``.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections import deque
from typing import Any

from spadekit.common.errors import SandboxError, SandboxTimeout
from spadekit.sandbox.sandbox import RemoteEnv, Sandbox

Call = tuple[Sandbox, str, dict]


def request_many(calls: list[Call], seconds: list[float] | None = None,
                 turn_seconds: list[float] | None = None) -> list[Any]:
    """Results in call order; each is the reply's result or the ``SandboxError`` instance.
    ``seconds`` (a list, filled in call order): each request's service time, from when its
    worker finished the request before it (or the batch started) to its reply; 0.0 for a
    request that failed without a reply. ``turn_seconds`` (filled in call order): the total
    of its worker's requests in this batch (the time that worker's last reply took from the
    batch's start), the same figure for every call to one worker: a worker serves its calls one
    after another, so this is what the slowest of them held the whole batch."""
    results: list[Any] = [None] * len(calls)
    if turn_seconds is not None and seconds is None:
        seconds = []
    if seconds is not None:
        seconds[:] = [0.0] * len(calls)
    groups: dict[int, list[int]] = {}
    boxes: dict[int, Sandbox] = {}
    for i, (sb, _op, _payload) in enumerate(calls):
        groups.setdefault(id(sb), []).append(i)
        boxes[id(sb)] = sb
    with contextlib.ExitStack() as stack:
        for key in sorted(boxes):  # one lock order for everyone: no deadlock between batches
            stack.enter_context(boxes[key]._lock)
        live: dict[int, _Flight] = {}
        for key, idx in groups.items():
            sb = boxes[key]
            try:
                sb._check_open()
                sb.check_quiet(calls[idx[0]][1])
                live[key] = _Flight(sb, [(i, calls[i][1], calls[i][2]) for i in idx], seconds)
            except SandboxError as exc:
                for i in idx:
                    results[i] = exc
        for fl in live.values():  # continue workers stopped while idle (launch.py), as
            fl.sb.worker.wake()  # Sandbox.request does
        try:
            _pump(live, results)
        finally:
            for fl in live.values():
                fl.sb.worker.rest()
    if turn_seconds is not None:
        total = {key: sum(seconds[i] for i in idx) for key, idx in groups.items()}
        turn_seconds[:] = [total[id(sb)] for sb, _op, _payload in calls]
    return results


def step_many(pairs: list[tuple[RemoteEnv, str]], seconds: list[float] | None = None,
              turn_seconds: list[float] | None = None) -> list[Any]:
    """``RemoteEnv.step`` for many environments at once; each result is the checked 5-tuple or
    the ``SandboxError`` instance (``seconds``, ``turn_seconds``: as in ``request_many``)."""
    raw = request_many([(env.sandbox, "step", {"instance": env.instance, "action": action})
                        for env, action in pairs], seconds, turn_seconds)
    out = []
    for (env, _action), value in zip(pairs, raw):
        if isinstance(value, SandboxError):
            out.append(value)
            continue
        try:
            out.append(env.checked_step(value))
        except SandboxError as exc:
            out.append(exc)
    return out


def start_many(specs: list[tuple[Sandbox, int | None, int | None, dict | None]]) -> list[Any]:
    """Create an instance in each sandbox and reset it: ``(sandbox, max_turns, seed, options)``
    in, ``(RemoteEnv, observation, info)`` or the ``SandboxError`` out."""
    created = request_many([(sb, "create", {"kwargs": {} if mt is None else {"max_turns": mt}})
                            for sb, mt, _seed, _opt in specs])
    envs: list[Any] = []
    for (sb, mt, _seed, _opt), info in zip(specs, created):
        if isinstance(info, SandboxError):
            envs.append(info)
            continue
        try:
            envs.append(sb.created(info, mt))
        except SandboxError as exc:
            envs.append(exc)
    todo = [i for i, e in enumerate(envs) if isinstance(e, RemoteEnv)]
    raw = request_many([(envs[i].sandbox, "reset", {"instance": envs[i].instance,
                                                    "seed": specs[i][2], "options": specs[i][3]})
                        for i in todo])
    out: list[Any] = list(envs)
    for i, value in zip(todo, raw):
        if isinstance(value, SandboxError):
            out[i] = value
            continue
        try:
            obs, info = envs[i].checked_reset(value)
            out[i] = (envs[i], obs, info)
        except SandboxError as exc:
            out[i] = exc
    return out


class _Flight:
    """The requests of one worker in this batch: bytes still to write, replies still due."""

    def __init__(self, sb: Sandbox, items: list[tuple[int, str, dict]],
                 seconds: list[float] | None = None) -> None:
        self.sb = sb
        self.seconds = seconds
        self.since = time.monotonic()  # when the request now due started being served
        self.pending: deque[tuple[int, int, str]] = deque()
        chunks = []
        for index, op, payload in items:
            rid = next(sb._ids)
            chunks.append(sb._encode(rid, op, payload))
            self.pending.append((index, rid, op))
        self.out = memoryview(b"".join(chunks))
        self.deadline = time.monotonic() + sb.deadline(items[0][1])

    def fail_all(self, exc: SandboxError, results: list[Any]) -> None:
        while self.pending:
            results[self.pending.popleft()[0]] = exc


def _pump(live: dict[int, _Flight], results: list[Any]) -> None:
    by_fd: dict[int, _Flight] = {}
    for fl in live.values():
        by_fd[fl.sb._in_fd] = fl
        by_fd[fl.sb._out_fd] = fl
    while any(fl.pending for fl in live.values()):
        fds = {}
        now = time.monotonic()
        soonest = None
        for fl in live.values():
            if not fl.pending:
                continue
            if now >= fl.deadline:
                op = fl.pending[0][2]
                seconds = fl.sb.deadline(op)
                fl.fail_all(fl.sb._fail(SandboxTimeout(
                    f"{op} timed out after {seconds:g}s; worker killed", op=op,
                    seconds=seconds)), results)
                continue
            fds[fl.sb._out_fd] = select.POLLIN
            if fl.out:
                fds[fl.sb._in_fd] = select.POLLOUT
            soonest = fl.deadline if soonest is None else min(soonest, fl.deadline)
        if not fds:
            break
        poller = select.poll()
        for fd, mask in fds.items():
            poller.register(fd, mask)
        for fd, event in poller.poll(max(0.0, soonest - now) * 1000.0):
            fl = by_fd[fd]
            if not fl.pending:
                continue
            if fd == fl.sb._in_fd:
                _write(fl, results)
            else:
                _read(fl, results)


def _write(fl: _Flight, results: list[Any]) -> None:
    try:
        n = os.write(fl.sb._in_fd, fl.out)
        fl.out = fl.out[n:]
    except BlockingIOError:
        pass
    except OSError:
        fl.fail_all(fl.sb._fail(fl.sb._died(fl.pending[0][2])), results)


def _read(fl: _Flight, results: list[Any]) -> None:
    sb = fl.sb
    chunk = sb._read_chunk()
    if chunk is None:
        return
    if not chunk:
        fl.fail_all(sb._fail(sb._died(fl.pending[0][2])), results)
        return
    sb._buf += chunk
    while fl.pending:
        nl = sb._buf.find(b"\n")
        if nl < 0:
            if len(sb._buf) > sb.config.max_reply_bytes:
                fl.fail_all(sb._fail(sb._oversized(fl.pending[0][2])), results)
            return
        line = bytes(sb._buf[:nl])
        del sb._buf[:nl + 1]
        index, rid, op = fl.pending.popleft()
        if fl.seconds is not None:
            now = time.monotonic()
            fl.seconds[index], fl.since = now - fl.since, now
        try:
            results[index] = sb._decode(line, rid, op)
        except SandboxError as exc:
            results[index] = exc
            if sb.failure is not None:  # the worker was killed: the rest cannot be answered
                fl.fail_all(sb.failure, results)
                return
        if fl.pending:
            fl.deadline = time.monotonic() + sb.deadline(fl.pending[0][2])
        elif sb._buf:  # bytes after the last reply due: a reply nobody asked for
            results[index] = sb.violation(f"more than one reply to {op}", op)
