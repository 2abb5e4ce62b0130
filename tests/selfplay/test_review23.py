"""Review of issue 23 (designer warm start, procedural pool, designer benchmark): failing tests
that each show one defect, with real parts (the real sandbox and validator, real SQLite, the
tiny model)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.selfplay.config import load_config

PEEK = r'''
import random
import re


def last_box(text):
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1].strip().lower() if found else ""


class PeekEnv:
    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = int(max_turns)

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.secret = self.rng.randint(100, 999)
        self.turns = 0
        return ("The vault code is %d. Commands: \\boxed{look} looks around; "
                "\\boxed{answer N} opens the vault with code N." % self.secret), {}

    def step(self, action):
        self.turns += 1
        cmd = last_box(action).split()
        truncated = self.turns >= self.max_turns
        if cmd and cmd[0] == "look":
            return "You look around. Nothing new.", 0.0, False, truncated, {}
        if len(cmd) == 2 and cmd[0] == "answer" and cmd[1].isdigit():
            ok = int(cmd[1]) == self.secret
            return ("Open." if ok else "Wrong."), (1.0 if ok else 0.0), True, False, {}
        return "Unknown command. Use \\boxed{look} or \\boxed{answer N}.", 0.0, False, truncated, {}

    def solution(self):
        return ["\\boxed{look}", "\\boxed{answer %d}" % self.secret]
'''


def _cfg(*sets):
    return load_config("cpu-tiny", overrides=["model=tiny", "designer.max_new_tokens=4096",
                                              *sets])


def _designer(texts):
    """A designer that writes ``texts`` in turn (after the response prefix, if any)."""
    queue = list(texts)
    return ScriptedPolicy(load_policy("tiny").tokenizer, lambda _ids, _text: queue.pop(0))


def _sample(cfg, texts, known=()):
    from spadekit.sandbox import SandboxPool
    from spadekit.sandbox.validate import Validator
    from spadekit.selfplay.designer_eval import sample_designs

    prefix = cfg.designer.response_prefix
    outs = [t[len(prefix):] if prefix and t.startswith(prefix) else t for t in texts]
    with SandboxPool(cfg.sandbox, warm=1) as pool, \
            Validator(pool, cfg.validation.settings(cfg.turn_cap)) as validator:
        return sample_designs(_designer(outs), cfg, validator, n=len(texts), seed=0,
                              skills=["Mathematical_Reasoning"],
                              documents=[("d", "copper wires carry current")],
                              references=(), known=list(known))


def _block(code, hint="Look first, then answer."):
    return f"```python\n{code.strip()}\n```\nHINT: {hint}"


def _procedural(seed=0, combo="number+reveal+exact+open"):
    from spadekit.envs.procedural import Combo, compose, surface_words

    words = surface_words("copper wires carry current through the old station",
                          random.Random(1))
    return compose(Combo.parse(combo), words, seed, 3)


# -- 1. metric honesty ------------------------------------------------------------------------

def test_a_game_won_in_one_turn_is_not_counted_multiturn():
    """The observation states the code; ``solution()`` wastes one look before answering. The
    validator passes it (no baseline reads the observation) and designer_eval counts it
    multi-turn because the *solution* took two turns, although answering at once wins."""
    [sample] = _sample(_cfg(), [_block(PEEK)])
    assert sample.reason == "ok"
    # the one-turn play: the solution's last action alone wins on the first turn
    ns: dict = {}
    exec(PEEK, ns)
    env = ns["PeekEnv"]()
    env.reset(seed=5)
    answer = env.solution()[-1]
    env.reset(seed=5)
    _obs, reward, terminated, _tr, _i = env.step(answer)
    assert reward == 1.0 and terminated  # one turn suffices
    assert sample.multiturn is False, "a one-turn-winnable game counted as multi-turn"


DEAD = '''
    def _ledger(self, entries):
        total, seen, order = 0, {}, []
        for entry in entries:
            key = str(entry).strip().lower()
            if key in seen:
                seen[key] += 1
                continue
            seen[key] = 1
            order.append(key)
            total += len(key) * 3 + 7
        ranked = sorted(order, key=lambda k: (-seen[k], k))
        return {"total": total, "ranked": ranked[:5], "unique": len(order)}
'''


def test_a_warm_start_program_padded_with_dead_code_is_not_novel():
    """A warm-start program with one never-called helper added: still that program (every
    shingle of it is in the copy), but Jaccard drops below 0.9 and it counts as novel. The
    project's own blacklist check uses containment for exactly this reason."""
    from spadekit.selfplay.memory import containment, fingerprint

    known = _procedural()
    padded = known.code.replace("\n    def reset(", DEAD + "\n    def reset(", 1)
    [sample] = _sample(_cfg(), [_block(padded, known.hint)], known=[known])
    assert sample.reason == "ok", sample.reason
    held = containment(fingerprint(padded), fingerprint(known.code))
    assert held >= 0.95  # the whole warm-start program is inside the sample
    assert sample.novel is False, (f"padded copy counted novel (jaccard {sample.similarity}, "
                                   f"containment {held:.3f})")


def test_novelty_uses_the_runs_dedup_threshold():
    """designer_eval claims to count exactly what the loop's dedup gate lets in, but it uses the
    constant 0.9, not the run's ``dedup_threshold``: with dedup_threshold=0.5 the loop refuses a
    re-numbered copy of a warm-start program that designer_eval calls novel."""
    known = _procedural(seed=0)
    other = _procedural(seed=987654, combo="number+reveal+steep+open")  # another scoring
    cfg = _cfg("dedup_threshold=0.5")
    [sample] = _sample(cfg, [_block(other.code, other.hint)], known=[known])
    assert sample.reason == "ok"
    assert sample.similarity >= cfg.dedup_threshold  # the loop's gate would refuse it
    assert sample.novel is False, f"similarity {sample.similarity} >= {cfg.dedup_threshold}"
