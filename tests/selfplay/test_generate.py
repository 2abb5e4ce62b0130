"""``run_generate``: the random tiny model (everything invalid) and a scripted stand-in policy
that answers with library programs, so that the pool directory gets real entries."""

from __future__ import annotations

import json
import re

import pytest

from spadekit.selfplay.corpus import Corpus, Document
from spadekit.envs.library import get, source
from spadekit.envs.program import EnvProgram
from spadekit.selfplay.generate import GenerateSummary, PoolError, load_pool, run_generate
from spadekit.policy.base import Generation

from conftest import TIERS

pytestmark = pytest.mark.skipif(not TIERS, reason="no safe sandbox tier works on this machine")

DOCS = Corpus([Document("a", "Tolls on the bridge depend on the number of axles. " * 10),
               Document("b", "A heap keeps the smallest item at the root of a tree. " * 10)],
              name="test-docs")

VAULT = '''import random

from spadekit.envs.actions import format_tool_call
from spadekit.envs.tooluse import ToolEnv, ToolError


class VaultEnv(ToolEnv):
    """Look up the code word and open the vault with it."""

    def setup(self, rng: random.Random) -> str:
        self.code = rng.choice(["amber", "cobalt", "violet"])
        self.opened = False
        return "Open the vault: look up today's code word, then open the vault with it."

    def tool_lookup_code(self) -> str:
        """Return today's code word."""
        return self.code

    def tool_open_vault(self, word: str) -> str:
        """Try to open the vault.

        Args:
            word: The code word.
        """
        if word.strip().lower() != self.code:
            raise ToolError("wrong code word")
        self.opened = True
        return "opened"

    def criteria(self) -> dict:
        return {"opened": self.opened, "looked_up": self.opened}

    def solution(self) -> list:
        return [format_tool_call("lookup_code", {}),
                format_tool_call("open_vault", {"word": self.code}) + "<answer>done</answer>"]
'''
BROKEN = "class BrokenEnv:\n    def reset(self, seed=None, options=None):\n        return 1\n"
VAULT_LEAK = "Try amber, cobalt and violet in turn until the vault opens."

#: skill -> (program code, designer HINT line)
DESIGNS = {
    "Logical_Deduction": (source("games_code_breaker"), get("games_code_breaker").hint),
    "Mathematical_Reasoning": (source("games_modular_search"),
                               "Ask mod 11 first, then combine the remainders."),
    "Pattern_Recognition": (BROKEN, "Look closely."),
    "Data_Retrieval": (source("tools_record_lookup"), get("tools_record_lookup").hint),
    "State_Modification": (VAULT, VAULT_LEAK),
}


class ScriptedPolicy:
    """A stand-in Policy: designer prompts get a library program in a fenced block plus a HINT
    line; hint prompts get a short hint (a leaking one first for the modular search and always
    for the vault)."""

    name = "scripted"
    capabilities = frozenset()
    tokenizer = None

    def __init__(self) -> None:
        self.calls: list[int] = []

    def render(self, messages, add_generation_prompt=True, tools=None):
        return [ord(c) % 256 for c in "".join(m["content"] for m in messages)][:64]

    def _answer(self, messages) -> str:
        system, user = messages[0]["content"], messages[1]["content"]
        if system.startswith("You are the Environment Designer"):
            skill = re.search(r"Target skill: (\S+)", user).group(1)
            code, hint = DESIGNS[skill]
            return f"Here is the environment.\n\n```python\n{code}```\n\nHINT: {hint}\n"
        if "class VaultEnv" in user:
            return f"HINT: {VAULT_LEAK}"
        if "class ModularSearchEnv" in user and "previous hint was rejected" not in user:
            return "HINT: Begin with \\boxed{mod 11} and keep going."
        return "HINT: Work out what each response rules out, and commit only when sure."

    def generate(self, requests):
        self.calls.append(len(requests))
        out = []
        for req in requests:
            text = self._answer(req.messages)
            out.append(Generation(prompt_ids=self.render(req.messages), token_ids=[1] * 10,
                                  logprobs=[-0.1] * 10, text=text, finish_reason="stop"))
        return out


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_tiny_model_outputs_are_all_rejected(tmp_path):
    out = tmp_path / "pool"
    summary = run_generate("tiny", "games", None, 2, out, corpus=DOCS, seed=1,
                           max_new_tokens=16, references=0, doc_words=30, batch_size=2)
    assert isinstance(summary, GenerateSummary)
    assert summary.status == "done" and summary.attempted == 2
    assert summary.valid == 0 and summary.invalid == 2 and summary.valid_share == 0.0
    assert sum(summary.reasons.values()) == 2
    assert set(summary.per_skill) == {"Mathematical_Reasoning", "Logical_Deduction"}
    rejected = _lines(out / "rejected.jsonl")
    assert len(rejected) == 2
    for rec in rejected:
        assert rec["reason"] and rec["stage"] and rec["message"]
        assert rec["completion_tokens"] == 16 and rec["finish_reason"] == "length"
        assert rec["prompt_tokens"] > 1000 and "raw_text" in rec and rec["doc_id"] in ("a", "b")
    assert (out / "pool.jsonl").read_text() == ""
    assert load_pool(out) == []
    data = json.loads((out / "summary.json").read_text())
    assert data["valid_share"] == 0.0 and data["model"] == "tiny" and data["pool_total"] == 0
    assert data["tokens"]["completion_mean"] == 16


