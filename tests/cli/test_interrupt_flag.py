"""Ctrl-C during ``play --model`` is never lost: a ``KeyboardInterrupt`` that the interpreter
drops (raised inside a finalizer, where Python prints "Exception ignored" and goes on) is raised
again by ``InterruptFlag.check`` at the next turn."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import pytest

from spadekit.cli.play_live import InterruptFlag


class _SignalsInFinalizer:
    """Sends SIGINT to this process from ``__del__`` and lets the handler run there."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # bytecodes: the handler runs inside __del__
            pass


def _drop_in_finalizer() -> None:
    obj = _SignalsInFinalizer()
    cycle = [obj]
    cycle.append(cycle)  # freed by the collector, not at the del below
    del obj, cycle
    gc.collect()


def test_a_sigint_raised_inside_a_finalizer_is_dropped_by_python_but_not_by_the_flag(
        monkeypatch):
    dropped: list = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    before = signal.getsignal(signal.SIGINT)
    flag = InterruptFlag()
    with pytest.raises(KeyboardInterrupt), flag.installed():  # leaving raises it again
        assert signal.getsignal(signal.SIGINT) == flag.handler
        _drop_in_finalizer()  # no KeyboardInterrupt reaches this frame ...
        assert [type(d.exc_value) for d in dropped] == [KeyboardInterrupt]  # Python dropped it
        assert flag.requested  # ... but the flag remembers it
        with pytest.raises(KeyboardInterrupt):
            flag.check()
    assert signal.getsignal(signal.SIGINT) == before


def test_without_a_sigint_check_does_nothing_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGINT)
    flag = InterruptFlag()
    with flag.installed():
        flag.check()
    assert not flag.requested and signal.getsignal(signal.SIGINT) == before


def test_a_sigint_in_ordinary_code_is_a_keyboard_interrupt_at_once():
    flag = InterruptFlag()
    with pytest.raises(KeyboardInterrupt), flag.installed():
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            pass
    assert flag.requested


def test_a_sigint_dropped_after_the_last_check_still_ends_the_block():
    """The last turn's check has passed and Python drops a Ctrl-C (a finalizer) before the
    play returns: leaving the block raises it, so the play still ends as interrupted."""
    flag = InterruptFlag()
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with flag.installed():
            flag.requested = True  # what the handler leaves when its exception was dropped
    assert signal.getsignal(signal.SIGINT) == before


def test_a_sigint_while_the_handler_is_put_back_is_not_lost_and_the_handler_is(monkeypatch):
    """The handler fires between the block's end and the restore (it raises there): the restore
    is tried again, the previous handler is back, and the interrupt goes on."""
    import spadekit.cli.play_live as play_live

    real = signal.signal
    calls = []

    def flaky(signum, handler):
        calls.append(handler)
        if len(calls) == 2:  # the restore: the handler ran first and raised
            raise KeyboardInterrupt
        return real(signum, handler)

    monkeypatch.setattr(play_live.signal, "signal", flaky)
    before = signal.getsignal(signal.SIGINT)
    flag = InterruptFlag()
    with pytest.raises(KeyboardInterrupt):
        with flag.installed():
            pass
    monkeypatch.undo()
    assert len(calls) == 3 and flag.requested
    assert signal.getsignal(signal.SIGINT) == before
