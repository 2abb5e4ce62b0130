"""Issue 15: a SPADE reference run's stored state (memory file, games directory) becomes a
spadekit pool, seeds a run's memory with lineage, and a plain directory of programs is an
environment source everywhere sources are taken."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TIERS

from spadekit.envs.refimport import import_reference, programs_from_dir
from spadekit.runs.sources import load_programs
from spadekit.common.errors import ConfigError

REFSTYLE = Path(__file__).parents[1] / "data" / "refstyle"
MATH = "game_00000_000_mathematical_reasoning.py"
RETRIEVAL = "game_00000_002_data_retrieval.py"
OPTIMIZATION = "game_00000_001_optimization.py"


def reference_state(tmp: Path) -> tuple[Path, Path]:
    """A reference run as it is left on disk: games/ holds two game files (one of them named
    by a memory record whose game_file path points elsewhere), the memory's second record's
    file was cleaned up but its snippet is whole, the third's snippet was cut."""
    games = tmp / "spade_games"
    games.mkdir()
    for name in (MATH, RETRIEVAL):
        (games / name).write_text((REFSTYLE / name).read_text())
    records = [
        {"game_file": f"/old/cache/{MATH}", "skill": "Mathematical Reasoning",
         "code_snippet": (REFSTYLE / MATH).read_text()[:2000], "actor_win_rate": 0.5,
         "regret": 0.3, "rollout_id": 4, "metadata": {}},
        {"game_file": "/old/cache/game_00003_001_optimization.py", "skill": "Optimization",
         "code_snippet": (REFSTYLE / OPTIMIZATION).read_text(), "actor_win_rate": 0.25,
         "regret": 0.125, "rollout_id": 3, "metadata": {}},
        {"game_file": "/old/cache/game_00003_002_optimization.py", "skill": "Optimization",
         "code_snippet": "class CutEnv:\n    def reset(self, seed=None):\n        return ('a",
         "actor_win_rate": 0.95, "regret": 0.0, "rollout_id": 3, "metadata": {}},
    ]
    memory = tmp / "env_memory.json"
    memory.write_text(json.dumps(records, indent=2))
    return memory, games


def test_import_reference_reads_code_from_files_or_whole_snippets_with_lineage(tmp_path):
    memory, games = reference_state(tmp_path)
    programs, summary = import_reference(memory, games)
    assert (summary["memory_records"], summary["game_files"], summary["imported"]) == (3, 2, 3)
    assert [s["what"] for s in summary["skipped"]] == [
        "memory record 2 (/old/cache/game_00003_002_optimization.py)"]
    by_class = {p.code.split("class ")[1].split("(")[0].split(":")[0]: p for p in programs}
    math = by_class["MatrixTraceRatioEnv"]
    assert math.skill == "Mathematical_Reasoning" and math.source == "spade-reference"
    assert math.meta["lineage"]["read_from"] == str(games / MATH)  # the file, not the snippet
    assert math.meta["lineage"]["memory_index"] == 0 and math.meta["lineage"]["rollout_id"] == 4
    assert dict(math.meta["reference_stats"]) == {"win_rate": 0.5, "regret": 0.3}
    packing = by_class["ConveyorPackingEnv"]
    assert packing.meta["lineage"]["read_from"] == "code_snippet"
    lookup = by_class["WarehouseLookupEnv"]  # only in the games directory
    assert lookup.skill == "Data_Retrieval" and "reference_stats" not in lookup.meta
    with pytest.raises(ConfigError, match="not valid JSON"):
        (tmp_path / "bad.json").write_text("{")
        import_reference(tmp_path / "bad.json")


def test_import_reference_command_writes_a_pool_that_seeds_memory(tmp_path):
    if not TIERS:
        pytest.skip("no safe sandbox tier works on this machine")
    from typer.testing import CliRunner

    from spadekit.cli.app import app
    from spadekit.selfplay.memory import EnvironmentMemory
    from spadekit.runs.store import RunStore

    memory, games = reference_state(tmp_path)
    out = tmp_path / "pool"
    args = ["import-reference", "--memory", str(memory), "--games", str(games), "--out",
            str(out), "--json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    summary = json.loads(first.output)
    assert (summary["written"], summary["rejected"], summary["duplicate"]) == (3, 0, 0)
    again = json.loads(CliRunner().invoke(app, args).output)
    assert (again["written"], again["duplicate"]) == (0, 3)
    pool = load_programs(out)
    assert len(pool) == 3 and len(list((out / "programs").glob("*.py"))) == 3
    assert {p.domain for p in pool} == {"games", "tooluse"}
    assert all(p.meta["validation"]["ok"] for p in pool)
    assert {p.meta["lineage"]["origin"] for p in pool} == {"spade-reference"}
    with RunStore(tmp_path / "run", create=True) as store:
        mem = EnvironmentMemory(store)
        assert mem.seed_from_source(str(out), "games") == 2
        assert mem.seed_from_source(str(out), "games") == 0
        rates = sorted((r.win_rate, r.regret) for r in mem.records())
        assert rates == [(0.25, 0.125), (0.5, 0.3)]
        event = store.events("memory_seeded")[0]["data"]
        assert event["source"] == str(out) and event["added"] == 2
        assert {e["lineage"]["memory_file"] for e in event["programs"]} == {str(memory)}


def test_a_plain_directory_is_an_environment_source(tmp_path):
    programs = load_programs(REFSTYLE)
    assert len(programs) == len(list(REFSTYLE.glob("*.py")))
    assert [p.skill for p in programs] == ["Mathematical_Reasoning", "Optimization",
                                           "Data_Retrieval", "State_Modification",
                                           "Tool_Selection"]
    assert programs[0].meta["lineage"]["file"] == str(REFSTYLE / MATH)
    (tmp_path / "notes.py").write_text("x = 1\n")  # no Env class: not an environment
    (tmp_path / "broken.py").write_text("class BrokenEnv(:\n")
    with pytest.raises(ConfigError, match="holds no environment programs"):
        load_programs(tmp_path)
    (tmp_path / "b.py").write_text((REFSTYLE / MATH).read_text())
    (tmp_path / "a.py").write_text((REFSTYLE / MATH).read_text())  # the same program twice
    assert len(programs_from_dir(tmp_path)) == 1
    from spadekit.eval.envs import EnvPoolSuite

    assert len(EnvPoolSuite(str(REFSTYLE)).programs) == len(programs)
