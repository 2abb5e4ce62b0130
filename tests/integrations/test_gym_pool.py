"""A pool registered with Gymnasium (``spadekit.integrations.gym_pool``): ids, Gymnasium's own
``check_env`` on every registered environment, the program running in the sandbox with its hint
withheld, and id conflicts refused."""

from __future__ import annotations

import os

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

from spadekit.cli.app import app
from spadekit.common.errors import ConfigError
from spadekit.envs.program import EnvProgram
from spadekit.integrations.gym_pool import check_registered, register_pool
from spadekit.runs.pool import write_pool
from spadekit.runs.release import gym_id
from spadekit.runs.sources import load_programs

PID_GAME = '''
import os


class PidEnv:
    """Say which process runs this program."""

    def reset(self, seed=None, options=None):
        return f"pid {os.getpid()} cwd-entries {len(os.listdir('.'))}", {}

    def step(self, action):
        return "done", 1.0 if "pid" in action else 0.0, True, False, {}

    def solution(self):
        return ["\\\\boxed{pid}"]
'''


@pytest.mark.parametrize("source", ["library:games", "library:tooluse"])
def test_every_registered_environment_passes_gymnasiums_check_env(source):
    ids = register_pool(source, name=f"lib-{source.split(':')[1]}")
    programs = load_programs(source)
    assert ids == [gym_id(f"lib-{source.split(':')[1]}", p.short_id) for p in programs]
    assert all(i in gymnasium.registry for i in ids)
    assert check_registered(ids) == {}
    env = gymnasium.make(ids[0])
    try:
        check_env(env.unwrapped)  # and the checker called directly, not through our helper
    finally:
        env.close()


def test_a_registered_program_runs_in_the_sandbox_with_its_hint_withheld(tmp_path):
    program = EnvProgram(code=PID_GAME, hint="SECRET-HINT-42 say pid", skill="Logical_Deduction",
                         domain="games")
    write_pool(tmp_path / "pool", [(program, None)])
    [env_id] = register_pool(tmp_path / "pool", name="pid")
    assert env_id == f"spadekit/pid-{program.short_id}"
    env = gymnasium.make(env_id)
    try:
        obs, _info = env.reset(seed=0)
        assert f"pid {os.getpid()} " not in obs and obs.startswith("pid ")
        assert "SECRET-HINT" not in obs
        _obs, reward, terminated, _trunc, _info = env.step("\\boxed{pid}")
        assert (reward, terminated) == (1.0, True)
    finally:
        env.close()
    [hinted] = register_pool(tmp_path / "pool", name="pid-hinted", with_hint=True)
    env = gymnasium.make(hinted)
    try:
        assert "SECRET-HINT-42" in env.reset(seed=0)[0]
    finally:
        env.close()


def test_registering_again_keeps_the_entry_and_a_taken_id_is_refused(tmp_path):
    first = register_pool("library:games", name="again")
    assert register_pool("library:games", name="again") == first
    other = EnvProgram(code=PID_GAME, domain="games")
    spec = gymnasium.registry[first[0]]
    spec.kwargs["program"] = other  # the id now names another program
    try:
        with pytest.raises(ConfigError, match="already registered for another program"):
            register_pool("library:games", name="again")
    finally:
        del gymnasium.registry[first[0]]


def test_the_register_command_lists_and_checks_the_ids():
    res = CliRunner().invoke(app, ["pool", "register", "library:games", "--name", "cli"])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("spadekit/cli-")]
    assert len(lines) == len(load_programs("library:games"))
    assert all(line.endswith("check_env: passed") for line in lines)
    res = CliRunner().invoke(app, ["pool", "register", "/nonexistent/pool"])
    assert res.exit_code == 2 and "not an environment source" in " ".join(res.output.split())
