"""EnvironmentMemory: FIFO cap, seed selection, near duplicates, library seeding."""

from __future__ import annotations

import ast
import random
import re

import pytest

from spadekit.envs.library import list_library, source
from spadekit.envs.program import EnvProgram
from spadekit.selfplay.memory import (
    EnvironmentMemory, MemoryRecord, canonical_tokens, fingerprint, jaccard,
)
from spadekit.runs.store import RunStore, StoreError, StoreNotFound


@pytest.fixture
def store(tmp_path):
    s = RunStore(tmp_path / "run", create=True)
    yield s
    s.close()


def prog(i: int, skill: str = "Optimization") -> EnvProgram:
    return EnvProgram(code=f"class P{i}Env:\n    LIMIT = {i}\n", skill=skill, hint=f"h{i}")


def test_cap_and_fifo_eviction(store):
    mem = EnvironmentMemory(store, cap=3)
    for i in range(3):
        mem.add(prog(i), step=i)
    mem.update_stats(prog(0).sha256, win_rate=0.5)  # an update does not refresh its position
    mem.add(prog(1), regret=0.3)  # nor does adding it again (stats are updated instead)
    assert mem.get(prog(1).sha256).regret == 0.3
    mem.add(prog(3), step=3)
    mem.add(prog(4), step=4)
    assert [r.sha256 for r in mem.records()] == [prog(i).sha256 for i in (2, 3, 4)]
    assert len(mem) == 3 and prog(0).sha256 not in mem and prog(4).sha256 in mem
    assert EnvironmentMemory(store).records() == mem.records()  # it lives in the database
    big = EnvironmentMemory(store)
    assert big.cap == 200


def test_record_round_trip_and_updates(store):
    mem = EnvironmentMemory(store)
    report = {"ok": True, "stage": "done", "reason": "ok", "message": "valid",
              "details": {"max_turns": 12, "class_name": "P1Env", "timings_ms": {"x": 1}}}
    rec = mem.add(prog(1), step=5, win_rate=0.5, win_rate_with_hint=0.75, regret=0.25,
                  designer_reward=0.9, n_plays=16, parents=["a" * 64], validation=report)
    assert isinstance(rec, MemoryRecord)
    assert (rec.win_rate, rec.win_rate_with_hint, rec.regret, rec.designer_reward) == (
        0.5, 0.75, 0.25, 0.9)
    assert rec.parents == ("a" * 64,) and rec.n_plays == 16 and rec.step == 5
    assert rec.validation == {"ok": True, "stage": "done", "reason": "ok", "message": "valid",
                              "max_turns": 12, "class_name": "P1Env"}
    assert rec.program.sha256 == prog(1).sha256 and rec.to_dict()["parents"] == ["a" * 64]
    rec = mem.update_stats(prog(1).sha256, win_rate=0.25, regret=None, step=7)
    assert (rec.win_rate, rec.regret, rec.win_rate_with_hint) == (0.25, None, 0.75)
    with pytest.raises(StoreNotFound):
        mem.update_stats("f" * 64, win_rate=0.5)
    with pytest.raises(StoreError):
        mem.update_stats(prog(1).sha256, win_rate=1.5)
    assert mem.remove(prog(1).sha256) and not mem.remove(prog(1).sha256)


def test_refresh_from_store_and_round_rollback(store):
    mem = EnvironmentMemory(store)
    p = prog(1)
    store.add_environment(p, step=2)
    store.record_plays([dict(env_sha=p.sha256, step=2, with_hint=h, episode_return=r)
                        for h, r in ((False, 1.0), (False, 0.0), (True, 1.0), (True, 1.0))])
    mem.add(p, step=2)
    rec = mem.refresh_from_store(p.sha256, designer_reward=0.7, step=2)
    assert (rec.win_rate, rec.win_rate_with_hint, rec.regret, rec.n_plays,
            rec.designer_reward) == (0.5, 1.0, 0.5, 2, 0.7)
    with pytest.raises(RuntimeError):
        with store.round(3):
            mem.add(prog(2))
            mem.update_stats(p.sha256, win_rate=0.0)
            raise RuntimeError
    assert len(mem) == 1 and mem.get(p.sha256).win_rate == 0.5


