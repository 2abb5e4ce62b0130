"""Batched sandbox requests: many workers, many queued requests, one poll, typed results."""

from __future__ import annotations

import time

from conftest import ECHO
from spadekit.common.errors import EnvRaised, InvalidResult, SandboxClosed, SandboxTimeout
from spadekit.sandbox.batch import request_many, start_many, step_many

MOODY = ECHO.replace("self.t += 1", "self.t += 1\n"
                     "        if action == 'raise': raise ValueError('asked to')\n"
                     "        if action == 'hang':\n"
                     "            while True: pass\n"
                     "        if action == 'nan': return 'x', float('nan'), False, False, {}")


def test_results_keep_call_order_across_workers(pool):
    a, b = pool.acquire(ECHO), pool.acquire(ECHO)
    try:
        started = start_many([(a, 50, 1, None), (b, 50, 2, None), (a, 50, 3, None)])
        envs = [s[0] for s in started]
        assert [s[1] for s in started] == ["echo ready"] * 3
        pairs = [(envs[i % 3], f"m{i}") for i in range(30)]
        out = step_many(pairs)
        assert [o[0] for o in out] == [f"echo:m{i}" for i in range(30)]
        assert [o[1] for o in out] == [0.5] * 30
    finally:
        a.close()
        b.close()


def test_one_bad_request_fails_alone_and_the_queue_goes_on(pool):
    sb = pool.acquire(MOODY)
    try:
        (env, _obs, _info), = start_many([(sb, 20, 0, None)])
        out = step_many([(env, "a"), (env, "raise"), (env, "nan"), (env, "b")])
        assert out[0][0] == "echo:a"
        assert isinstance(out[1], EnvRaised) and out[1].exc_type == "ValueError"
        assert isinstance(out[2], InvalidResult) and out[2].reason == "reward_not_finite"
        assert out[3][0] == "echo:b"
        assert sb.alive
    finally:
        sb.close()


def test_a_hang_kills_only_its_worker_and_fails_its_queue(pool):
    bad, good = pool.acquire(MOODY), pool.acquire(ECHO)
    try:
        started = start_many([(bad, 20, 0, None), (good, 20, 0, None)])
        bad_env, good_env = started[0][0], started[1][0]
        t = time.monotonic()
        out = step_many([(bad_env, "a"), (bad_env, "hang"), (good_env, "x"), (bad_env, "c"),
                         (good_env, "y")])
        elapsed = time.monotonic() - t
        assert out[0][0] == "echo:a" and out[2][0] == "echo:x" and out[4][0] == "echo:y"
        assert isinstance(out[1], SandboxTimeout) and isinstance(out[3], SandboxTimeout)
        assert elapsed < pool.config.step_timeout * 2 + 1
        assert not bad.alive and good.alive
        assert isinstance(step_many([(bad_env, "again")])[0], SandboxClosed)
        assert step_many([(good_env, "z")])[0][0] == "echo:z"
    finally:
        bad.close()
        good.close()


def test_many_requests_larger_than_a_pipe_buffer(pool):
    sb = pool.acquire(ECHO)
    try:
        (env, _o, _i), = start_many([(sb, 10_000, 0, None)])
        action = "y" * 2000
        out = step_many([(env, action)] * 200)  # ~400 KB of requests, ~20 KB of replies
        assert all(o[0] == "echo:" + action for o in out)
        raw = request_many([(sb, "ping", {})] * 5)
        assert all(r == {"instances": 1} for r in raw)
    finally:
        sb.close()


def test_close_never_waits_forever_on_a_held_request_lock(pool, monkeypatch):
    """A request lock held by another thread (a request in flight, or a lock an interrupt left
    held) delays ``close`` by at most ``CLOSE_LOCK_S``: the worker is killed anyway."""
    import threading

    from spadekit.sandbox import sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "CLOSE_LOCK_S", 0.5)
    sb = pool.acquire(ECHO)
    held, done = threading.Event(), threading.Event()

    def hold():
        with sb._lock:
            held.set()
            done.wait(30)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(10)
    start = time.monotonic()
    sb.close()
    took = time.monotonic() - start
    done.set()
    thread.join(10)
    assert sb.worker.closed and not sb.alive
    assert 0.4 <= took < 5.0, took