@pytest.fixture(scope="module")
def games_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("games") / "pool"
    policy = ScriptedPolicy()
    skills = "Logical_Deduction,mathematical reasoning,Pattern_Recognition"
    summary = run_generate(policy, "games", skills, 4, out, corpus=DOCS, seed=3, batch_size=4)
    return out, policy, summary


def test_scripted_games_pool(games_run):
    out, policy, summary = games_run
    # index 0: code breaker, 1: modular search, 2: broken, 3: code breaker again (duplicate)
    assert policy.calls[0] == 4, "one generate call for the whole batch of designer prompts"
    assert (summary.attempted, summary.valid, summary.invalid, summary.duplicates) == (4, 2, 1, 1)
    assert summary.valid_share == 0.75
    assert summary.hints["written"] == 2 and summary.hints["leaks_rejected"] == 1
    assert summary.hints["retried"] == 1 and summary.hints["missing"] == 0
    records = _lines(out / "pool.jsonl")
    assert [r["generation"]["index"] for r in records] == [0, 1]
    for rec in records:
        assert rec["validation"]["ok"] and rec["validation"]["solution"] == "replayed"
        gen = rec["generation"]
        assert gen["doc_id"] in ("a", "b") and gen["finish_reason"] == "stop"
        assert gen["completion_tokens"] == 10 and gen["prompt_tokens"] == 64
        assert gen["references"] and gen["designed_at"] and gen["written_at"]
        assert rec["domain"] == "games" and rec["skill"] == gen["skill"]
        text = (out / "programs" / f"{rec['short_id']}.py").read_text()
        assert f"# skill: {rec['skill']}" in text and f"# hint: {rec['hint']}" in text
        assert text.endswith(rec["code"])
    modular = records[1]
    assert "mod 11" not in modular["hint"]
    attempts = modular["generation"]["hint"]["attempts"]
    assert attempts[0]["problem"].startswith("leak") and attempts[1]["problem"] is None
    assert modular["generation"]["hint"]["source"] == "second_call_retry"
    rejected = _lines(out / "rejected.jsonl")
    assert sorted(r["reason"] for r in rejected) == ["bad_reset_type", "duplicate"]
    broken = next(r for r in rejected if r["reason"] != "duplicate")
    assert broken["skill"] == "Pattern_Recognition" and broken["stage"] in ("load", "interface")
    data = json.loads((out / "summary.json").read_text())
    assert data["pool_total"] == 2 and data["valid"] == 2 and data["reasons"] == summary.reasons


