"""Crash-safe JSON lines: a torn tail is moved aside before appending, records are whole lines."""

from __future__ import annotations

import json

from spadekit.common.jsonl import JsonlAppender, repair_tail


def test_repair_tail_moves_a_torn_line_aside_and_keeps_whole_ones(tmp_path):
    path = tmp_path / "log.jsonl"
    assert repair_tail(path) is False  # missing: nothing to do, nothing created
    assert not path.exists()
    path.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    assert repair_tail(path) is True
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n'
    assert (tmp_path / "log.jsonl.partial").read_text() == '{"c": \n'
    assert repair_tail(path) is False  # idempotent once whole
    path.write_text("no newline at all")
    assert repair_tail(path) is True and path.read_text() == ""
    assert (tmp_path / "log.jsonl.partial").read_text().splitlines() == ['{"c": ',
                                                                        "no newline at all"]


def test_appender_writes_whole_lines_after_a_crash(tmp_path):
    path = tmp_path / "sub" / "pool.jsonl"
    with JsonlAppender(path) as out:  # creates the folder
        out.write({"x": "é"})
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"x": "tor')  # the process died mid-write
    with JsonlAppender(path) as out:
        out.write_many([{"x": 2}, {"x": 3}])
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows == [{"x": "é"}, {"x": 2}, {"x": 3}]
    assert (path.parent / "pool.jsonl.partial").read_text() == '{"x": "tor\n'
