"""Sandboxed environments and validation on Ray actors: ``RayEnvBackend`` and ``RayValidator``.

``RayEnvBackend(num_workers)`` is an ``EnvBackend`` whose actors each own a local
``SandboxPool`` (each node applies its own isolation tier, or answers with
``InsecureSandboxError``). A program's episodes go to one actor by sha256; calls fan out and are
gathered with a deadline; a dead or late actor turns its episodes into typed ``WorkerDied`` /
``SandboxTimeout`` failures and is replaced. Step timings and typed errors cross Ray as plain
data, so the engine sees what it sees with the local pool. ``RayValidator`` spreads
``Validator.validate_many`` over the same actors; ``make_env_backend`` builds either backend.
Importing never imports Ray; without it, building raises ``ConfigError``. On a cluster spadekit
must be importable on every node.
"""

from __future__ import annotations

import math
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from spadekit.common.errors import (ConfigError, SandboxClosed, SandboxError, SandboxTimeout,
                             SpadekitError, WorkerDied)
from spadekit.rollout.engine import (EnvBackend, EnvSession, LocalPoolBackend, StartItem, Started,
                              StepResult)
from spadekit.rollout.ray_reaper import RayReaper
from spadekit.sandbox.config import SandboxConfig

SLACK_S = 30.0
"""Added to every computed actor-call deadline (actor start-up, Ray scheduling, transfer)."""

_ATTRS = ("exc_type", "traceback", "op", "seconds", "returncode", "signal", "stderr_tail",
          "kind")
"""Keyword details that some error classes also keep as attributes (those their ``__init__``
names)."""


# -- typed errors as plain data -------------------------------------------------------------

def _error_classes() -> dict[str, type[SpadekitError]]:
    out: dict[str, type[SpadekitError]] = {}
    todo: list[type[SpadekitError]] = [SpadekitError]
    while todo:
        cls = todo.pop()
        out.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return out


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def error_to_wire(exc: SpadekitError) -> dict[str, Any]:
    """A typed error as a plain dict (safe to pickle, to send over Ray, to store)."""
    return {"__spadekit_error__": type(exc).__name__, "reason": exc.reason,
            "message": exc.message,
            "details": {k: v for k, v in exc.details.items() if _plain(v)}}


def error_from_wire(data: dict[str, Any]) -> SandboxError:
    """The ``SandboxError`` subclass instance that ``error_to_wire`` described."""
    cls = _error_classes().get(str(data.get("__spadekit_error__")), SandboxError)
    if not issubclass(cls, SandboxError):
        cls = SandboxError
    exc = cls.__new__(cls)
    Exception.__init__(exc, data["message"])
    exc.message = data["message"]
    exc.details = dict(data.get("details") or {})
    if data.get("reason") and data["reason"] != cls.reason:
        exc.reason = data["reason"]
    init = cls.__init__.__code__
    named = init.co_varnames[:init.co_argcount + init.co_kwonlyargcount]
    for key in _ATTRS:
        if key in named and key in exc.details:
            setattr(exc, key, exc.details[key])
    return exc


def _is_wire_error(value: Any) -> bool:
    return isinstance(value, dict) and "__spadekit_error__" in value


# -- the actor (a plain class; wrapped by ray.remote lazily) ---------------------------------

