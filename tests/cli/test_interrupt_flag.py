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
    with flag.installed():
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
    with flag.installed(), pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            pass
    assert flag.requested
