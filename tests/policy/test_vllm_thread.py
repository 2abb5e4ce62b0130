"""``EngineThread`` (``spadekit.policy.vllm_thread``): every call runs on its one thread, in
order, results and exceptions come back to the caller, a call from the thread itself runs inline,
and the thread never holds the interpreter's exit."""

from __future__ import annotations

import threading

import pytest

from spadekit.policy.vllm_thread import EngineThread


def test_calls_run_on_one_thread_and_their_results_and_errors_come_back():
    engine = EngineThread("test-engine")
    try:
        names = {engine.call(lambda: threading.current_thread().name) for _ in range(3)}
        assert names == {"test-engine"}
        callers = [threading.Thread(target=lambda: seen.append(
            engine.call(lambda: threading.current_thread().name))) for _ in range(4)]
        seen: list[str] = []
        for t in callers:
            t.start()
        for t in callers:
            t.join(10)
        assert seen == ["test-engine"] * 4
        with pytest.raises(ZeroDivisionError):
            engine.call(lambda: 1 / 0)
        assert engine.call(lambda: engine.call(lambda: 7) + 1) == 8  # inline from inside
        assert engine._thread.daemon
    finally:
        engine.stop()
    engine._thread.join(10)
    assert not engine._thread.is_alive()
    with pytest.raises(RuntimeError, match="stopped"):
        engine.call(lambda: 1)
