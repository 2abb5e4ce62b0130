"""A watch on vLLM's engine process, for the ``vllm`` backend: the engine dying or freezing in the
middle of a generation ends it in ``EngineLost`` instead of a wait without end.

With the engine in a child process, ``vllm.LLM``'s client waits for each step's outputs without
a timeout, forever once the process is killed or frozen. ``watch(llm, lose)`` wraps that
client's ``get_output``: the wait ends in ``lose(why)`` when the engine is marked dead (checked
every second) or produces nothing for ``step_timeout()`` seconds (``SPADEKIT_VLLM_TIMEOUT``,
default 300), after killing the engine's processes. No polling latency. An in-process engine,
or a client without these attributes, is not watched.
"""

from __future__ import annotations

import queue
import time
from typing import Any, Callable

from spadekit.policy.base import seconds_from_env

__all__ = ["TIMEOUT_ENV", "step_timeout", "watch"]

TIMEOUT_ENV = "SPADEKIT_VLLM_TIMEOUT"
DEFAULT_TIMEOUT = 300.0
_POLL_S = 1.0


def step_timeout() -> float:
    """Seconds an engine step may take (env ``SPADEKIT_VLLM_TIMEOUT``, else 300)."""
    return seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT)


def watch(llm: Any, lose: Callable[[str], BaseException]) -> bool:
    """Watch the engine process of ``llm`` (a ``vllm.LLM``); False when it has none to watch."""
    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    outputs = getattr(client, "outputs_queue", None)
    resources = getattr(client, "resources", None)
    original = getattr(client, "get_output", None)
    if not isinstance(outputs, queue.Queue) or resources is None or not callable(original):
        return False
    timeout = step_timeout()

    def get_output() -> Any:
        start = time.monotonic()
        with outputs.not_empty:  # the queue's condition: put() wakes it
            while not outputs._qsize():  # (the queue's lock is held: qsize() would deadlock)
                if getattr(resources, "engine_dead", False):
                    raise lose("its engine process died")
                if time.monotonic() - start >= timeout:
                    _kill(resources)
                    raise lose(f"its engine process produced nothing for {timeout:g} s "
                               f"({TIMEOUT_ENV})")
                outputs.not_empty.wait(_POLL_S)
        return original()  # an output (or vLLM's own error) is there: no wait

    client.get_output = get_output
    return True


def _kill(resources: Any) -> None:
    manager = getattr(resources, "engine_manager", None)
    for proc in list(getattr(manager, "processes", None) or []):
        try:
            proc.kill()
        except Exception:  # noqa: BLE001 - gone already, or not ours to kill
            pass
