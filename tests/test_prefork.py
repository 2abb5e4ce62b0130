"""``tests/prefork.py``: a child forked from a preloaded zygote behaves as a fresh ``python``
would, for what the fault and resume tests rely on (pipes, exit codes, signals, timeouts,
arguments, environment, working directory, atexit), and two processes in a row differ in hash
seed and numpy's random state as two fresh interpreters do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import prefork

SCRIPT = r'''
import atexit, json, os, sys, threading, time
import numpy
mode = sys.argv[1]
if mode == "report":
    print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("PF_X"),
                      "path0": sys.path[0], "hash": hash("spadekit"),
                      "numpy": float(numpy.random.random()), "name": __name__}), flush=True)
elif mode == "echo":
    sys.stdout.write(sys.stdin.read().upper())
elif mode == "exit":
    atexit.register(lambda: print("atexit ran", flush=True))
    t = threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined", flush=True)))
    t.start()
    sys.exit(int(sys.argv[2]))
elif mode == "raise":
    raise ValueError("broken on purpose")
elif mode == "wait":
    print("waiting", flush=True)
    time.sleep(60)
'''


@pytest.fixture
def zygotes(monkeypatch, tmp_path):
    """A zygote pair of its own (a light preload) for this test's environment."""
    monkeypatch.setattr(prefork, "PRELOAD", ("json", "numpy"))
    monkeypatch.setenv("PYTHONPREFORKTEST", tmp_path.name)  # a key no other test shares
    script = tmp_path / "child.py"
    script.write_text(SCRIPT)
    yield script
    key = prefork._key(dict(os.environ))
    for z in prefork._zygotes.pop(key, []):
        z.close()


def _popen(script, *args, **kwargs):
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return prefork.popen([sys.executable, str(script), *args], text=True, **kwargs)


def test_exit_codes_atexit_threads_and_tracebacks_are_a_fresh_processes(zygotes):
    proc = _popen(zygotes, "exit", "3")
    out, _ = proc.communicate(timeout=60)
    assert isinstance(proc, prefork.ForkedPopen) and proc.returncode == 3
    assert out.splitlines() == ["thread joined", "atexit ran"]
    proc = _popen(zygotes, "raise")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "ValueError: broken on purpose" in err
    done = prefork.run([sys.executable, str(zygotes), "echo"], input="abc", capture_output=True,
                       text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ABC"


def test_signals_timeouts_and_a_second_communicate(zygotes):
    proc = _popen(zygotes, "wait")
    assert proc.stdout.readline() == "waiting\n" and proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.5)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    proc = _popen(zygotes, "wait")
    proc.stdout.readline()
    proc.send_signal(signal.SIGSTOP)  # a frozen child stays frozen until SIGCONT
    time.sleep(0.2)
    assert proc.poll() is None
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    assert proc.wait(30) == -signal.SIGTERM


def test_arguments_environment_and_working_directory_are_the_requests(zygotes, tmp_path):
    import json

    out = _popen(zygotes, "report", "two", env={**os.environ, "PF_X": "42"},
                 cwd=tmp_path).communicate(timeout=60)[0]
    seen = json.loads(out)
    assert seen["argv"] == [str(zygotes), "report", "two"] and seen["x"] == "42"
    assert seen["cwd"] == str(tmp_path) and seen["path0"] == str(zygotes.parent)
    assert seen["name"] == "__main__"
    done = prefork.run([sys.executable, "-m", "json.tool"], input='{"a": 1}',
                       capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and '"a": 1' in done.stdout


def test_processes_in_a_row_differ_in_hash_seed_and_numpy_state(zygotes):
    import json

    seen = [json.loads(_popen(zygotes, "report").communicate(timeout=60)[0]) for _ in range(4)]
    assert seen[0]["hash"] != seen[1]["hash"]  # the two zygotes, in turn
    assert seen[0]["hash"] == seen[2]["hash"]  # (so the difference is the seed, not noise)
    assert len({s["numpy"] for s in seen}) == 4


def test_what_a_zygote_cannot_serve_is_an_ordinary_process(zygotes):
    proc = prefork.popen([sys.executable, "-c", "print(1)"], stdout=subprocess.PIPE)
    assert type(proc) is subprocess.Popen and proc.communicate(timeout=60)[0] == b"1\n"
    proc = prefork.popen(["sh", "-c", "exit 4"])
    assert type(proc) is subprocess.Popen and proc.wait(30) == 4
