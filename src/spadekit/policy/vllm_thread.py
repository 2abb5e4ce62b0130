"""One thread for an in-process vLLM engine: it is built there and every generation runs there.

vLLM's CPU build binds its OpenMP threads in the thread that builds the engine, and its
attention kernel refuses a step from a thread with another OpenMP thread count; built and
stepped on one thread, the counts agree whoever calls. The thread is a daemon and serves one call
at a time; a call from the engine thread itself runs inline; an interrupted caller asks the call
to stop and waits for it (``call``). It ends when its owner is collected (``stop``).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable


class EngineThread:
    """Runs callables on one long-lived daemon thread, in order; ``call`` waits for the result
    (or re-raises the exception) in the caller."""

    def __init__(self, name: str = "spadekit-vllm") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, args, kwargs = job
            fut.set_running_or_notify_cancel()  # nobody cancels these futures
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to the caller, who re-raises it
                fut.set_exception(exc)
            del job, fut, fn, args, kwargs  # hold nothing of the owner between calls

    def call(self, fn: Callable[..., Any], *args: Any,
             on_interrupt: Callable[[], None] | None = None, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the thread; its result, or its exception raised here.
        When the caller is interrupted while it waits (``KeyboardInterrupt``, a signal
        handler's ``SystemExit``), ``on_interrupt`` is called (it asks ``fn`` to stop) and the
        caller still waits for ``fn`` to end before the interrupt goes on: the engine is never
        left working for nobody (a weight push racing it), and the interpreter
        never exits under a thread inside the engine's native code (that aborts the process:
        "terminate called without an active exception")."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        if not self._thread.is_alive():
            raise RuntimeError("the engine thread has stopped")
        fut: Future = Future()
        self._jobs.put((fut, fn, args, kwargs))
        try:
            return fut.result()
        except BaseException:
            if fut.done():
                raise  # fn's own exception
            if on_interrupt is not None:
                on_interrupt()
            while True:  # more Ctrl-C while fn winds down changes nothing
                try:
                    fut.exception()
                    break
                except BaseException:
                    continue
            raise

    def stop(self) -> None:
        """Ends the thread after the calls already queued."""
        self._jobs.put(None)
