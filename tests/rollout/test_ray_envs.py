"""Environments and validation on Ray actors (``spadekit.rollout.ray_envs``) equal the local
sandbox pool: same trajectories, same typed failures, same validation reports; a killed actor
fails only its own episodes and is replaced. The tests on Ray are marked ``extra("ray")``:
skipped, naming the extra and its install command, where Ray is not installed."""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import pytest

from conftest import ECHO, TEST_CONFIG, TIERS
from spadekit.envs import library
from spadekit.envs.program import EnvProgram
from spadekit.common.errors import (ConfigError, EnvRaised, InsecureSandboxError, InvalidResult,
                             ProgramLoadError, ProtocolViolation, ResourceLimit, SandboxClosed,
                             SandboxTimeout, WorkerDied)
from spadekit.rollout.ray_envs import (RayEnvBackend, RayValidator, error_from_wire,
                                            error_to_wire, make_env_backend)
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.policy.tiny import tiny_tokenizer
from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from spadekit.sandbox import SandboxConfig, SandboxPool
from spadekit.sandbox.validate import Validator

SRC = str(Path(__file__).resolve().parents[2] / "src")
TOK = tiny_tokenizer()
CONFIG = SandboxConfig(tier=TIERS[0] if TIERS else "auto", **TEST_CONFIG)
ANSWERS = ["\\boxed{1}", "\\boxed{guess 500}", "\\boxed{up}", "\\boxed{inspect 1}", "hello",
           '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "<answer>done</answer>"]


def lib(name: str) -> EnvProgram:
    return library.program(library.get(name))


LIBRARY = [lib(e.name) for e in library.list_library()]


@pytest.fixture(scope="module")
def ray_mod():
    """Ray, started for the module (a test that takes it, or ``backend``, is marked
    ``extra("ray")``: skipped, naming the extra, where Ray is not installed)."""
    import ray

    if not TIERS:
        pytest.skip("no safe sandbox tier works on this machine")
    # the workers import this checkout's spadekit, as the tests do (conftest.py), also where
    # spadekit is not installed (without it every actor died at creation)
    path = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def backend(ray_mod):
    b = RayEnvBackend(2, CONFIG, warm=1)
    yield b
    b.close()


@pytest.fixture(scope="module")
def local():
    with SandboxPool(CONFIG, warm=2) as p:
        yield p


def scripted() -> ScriptedPolicy:
    """Answers picked by a hash of the conversation so far: deterministic, order-free."""
    return ScriptedPolicy(TOK, lambda ids, _t: ANSWERS[hash(tuple(ids)) % len(ANSWERS)],
                          decode_prompt=False)


def view(trajs) -> list[tuple]:
    return [(t.token_ids, t.loss_mask, t.logprobs, t.messages, t.episode_return, t.stop_reason,
             t.terminated, t.truncated, t.failure and (t.failure["type"], t.failure["reason"]))
            for t in trajs]


@pytest.mark.extra("ray")
def test_typed_errors_cross_ray_intact(ray_mod):
    errors = [EnvRaised("boom", exc_type="KeyError", traceback="tb", op="step"),
              SandboxTimeout("slow", op="step", seconds=2.0),
              WorkerDied("gone", returncode=-9, signal="SIGKILL", stderr_tail="x", op="reset"),
              ProgramLoadError("bad", reason="syntax", line=3),
              InvalidResult("nan", reason="reward_not_finite", op="step"),
              ResourceLimit("mem", kind="memory", op="step"), ProtocolViolation("junk", op="step"),
              SandboxClosed("closed", cause="timeout"), InsecureSandboxError("weak", attempts=[])]
    echo = ray_mod.remote(lambda wires: wires)
    back = ray_mod.get(echo.remote([error_to_wire(e) for e in errors]))
    for before, wire in zip(errors, back):
        after = error_from_wire(wire)
        assert type(after) is type(before) and after.to_dict() == before.to_dict()
        assert str(after) == str(before) and after.reason == before.reason
        for attr in ("exc_type", "op", "seconds", "returncode", "signal", "kind"):
            assert getattr(after, attr, None) == getattr(before, attr, None)


@pytest.mark.extra("ray")
def test_same_trajectories_as_local_with_the_tiny_model(backend, local):
    tiny = load_policy("tiny")
    cfg = RolloutConfig(max_turns=3, max_new_tokens=16, seed=5, temperature=0.9)
    specs = lambda: [EpisodeSpec(p, seed=s, hint=p.hint if s else None)  # noqa: E731
                     for p in LIBRARY[::3] for s in (0, 1)]
    on_ray = RolloutEngine(tiny, backend, cfg).run(specs())
    here = RolloutEngine(tiny, local, cfg).run(specs())
    assert all(t.failure is None for t in on_ray), [t.failure for t in on_ray]
    assert view(on_ray) == view(here)


@pytest.mark.extra("ray")
def test_same_trajectories_as_local_with_a_scripted_policy(backend, local):
    cfg = RolloutConfig(max_turns=6, max_context_tokens=32768)
    specs = lambda: [EpisodeSpec(p, seed=s) for p in LIBRARY for s in (3, 4, 5)]  # noqa: E731
    on_ray = RolloutEngine(scripted(), backend, cfg).run(specs())
    here = RolloutEngine(scripted(), local, cfg).run(specs())
    assert view(on_ray) == view(here)
    assert {t.stop_reason for t in on_ray} <= {"terminated", "truncated", "max_turns"}
    assert any(t.tools for t in on_ray) and any(t.turns for t in on_ray)


@pytest.mark.extra("ray")
def test_hostile_programs_fail_alike_and_alone(backend, local):
    hostile = {
        "hang": ECHO.replace("self.t += 1", "while True: pass"),
        "memory": ECHO.replace("self.t += 1", "self.x = bytearray(8 << 30)"),
        "raises": ECHO.replace("self.t += 1", "raise KeyError('nope')"),
        "crash": ECHO.replace("self.t += 1", "import os; os._exit(3)"),
        "no_load": "class BrokenEnv(:\n    pass\n",
    }
    cfg = RolloutConfig(max_turns=3)
    specs = lambda: [EpisodeSpec(EnvProgram(code=c), seed=0, tag={"k": k})  # noqa: E731
                     for k, c in hostile.items()] + [EpisodeSpec(p, seed=1) for p in LIBRARY[:4]]
    on_ray = RolloutEngine(scripted(), backend, cfg).run(specs())
    here = RolloutEngine(scripted(), local, cfg).run(specs())
    assert view(on_ray) == view(here)
    got = {t.spec.tag["k"]: t.failure["reason"] for t in on_ray[:len(hostile)]}
    assert got["hang"] == "timeout" and got["raises"] == "env_raised"
    assert got["crash"] == "worker_died" and got["no_load"] == "syntax"
    assert got["memory"] in ("resource_limit", "worker_died")
    for tr in on_ray[len(hostile):]:
        assert tr.failure is None and tr.turns


def kill_and_wait(ray, actor, within_s: float = 60.0) -> None:
    """Kills ``actor`` and returns once it is dead. ``ray.kill`` only asks for the kill: the actor
    may still answer a call or two, which would make the turn it dies on a matter of timing."""
    ray.kill(actor, no_restart=True)
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            ray.get(actor.ping.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"the actor still answers {within_s:.0f} s after ray.kill")


class KillingPolicy(ScriptedPolicy):
    """Kills the Ray actor in slot 0 during its second generate call, before it returns."""

    def __init__(self, ray, backend) -> None:
        super().__init__(TOK, lambda _i, _t: "\\boxed{1}", decode_prompt=False)
        self.ray, self.backend, self.n = ray, backend, 0

    def generate(self, requests):
        self.n += 1
        if self.n == 2:
            kill_and_wait(self.ray, self.backend.actors()[0])
        return super().generate(requests)


@pytest.mark.extra("ray")
def test_killed_actor_fails_its_episodes_typed_and_is_replaced(ray_mod, backend):
    cfg = RolloutConfig(max_turns=4)
    specs = lambda: [EpisodeSpec(p, seed=s) for p in LIBRARY[:6] for s in (0, 1)]  # noqa: E731
    items = [(s.program.sha256, s.program.code, 4, s.seed) for s in specs()]
    on_zero = [slot == 0 for slot in backend.assign(items)]
    replaced = backend.replaced
    trajs = RolloutEngine(KillingPolicy(ray_mod, backend), backend, cfg).run(specs())
    assert any(on_zero) and not all(on_zero)
    for tr, zero in zip(trajs, on_zero):
        if zero:
            assert tr.stop_reason == "env_error" and tr.failure["type"] == "WorkerDied", tr.failure
            assert len(tr.turns) == 1
        else:
            assert tr.failure is None and tr.stop_reason in ("terminated", "truncated")
    assert backend.replaced == replaced + 1
    again = RolloutEngine(scripted(), backend, cfg).run(specs())
    assert all(t.failure is None for t in again), [t.failure for t in again]


@pytest.mark.extra("ray")
def test_validation_fan_out_matches_local_validation(backend, local):
    broken = ["class BrokenEnv(:\n    pass\n", "x = 1\n",
              ECHO.replace("self.t = 0", "while True: pass"),
              ECHO.replace("return \"echo:\" + action, 0.5", "return \"echo:\" + action, 7.0"),
              "no code here at all", EnvProgram(code=LIBRARY[0].code)]  # (ECHO: no solution)
    sources = LIBRARY + broken
    seeds = list(range(100, 100 + len(sources)))  # the same draws on both sides
    remote = RayValidator(backend).validate_many(sources, workers=2, seeds=seeds)
    with Validator(local) as validator:
        here = validator.validate_many(sources, workers=2, seeds=seeds)

    def key(r):
        details = {k: v for k, v in r.details.items()
                   if k not in ("timings_ms", "output_tail", "step_ms")}
        return (r.ok, r.stage, r.reason, r.message, details,
                r.program and r.program.sha256)

    assert [key(r) for r in remote] == [key(r) for r in here]
    assert all(r.ok for r in remote[:len(LIBRARY)])
    assert not any(r.ok for r in remote[len(LIBRARY):-1]) and remote[-1].ok


@pytest.mark.extra("ray")
def test_node_without_a_safe_tier_reports_it_typed(ray_mod):
    with RayEnvBackend(1, SandboxConfig(tier="weak", **TEST_CONFIG), warm=0) as weak:
        trajs = RolloutEngine(scripted(), weak, RolloutConfig(max_turns=2)).run(
            [EpisodeSpec(LIBRARY[0], seed=0), EpisodeSpec(LIBRARY[1], seed=0)])
        assert [t.failure["type"] for t in trajs] == ["InsecureSandboxError"] * 2
        report = RayValidator(weak).validate(LIBRARY[0])
        assert (report.ok, report.stage, report.reason) == (False, "load", "insecure_sandbox")
        assert weak.workers_info()[0]["error"]["__spadekit_error__"] == "InsecureSandboxError"


def test_missing_ray_and_unknown_kind_are_config_errors(monkeypatch):
    with pytest.raises(ConfigError, match="local or ray"):
        make_env_backend("dask")
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r'pip install "spadekit\[ray\]"'):
        RayEnvBackend(1)


