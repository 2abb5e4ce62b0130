"""``_one_line`` keeps a header on one line, but the header's second
line (``# skill: ...   setting: ...   source: ...``) is where Python reads a source encoding
cookie. A release whose skill (or source) is ``coding: utf-7`` makes Python decode the written
``programs/<id>.py`` as UTF-7, where the hint's ``+AAo-`` is a line break: the hint becomes code.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spadekit.cli.app import app
from spadekit.envs.program import EnvProgram
from spadekit.runs.pool import write_pool

CODE = '''
class QuietEnv:
    max_turns = 2

    def reset(self, seed=None, options=None):
        return "hello", {}

    def step(self, action):
        return "ok", 1.0, True, False, {}
'''


def test_a_skill_cannot_declare_the_program_files_encoding(tmp_path):
    program = EnvProgram(code=CODE, hint="x +AAo-print('pwned')", skill="coding: utf-7",
                         domain="games")
    write_pool(tmp_path / "pool", [(program, None)])
    path = tmp_path / "pool" / "programs" / f"{program.short_id}.py"
    with open(path, "rb") as fh:
        encoding, _lines = tokenize.detect_encoding(fh.readline)
    ran = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=60)
    assert "pwned" not in ran.stdout, ran.stdout
    assert encoding == "utf-8", encoding


def test_a_release_record_cannot_declare_the_imported_files_encoding(tmp_path):
    from spadekit.runs.pool_export import export_pool

    src = tmp_path / "src"
    from spadekit.sandbox.validate import ValidationReport

    write_pool(src, [(EnvProgram(code=CODE, hint="say hello", domain="games"),
                      ValidationReport(ok=True, stage="done", reason="ok", message="valid"))])
    release = tmp_path / "release"
    export_pool(src, release, parquet=False)
    records = [json.loads(x) for x in (release / "manifest.jsonl").read_text().splitlines()]
    records[0]["skill"] = "coding: utf-7"
    records[0]["hint"] = "x +AAo-print('pwned')"
    (release / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    files = sorted(p.relative_to(release).as_posix() for p in release.rglob("*")
                   if p.is_file() and p.name != "checksums.sha256")
    (release / "checksums.sha256").write_text("".join(
        f"{hashlib.sha256((release / f).read_bytes()).hexdigest()}  {f}\n" for f in files))
    pool = tmp_path / "pool"
    res = CliRunner().invoke(app, ["import-reference", "--release", str(release), "--out",
                                   str(pool), "--no-validate"])
    assert res.exit_code == 0, res.output
    (path,) = (pool / "programs").glob("*.py")
    ran = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=60)
    assert "pwned" not in ran.stdout, ran.stdout
