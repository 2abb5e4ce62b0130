"""``spadekit.sandbox.gym_adapter``: environment programs as ``gymnasium.Env``, on the real sandbox.

Every test that needs a worker runs once per isolation tier that boots here (the ``pool`` fixture).
"""

from __future__ import annotations

import warnings

import gymnasium
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env

from conftest import ECHO, TIERS
from spadekit.sandbox.gym_adapter import CHARSET, SandboxedTextEnv, fit_to_charset, make
from spadekit.envs.program import EnvProgram
from spadekit.common.errors import (ConfigError, EnvRaised, InvalidResult, ProgramLoadError,
                             SandboxClosed, SandboxError, WorkerDied)

try:
    from spadekit.envs import library
except ImportError:  # the library is written elsewhere; its tests skip until it exists
    library = None

LIBRARY_NAMES = [env.name for env in library.list_library()] if library else ["<no library>"]

DICE = '''
import random
class DiceEnv:
    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        return "secret %d" % self.rng.randint(0, 10**9), {"options": options}
    def step(self, action):
        return "roll %d" % self.rng.randint(0, 10**9), 0.0, False, False, {"action": action}
'''

NEVER_ENDS = '''
class NeverEnv:
    def __init__(self, max_turns=2):
        self.max_turns = max_turns
    def reset(self, seed=None, options=None):
        return "start", {}
    def step(self, action):
        return "again", 0.0, False, False, {}
'''

RAISES = '''
class BrokenEnv:
    def reset(self, seed=None, options=None):
        return "ready", {}
    def step(self, action):
        if action == "crash":
            raise KeyError("no such move")
        return "ok", 1.0, False, False, {}
'''

EXITS = '''
import os
class ExitEnv:
    def reset(self, seed=None, options=None):
        return "ready", {}
    def step(self, action):
        os._exit(3)
'''

UNICODE = '''
class FancyEnv:
    def reset(self, seed=None, options=None):
        return "caf\\u00e9 \\u2192 \\u201cgo\\u201d\\u2026 \\u2603 \\u00d7 2", {}
    def step(self, action):
        return "plain", 1.0, True, False, {}
'''


# -- the Gymnasium checker ----------------------------------------------------------------------


def test_check_env_echo(pool):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium's checker warns through `warnings`
        with SandboxedTextEnv(ECHO, pool=pool) as env:
            check_env(env, skip_render_check=True)


@pytest.mark.parametrize("name", LIBRARY_NAMES)
def test_check_env_library(pool, name):
    if library is None:
        pytest.skip("spadekit.envs.library is not there yet")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with SandboxedTextEnv(library.source(name), pool=pool) as env:
            check_env(env, skip_render_check=True)
            # the solution's trajectory stays inside the observation space, unchanged (ASCII)
            obs, info = env.reset(seed=3)
            assert obs in env.observation_space and "raw_observation" not in info
            done = False
            for action in env.solution():
                assert not done
                obs, reward, terminated, truncated, info = env.step(action)
                assert obs in env.observation_space and "raw_observation" not in info
                done = terminated or truncated
            assert terminated and reward == 1.0


# -- seeding, hint, turn limit ------------------------------------------------------------------


def test_seeding_determinism(pool):
    with SandboxedTextEnv(DICE, pool=pool) as env, SandboxedTextEnv(DICE, pool=pool) as twin:
        first = env.reset(seed=7)[0]
        drawn = env.reset()[0]
        drawn_seed = env.last_seed
        assert env.reset(seed=7)[0] == first
        assert env.reset()[0] == drawn and env.last_seed == drawn_seed
        assert drawn != first and env.reset(seed=8)[0] != first

        assert twin.reset(seed=7)[0] == env.reset(seed=7)[0]
        assert [twin.step("a")[0] for _ in range(3)] == [env.step("a")[0] for _ in range(3)]
        assert env.reset(seed=5, options={"k": 1})[1] == {"options": {"k": 1}}