def test_local_kind_wraps_a_pool(local):
    backend = make_env_backend("local", pool=local)
    tr = RolloutEngine(scripted(), backend, RolloutConfig(max_turns=2)).run(
        [EpisodeSpec(LIBRARY[random.Random(0).randrange(len(LIBRARY))], seed=0)])[0]
    assert tr.failure is None and backend.pool is local


@pytest.mark.extra("ray")
def test_selfplay_round_with_ray_env_workers(ray_mod, tmp_path):
    """The whole loop with `--set distributed.env_backend=ray`: design, Ray validation, hints,
    plays on Ray actors, update, commit."""
    from spadekit.policy.registry import load_policy
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.loop import SelfPlay
    from test_selfplay import WORDS, config, designer_responder

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    cfg = config(tmp_path, rounds=1, **{"distributed.env_backend": "ray",
                                        "distributed.env_workers": 2, "tensorboard": "false"})
    with SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=designer) as sp:
        assert type(sp.env_backend).__name__ == "RayEnvBackend"
        (m0,) = sp.run()
        assert m0["valid"] == 2 and m0["agent_episodes"] == 8 and m0["agent_failures"] == 0
        assert sp.store.latest_complete_step() == 0


STEP_TIMES = '''
import time


class TimedEnv:
    def reset(self, seed=None, options=None):
        self.pause = 0.02 + 0.04 * (seed or 0)
        return "ready", {}

    def step(self, action):
        time.sleep(self.pause)
        return "ok", 0.0, False, False, {}
'''


@pytest.mark.extra("ray")
def test_step_times_and_worker_turn_totals_come_back_per_episode(backend):
    # issue 22: the watch saw batch-averaged step times under Ray; now each episode's own,
    # and its sandbox worker's total for the turn, as with the local pool
    with backend.session() as session:
        started = session.start([("t", STEP_TIMES, 12, seed) for seed in (0, 1, 2)])
        session.step([(s[0], "x") for s in started])
        own, turn = session.step_seconds, session.turn_seconds
    assert len(own) == 3 and len(turn) == 3
    assert own[0] < own[1] < own[2] and own[2] >= 0.1  # 0.02, 0.06, 0.10 s: not averaged
    by_slot: dict[int, list[int]] = {}
    for i, s in enumerate(started):
        by_slot.setdefault(s[0].slot, []).append(i)
    for idx in by_slot.values():  # one sandbox per program per actor: its episodes' sum
        assert all(turn[i] == pytest.approx(sum(own[j] for j in idx)) for i in idx)
