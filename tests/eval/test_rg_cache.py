"""The on-disk cache of Reasoning Gym items (issue 17): the same ids and items with and without
it, a second load without generation, damaged files detected and regenerated, and the tagged
JSON codec that keeps Reasoning Gym's entries (sets, tuples, numpy values) exact."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("reasoning_gym")

from spadekit.eval import rg_cache  # noqa: E402
from spadekit.eval.rg import ReasoningGymSuite  # noqa: E402

# fast generators with varied entries (nested metadata, tuples, sets), plus one that the hard
# config makes fail on some items (retried with derived seeds)
DATASETS = ["complex_arithmetic", "basic_arithmetic", "graph_color", "propositional_logic",
            "sudoku", "word_sorting"]


def _suite(cache, datasets=DATASETS, level="hard"):
    return ReasoningGymSuite(level, datasets=datasets, cache=cache)


def test_items_are_identical_with_and_without_the_cache(tmp_path):
    plain = _suite(False).load_items(limit=3)
    first = _suite(tmp_path)
    cold = first.load_items(limit=3)
    assert first.cache.stats.misses == 3 * len(DATASETS) and first.cache.stats.hits == 0
    second = _suite(tmp_path)
    warm = second.load_items(limit=3)
    assert second.cache.stats.hits == 3 * len(DATASETS) and second.cache.stats.misses == 0
    assert [i.id for i in plain] == [i.id for i in cold] == [i.id for i in warm]
    assert plain == cold == warm  # prompt, answer, group, data (seed, index, size): all equal
    # scoring a cached item gives what scoring a fresh one gives (gold wins, garbage does not)
    fresh = _suite(False)
    fresh_items = fresh.load_items(limit=3)
    for item, ref in zip(warm, fresh_items):
        assert second.gold_completion(item) == fresh.gold_completion(ref)
        gold = fresh.gold_completion(ref)
        if gold is not None:
            assert second.score(item, gold) == fresh.score(ref, gold)
        assert second.score(item, "<answer>zzz</answer>") == fresh.score(ref, "<answer>zzz</answer>")


def test_a_larger_limit_generates_only_the_missing_items(tmp_path):
    _suite(tmp_path).load_items(limit=2)
    more = _suite(tmp_path)
    items = more.load_items(limit=4)
    assert more.cache.stats.hits == 2 * len(DATASETS)
    assert more.cache.stats.misses == 2 * len(DATASETS)
    assert items == _suite(False).load_items(limit=4)


def test_failed_items_are_cached_with_their_error(tmp_path, monkeypatch):
    """An item no seed produces is remembered with its error, not searched for again."""
    cold = _suite(tmp_path, ["word_sorting"])

    def broken(dataset, seed, size=None):
        raise ValueError("Failed to generate valid puzzle")

    monkeypatch.setattr(cold, "_generator", broken)
    assert cold.load_items(limit=2) == []
    warm = _suite(tmp_path, ["word_sorting"])
    monkeypatch.setattr(warm, "_generator", lambda *a, **k: pytest.fail("regenerated"))
    assert warm.load_items(limit=2) == [] and warm.cache.stats.misses == 0
    assert warm.skipped == cold.skipped and len(warm.skipped) == 2
    assert "Failed to generate" in warm.skipped[0][1]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "edited", "key", "record"])
def test_a_damaged_cache_file_is_detected_and_regenerated(tmp_path, damage):
    reference = _suite(False, ["complex_arithmetic"]).load_items(limit=3)
    _suite(tmp_path, ["complex_arithmetic"]).load_items(limit=3)
    [file] = list(tmp_path.rglob("complex_arithmetic.json"))
    text = file.read_text()
    doc = json.loads(text)
    if damage == "garbage":
        file.write_bytes(b"\x00\xff not json")
    elif damage == "truncated":
        file.write_text(text[: len(text) // 2])
    elif damage == "edited":  # a question changed without fixing the digest
        doc["records"]["1"]["question"] = "What is 1 + 1?"
        file.write_text(json.dumps(doc))
    elif damage == "key":  # another suite's file under this name
        doc["key"]["seed"] = 46
        file.write_text(json.dumps(doc))
    else:  # a record with a consistent digest but no question
        del doc["records"]["0"]["question"]
        doc["sha256"] = rg_cache._digest(doc["records"])
        file.write_text(json.dumps(doc))
    again = _suite(tmp_path, ["complex_arithmetic"])
    items = again.load_items(limit=3)
    assert len(again.cache.stats.corrupt) == 1 and again.cache.stats.misses == 3
    assert items == reference
    healed = _suite(tmp_path, ["complex_arithmetic"])
    assert healed.load_items(limit=3) == reference
    assert healed.cache.stats.hits == 3 and not healed.cache.stats.corrupt


def test_the_key_names_suite_seed_and_versions(tmp_path):
    hard, easy = _suite(tmp_path), _suite(tmp_path, level="easy")
    assert hard.cache.dir != easy.cache.dir
    key = hard.cache.key
    assert key["suite"] == "rg-hard" and key["seed"] == 45 and key["spadekit"]
    assert key["reasoning_gym"] != "unknown"


leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8),
                 st.floats(allow_nan=False), st.just(float("inf")), st.binary(max_size=6),
                 st.integers(-5, 5).map(np.int64), st.floats(-3, 3).map(np.float32))
hashable = st.one_of(st.integers(), st.text(max_size=6), st.tuples(st.integers(), st.integers()))
values = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
    st.sets(hashable, max_size=4), st.frozensets(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=6), inner, max_size=4),
    st.dictionaries(hashable, inner, max_size=3),
    st.lists(st.integers(-9, 9), min_size=1, max_size=6).map(np.array)), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(values)
def test_codec_round_trips_exactly(value):
    back = rg_cache.decode(json.loads(json.dumps(rg_cache.encode(value))))
    assert rg_cache.same(back, value)


@settings(max_examples=100, deadline=None)
@given(values, values)
def test_same_tells_types_apart(a, b):
    if rg_cache.same(a, b):
        assert type(a) is type(b)
    assert rg_cache.same(a, a)


def test_codec_refuses_what_it_cannot_hold():
    class Thing:
        pass

    with pytest.raises(rg_cache.Unencodable):
        rg_cache.encode({"a": [Thing()]})
    rec = rg_cache.record_of(45, {"question": "q", "metadata": {"x": Thing()}})
    assert rec == {"seed": 45, "question": "q"}  # kept without its entry: scoring regenerates
    assert rg_cache.same(1, 1) and not rg_cache.same(1, True) and not rg_cache.same((1,), [1])
