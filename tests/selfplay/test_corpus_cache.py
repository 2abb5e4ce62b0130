"""The default corpus kept on disk between processes (``spadekit.selfplay.corpus_cache``): a
second read costs no build, a damaged or foreign file is built again, the key follows what the
build reads, and any bytes in the cache file give a whole build or none."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spadekit.selfplay import corpus_cache
from spadekit.selfplay.corpus_cache import build_key, cache_path, cached_build

ROWS = [["stdlib:a", "a(x)\n\nFirst document.\n", "stdlib:a"],
        ["numpy:b", "b()\n\nSecond document.\n", "numpy:b"]]
VERSIONS = {"numpy": "2.0.0"}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPADEKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


class Builds:
    def __init__(self, rows=ROWS):
        self.rows, self.calls = rows, 0

    def __call__(self):
        self.calls += 1
        return [list(r) for r in self.rows], dict(VERSIONS)


def test_the_second_read_costs_no_build_and_gives_the_same_rows(cache):
    build = Builds()
    first = cached_build("k1", build)
    second = cached_build("k1", build)
    assert build.calls == 1 and first == second == (ROWS, VERSIONS)
    assert cache_path("k1").is_relative_to(cache) and cache_path("k1").exists()
    other = cached_build("k2", Builds(ROWS[:1]))  # another key is another build
    assert other == (ROWS[:1], VERSIONS)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "digest", "no rows", "wrong shape"])
def test_a_damaged_cache_file_is_built_again_and_replaced(cache, damage):
    build = Builds()
    cached_build("k", build)
    path = cache_path("k")
    data = json.loads(gzip.decompress(path.read_bytes()))
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "garbage":
        path.write_bytes(b"\x00not gzip at all")
    elif damage == "digest":  # a document changed after it was written
        data["docs"][0][1] = "Another text.\n"
        path.write_bytes(gzip.compress(json.dumps(data).encode()))
    elif damage == "no rows":
        data.update(docs=[], digest=corpus_cache._digest([]))
        path.write_bytes(gzip.compress(json.dumps(data).encode()))
    else:
        data.update(docs=[["only two", "fields"]], digest=corpus_cache._digest([["a", "b"]]))
        path.write_bytes(gzip.compress(json.dumps(data).encode()))
    assert cached_build("k", build) == (ROWS, VERSIONS) and build.calls == 2
    assert cached_build("k", build) == (ROWS, VERSIONS) and build.calls == 2  # replaced


def test_no_key_or_an_unwritable_cache_still_builds(tmp_path, monkeypatch):
    build = Builds()
    assert cached_build(None, build) == (ROWS, VERSIONS) and build.calls == 1
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SPADEKIT_CACHE", str(blocker / "cache"))
    assert cached_build("k", build) == (ROWS, VERSIONS) and build.calls == 2
    assert not list(tmp_path.glob("**/*.tmp"))


def test_the_key_follows_the_builder_and_the_packages(tmp_path):
    builder = tmp_path / "builder.py"
    builder.write_text("# one builder\n")
    key = build_key(["json", "numpy"], builder)
    assert key is not None and key == build_key(["json", "numpy"], builder)
    assert build_key(["json"], builder) != key  # another set of packages
    builder.write_text("# another builder\n")
    assert build_key(["json", "numpy"], builder) != key
    assert build_key(["json"], tmp_path / "missing.py") is None  # unreadable: nothing cached
    assert build_key(["json"], builder, python=str(tmp_path / "no-python")) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=200),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                              lambda c: st.lists(c, max_size=4)
                              | st.dictionaries(st.sampled_from(["docs", "versions", "digest"]),
                                                c, max_size=3), max_leaves=12)
                 .map(lambda v: gzip.compress(json.dumps(v).encode()))))
def test_any_bytes_in_the_cache_file_give_a_whole_build_or_none(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("c") / "f.json.gz"
    path.write_bytes(blob)
    found = corpus_cache._read(path)
    assert found is None or (found[0] and all(len(r) == 3 for r in found[0]))
