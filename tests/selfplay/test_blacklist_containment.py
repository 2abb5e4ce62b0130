"""The near-duplicate blacklist holds against dead-code padding (review of issue 22, finding 2).

``tests/data/reward_attacks/blacklist_padding.py``: a retired program (``batch_detector.py``)
with one unused function appended had a Jaccard similarity of 0.716 to itself and passed the
gate (threshold 0.9). The gate now measures containment: the share of the blacklisted program's
shingles present in the new one. Exact copies, one-token edits and padded copies are refused;
unrelated programs (the library's, against each other) are not.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest

from spadekit.envs.library import list_library
from spadekit.envs.library import program as library_program
from spadekit.envs.program import EnvProgram
from spadekit.runs.store import RunStore
from spadekit.selfplay.memory import EnvironmentMemory, containment, fingerprint, jaccard

ATTACK = Path(__file__).resolve().parents[1] / "data" / "reward_attacks" / "blacklist_padding.py"


def attack():
    spec = importlib.util.spec_from_file_location("blacklist_padding", ATTACK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def memory(tmp_path):
    store = RunStore(tmp_path / "run", create=True)
    yield EnvironmentMemory(store)
    store.close()


def blacklist(memory, program: EnvProgram) -> None:
    memory.store.add_environment(program, step=0)
    memory.store.blacklist(program.sha256, "garbage_wins", 1)


def test_containment_by_hand():
    a, b = frozenset({1, 2, 3, 4}), frozenset({1, 2})
    assert containment(a, b) == 1.0 and containment(b, a) == 0.5
    assert jaccard(a, b) == 0.5 and containment(frozenset(), frozenset()) == 1.0


def test_padded_copy_of_a_blacklisted_program_is_refused(memory):
    mod = attack()
    retired = EnvProgram(code=mod.RETIRED)
    blacklist(memory, retired)
    padded = EnvProgram(code=mod.RETIRED + mod.PADDING)
    assert jaccard(fingerprint(padded.code), fingerprint(retired.code)) < 0.9  # the attack
    assert memory.blacklist_reason(padded) == "garbage_wins"
    twice = EnvProgram(code=mod.RETIRED + mod.PADDING + mod.PADDING.replace("_unused", "_more"))
    assert memory.blacklist_reason(twice) == "garbage_wins"
    one_token = EnvProgram(code=mod.RETIRED.replace("len(RECENT) == 6",
                                                    "len(RECENT) == 6 and True"))
    assert memory.blacklist_reason(one_token) == "garbage_wins"
    assert memory.blacklist_reason(retired) == "garbage_wins"


def test_the_attack_script_reports_it_stopped():
    assert attack().main() == 1  # 0 while the padded copy got through


def test_unrelated_programs_are_not_refused(memory):
    programs = [library_program(entry) for entry in list_library()]
    assert len(programs) >= 5
    for old, new in itertools.permutations(programs[:8], 2):
        assert containment(fingerprint(new.code), fingerprint(old.code)) < 0.9
    blacklist(memory, programs[0])
    assert all(memory.blacklist_reason(p) is None for p in programs[1:])