def hand_built(store) -> tuple[EnvironmentMemory, list[EnvProgram]]:
    """14 in-band Optimization records with distinct regrets, plus distractors."""
    mem = EnvironmentMemory(store)
    ranked = []
    for i in range(14):
        p = prog(i)
        win = [0.15, 0.85, 0.5, 0.3][i % 4]  # band edges are inclusive
        mem.add(p, win_rate=win, regret=i / 20)
        ranked.append(p)
    ranked.reverse()  # highest regret first
    mem.add(prog(100), win_rate=0.6, regret=None)  # in band, regret unknown: ranked last
    ranked.append(prog(100))
    mem.add(prog(101), win_rate=0.149, regret=5.0)  # out of band
    mem.add(prog(102), win_rate=0.851, regret=5.0)  # out of band
    mem.add(prog(103), win_rate=None, regret=5.0)  # not played yet
    mem.add(prog(104, "Logical_Deduction"), win_rate=0.5, regret=5.0)  # other skill
    return mem, ranked


def test_positive_seeds_top_k(store):
    mem, ranked = hand_built(store)
    for n, k in ((2, 10), (4, 12), (5, 15)):
        top = [p.sha256 for p in ranked[:k]]
        for seed in range(20):
            got = [r.sha256 for r in mem.positive_seeds("Optimization", n, random.Random(seed))]
            assert got == random.Random(seed).sample(top, n)  # exactly: sample n of the top k
    seen = set()
    for seed in range(300):
        seen.update(r.sha256 for r in mem.positive_seeds("Optimization", 2, random.Random(seed)))
    assert seen == {p.sha256 for p in ranked[:10]}
    a = mem.positive_seeds("Optimization", 2, random.Random(7))
    assert a == mem.positive_seeds("Optimization", 2, random.Random(7))  # deterministic
    only = mem.positive_seeds("Logical_Deduction", 2, random.Random(0))
    assert [r.sha256 for r in only] == [prog(104, "Logical_Deduction").sha256]
    assert mem.positive_seeds("Spatial_Reasoning", 2, random.Random(0)) == []
    assert mem.positive_seeds("Optimization", 0, random.Random(0)) == []


def test_positive_seeds_fall_back_to_library(store):
    mem = EnvironmentMemory(store)
    assert mem.seed_from_library() == 12
    lib = mem.positive_seeds("Optimization", 2, random.Random(0))
    assert len(lib) == 1 and lib[0].library and lib[0].skill == "Optimization"
    mem.add(prog(1), win_rate=0.05)  # out of band: the library still stands in
    assert mem.positive_seeds("Optimization", 2, random.Random(0)) == lib
    mem.add(prog(2), win_rate=0.5, regret=0.1)
    got = mem.positive_seeds("Optimization", 2, random.Random(0))
    assert [r.sha256 for r in got] == [prog(2).sha256]


def test_negative_seed(store):
    mem = EnvironmentMemory(store)
    assert mem.negative_seed("Optimization", random.Random(0)) is None
    mem.add(prog(1, "Logical_Deduction"), win_rate=0.95)
    rec, why = mem.negative_seed("Optimization", random.Random(0))  # falls back to any skill
    assert rec.sha256 == prog(1, "Logical_Deduction").sha256 and why == "too easy"
    mem.add(prog(2), win_rate=0.05)
    mem.add(prog(3), win_rate=0.5)
    mem.add(prog(4), win_rate=0.9)  # not > 0.9
    mem.add(prog(5), win_rate=0.1)  # not < 0.1
    for seed in range(10):
        rec, why = mem.negative_seed("Optimization", random.Random(seed))
        assert rec.sha256 == prog(2).sha256 and why == "too hard"
    mem.add(prog(6), win_rate=1.0)
    picks = {mem.negative_seed("Optimization", random.Random(s))[0].sha256 for s in range(40)}
    assert picks == {prog(2).sha256, prog(6).sha256}
    assert mem.negative_seed("Optimization", random.Random(3)) == \
        mem.negative_seed("Optimization", random.Random(3))


