"""A warm pool of sandbox workers.

Booting an isolated worker costs tens of milliseconds (interpreter start, namespaces, Landlock,
seccomp); the pool keeps ``warm`` workers booted ahead of demand so that hosting a new program
costs one ``load`` round trip. Workers are never reused across programs: a worker is handed out
once, and closing the returned ``Sandbox`` kills it; a background thread boots replacements.

Thread-safe; ``aacquire`` serves asyncio callers. ``max_workers`` bounds the live sandboxes
(handed out + warm); ``acquire`` waits for a free slot up to its timeout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time

from spadekit.common.errors import ConfigError, SandboxError, SandboxStartError
from spadekit.sandbox.config import SandboxConfig
from spadekit.sandbox.isolation import IsolationReport, detect
from spadekit.sandbox.sandbox import Sandbox


YIELD_S = 0.005


class SandboxPool:
    def __init__(self, config: SandboxConfig | None = None, warm: int = 2,
                 max_workers: int | None = None) -> None:
        if warm < 0 or (max_workers is not None and max_workers < 1):
            raise ConfigError("warm must be >= 0 and max_workers >= 1")
        self.config = config or SandboxConfig()
        self.report, self.plan = detect(self.config)
        self.warm = warm if max_workers is None else min(warm, max_workers)
        self.max_workers = max_workers
        self._ready: collections.deque[Sandbox] = collections.deque()
        self._live: set[Sandbox] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._booting = 0
        self._last_pop = 0.0
        self._paused = 0
        self.stats = {"acquired": 0, "warm_hits": 0, "cold_starts": 0, "boot_failures": 0}
        # Booting is mostly waiting for the child, so a few boots run side by side.
        self._threads = [threading.Thread(target=self._refill, daemon=True,
                                          name=f"spadekit-sandbox-pool-{i}")
                         for i in range(max(1, min(self.warm, 4)))]
        for thread in self._threads:
            thread.start()

    @property
    def isolation(self) -> IsolationReport:
        return self.report

    # -- public API ------------------------------------------------------------------------

    def acquire(self, code: str, filename: str = "env.py", timeout: float = 60.0) -> Sandbox:
        """A sandbox hosting ``code`` (already loaded). Load failures raise typed errors
        (``ProgramLoadError``, ``SandboxTimeout``, ...) and the worker is discarded."""
        sb = self._take(timeout)
        try:
            sb.load(code, filename)
        except BaseException:
            self.release(sb)
            raise
        return sb

    def spare(self, timeout: float = 60.0) -> Sandbox:
        """A booted sandbox with no program yet (call ``load`` on it yourself)."""
        return self._take(timeout)

    def release(self, sb: Sandbox) -> None:
        """Kill a sandbox handed out by this pool (``sb.close()`` does the same)."""
        sb.close()
        with self._cond:
            self._live.discard(sb)
            self._cond.notify_all()

    @contextlib.contextmanager
    def paused(self):
        """Hold background boots while latency-critical work runs (a rollout): replacements for
        the workers it takes are booted when the block ends. ``acquire`` still cold-starts a
        worker when none is warm."""
        with self._cond:
            self._paused += 1
        try:
            yield self
        finally:
            with self._cond:
                self._paused -= 1
                self._cond.notify_all()

    def sandboxes(self) -> list[Sandbox]:
        """The sandboxes this pool holds now: warm ones and those handed out."""
        with self._cond:
            return list(self._ready) + list(self._live)

    async def aacquire(self, code: str, filename: str = "env.py", timeout: float = 60.0):
        return await asyncio.to_thread(self.acquire, code, filename, timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            workers = list(self._ready) + list(self._live)
            self._ready.clear()
            self._live.clear()
            self._cond.notify_all()
        for sb in workers:
            sb.close()
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _count(self) -> int:
        return len(self._ready) + len(self._live) + self._booting

    def _take(self, timeout: float) -> Sandbox:
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the sandbox pool is closed")
                self._live = {s for s in self._live if not s.worker.closed}
                while self._ready and not self._ready[0].alive:
                    self._ready.popleft()
                if self._ready:
                    sb = self._ready.popleft()
                    self._last_pop = time.monotonic()
                    self._live.add(sb)
                    self.stats["acquired"] += 1
                    self.stats["warm_hits"] += 1
                    self._cond.notify_all()
                    return sb
                if self.max_workers is None or self._count() < self.max_workers:
                    self._booting += 1
                    break
                left = end - time.monotonic()
                if left <= 0:
                    raise SandboxStartError(f"no sandbox slot free within {timeout:g}s "
                                            f"(max_workers={self.max_workers})")
                self._cond.wait(min(left, 0.5))
        try:
            sb = Sandbox.start(self.config, self.plan)
        finally:
            with self._cond:
                self._booting -= 1
        with self._cond:
            self._live.add(sb)
            self.stats["acquired"] += 1
            self.stats["cold_starts"] += 1
            self._cond.notify_all()
        return sb

    def _refill(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._closed and (
                        self._paused
                        or len(self._ready) + self._booting >= self.warm
                        or (self.max_workers is not None and self._count() >= self.max_workers)):
                    self._cond.wait(0.5)
                if self._closed:
                    return
                self._booting += 1
                wait = YIELD_S - (time.monotonic() - self._last_pop)
            if wait > 0:  # let the caller that just took a worker load its program first:
                time.sleep(wait)  # spawning holds the GIL for a while
            try:
                sb = Sandbox.start(self.config, self.plan)
                failures = 0
            except SandboxError:
                sb = None
                failures += 1
                self.stats["boot_failures"] += 1
            with self._cond:
                self._booting -= 1
                if sb is not None:
                    if self._closed:
                        sb.close()
                    else:
                        self._ready.append(sb)
                self._cond.notify_all()
            if failures:
                time.sleep(min(0.05 * 2 ** failures, 5.0))
