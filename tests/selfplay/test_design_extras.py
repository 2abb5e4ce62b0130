"""Designer extras: repair turns, the policy as judge and an external hint model.

The designer is a scripted policy over the real tiny model's tokenizer; validation runs in the
real sandbox; the external hint model is a second scripted policy behind a real HTTP server.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_selfplay import LETTERS, WORDS, config  # noqa: E402

from spadekit.common.streams import RoundStreams
from spadekit.selfplay.judge import judge_enabled, parse_judgement, parse_verdict  # noqa: E402
from spadekit.policy.registry import load_policy  # noqa: E402
from spadekit.policy.scripted import ScriptedPolicy  # noqa: E402
from spadekit.selfplay.repair import REPAIR_MARK, build_repair_messages  # noqa: E402

JUDGE_MARK = "You review the source code of text environments"
HINT_MARK = "You write privileged hints"
BROKEN = "Draft:\n```python\nWORD = 'solve'\nprint(WORD)\n```"  # no Env class


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny")


def _block(code: str) -> str:
    return f"Here it is.\n```python\n{code}\n```\nHINT: use letters."


def responder(designs, judge=None, calls=None):
    """``designs``: outputs for designer prompts in order; repair prompts get ``WORDS[7]``."""
    state = {"n": 0}
    calls = calls if calls is not None else {}

    def respond(_ids, text):
        if HINT_MARK in text:
            calls["hint"] = calls.get("hint", 0) + 1
            return "HINT: Answer with one short lowercase word that names the goal."
        if JUDGE_MARK in text:
            calls["judge"] = calls.get("judge", 0) + 1
            return judge(text) if judge else "VERDICT: ACCEPT"
        if REPAIR_MARK in text:
            calls["repair"] = calls.get("repair", 0) + 1
            return _block(WORDS[7])
        out = designs[state["n"] % len(designs)]
        state["n"] += 1
        return out

    return respond


def _phase(tmp_path, tiny, respond, **extra):
    from spadekit.selfplay.loop import SelfPlay

    designer = ScriptedPolicy(tiny.tokenizer, respond)
    return SelfPlay(config(tmp_path, rounds=1, **extra), tmp_path / "run", policy=tiny,
                    designer_policy=designer)


def test_repair_pools_the_fixed_program_but_trains_the_invalid_first_attempt(tmp_path, tiny):
    calls = {}
    with _phase(tmp_path, tiny, responder([BROKEN, _block(WORDS[1])], calls=calls),
                **{"designer.repair_attempts": 2}) as sp:
        out = sp.design.run(0, RoundStreams(0, 0))
        assert calls["repair"] == 1
        assert out.valid == 1 and out.repaired == 1 and len(out.pooled) == 2
        assert out.reasons == {"no_env_class": 1}
        envs = {e["sha256"]: e for e in sp.store.environments()}
        marked = [e for e in envs.values() if (e["lineage"] or {}).get("repaired")]
        assert len(marked) == 1
        mark = marked[0]["lineage"]["repaired"]
        assert mark == {"attempts": 1, "first_reason": "no_env_class", "first_stage": "extract"}
        assert '"games"' in marked[0]["code"]  # WORDS[7], the repair reply
        assert sp.memory.get(marked[0]["sha256"]).repaired == mark
        other = next(s for s in envs if s != marked[0]["sha256"])
        assert sp.memory.get(other).repaired is None
        assert [r["reason"] for r in sp.store.rejected()] == ["no_env_class"]
        samples = sp.store.pop_due(1)
        assert len(samples) == 2  # the two designer samples only: no repair tokens
        by_reason = {s["meta"]["reason"]: s for s in samples}
        assert by_reason["no_env_class"]["meta"]["fixed_reward"] == 0.0
        assert "env_sha" not in by_reason["no_env_class"] or \
            by_reason["no_env_class"].get("env_sha") is None
        text = tiny.tokenizer.decode(by_reason["no_env_class"]["token_ids"])
        assert BROKEN in text and REPAIR_MARK not in text
        assert by_reason["ok"]["env_sha"] in envs


def test_failed_repairs_are_rejected_and_zero_attempts_keep_the_old_behaviour(tmp_path, tiny):
    calls = {}
    with _phase(tmp_path / "a", tiny, responder([BROKEN, _block(WORDS[1])], calls=calls)) as sp:
        out = sp.design.run(0, RoundStreams(0, 0))
        assert "repair" not in calls and out.repaired == 0 and len(out.pooled) == 1
        assert [r["reason"] for r in sp.store.rejected()] == ["no_env_class"]

    base = responder([BROKEN, _block(WORDS[1])])

    def still_broken(_ids, text):
        return "still nothing" if REPAIR_MARK in text else base(_ids, text)

    with _phase(tmp_path / "b", tiny, still_broken, **{"designer.repair_attempts": 2}) as sp:
        out = sp.design.run(0, RoundStreams(0, 0))
        assert out.repaired == 0 and out.repair_calls == 2 and len(out.pooled) == 1
        rejected = sp.store.rejected()
        assert [r["details"].get("repair_attempt") for r in rejected] == [None, 1, 2]
        assert len(sp.store.pop_due(1)) == 2


def test_repair_prompt_holds_the_conversation_output_and_report():
    msgs = build_repair_messages([{"role": "system", "content": "S"},
                                  {"role": "user", "content": "U"}], "bad output",
                                 {"stage": "solution", "reason": "solution_fails",
                                  "message": "x" * 5000})
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == "bad output"
    last = msgs[3]["content"]
    assert "solution" in last and "solution_fails" in last and "(cut)" in last
    assert len(last) < 2500


def test_verdict_parsing():
    assert parse_verdict("looks fine\nVERDICT: ACCEPT") == "accept"
    assert parse_judgement("**Verdict:** REJECT: step() never ends") == \
        ("reject", "step() never ends")
    assert parse_verdict("VERDICT: REJECT - x\nVERDICT: ACCEPT") == "accept"
    assert parse_verdict("<think>VERDICT: REJECT</think> no verdict here") is None
    assert parse_verdict("gibberish") is None and parse_verdict(None) is None
    assert judge_enabled("auto", "tooluse") and not judge_enabled("auto", "games")
    assert judge_enabled("on", "games") and not judge_enabled("off", "tooluse")
    assert judge_enabled(True, "games") and not judge_enabled(False, "tooluse")  # YAML on/off
    with pytest.raises(ValueError):
        judge_enabled("maybe", "games")


def test_judge_reject_is_a_rejection_and_garbage_is_accepted(tmp_path, tiny):
    def judge(text):
        if '"solve"' in text:
            return "The reward ignores the action.\nVERDICT: REJECT: the reward ignores the action"
        return "I like it a lot!!"  # no verdict: accept

    calls = {}
    with _phase(tmp_path, tiny, responder([_block(WORDS[0]), _block(WORDS[1])], judge, calls),
                **{"designer.judge": "on"}) as sp:
        out = sp.design.run(0, RoundStreams(0, 0))
        assert calls["judge"] == 2
        assert out.reasons == {"judge_rejected": 1} and len(out.pooled) == 1
        assert out.judge == {"accept": 0, "reject": 1, "no_verdict": 1}
        (rej,) = sp.store.rejected()
        assert rej["reason"] == "judge_rejected" and rej["stage"] == "judge"
        assert rej["message"] == "the reward ignores the action"
        samples = {s["meta"]["reason"]: s for s in sp.store.pop_due(1)}
        assert samples["judge_rejected"]["meta"]["fixed_reward"] == 0.0


def test_judge_auto_is_off_for_games(tmp_path, tiny):
    calls = {}
    with _phase(tmp_path, tiny, responder([_block(w) for w in WORDS[:2]], calls=calls)) as sp:
        assert sp.config.designer.judge == "auto"
        out = sp.design.run(0, RoundStreams(0, 0))
        assert "judge" not in calls and len(out.pooled) == 2


def test_judge_auto_is_on_for_tooluse(tmp_path, tiny):
    from spadekit.envs.library import __file__ as lib

    code = (Path(lib).parent / "tools_record_lookup.py").read_text()
    calls = {}
    with _phase(tmp_path, tiny, responder([_block(code)], lambda _t: "VERDICT: REJECT: broken",
                                          calls), setting="tooluse", envs_per_round=1,
                **{"rollout.max_turns": 12}) as sp:  # the turn cap must fit its solution
        out = sp.design.run(0, RoundStreams(0, 0))
        assert calls.get("judge") == 1, out.reasons
        assert out.reasons == {"judge_rejected": 1} and out.pooled == []


def test_hints_from_a_separate_hint_model(tmp_path, tiny):
    """``designer.hint_model`` names another policy (any spec; over HTTP an ``openai:`` one,
    tests/policy/test_openai_backend.py): it writes the hints, the designer is not asked."""
    import uuid

    from spadekit.policy.registry import register_backend

    external = ScriptedPolicy(tiny.tokenizer, lambda _i, _t:
                              "HINT: Think about which single word the rules point to.")
    asked = []
    name = f"hinter{uuid.uuid4().hex[:8]}"
    register_backend(name, lambda spec, **options: asked.append(spec) or external)
    calls = {}
    with _phase(tmp_path, tiny, responder([_block(w) for w in WORDS[:2]], calls=calls),
                **{"designer.hint_model": f"{name}:hints"}) as sp:
        out = sp.design.run(0, RoundStreams(0, 0))
        hints = [sp.store.get_hint(sha)["hint"] for sha in out.pooled]
    assert asked == [f"{name}:hints"]
    assert "hint" not in calls and out.hints["ok"] == 2
    assert hints == ["Think about which single word the rules point to."] * 2


def test_letters_is_still_importable():
    assert "LettersEnv" in LETTERS


def _validation_seeds(sp) -> list[int]:
    return sorted(e["validation"]["details"]["validation_seed"] for e in sp.store.environments()
                  if (e.get("validation") or {}).get("details"))


def test_validation_seeds_come_from_the_loop_stream(tmp_path, tiny):
    """The designer phase draws each validation's seed from the round's random stream: the same
    run seed repeats the validations exactly, another one draws other seeds."""
    seeds = []
    for name, rng_seed in (("a", 3), ("b", 3), ("c", 4)):
        with _phase(tmp_path / name, tiny, responder([_block(WORDS[1]), _block(WORDS[2])])) as sp:
            sp.design.run(0, RoundStreams(rng_seed, 0))
            seeds.append(_validation_seeds(sp))
    assert len(seeds[0]) == 2 and seeds[0] == seeds[1]
    assert set(seeds[0]).isdisjoint(seeds[2])