def test_hint_only_on_first_observation(pool):
    with SandboxedTextEnv(ECHO, pool=pool, hint="try saying hi") as env:
        for seed in (1, 2):
            obs, _ = env.reset(seed=seed)
            assert obs == "echo ready\n\nHINT: try saying hi"
            assert obs in env.observation_space
            assert env.step("hi")[0] == "echo:hi"
            assert "HINT" not in env.step("again")[0]
    with SandboxedTextEnv(EnvProgram(ECHO, hint="ignored unless passed"), pool=pool) as env:
        assert env.reset(seed=0)[0] == "echo ready"


def test_runner_truncates_at_max_turns(pool):
    with SandboxedTextEnv(DICE, pool=pool, max_turns=3) as env:
        assert env.max_turns == 3
        env.reset(seed=0)
        assert [env.step("x")[3] for _ in range(2)] == [False, False]
        obs, reward, terminated, truncated, info = env.step("x")
        assert (terminated, truncated, info.get("turn_limit")) == (False, True, True)
        with pytest.raises(ResetNeeded):
            env.step("x")
        env.reset()
        assert env.turn == 0 and env.step("x")[3] is False
    # without max_turns=, the program's own max_turns attribute is the limit
    with SandboxedTextEnv(NEVER_ENDS, pool=pool) as env:
        assert env.max_turns == 2
        env.reset()
        assert [env.step("x")[3] for _ in range(2)] == [False, True]


# -- failures -----------------------------------------------------------------------------------


def test_typed_error_from_step(pool):
    with SandboxedTextEnv(RAISES, pool=pool) as env:
        env.reset(seed=0)
        assert env.step("fine")[:2] == ("ok", 1.0)
        with pytest.raises(EnvRaised) as caught:
            env.step("crash")
        assert caught.value.exc_type == "KeyError" and "no such move" in caught.value.message
        with pytest.raises(ResetNeeded):  # the episode ended with the error
            env.step("fine")
        assert env.sandbox.alive
        env.reset(seed=1)
        assert env.step("fine")[0] == "ok"
        with pytest.raises(TypeError):
            env.step(42)


def test_on_error_truncate_returns_error_info(pool):
    with SandboxedTextEnv(RAISES, pool=pool, on_error="truncate") as env:
        obs0, _ = env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("crash")
        assert (obs, reward, terminated, truncated) == (obs0, 0.0, False, True)
        assert info["error"]["type"] == "EnvRaised" and info["error"]["reason"] == "env_raised"
        with pytest.raises(ResetNeeded):
            env.step("fine")


def test_dead_worker_is_typed_and_final(pool):
    with SandboxedTextEnv(EXITS, pool=pool) as env:
        env.reset(seed=0)
        with pytest.raises(WorkerDied):
            env.step("anything")
        assert not env.sandbox.alive
        with pytest.raises(SandboxClosed):
            env.reset(seed=0)


def test_load_and_construct_failures_release_the_worker(pool):
    with pytest.raises(ProgramLoadError):
        SandboxedTextEnv("class Broken(:\n", pool=pool)
    bad_ctor = "class BadCtorEnv:\n    def __init__(self, **kw):\n        raise ValueError('no')\n"
    with pytest.raises(ProgramLoadError) as caught:
        SandboxedTextEnv(bad_ctor, pool=pool)
    assert caught.value.reason == "construct_failed"
    assert not [sb for sb in pool.sandboxes()
                if (sb.program or {}).get("class_name") == "BadCtorEnv"]


def test_observation_longer_than_max_length(pool):
    with SandboxedTextEnv(ECHO, pool=pool, max_length=8) as env:
        with pytest.raises(InvalidResult) as caught:
            env.reset(seed=0)
        assert caught.value.reason == "observation_too_large"


def test_bad_arguments():
    with pytest.raises(ConfigError):
        SandboxedTextEnv("", pool=None)
    for kwargs in ({"render_mode": "human"}, {"max_turns": 0}, {"max_length": 0},
                   {"on_error": "ignore"}, {"hint": 3}):
        with pytest.raises(ConfigError):
            SandboxedTextEnv(ECHO, **kwargs)


