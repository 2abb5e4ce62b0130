"""The run's closing lines name the designed games it pooled (issue 39): from a real run
database, each designed environment since the run's first round with its composition, the
mean return of its plays without and with the hint, and the memory's regret and designer
reward; library or procedural programs and earlier rounds' designs are not named."""

from __future__ import annotations

from spadekit.envs.procedural import Combo, compose_kit
from spadekit.envs.program import EnvProgram
from spadekit.runs.store import RunStore
from spadekit.selfplay.memory import EnvironmentMemory
from spadekit.selfplay.round_report import designed_games, designed_games_line

WORDS = ["harbor", "lantern", "meadow", "copper", "thistle", "willow", "garnet", "pebble"]


def _designed(combo: str, seed: int, step: int) -> EnvProgram:
    p = compose_kit(Combo.parse(combo), WORDS, seed, 3)
    return EnvProgram(code=p.code, hint=p.hint, skill=p.skill, domain="games",
                      source=f"designer:step-{step}", class_name=p.class_name)


def test_designed_games_are_read_back_as_computed_by_hand(tmp_path):
    store = RunStore(tmp_path / "run", create=True)
    try:
        memory = EnvironmentMemory(store)
        old = _designed("cell+probe+steep+open", 1, 0)
        new = _designed("number+clue+banded+budget", 2, 1)
        lib = EnvProgram(code="class LibEnv:\n    pass\n", skill="Optimization",
                         domain="games", source="library:x", class_name="LibEnv")
        for program, step in ((old, 0), (new, 1), (lib, 1)):
            store.add_environment(program, step=step)
            memory.add(program, step=step)
        for ret, hint in ((0.0, False), (0.5, False), (1.0, True), (0.4, True)):
            store.record_play(new.sha256, 1, with_hint=hint, episode_return=ret)
        store.record_play(new.sha256, 1, with_hint=False, episode_return=0.0, failure="crash")
        memory.update_stats(new.sha256, regret=0.45, designer_reward=0.3, step=1)
        games = designed_games(store, since_step=1)
        assert [g["sha256"] for g in games] == [new.sha256]
        g = games[0]
        assert g["composition"] == "number+clue+banded+budget"
        assert (g["plays"], g["plays_with_hint"]) == (2, 2)
        assert g["return"] == 0.25 and abs(g["return_with_hint"] - 0.7) < 1e-12
        assert (g["regret"], g["designer_reward"]) == (0.45, 0.3)
        line = designed_games_line(games)
        assert line == (f"designed games pooled: 1: {new.class_name} (number+clue+banded+budget;"
                        " return 0.25 -> 0.70 with hint, regret 0.45, designer reward 0.30)")
        both = designed_games(store, since_step=0)
        assert len(both) == 2 and both[0]["regret"] is None
        assert "return - -> - with hint" in designed_games_line(both)
        assert designed_games_line([]) == "designed games pooled: none"
    finally:
        store.close()
