"""``spadekit.cli.train.resume_arg``: the ``--resume PATH`` the CLI prints gives a shell back
the very path, byte for byte, whatever the path holds (spaces, quotes, brackets, emoji codes,
tabs, control characters, bytes that are not UTF-8), and is printable text."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spadekit.cli.train import resume_arg

BASH = shutil.which("bash")


def _shell_reads(arg: str) -> bytes:
    assert arg.startswith("--resume ")
    done = subprocess.run([BASH, "-c", "printf '%s' " + arg[len("--resume "):]],
                          capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(BASH is None, reason="no bash")
@pytest.mark.parametrize("path", ["/runs/a b [gw0] :x:\\", "/runs/a\tb", "/runs/a\x1b[2Jb",
                                  "/runs/é'q\"", "/runs/\u202eevil", "runs/x\ny",
                                  os.fsdecode(b"/runs/a\xffb")])
def test_known_hard_paths_come_back_whole(path):
    arg = resume_arg(path)
    assert arg.isprintable() and "\n" not in arg
    assert _shell_reads(arg) == os.fsencode(path)


@pytest.mark.skipif(BASH is None, reason="no bash")
@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=40).filter(lambda b: b"\x00" not in b))
def test_any_path_comes_back_whole(raw):
    path = os.fsdecode(raw)
    arg = resume_arg(path)
    assert arg.isprintable()
    assert _shell_reads(arg) == raw