class EnvActor:
    """One Ray actor: a local sandbox pool plus the episodes it started, per session."""

    def __init__(self, config: SandboxConfig, warm: int, load_workers: int) -> None:
        from spadekit.sandbox.pool import SandboxPool

        self.config = config
        self.load_workers = load_workers
        self.pool: SandboxPool | None = None
        self.error: SandboxError | None = None
        try:
            self.pool = SandboxPool(config, warm=warm)
        except SandboxError as exc:  # e.g. InsecureSandboxError: this node has no safe tier
            self.error = exc
        self.sessions: dict[str, Any] = {}
        self.envs: dict[str, dict[int, Any]] = {}
        self._keys = 0

    def info(self) -> dict[str, Any]:
        import os
        import socket

        node = None
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:
            pass
        return {"pid": os.getpid(), "host": socket.gethostname(), "node_id": node,
                "tier": self.pool.report.tier if self.pool else None,
                "error": error_to_wire(self.error) if self.error else None}

    def _session(self, sid: str):
        if sid not in self.sessions:
            self.sessions[sid] = LocalPoolBackend(self.pool, self.load_workers).session()
            self.envs[sid] = {}
        return self.sessions[sid]

    def start(self, sid: str, items: list[StartItem]) -> list[Any]:
        if self.pool is None:
            return [error_to_wire(self.error)] * len(items)
        envs = self._session(sid)
        table = self.envs[sid]
        out: list[Any] = []
        for result in envs.start(items):
            if isinstance(result, SandboxError):
                out.append(error_to_wire(result))
                continue
            self._keys += 1
            table[self._keys] = result[0]
            out.append((self._keys, result[1], result[2], result[3]))
        return out

    def step(self, sid: str, pairs: list[tuple[int, str]]) -> dict[str, list[Any]]:
        """``results`` (a step result or wire error per pair), and per pair the episode's own
        ``seconds`` and its sandbox worker's ``turn_seconds`` (None where not measured)."""
        table = self.envs.get(sid, {})
        known = [(table[k], a) for k, a in pairs if k in table]
        session = self.sessions.get(sid)
        raw = session.step(known) if known and session is not None else []
        results = iter(raw)
        own = iter(_aligned(getattr(session, "step_seconds", None), len(raw)))
        turn = iter(_aligned(getattr(session, "turn_seconds", None), len(raw)))
        out: dict[str, list[Any]] = {"results": [], "seconds": [], "turn_seconds": []}
        for key, _action in pairs:
            if key not in table:
                out["results"].append(error_to_wire(SandboxClosed(
                    "this episode is not live on its Ray env worker", op="step")))
                out["seconds"].append(None)
                out["turn_seconds"].append(None)
                continue
            result = next(results)
            out["results"].append(error_to_wire(result) if isinstance(result, SandboxError)
                                  else result)
            out["seconds"].append(next(own))
            out["turn_seconds"].append(next(turn))
        return out

    def release(self, sid: str) -> None:
        session = self.sessions.pop(sid, None)
        self.envs.pop(sid, None)
        if session is not None:
            session.release()

    def validate(self, sources: list[Any], settings: Any, workers: int,
                 seeds: list[int] | None = None) -> list[Any]:
        from spadekit.sandbox.validate import Validator

        validator = Validator(self.pool if self.pool is not None else _RefusingPool(self.error),
                              settings)
        return validator.validate_many(sources, workers=workers, seeds=seeds)

    def ping(self) -> bool:
        return True


class _RefusingPool:
    """Stands in for the pool of an actor whose node has no safe tier: every load fails typed."""

    def __init__(self, error: SandboxError | None) -> None:
        self.error = error

    def acquire(self, code: str, *args: Any, **kwargs: Any) -> Any:
        raise self.error or SandboxError("no sandbox on this Ray env worker")

    def release(self, sb: Any) -> None:
        pass

    def close(self) -> None:
        pass


_REMOTE: dict[str, Any] = {}
_REMOTE_LOCK = threading.Lock()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError('the Ray env backend needs Ray: pip install "spadekit[ray]"') from None
    return ray


def _remote_actor_class(ray: Any) -> Any:
    with _REMOTE_LOCK:
        if "actor" not in _REMOTE:
            _REMOTE["actor"] = ray.remote(max_restarts=0)(EnvActor)
        return _REMOTE["actor"]


# -- the driver side ----------------------------------------------------------------------

@dataclass(frozen=True)
class RayHandle:
    """An episode living on a Ray env worker: its slot, the actor generation, its key there."""

    slot: int
    generation: int
    key: int


@dataclass
class _Slot:
    actor: Any
    generation: int


