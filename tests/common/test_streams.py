"""Named random streams (``spadekit.common.streams``): each a pure function of the run seed, its
name and its keys; drawing from one never moves another."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spadekit.common.streams import STREAMS, RoundStreams, derive_seed, stream


def test_the_seed_is_sha256_of_the_run_seed_secret_name_and_keys():
    digest = hashlib.sha256(b'["spadekit-stream",2,7,"k3y","play",3,"abc"]').digest()
    assert derive_seed(7, "play", 3, "abc", secret="k3y") == int.from_bytes(digest[:8], "big")
    assert stream(7, "play", 3, "abc", secret="k3y").random() == random.Random(
        int.from_bytes(digest[:8], "big")).random()
    assert RoundStreams(7, 3, "k3y").get("play", "abc").random() == random.Random(
        int.from_bytes(digest[:8], "big")).random()


def test_without_the_secret_a_program_cannot_compute_its_seeds():
    """What a program knows (formula, public seed, round, its own hash) gives other seeds than
    the run's secret key does."""
    known = {derive_seed(0, name, step, "sha") for name in STREAMS for step in range(4)}
    keyed = {derive_seed(0, name, step, "sha", secret="9f2c") for name in STREAMS
             for step in range(4)}
    assert known.isdisjoint(keyed)


def test_every_name_key_and_seed_gives_its_own_stream():
    seeds = {derive_seed(s, name, step) for s in (0, 1) for name in STREAMS for step in (0, 1)}
    assert len(seeds) == 2 * len(STREAMS) * 2
    assert derive_seed(0, "play", 0, "a") != derive_seed(0, "play", 0, "b")
    assert derive_seed(0, "play", 1) != derive_seed(0, "play", "1")  # a key's type counts


def test_drawing_more_from_one_stream_moves_no_other():
    a, b = RoundStreams(5, 2), RoundStreams(5, 2)
    for _ in range(1000):  # one run draws a lot more corpus documents
        a.get("corpus").randrange(17)
    b.get("corpus").randrange(3)
    assert [a.get("play", "env").random() for _ in range(5)] == \
        [b.get("play", "env").random() for _ in range(5)]
    assert a.get("spot_checks", "x").random() == b.get("spot_checks", "x").random()


def test_a_round_continues_its_streams_and_another_round_starts_anew():
    streams = RoundStreams(1, 0)
    first, second = streams.get("design").random(), streams.get("design").random()
    assert first != second and streams.get("design") is streams.get("design")
    assert RoundStreams(1, 0).get("design").random() == first
    assert RoundStreams(1, 1).get("design").random() != first


def test_unknown_names_and_bad_keys_are_refused():
    with pytest.raises(ValueError, match="unknown random stream 'plays'"):
        derive_seed(0, "plays")
    with pytest.raises(TypeError):
        derive_seed(True, "play")
    with pytest.raises(TypeError):
        derive_seed(0, "play", 1.5)
    with pytest.raises(TypeError):
        derive_seed(0, "play", None)
    with pytest.raises(TypeError):
        derive_seed(0, "play", secret=None)


@given(st.integers(-2 ** 70, 2 ** 70), st.sampled_from(sorted(STREAMS)),
       st.lists(st.one_of(st.integers(), st.text()), max_size=3))
def test_derived_seeds_are_64_bit_and_repeat(seed, name, keys):
    value = derive_seed(seed, name, *keys)
    assert 0 <= value < 2 ** 64 and value == derive_seed(seed, name, *keys)
