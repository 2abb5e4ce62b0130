"""The procedural game parts compose: every combination of hidden state, information action,
scoring rule and turn structure makes a program whose solution wins and whose garbage does not
(issue 23). These run the programs in-process (the programs are made here, by our own code);
the real validator in the sandbox checks a sample in tests/selfplay/test_procedural_pool.py."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from spadekit.envs.procedural import Combo, all_combos, compose, surface_words
from spadekit.envs.procedural.mechanics import HIDDEN, INFO, SCORING, TURNS

WORDS = surface_words("The river carries silt and pebbles past the mill where farmers grind "
                      "barley and oats", random.Random(0))


def _load(program):
    ns: dict = {}
    exec(compile(program.code, "<procedural>", "exec"), ns)
    return ns[program.class_name]


def _play(env, seed, actions):
    obs, info = env.reset(seed=seed)
    assert isinstance(obs, str) and obs and info == {}
    out = None
    for action in actions:
        out = env.step(action)
        if out[2] or out[3]:
            break
    return out


def test_every_part_combines_with_every_other():
    combos = all_combos()
    assert len(combos) == len(HIDDEN) * len(INFO) * len(SCORING) * len(TURNS)
    assert len({c.skill for c in combos}) >= 6
    for k, combo in enumerate(combos):
        program = compose(combo, WORDS, k)
        env = _load(program)(max_turns=8)
        for seed in range(4):
            env.reset(seed=seed)
            solution = env.solution()
            assert len(solution) == 2  # one look, then the answer: a multi-turn solution
            _obs, reward, terminated, truncated, _ = _play(env, seed, solution)
            assert (reward, terminated, truncated) == (1.0, True, False), combo.key
            # garbage never wins; a bare answer verb without a candidate scores 0
            assert _play(env, seed, ["\\boxed{zzz}"] * 8)[1] == 0.0
            assert _play(env, seed, ["hello"] * 8)[3] is True  # truncated at the cap


def test_the_same_seed_writes_the_same_program_and_another_seed_other_numbers():
    combo = Combo("number", "probe", "steep", "budget")
    assert compose(combo, WORDS, 5).code == compose(combo, WORDS, 5).code
    codes = {compose(combo, WORDS, s).code for s in range(8)}
    assert len(codes) > 1


def test_unknown_parts_and_bad_surfaces_are_refused():
    with pytest.raises(ValueError, match="unknown hidden part"):
        Combo("nope", "probe", "exact", "open")
    with pytest.raises(ValueError, match="hidden\\+info\\+scoring\\+turns"):
        Combo.parse("number+probe")
    assert Combo.parse("cell+clue+banded+gated") == Combo("cell", "clue", "banded", "gated")
    with pytest.raises(ValueError, match="at least 6 distinct words"):
        compose(Combo("number", "probe", "exact", "open"), ["a", "b"], 0)


def test_the_turn_structures_do_what_they_say():
    gated = _load(compose(Combo("number", "reveal", "exact", "gated"), WORDS, 1))()
    gated.reset(seed=3)
    answer = gated.solution()[1]
    obs, reward, terminated, _t, _ = gated.step(answer)  # no look yet: refused, not ended
    assert (reward, terminated) == (0.0, False) and "at least once" in obs
    budget = _load(compose(Combo("cell", "reveal", "exact", "budget"), WORDS, 2))(max_turns=20)
    budget.reset(seed=0)
    seen = [budget.step("\\boxed{" + budget.solution()[0].split("{")[1].split()[0] + " 1}")[0]
            for _ in range(6)]
    assert any("No looks left" in s for s in seen)


def test_thrifty_scoring_charges_for_extra_looks():
    env = _load(compose(Combo("code", "clue", "thrifty", "open"), WORDS, 4))(max_turns=12)
    env.reset(seed=1)
    look, answer = env.solution()
    rewards = [env.step(look)[1] for _ in range(3)] + [env.step(answer)[1]]
    assert rewards == [0.0, 0.0, 0.0, pytest.approx(0.8)]


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=300), seed=st.integers(0, 2 ** 31 - 1))
def test_surface_words_are_always_usable(text, seed):
    words = surface_words(text, random.Random(seed))
    assert len(words) == 8 and len(set(words)) == 8
    assert all(w.isalpha() and w.islower() and 3 <= len(w) <= 9 for w in words)
    program = compose(Combo("cause", "probe", "banded", "open"), words, seed)
    env = _load(program)()
    env.reset(seed=seed)
    assert _play(env, seed, env.solution())[1] == 1.0
