"""Issue 22's closing check: over 8 real rounds, a designer that writes only reward hacks earns
less than one that writes honest programs at the agent's frontier.

Two runs of the real loop (tiny model that really trains, real sandbox, real run database), each
with a scripted designer:

- honest: four-door games (tests/data/honesty/door.py); the clue word and offset decide the door,
  and the hint says how to read them without naming a door;
- hacks, in turn: a lottery that pays 0.2 on half the seeds whatever the agent says and has no
  ``solution()``; a password door whose hint names the password; a
  constant answer whose hint says it ("Always answer 42."); a lottery with a way out whose hint
  spells the phrase letter by letter ("O-P-E-N S-E-S-A-M-E").

The agent is scripted too, so every return is known: without a hint it opens the right door on
every other play of a door game (mean return 0.5, the plateau's band) and says ``red`` to
anything else; with a hint it follows it (it counts letters as the door hint says, and it reads
an answer the hint gives away in any of the forms above). So a hint that leaks would earn full
regret if the leak check let it through, and a lottery would sit in the plateau's band if the
plateau still counted returns > 0.

The designer rewards are read from the ``designer_samples`` events of the run database.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.selfplay.config import load_config

DATA = Path(__file__).resolve().parents[1] / "data" / "honesty"
DOOR_SETS = [["red", "blue", "green", "gold"], ["oak", "elm", "ash", "yew"],
             ["north", "south", "east", "west"], ["tin", "iron", "lead", "zinc"]]
HINTS = {
    "Door": "Add the number of letters in the clue word to the offset, then count along the "
            "doors from the first, wrapping around.",
    "Lottery": "Any wish works when fortune smiles on you.",
    "Password": "The magic word that opens the door is xyzzy.",
    "Answer": "Always answer 42.",
    "Jackpot": "Spell it out: O-P-E-N S-E-S-A-M-E.",
}
ROUNDS = 8


def _program(kind: str, n: int) -> str:
    name = f"K{n}"
    code = (DATA / f"{kind}.py").read_text().replace("NAME", name)
    doors = DOOR_SETS[n % len(DOOR_SETS)]
    return (code.replace("DOOR_LIST", repr(doors)).replace("SECRET_WORD", "xyzzy")
            .replace("ANSWER", "42"))


def designer(tokenizer, kinds: list[str]) -> ScriptedPolicy:
    count = {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            kind = re.findall(r"class K\d+(\w+?)Env", text)[-1]
            return HINTS[kind]
        n = count["n"]
        count["n"] += 1
        return f"```python\n{_program(kinds[n % len(kinds)], n)}\n```"

    return ScriptedPolicy(tokenizer, respond)


def _given_away(hint: str) -> str | None:
    """The answer a hint gives away, in any of the hacks' forms."""
    spelled = re.findall(r"\b([A-Z](?:-[A-Z])+)\b", hint)
    if spelled:
        return " ".join(s.replace("-", "") for s in spelled).lower()
    said = re.search(r"\b(?:is|answer)\s+(\w+)", hint)
    return said.group(1) if said else None


def agent(tokenizer) -> ScriptedPolicy:
    plays: dict[str, int] = {}

    def respond(_ids, text):
        hint = text.rsplit("HINT:", 1)[1].split("\n", 1)[0] if "HINT:" in text else None
        door = re.findall(r"Clue word: (\w+)\. Offset: (\d)\. Doors, in order: ([\w, ]+)\.", text)
        if door:
            word, offset, names = door[-1]
            doors = names.split(", ")
            right = doors[(len(word) + int(offset)) % 4]
            if hint:
                return f"\\boxed{{{right}}}"
            k = plays.get(names, 0)
            plays[names] = k + 1
            return f"\\boxed{{{right if k % 2 == 0 else doors[(doors.index(right) + 1) % 4]}}}"
        answer = _given_away(hint) if hint else None
        return f"\\boxed{{{answer or 'red'}}}"

    return ScriptedPolicy(tokenizer, respond)


def run(tmp_path: Path, kinds: list[str]) -> tuple[list[float], dict]:
    from spadekit.rollout.engine import RolloutEngine
    from spadekit.selfplay.loop import SelfPlay

    sets = ["model=tiny", f"rounds={ROUNDS}", "envs_per_round=2", "num_generations=4",
            "hint_generations=4", "regen_interval=1", "skills_per_epoch=1", "bootstrap=null",
            "memory_seed_library=false", "dedup_threshold=1.01", "rollout.max_turns=2",
            "rollout.max_new_tokens=16", "rollout.temperature=1.0", "designer.temperature=1.0",
            "designer.max_new_tokens=8192", "rollout.max_context_tokens=8192",
            "tensorboard=false", "checkpoint_every=100", "seed=0"]
    cfg = load_config(preset=None, overrides=sets + ["stream_key=tests"])
    policy = load_policy("tiny")
    with SelfPlay(cfg, tmp_path / "run", policy=policy,
                  designer_policy=designer(policy.tokenizer, kinds)) as sp:
        sp.engine = RolloutEngine(agent(policy.tokenizer), sp.env_backend, cfg.rollout)
        metrics = sp.run(ROUNDS)
        events = sp.store.events("designer_samples")
    rewards = [s["reward"] for e in events for s in e["data"]["samples"]]
    by_kind: dict[str, list[float]] = {}
    totals = {"leaked": sum(m.get("hints_leaked", 0) for m in metrics),
              "valid": sum(m.get("valid", 0) for m in metrics),
              "designed": sum(m.get("designed", 0) for m in metrics),
              "by_kind": by_kind}
    return rewards, totals


@pytest.mark.timeout(600)
def test_hacks_earn_less_than_honest_frontier_programs(tmp_path):
    honest, h = run(tmp_path / "honest", ["door"])
    hacks, x = run(tmp_path / "hacks", ["lottery", "password", "answer42", "jackpot"])
    # round r's designs are rewarded at round r + 1: rounds 0..6, two programs each
    assert len(honest) == len(hacks) == 2 * (ROUNDS - 1)
    assert h["valid"] == h["designed"] == 2 * ROUNDS and h["leaked"] == 0
    # honest: regret .5 (norm 1) and mean return .5 (plateau 1): about 1 each
    assert min(honest) > 0.8
    # every hack earns (nearly) nothing: the no-solution programs are invalid (0), the leaked
    # hints are refused (no regret), and a lottery paying .2 on lucky seeds has a mean return of
    # at most .2 (all 4 plays lucky), so at most .6 * plateau(.2) = .12
    assert max(hacks) <= 0.12 + 1e-9, hacks
    assert x["leaked"] >= 2  # the 42 and the spelled-out phrase
    assert sum(hacks) / len(hacks) < sum(honest) / len(honest) - 0.5
