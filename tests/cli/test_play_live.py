"""``spadekit play --model`` (issue 17): turns are printed as they happen, the defaults fit a
small model, and Ctrl-C (a real SIGINT to a child process) ends the run cleanly with what was
played so far."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TIERS

SRC = Path(__file__).resolve().parents[2] / "src"

ENDLESS = '''
class EndlessEnv:
    """Never terminates: only the turn cap or the user ends it."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = int(max_turns)

    def reset(self, seed=None, options=None):
        self.t = 0
        return "say anything", {}

    def step(self, action):
        self.t += 1
        return f"turn {self.t} heard", 0.25, False, False, {}

    def solution(self):
        return ["\\\\boxed{x}"]
'''

pytestmark = pytest.mark.skipif(not TIERS, reason="no safe sandbox tier works here")


def _spadekit(*args: str) -> list[str]:
    return [sys.executable, "-m", "spadekit", *args]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def test_each_turn_is_printed_as_it_happens(tmp_path):
    program = tmp_path / "endless.py"
    program.write_text(ENDLESS)
    out = subprocess.run(_spadekit("play", str(program), "--model", "tiny", "--max-turns", "3",
                                   "--max-new-tokens", "8", "--episodes", "2"),
                         capture_output=True, text=True, timeout=300, env=_env())
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if " turn " in line]
    for ep in (1, 2):
        assert [f"episode {ep} turn {t}:" in " ".join(lines) for t in (1, 2, 3)] == [True] * 3
    assert out.stdout.count("reward 0.250") == 6
    assert "response prefix \\boxed{" in " ".join(out.stdout.split())  # cpu-tiny: the aid


def test_json_keeps_stdout_one_document(tmp_path):
    program = tmp_path / "endless.py"
    program.write_text(ENDLESS)
    out = subprocess.run(_spadekit("play", str(program), "--model", "tiny", "--max-turns", "2",
                                   "--max-new-tokens", "8", "--json", "--preset", "games-4b"),
                         capture_output=True, text=True, timeout=300, env=_env())
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert [len(e["turns"]) for e in doc["episodes"]] == [2]
    assert "episode 1 turn 2:" in out.stderr  # the live lines went to stderr
    assert not doc["episodes"][0]["turns"][0]["action"].startswith("\\boxed{")  # no aids


def test_ctrl_c_ends_cleanly_with_what_was_played(tmp_path):
    program = tmp_path / "endless.py"
    program.write_text(ENDLESS)
    proc = subprocess.Popen(_spadekit("play", str(program), "--model", "tiny", "--max-turns",
                                      "100000", "--max-new-tokens", "16"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    seen = []
    deadline = time.monotonic() + 240
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "episode 1 turn 3:" in line:
            break
    assert any("episode 1 turn 3:" in line for line in seen), "".join(seen)
    proc.send_signal(signal.SIGUSR1)  # a stack dump, and the play goes on
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "episode 1 turn 4:" in line:
            break
    assert any("episode 1 turn 4:" in line for line in seen), "".join(seen)
    proc.send_signal(signal.SIGINT)
    try:
        rest, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # the CLI dumps every thread's stack on SIGUSR1
        time.sleep(3)
        proc.kill()
        _, err = proc.communicate()
        dropped = [x for x in err.splitlines() if "Exception ignored" in x]
        raise AssertionError("play did not end within 60 s of SIGINT; dropped exceptions: "
                             f"{dropped}; its stacks:\n" + err[-6000:])
    text = "".join(seen) + rest
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted after" in text and "Traceback" not in err
    assert "most recent call first" in err  # SIGUSR1's dump of every thread's stack
    played = int(text.split("interrupted after")[1].split("turn(s) played")[0].split(":")[1])
    assert played >= 3
    assert "episode 1 (seed 0): " in text and "unfinished" in text
