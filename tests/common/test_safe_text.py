"""Terminal and markup injection, and the CLI's exit-code guarantee on hostile programs.

``terminal_text`` is checked as a function (escape sequences, C0/C1 controls, bidi overrides,
lone surrogates, rich markup; a property test over arbitrary text). Then hostile programs go
through the real commands (``validate``, ``play`` with and without ``--json``, ``eval``) in the
real sandbox: every command exits 0 or 1 without a traceback, ``--json`` output is strict JSON,
a markup class name and a ``[/]`` in an exception print literally, and no escape sequence a
program wrote reaches stdout.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings, strategies as st
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.testing import CliRunner

from spadekit.cli.app import app
from spadekit.common.safe_text import strict_json, terminal_text
from test_sandbox_replies import FORGED_STEPS, HONEST, forger

BAD_CHARS = ["\x1b", "\x07", "\r", "\x08", "\x00", "\x7f", "\x9b", "\x9d", "\x85",
             "\u202e", "\u202d", "\u2066", "\u2069", "\u200f", "\u061c"]


def _clean(text: str) -> bool:
    return not any(c in text for c in BAD_CHARS) and text.encode("utf-8") is not None


@pytest.mark.parametrize("raw,want", [
    ("\x1b]0;pwned\x07title", "title"),
    ("a\x1b]52;c;ZXZpbA==\x07b", "ab"),
    ("\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\", "click"),
    ("\x1b[2J\x1b[1;31mred\x1b[0m", "red"),
    ("score 0\r reward 1.0", "score 0 reward 1.0"),
    ("\u202eexe.txt", "exe.txt"),
    ("line\nnext\ttab", "line\nnext\ttab"),
    ("\x9b31mx\x9d0;t\x07y", "xy"),
    ("unterminated \x1b]0;title", "unterminated "),
    ("lone \ud800 surrogate", "lone \ufffd\ufffd\ufffd surrogate"),
])
def test_control_sequences_are_removed(raw, want):
    assert terminal_text(raw, markup=False) == want


def test_markup_is_escaped_and_prints_literally():
    name = "[link=http://x]Evil[/link]Env"
    assert Text.from_markup(terminal_text(name)).plain == name
    assert Text.from_markup(terminal_text("bad [/] input")).plain == "bad [/] input"
    table = Table()
    table.add_column("name")
    table.add_row(terminal_text(name + " [/]"))
    console = Console(record=True, width=200, color_system=None)
    console.print(table)
    assert name + " [/]" in console.export_text()


def test_strict_json_never_prints_nan():
    text = strict_json({"a": [math.nan, math.inf, 1.5], "b": -math.inf, "c": {1, 2}.__class__})
    assert json.loads(text, parse_constant=_refuse) == {"a": [None, None, 1.5], "b": None,
                                                       "c": "<class 'set'>"}


def _refuse(name):
    raise ValueError(f"{name} in JSON output")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.characters(), st.sampled_from(
    BAD_CHARS + list("[]/\\=:") + ["[link=http://x]", "[/]", "[b]", "[#f00]", "[@click]",
                                    "\x1b]0;t\x07", "\x1b[31m"])), max_size=30).map("".join))
def test_any_text_comes_out_clean_and_literal(raw):
    plain = terminal_text(raw, markup=False)
    assert _clean(plain)
    inside = Text.from_markup(f"[red]{terminal_text(raw)}[/red]", emoji=False).plain
    assert inside == plain  # between tags: exactly the text
    alone = Text.from_markup(terminal_text(raw), emoji=False).plain
    trailing = len(plain) - len(plain.rstrip("\\"))  # doubled so a closing tag still closes
    assert alone == plain + "\\" * trailing
    assert terminal_text(raw, markup=False, limit=10) == (
        plain if len(plain) <= 10 else plain[:9] + "\u2026")


# ---------------------------------------------------------------------------------------------
# hostile programs through the real commands

SEQUENCES = ("\\x1b]0;pwned title\\x07\\x1b]52;c;ZXZpbA==\\x07\\x1b]8;;http://evil\\x1b\\\\click"
             "\\x1b]8;;\\x1b\\\\ \\x1b[2J\\x1b[31mred\\r reward 1.0 \\u202eTXT.exe\\x9b31m "
             "[bold]b[/]")

MARKUP_NAME = f'''
class EvilEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
        self.t = 0

    def reset(self, seed=None, options=None):
        self.t = 0
        print("{SEQUENCES}")
        return "{SEQUENCES}", {{"k": "{SEQUENCES}"}}

    def step(self, action):
        self.t += 1
        if action == "boom":
            raise ValueError("bad [/] input [link=http://x]y {SEQUENCES}")
        return "moved {SEQUENCES}", 1.0 if action == "win" else 0.0, action == "win", False, {{}}

    def solution(self):
        return ["win"]


EvilEnv.__name__ = EvilEnv.__qualname__ = "[link=http://x]Evil[/link]Env"
_cls = globals().pop("EvilEnv")
globals()[_cls.__name__] = _cls
'''

RAISES = '''
class RaisingEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
    def reset(self, seed=None, options=None):
        return "ready", {}
    def step(self, action):
        raise ValueError("bad [/] input \\x1b]0;title\\x07 [link=http://x]y")
'''

HUGE_TURNS = HONEST.replace("self.max_turns = max_turns", "self.max_turns = 10 ** 12")

HOSTILE = {
    "not a program": "Here is my environment! \x1b]0;pwned title\x07 [/] [link=http://x]y",
    "markup class name": MARKUP_NAME,
    "raises with markup": RAISES,
    "honest odd values": HONEST,
    "max_turns 10**12": HUGE_TURNS,
    "forged create": forger(init="forge(lambda r: b'{\"id\":%d,\"ok\":true,\"result\":"
                                 "{\"instance\":1,\"max_turns\":\"12\"}}\\n' % r)"),
    **{f"forged {case}": forger(step=FORGED_STEPS[case])
       for case in ("NaN in info", "100k-deep nesting", "lone surrogate", "two replies at once",
                    "huge error field")},
}


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    files = {}
    for i, (name, code) in enumerate(sorted(HOSTILE.items())):
        path = root / f"hostile_{i}.py"
        path.write_text(code)
        files[name] = str(path)
    return files


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch):
    """Tables wide enough that a checked string is not folded across lines."""
    from spadekit.cli import app as cli
    from spadekit.cli import eval as cli_eval

    for console in (cli.console, cli.err_console, cli_eval.console, cli_eval.err_console):
        monkeypatch.setattr(console, "width", 400)


def run_cli(args: list[str]):
    result = CliRunner().invoke(app, args, catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args}: {result.exception!r}\n{result.output[-2000:]}")
    assert result.exit_code in (0, 1), (args, result.exit_code, result.output[-2000:])
    if "--json" not in args:  # JSON carries the program's own tracebacks as data
        assert "Traceback" not in result.output
    for bad in ("\x1b", "\x07", "\u202e", "\x9b", "\r"):
        assert bad not in result.stdout, (args, bad, result.stdout[-500:])
    return result


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_validate_exits_0_or_1_and_prints_nothing_raw(hostile_files, name):
    result = run_cli(["validate", hostile_files[name], "--step-timeout", "2"])
    if name == "raises with markup":
        assert "[/]" in result.stdout and result.exit_code == 1
    out = json.loads(run_cli(["validate", hostile_files[name], "--json", "--step-timeout",
                              "2"]).stdout, parse_constant=_refuse)
    assert isinstance(out, list) and len(out) == 1
    if name.startswith("forged"):
        assert out[0]["ok"] is False and out[0]["reason"] == "protocol_violation", out[0]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_play_exits_0_or_1_with_valid_json(hostile_files, name):
    actions = ["-a", "info", "-a", "surrogate", "-a", "boom", "-a", "go", "-a", "win"]
    run_cli(["play", hostile_files[name], "--seed", "1", *actions])
    transcript = json.loads(run_cli(["play", hostile_files[name], "--seed", "1", "--json",
                                     *actions]).stdout, parse_constant=_refuse)
    assert "turns" in transcript
    if name.startswith("forged") and name != "forged create":
        assert transcript["error"]["type"] == "ProtocolViolation", transcript["error"]


def test_markup_class_name_and_sequences_print_literally(hostile_files):
    """A class name that is not an identifier is refused at load (ProgramLoadError), and the
    refusal, naming it, prints literally; escape sequences and markup an ordinary program
    prints are shown as text."""
    evil = hostile_files["markup class name"]
    for args in (["play", evil], ["validate", evil]):
        result = run_cli(args)
        assert result.exit_code == 1
        assert "'[link=http://x]Evil[/link]Env' is not a Python identifier" in result.stdout
    named = MARKUP_NAME.replace('EvilEnv.__name__ = EvilEnv.__qualname__ = "[link=http://x]Evil'
                                '[/link]Env"', "").replace("_cls.__name__", '"EvilEnv"')
    path = hostile_files["markup class name"].replace(".py", "_named.py")
    with open(path, "w") as fh:
        fh.write(named)
    result = run_cli(["play", path, "--seed", "0", "-a", "go", "-a", "boom"])
    assert "pwned title" not in result.stdout and "ZXZpbA" not in result.stdout
    assert "[bold]b[/]" in result.stdout and "click" in result.stdout
    assert "bad [/] input [link=http://x]y" in result.stdout
    transcript = json.loads(run_cli(["play", path, "--json", "-a", "win"]).stdout)
    assert transcript["class_name"] == "EvilEnv" and transcript["return"] == 1.0
    assert "\x1b]0;pwned" in transcript["initial_observation"]  # the data itself is kept


def test_eval_over_hostile_programs_exits_0_or_1(hostile_files, tmp_path):
    from spadekit.sandbox.validate import to_program

    pool = tmp_path / "pool"
    pool.mkdir()
    with open(pool / "pool.jsonl", "w") as fh:
        for name in ("markup class name", "forged NaN in info", "honest odd values",
                     "forged two replies at once"):
            with open(hostile_files[name]) as src:
                fh.write(json.dumps(to_program(src.read()).to_dict()) + "\n")
    out = tmp_path / "results.json"
    run_cli(["eval", "--model", "tiny", "--suite", f"envs:{pool}", "--max-turns", "2",
             "--max-new-tokens", "8", "-k", "1", "--out", str(out)])
    json.loads(out.read_text(), parse_constant=_refuse)