class RayEnvBackend(EnvBackend):
    """Environments on ``num_workers`` Ray actors, each with its own local sandbox pool.

    ``address``: None starts (or joins) local Ray, with a ``ray_reaper`` watchdog; ``"auto"`` or
    ``"ray://host:10001"`` joins a cluster. ``warm``: warm sandboxes per actor. ``call_timeout``: a
    fixed deadline per actor call (default: from the sandbox deadlines and call size, plus
    ``SLACK_S``). ``actor_options`` go to ``.options()`` (default ``SPREAD``), ``init_options`` to
    ``ray.init``.
    """

    def __init__(self, num_workers: int = 2, sandbox_config: SandboxConfig | None = None,
                 address: str | None = None, warm: int = 2, *, load_workers: int = 8,
                 call_timeout: float | None = None, actor_options: dict | None = None,
                 init_options: dict | None = None) -> None:
        if num_workers < 1:
            raise ConfigError("RayEnvBackend needs num_workers >= 1")
        ray = _import_ray()
        self.ray = ray
        self.config = sandbox_config or SandboxConfig()
        self.num_workers = num_workers
        self.warm = warm
        self.load_workers = load_workers
        self.call_timeout = call_timeout
        self.actor_options = {"scheduling_strategy": "SPREAD", **(actor_options or {})}
        self.owns_ray = False
        self.reaper: Any = None
        if not ray.is_initialized():
            if address in (None, "local"):  # a local Ray may start here: it dies with us
                self.reaper = RayReaper.for_ray(ray)
            try:
                ray.init(address=address, include_dashboard=False, **(init_options or {}))
            except BaseException:
                if self.reaper is not None:
                    self.reaper.close()
                raise
            self.owns_ray = True
        self._cls = _remote_actor_class(ray)
        self._lock = threading.Lock()
        self.slots = [self._spawn(0) for _ in range(num_workers)]
        self.replaced = 0
        self._closed = False

    # -- actors ---------------------------------------------------------------------------

    def _spawn(self, generation: int) -> _Slot:
        actor = self._cls.options(**self.actor_options).remote(self.config, self.warm,
                                                                self.load_workers)
        return _Slot(actor, generation)

    def _replace(self, index: int, generation: int) -> None:
        with self._lock:
            slot = self.slots[index]
            if slot.generation != generation or self._closed:
                return  # someone already replaced it
            try:
                self.ray.kill(slot.actor, no_restart=True)
            except Exception:
                pass
            self.slots[index] = self._spawn(generation + 1)
            self.replaced += 1

    def actors(self) -> list[Any]:
        """The live actor handles, slot order (for tests and monitoring)."""
        return [s.actor for s in self.slots]

    def workers_info(self, timeout: float = 60.0) -> list[dict[str, Any] | SandboxError]:
        """Each actor's pid, host, node id and isolation tier (or its typed refusal)."""
        calls = [(i, "info", ()) for i in range(self.num_workers)]
        return self.call(calls, timeout)

    def call(self, calls: list[tuple[int, str, tuple]], timeout: float) -> list[Any]:
        """Run ``(slot, method, args)`` calls at once; each result is the method's return or a
        typed ``SandboxError`` for the whole call (actor died, deadline missed: replaced)."""
        ray = self.ray
        sent = []
        for index, method, args in calls:
            slot = self.slots[index]
            sent.append((index, method, slot.generation,
                         getattr(slot.actor, method).remote(*args)))
        refs = [s[3] for s in sent]
        _ready, waiting = ray.wait(refs, num_returns=len(refs), timeout=timeout) \
            if refs else ([], [])
        late = set(waiting)
        out: list[Any] = []
        for index, method, generation, ref in sent:
            if ref in late:
                self._replace(index, generation)
                out.append(SandboxTimeout(
                    f"Ray env worker {index} did not answer {method} within {timeout:g}s; "
                    "actor replaced", op=method, seconds=timeout, worker=index))
                continue
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayActorError as exc:
                self._replace(index, generation)
                out.append(WorkerDied(f"Ray env worker {index} died during {method}: "
                                      f"{str(exc).splitlines()[0][:500] if str(exc) else ''}",
                                      op=method, worker=index))
            except ray.exceptions.RayError as exc:
                out.append(SandboxError(f"Ray env worker {index} failed {method}: "
                                        f"{str(exc)[-1500:]}", op=method, worker=index))
        return out

    def deadline(self, op: str, per_sandbox: int) -> float:
        """The actor-call deadline for ``per_sandbox`` queued requests to one sandbox."""
        if self.call_timeout is not None:
            return self.call_timeout
        c = self.config
        n = max(1, per_sandbox)
        if op == "start":
            return SLACK_S + c.start_timeout + c.load_timeout + n * (
                c.create_timeout + c.reset_timeout + c.call_timeout)
        return SLACK_S + n * c.deadline(op)

    # -- EnvBackend -----------------------------------------------------------------------

    def session(self) -> "RaySession":
        return RaySession(self)

    def assign(self, items: list[StartItem]) -> list[int]:
        """A slot per item: programs grouped by sha (split while there are fewer groups than
        actors), groups placed largest first on the least-loaded actor. Deterministic."""
        by_sha: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            by_sha.setdefault(item[0], []).append(i)
        groups = sorted(by_sha.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        while len(groups) < self.num_workers and len(groups[0][1]) > 1:
            sha, idx = groups.pop(0)
            half = (len(idx) + 1) // 2
            groups += [(sha, idx[:half]), (sha, idx[half:])]
            groups.sort(key=lambda kv: (-len(kv[1]), kv[0], kv[1][0]))
        load = [0] * self.num_workers
        slot_of = [0] * len(items)
        for _sha, idx in groups:
            best = min(range(self.num_workers), key=lambda k: (load[k], k))
            load[best] += len(idx)
            for i in idx:
                slot_of[i] = best
        return slot_of

    def close(self) -> None:
        """Kill the actors (and with them their sandboxes); shut Ray down if this started it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            slots, self.slots = self.slots, []
        for slot in slots:
            try:
                self.ray.kill(slot.actor, no_restart=True)
            except Exception:
                pass
        if self.owns_ray:
            self.ray.shutdown()
        if self.reaper is not None:  # kills whatever the shutdown left running
            self.reaper.close()
            self.reaper = None

    def __enter__(self) -> "RayEnvBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RaySession(EnvSession):
    """One rollout run's episodes on the backend's actors (a session id on each actor)."""

    def __init__(self, backend: RayEnvBackend) -> None:
        self.backend = backend
        self.id = uuid.uuid4().hex
        self.used: dict[int, int] = {}
        """slot -> actor generation this session started episodes on."""

    def start(self, items: list[StartItem]) -> list[Started | SandboxError]:
        if not items:
            return []
        b = self.backend
        if b._closed:
            return [SandboxClosed("the Ray env backend was closed", op="start") for _ in items]
        slot_of = b.assign(items)
        per_slot: dict[int, list[int]] = {}
        for i, slot in enumerate(slot_of):
            per_slot.setdefault(slot, []).append(i)
        order = sorted(per_slot)
        for slot in order:
            self.used.setdefault(slot, b.slots[slot].generation)
        generations = {slot: b.slots[slot].generation for slot in order}
        worst = max(_max_per_key([items[i][0] for i in per_slot[s]]) for s in order)
        results = b.call([(s, "start", (self.id, [items[i] for i in per_slot[s]]))
                          for s in order], b.deadline("start", worst))
        out: list[Any] = [None] * len(items)
        _scatter(out, order, per_slot, results, lambda slot, r: (
            RayHandle(slot, generations[slot], r[0]), r[1], r[2], r[3]))
        return out

    def step(self, pairs: list[tuple[Any, str]]) -> list[StepResult | SandboxError]:
        b = self.backend
        out: list[Any] = [None] * len(pairs)
        per_slot: dict[int, list[int]] = {}
        for i, (handle, _action) in enumerate(pairs):
            if b._closed:
                out[i] = SandboxClosed("the Ray env backend was closed", op="step")
            elif handle.generation != b.slots[handle.slot].generation:
                out[i] = WorkerDied("the Ray env worker hosting this episode died or was "
                                    "replaced", op="step", worker=handle.slot)
            else:
                per_slot.setdefault(handle.slot, []).append(i)
        order = sorted(per_slot)
        if not order:
            return out
        worst = max(len(per_slot[s]) for s in order)  # bound: all on one sandbox
        replies = b.call([(s, "step", (self.id, [(pairs[i][0].key, pairs[i][1])
                                                 for i in per_slot[s]])) for s in order],
                         b.deadline("step", worst))
        own: list[float | None] = [None] * len(pairs)
        turn: list[float | None] = [None] * len(pairs)
        results: list[Any] = []
        for slot, reply in zip(order, replies):
            if isinstance(reply, SandboxError) or not isinstance(reply, dict):
                results.append(reply)
                continue
            results.append(reply["results"])
            for i, sec, total in zip(per_slot[slot], reply["seconds"], reply["turn_seconds"]):
                own[i], turn[i] = sec, total
        _scatter(out, order, per_slot, results, lambda slot, r: r)
        self.step_seconds, self.turn_seconds = own, turn  # type: ignore[assignment]
        return out

    def release(self) -> None:
        b = self.backend
        used, self.used = self.used, {}
        calls = [(slot, "release", (self.id,)) for slot, gen in sorted(used.items())
                 if not b._closed and b.slots[slot].generation == gen]
        if calls:
            b.call(calls, SLACK_S)


def _aligned(values: list[Any] | None, n: int) -> list[Any]:
    """``values`` when it has one entry per result, else None for each."""
    return list(values) if isinstance(values, list) and len(values) == n else [None] * n


def _max_per_key(keys: list[str]) -> int:
    counts: dict[str, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    return max(counts.values()) if counts else 0


# -- validation fan-out ---------------------------------------------------------------------

class RayValidator:
    """``Validator.validate_many`` spread over a ``RayEnvBackend``'s actors (round-robin), the
    same ``ValidationReport``s back in order. Each actor runs ``workers`` validations at once.
    An actor that dies or misses its deadline fails its share with stage ``load`` and the
    typed error's reason (``worker_died`` / ``timeout``)."""

    def __init__(self, backend: RayEnvBackend, settings: Any = None) -> None:
        from spadekit.sandbox.validate import ValidatorSettings

        self.backend = backend
        self.settings = settings or ValidatorSettings()

    def validate_many(self, sources: list[Any], workers: int = 2,
                      seeds: list[int] | None = None) -> list[Any]:
        """``seeds``: one validation seed per source (``Validator.validate_many``'s), else each
        actor draws its own."""
        from spadekit.sandbox.validate import ValidationReport

        if seeds is not None and len(seeds) != len(sources):
            raise ConfigError(f"{len(seeds)} seeds for {len(sources)} programs")
        if not sources:
            return []
        b = self.backend
        n = min(b.num_workers, len(sources))
        shares = [list(range(k, len(sources), n)) for k in range(n)]
        per_call = math.ceil(max(len(s) for s in shares) / max(1, workers))
        c = b.config
        timeout = b.call_timeout or SLACK_S + per_call * (
            self.settings.total_timeout + c.start_timeout + c.load_timeout + c.create_timeout
            + max(c.step_timeout, c.call_timeout, c.reset_timeout))
        results = b.call([(k, "validate", ([sources[i] for i in share], self.settings, workers,
                                            None if seeds is None else [seeds[i] for i in share]))
                          for k, share in enumerate(shares)], timeout)
        out: list[Any] = [None] * len(sources)
        for share, result in zip(shares, results):
            for j, i in enumerate(share):
                if isinstance(result, SandboxError):
                    out[i] = ValidationReport(False, "load", result.reason, result.message,
                                              {"error": result.to_dict()}, _program(sources[i]))
                else:
                    out[i] = result[j]
        return out

    def validate(self, source: Any) -> Any:
        return self.validate_many([source], workers=1)[0]

    def close(self) -> None:
        """The backend belongs to the caller."""

    def __enter__(self) -> "RayValidator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _program(source: Any) -> Any:
    from spadekit.sandbox.validate import to_program

    try:
        return to_program(source)
    except Exception:
        return None


# -- construction from settings -------------------------------------------------------------

class _OwnedPoolBackend(LocalPoolBackend):
    def close(self) -> None:
        self.pool.close()


def _scatter(out: list[Any], order: list[int], per_slot: dict[int, list[int]],
             results: list[Any], convert: Callable[[int, Any], Any]) -> None:
    """Put each actor's per-request results back at their places in ``out``: an actor-level
    failure fails all its requests; a wire error becomes its typed error; else ``convert``."""
    for slot, result in zip(order, results):
        idx = per_slot[slot]
        if isinstance(result, SandboxError):
            for i in idx:
                out[i] = result
            continue
        for i, r in zip(idx, result):
            out[i] = error_from_wire(r) if _is_wire_error(r) else convert(slot, r)


def make_env_backend(kind: str, sandbox_config: SandboxConfig | None = None, *,
                     pool: Any = None, num_workers: int = 2, address: str | None = None,
                     warm: int = 2, **ray_options: Any) -> EnvBackend:
    """``local``: ``LocalPoolBackend`` over ``pool`` (the caller's), else over a new pool that
    ``close()`` closes. ``ray``: ``RayEnvBackend(num_workers, sandbox_config, address, warm,
    **ray_options)``."""
    if kind == "local":
        if pool is not None:
            return LocalPoolBackend(pool)
        from spadekit.sandbox.pool import SandboxPool

        return _OwnedPoolBackend(SandboxPool(sandbox_config, warm=warm))
    if kind == "ray":
        return RayEnvBackend(num_workers, sandbox_config, address, warm, **ray_options)
    raise ConfigError(f"env backend must be local or ray, got {kind!r}")


__all__ = ["EnvActor", "RayEnvBackend", "RayHandle", "RaySession", "RayValidator",
           "error_from_wire", "error_to_wire", "make_env_backend"]
