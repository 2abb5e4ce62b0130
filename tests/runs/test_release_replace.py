"""``--force`` moves the old OUT aside, then renames the new tree
into place; when that second rename fails (or Ctrl-C lands between the two), the new tree is
removed and the old OUT is left hidden as ``.OUT.old-<pid>``: OUT is gone, not kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spadekit.common.errors import ConfigError


def test_a_failed_forced_replace_keeps_the_old_out(tmp_path, monkeypatch):
    import spadekit.runs.release as rel
    from spadekit.envs.program import EnvProgram

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("the previous export")
    entry = {"program": EnvProgram(code="class E:\n    pass\n", hint="h", domain="games"),
             "validation": {"ok": True, "stage": "done", "reason": "ok", "message": "",
                            "details": {}},
             "status": "pooled", "removed_reason": None, "created_step": 0,
             "retired_step": None, "parents": [], "lineage": {},
             **{k: None for k in rel.STAT_KEYS}}
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(rel.os, "replace", flaky)
    with pytest.raises(ConfigError):
        rel.write_release(out, [entry], {"name": "x"}, force=True)
    assert (out / "old.txt").is_file(), sorted(p.name for p in tmp_path.iterdir())