def test_rerun_is_idempotent_and_extends(games_run):
    out, _policy, first = games_run
    before = (out / "pool.jsonl").read_text()
    again = run_generate(ScriptedPolicy(), "games",
                         "Logical_Deduction,mathematical reasoning,Pattern_Recognition", 4, out,
                         corpus=DOCS, seed=3, batch_size=2)
    assert again.resumed == 4 and again.attempted == 0 and again.valid_share is None
    assert (out / "pool.jsonl").read_text() == before
    # a new seed designs again, but the same programs are not added twice
    other = run_generate(ScriptedPolicy(), "games", "Logical_Deduction", 2, out, corpus=DOCS,
                         seed=4)
    assert other.attempted == 2 and other.duplicates == 2 and other.valid == 0
    assert (out / "pool.jsonl").read_text() == before
    assert len(load_pool(out)) == 2


def test_load_pool_round_trip_and_corrupt_lines(games_run, tmp_path):
    out, _policy, _summary = games_run
    programs = load_pool(out)
    assert [p.skill for p in programs] == ["Logical_Deduction", "Mathematical_Reasoning"]
    assert all(isinstance(p, EnvProgram) and p.hint and p.domain == "games" for p in programs)
    assert programs[0].meta["generation"]["index"] == 0
    assert programs[0].meta["validation"]["ok"] is True
    assert load_pool(out / "pool.jsonl") == programs
    lines = (out / "pool.jsonl").read_text().splitlines()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "pool.jsonl").write_text(lines[0] + "\n{not json\n")
    with pytest.raises(PoolError, match="line 2"):
        load_pool(bad, strict=True)
    assert load_pool(bad) == programs[:1]  # by default a bad line is skipped with a warning
    edited = json.loads(lines[1])
    edited["code"] += "\n# edited\n"
    (bad / "pool.jsonl").write_text(lines[0] + "\n\n" + json.dumps(edited) + "\n")
    with pytest.raises(PoolError, match="line 3.*sha256"):
        load_pool(bad, strict=True)
    with pytest.raises(PoolError, match="no pool"):
        load_pool(tmp_path / "missing")


def test_partial_last_line_is_moved_aside(games_run):
    out, _policy, _summary = games_run
    with open(out / "pool.jsonl", "a") as fh:
        fh.write('{"code": "half a rec')
    run_generate(ScriptedPolicy(), "games", "Logical_Deduction", 1, out, corpus=DOCS, seed=3)
    assert len(load_pool(out)) == 2
    assert (out / "pool.jsonl.partial").read_text().startswith('{"code": "half')


def test_scripted_tooluse_designer_hints(tmp_path):
    out = tmp_path / "tools"
    summary = run_generate(ScriptedPolicy(), "tooluse", "Data_Retrieval,State_Modification", 2,
                           out, corpus=None, seed=0, hint_mode="designer")
    assert summary.valid == 2 and summary.invalid == 0
    assert summary.hints["from_designer"] == 1 and summary.hints["missing"] == 1
    assert summary.hints["leaks_rejected"] == 2 and summary.hints["retried"] == 1
    lookup, vault = load_pool(out)
    assert lookup.hint == get("tools_record_lookup").hint and lookup.domain == "tooluse"
    assert lookup.meta["generation"]["hint"]["source"] == "designer"
    assert lookup.meta["validation"]["tools"]
    assert vault.hint is None and vault.class_name == "VaultEnv"
    problems = [a["problem"] for a in vault.meta["generation"]["hint"]["attempts"]]
    assert len(problems) == 2 and all(p.startswith("leak") for p in problems)
    assert lookup.meta["generation"]["doc_id"].split(":")[0] in (
        "stdlib", "numpy", "scipy", "networkx", "sympy")
    header = (out / "programs" / f"{vault.short_id}.py").read_text().splitlines()[2]
    assert header == "# hint: (none)"


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="skill"):
        run_generate(ScriptedPolicy(), "games", "Data_Retrieval", 1, tmp_path)
    with pytest.raises(ValueError, match="hint_mode"):
        run_generate(ScriptedPolicy(), "games", None, 1, tmp_path, hint_mode="nope")
    with pytest.raises(ValueError, match="setting"):
        run_generate(ScriptedPolicy(), "board", None, 1, tmp_path)