# -- spaces and rendering -----------------------------------------------------------------------


def test_spaces_contain_observations(pool):
    with SandboxedTextEnv(ECHO, pool=pool, max_length=200) as env:
        for space in (env.observation_space, env.action_space):
            assert isinstance(space, gymnasium.spaces.Text)
            assert space.min_length == 0 and space.character_set == frozenset(CHARSET)
        obs, _ = env.reset(seed=0)
        assert obs in env.observation_space
        env.action_space.seed(0)
        for _ in range(5):
            action = env.action_space.sample()
            obs = env.step(action)[0]
            assert obs == "echo:" + action and obs in env.observation_space
        assert env.step("")[0] in env.observation_space


def test_non_ascii_observation_is_fitted(pool):
    with SandboxedTextEnv(UNICODE, pool=pool) as env:
        obs, info = env.reset(seed=0)
        assert obs == 'cafe -> "go"... ? x 2'
        assert obs in env.observation_space
        assert info["raw_observation"] == "caf\u00e9 \u2192 \u201cgo\u201d\u2026 \u2603 \u00d7 2"
        assert "raw_observation" not in env.step("x")[4]


def test_fit_to_charset():
    text = "plain ASCII\twith\nwhitespace {}\\"
    assert fit_to_charset(text) is text
    assert fit_to_charset("na\u00efve \u2014 \u00bd\u00a0\u2013 \u4e2d") == "naive -- 1/2 - ?"
    assert fit_to_charset("\u00e9!", charset="abcdef") == "e"


def test_render_ansi(pool):
    with SandboxedTextEnv(ECHO, pool=pool, render_mode="ansi", hint="h") as env:
        assert env.render() == ""
        obs, _ = env.reset(seed=0)
        assert env.render() == obs
        env.step("yo")
        assert env.render() == "echo:yo"
    with SandboxedTextEnv(ECHO, pool=pool) as env:
        env.reset(seed=0)
        assert env.render() is None


# -- lifetime -----------------------------------------------------------------------------------


def test_close_releases_the_sandbox(pool):
    env = SandboxedTextEnv(ECHO, pool=pool)
    sb = env.sandbox
    env.reset(seed=0)
    assert sb.alive and not sb.worker.closed
    env.close()
    assert sb.worker.closed and not sb.alive
    assert sb.worker.proc.poll() is not None  # the worker process is gone
    assert sb not in pool.sandboxes()
    env.close()  # idempotent
    with pytest.raises(SandboxClosed):
        env.reset(seed=0)
    with pytest.raises(SandboxClosed):
        env.step("hi")


@pytest.mark.skipif(not TIERS, reason="no safe sandbox tier works on this machine")
def test_owned_pool_is_closed_with_the_env():
    env = make(ECHO, max_turns=2)
    own_pool, sb = env.pool, env.sandbox
    assert env.reset(seed=4) == ("echo ready", {"seed": 4})
    env.close()
    assert sb.worker.closed and not sb.alive
    assert own_pool.sandboxes() == []
    with pytest.raises(SandboxError):
        own_pool.spare(timeout=1)


def test_nothing_registered_and_manual_registration(pool):
    assert not [key for key in gymnasium.registry if "spadekit" in key.lower()]
    env_id = "spadekit-test/Echo-v0"
    gymnasium.register(id=env_id, entry_point="spadekit.sandbox.gym_adapter:make",
                       kwargs={"program": ECHO})
    try:
        env = gymnasium.make(env_id, pool=pool, max_turns=2)
        try:
            assert isinstance(env.unwrapped, SandboxedTextEnv)
            assert env.reset(seed=1)[0] == "echo ready"
            assert env.step("a")[3] is False and env.step("b")[3] is True
        finally:
            env.close()
        assert env.unwrapped.sandbox.worker.closed
    finally:
        gymnasium.registry.pop(env_id, None)