RENAMES = {"secret": "hidden_code", "feedback": "score_guess", "extract_boxed": "find_box",
           "CodeBreakerEnv": "MastermindEnv", "LENGTH": "N_POS", "ALL_CODES": "CANDIDATES",
           "guess": "attempt", "exact": "hits"}


def rename(code: str) -> str:
    return re.sub(r"\b(" + "|".join(RENAMES) + r")\b", lambda m: RENAMES[m.group(1)], code)


def test_near_duplicates(store):
    mem = EnvironmentMemory(store)
    original = source("games_code_breaker")
    mem.add(EnvProgram(code=original, skill="Logical_Deduction"))
    sha = EnvProgram(code=original).sha256

    renamed = rename(original)
    assert renamed != original
    reformatted = "# a copy\n" + ast.unparse(ast.parse(original)).replace("\n", "\n\n# note\n")
    redocumented = original.replace('"""Mastermind-style', '"""A completely new game. Mastermind')
    for variant in (renamed, reformatted, redocumented, rename(reformatted)):
        dup, closest, sim = mem.is_near_duplicate(variant)
        assert dup and closest == sha and sim == pytest.approx(1.0)
    tweaked = original.replace('LENGTH, DIGITS = 4, "123456"', 'LENGTH, DIGITS = 5, "1234567"')
    dup, _, sim = mem.is_near_duplicate(tweaked)
    assert dup and 0.9 <= sim < 1.0

    # the gate's similarity is the larger of Jaccard and containment (the share of the stored
    # program's shingles found in the new one): other games share up to about 0.6 of it
    for other in ("games_modular_search", "games_switchboard", "tools_record_lookup"):
        dup, closest, sim = mem.is_near_duplicate(source(other))
        assert not dup and closest == sha and sim < 0.7, (other, sim)
    padded = original + "\n\ndef _unused(rows):\n" + "".join(
        f"    rows = [r * {k} + {k} for r in rows if r != {k}]\n" for k in range(40)) + \
        "    return rows\n"
    dup, closest, sim = mem.is_near_duplicate(padded)  # a copy with dead code is a copy
    assert dup and closest == sha and sim == pytest.approx(1.0)
    assert mem.is_near_duplicate(renamed, skill="Optimization") == (False, None, 0.0)
    other = source("games_modular_search")  # the threshold is honoured either side of it
    near = mem.is_near_duplicate(other)[2]
    assert mem.is_near_duplicate(other, threshold=near)[0] is True
    assert mem.is_near_duplicate(other, threshold=near + 0.01)[0] is False
    switchboard = source("games_switchboard")  # the memory's own threshold, likewise
    sim = mem.is_near_duplicate(switchboard)[2]
    assert EnvironmentMemory(store, duplicate_threshold=sim).is_near_duplicate(
        switchboard)[0] is True
    assert EnvironmentMemory(store, duplicate_threshold=sim + 0.01).is_near_duplicate(
        switchboard)[0] is False
    broken = "class BrokenEnv(:\n    pass\n"
    assert canonical_tokens(broken)  # unparsable code falls back to raw tokens
    assert jaccard(fingerprint(broken), fingerprint(broken)) == 1.0


def test_library_seeding(store):
    mem = EnvironmentMemory(store)
    assert mem.seed_from_library(step=0) == 12 == len(list_library())
    assert mem.seed_from_library() == 0 and len(mem) == 12
    records = mem.records()
    assert all(r.library and r.win_rate is None and r.regret is None for r in records)
    assert {r.skill for r in records} == {e.skill for e in list_library()}
    by_skill = {e.skill: e for e in list_library()}
    for r in records:
        assert r.hint == by_skill[r.skill].hint and r.domain == by_skill[r.skill].setting
    # the library programs are far apart from each other, and each finds itself
    prints = {r.sha256: fingerprint(r.code) for r in records}
    for r in records:
        sims = [jaccard(prints[r.sha256], prints[o.sha256]) for o in records if o != r]
        assert max(sims) < 0.6
    assert mem.is_near_duplicate(records[3].code) == (True, records[3].sha256, 1.0)
