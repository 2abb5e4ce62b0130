"""Programs that behave only while validated are retired during training (``spadekit.selfplay.watch``):
a hang in play (issue 12 defect 5), garbage that wins, a replay that differs from admission and
steps that turn slow (issue 13). Real sandboxes, a real run database, the real tiny agent."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spadekit.common.streams import RoundStreams
from spadekit.envs.program import EnvProgram
from spadekit.common.errors import ConfigError
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.runs.store import RunStore
from spadekit.sandbox.validate import Validator, ValidatorSettings
from spadekit.selfplay.watch import (RETIRE_PENALTY, PoolWatch, ProbeResult, WatchConfig, run_probes,
                            slow_verdict, spot_check_verdicts, turn_verdict)

from knob_watch import ANYTHING_WINS  # noqa: E402  (one fixture for both)
from test_selfplay import config

# Hangs when the first step its worker serves comes after two instances were created: the shape
# of play (a session creates a program's whole group, then steps it). Validation still probes
# its first instance alone before it creates another, a tell left open after issue 22; the
# older tell (two live episodes taking turns) is found by the validator's lockstep batch now.
INTERLEAVE_HANG = r'''
import re

class TakeTurnsEnv:
    """Guess the word; partial credit for letters."""

    created = 0
    stepped = False

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = int(max_turns)
        self.t = 0
        type(self).created += 1

    def reset(self, seed=None, options=None):
        self.t = 0
        return "Reply with a word inside \\boxed{}.", {}

    def step(self, action):
        if not type(self).stepped and type(self).created >= 2:
            while True:
                pass
        type(self).stepped = True
        self.t += 1
        m = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if m and m[-1] == "WORD":
            return "Solved.", 1.0, True, False, {}
        score = round(0.5 * sum(c.isalpha() for c in action) / max(len(action), 1), 4)
        return "Scored %.2f." % score, score, False, self.t >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{WORD}"]
'''
HANGERS = [INTERLEAVE_HANG.replace("WORD", w) for w in ("solve", "train")]
COIN = r'''
import random
from pathlib import Path

class CoinEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.t = 0
        return "Guess.", {}

    def step(self, action):
        self.t += 1
        # seeded from the OS: the module random is per instance and fixed in the worker now
        return "Hm.", round(random.Random().random() * 0.9, 6), False, self.t >= self.max_turns, {}
'''
HONEST = COIN.replace("CoinEnv", "HonestEnv").replace("import random\n", "").replace(
    "round(random.Random().random() * 0.9, 6)", "0.25")
SLOW = HONEST.replace("HonestEnv", "SlowEnv").replace(
    "        self.t += 1\n", "        self.t += 1\n        time.sleep(0.2)\n").replace(
    "class SlowEnv", "import time\n\n\nclass SlowEnv")  # a wall-clock step: CPU speed aside


def test_a_program_that_hangs_only_in_play_is_punished_removed_and_never_validated_again(
        tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    calls = {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return "HINT: one short lowercase word."
        calls["n"] += 1
        return f"```python\n{HANGERS[(calls['n'] - 1) % 2]}\n```"

    designer = ScriptedPolicy(policy.tokenizer, respond)
    cfg = config(tmp_path, rounds=3, regen_interval=2, **{"watch.spot_checks": 0})
    with SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=designer) as sp:
        m0 = sp.round(0)
        store = sp.store
        # both validated (validation plays one episode at a time) and both hung in play
        assert m0["valid"] == 2 and m0["watch/play_timeout"] == 2 and m0["watch/retired"] == 2
        assert m0["watch/designer_penalised"] == 2 and m0["agent_episodes"] == 0
        for env in store.environments():
            assert env["status"] == "blacklisted"
            assert store.blacklist_reason(env["sha256"]) == "play_timeout"
            assert env["sha256"] not in sp.memory
        queued = store.query("SELECT meta FROM delay_buffer")
        assert len(queued) == 2 and all('"fixed_reward": -0.5' in r[0] for r in queued)
        assert {e["data"]["reason"] for e in store.events("env_retired")} == {"play_timeout"}
        sp.next_step = 1
        m1 = sp.round(1)  # nothing left in the pool: no play of either
        assert store.query("SELECT COUNT(*) FROM plays WHERE step = 1")[0][0] == 0
        m2 = sp.round(2)  # the designer's samples of round 0 are due: the hang penalty
        assert m2["designer_reward"] == pytest.approx(RETIRE_PENALTY)
        # round 2 designs the same programs again: read from the blacklist, not validated
        assert m2["blacklist_skipped"] == 2 and m2["invalid_reasons"] == {"blacklisted": 2}
        assert m2["valid"] == 0 and "timeout" not in m2["invalid_reasons"]
        assert store.metrics("watch/play_timeout") == [(0, 2.0), (1, 0.0), (2, 0.0)]
    assert m1["watch/retired"] == 0


def _pooled(store: RunStore, code: str, validation: object) -> str:
    """Pool ``code`` with ``validation`` (a report or its details) and a queued designer
    sample, as the design phase leaves a valid program."""
    if isinstance(validation, dict):
        validation = {"ok": True, "details": validation}
    sha = store.add_environment(EnvProgram(code=code), step=0, validation=validation)
    store.push_delayed({"token_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [0.0, -1.0],
                        "generated_step": 0, "due_step": 4, "env_sha": sha, "skill": "s",
                        "meta": {"reason": "ok"}})
    return sha


def _reference(pool, code: str, seed: int, actions: list[str], cap: int) -> dict:
    """A reference episode in the validator's format, played once (for programs the validator
    would turn away, so that the watch's own checks are what is tested)."""
    (res,) = run_probes(pool, [(EnvProgram(code=code), seed, actions)], cap)
    return {"seed": seed, "actions": res.actions, "rewards": res.rewards,
            "terminated": res.ended, "truncated": False}


def test_spot_checks_retire_garbage_wins_and_nondeterminism_and_spare_honest_programs(
        tmp_path, pool):
    streams = RoundStreams(3, 0)
    # HONEST pays 0.25 for anything and has no solution: validated as without the requirement
    honest_report = Validator(pool, ValidatorSettings(max_turns=4, require_solution=False)).validate(
        EnvProgram(code=HONEST))
    assert honest_report.ok and "reference_episode" in honest_report.details
    with RunStore(tmp_path / "run", create=True) as store:
        wins = _pooled(store, ANYTHING_WINS, {})
        coin = _pooled(store, COIN, {"reference_episode": _reference(
            pool, COIN, 11, ["a", "b", "c"], 4)})
        honest = _pooled(store, HONEST, honest_report)  # the real validator's record
        watch = PoolWatch(WatchConfig(spot_checks=2), store, {}, pool, 4, tooluse=False)
        retired, metrics = watch.after_play(0, [], streams)
        assert retired == {wins, coin}
        assert store.blacklist_reason(wins) == "garbage_wins"
        assert store.blacklist_reason(coin) == "nondeterministic_in_play"
        assert store.get_environment(honest)["status"] == "pooled"
        assert metrics["watch/spot_checked_envs"] == 3 and metrics["watch/retired"] == 2
        assert metrics["watch/garbage_wins"] == metrics["watch/nondeterministic_in_play"] == 1
        due = {d["env_sha"]: d["meta"] for d in store.pop_due(4)}
        assert due[wins]["fixed_reward"] == due[coin]["fixed_reward"] == RETIRE_PENALTY
        assert "fixed_reward" not in due[honest]
        # spot checks are not plays: nothing was recorded for training or statistics
        assert store.query("SELECT COUNT(*) FROM plays")[0][0] == 0


def test_a_program_whose_steps_turn_slow_after_validation_is_retired(tmp_path, pool):
    fast = {"step_ms": {"calls": 20, "p50": 0.5}}  # what validation measured: 0.5 ms a call
    with RunStore(tmp_path / "run", create=True) as store:
        slow = _pooled(store, SLOW, fast)
        honest = _pooled(store, HONEST, fast)
        watch = PoolWatch(WatchConfig(spot_checks=1, step_time_limit_s=30.0), store, {}, pool,
                          2, tooluse=False)
        retired, metrics = watch.after_play(0, [], RoundStreams(0, 0))
        assert retired == {slow} and metrics["watch/slow_in_play"] == 1
        event = store.events("env_retired")[0]["data"]
        assert event["reason"] == "slow_in_play" and event["details"]["mean_step_s"] > 0.05
        assert event["details"]["validation_step_s"] == pytest.approx(0.0005)
        assert store.get_environment(honest)["status"] == "pooled"


def test_probes_run_in_lockstep_with_typed_failures_and_measured_steps(pool):
    hang = HONEST.replace("HonestEnv", "HangEnv").replace("self.t += 1",
                                                          "while True:\n            pass")
    ok, hung = run_probes(pool, [(EnvProgram(code=HONEST), 5, ["a", "b", "c"]),
                                 (EnvProgram(code=hang), 5, ["a", "b"])], 2)
    assert ok.rewards == [0.25, 0.25] and ok.ends == [False, True] and ok.actions == ["a", "b"]
    assert len(ok.step_s) == 2 and all(s >= 0 for s in ok.step_s)
    assert hung.error is not None and hung.error.reason == "timeout" and hung.rewards == []
    assert spot_check_verdicts([hung], None, None)[0] == "play_timeout"


def _ret(seed: int, value: float) -> ProbeResult:
    """An episode that terminated with return ``value``."""
    return ProbeResult(seed=seed, actions=["a"], rewards=[value], ends=[True], terminated=True)


def test_verdicts_by_hand():
    admitted = {"seed": 1, "actions": ["x"], "rewards": [0.5], "terminated": True,
                "truncated": False}
    same = ProbeResult(seed=1, actions=["x"], rewards=[0.5], ends=[True], terminated=True)
    other = ProbeResult(seed=1, actions=["x"], rewards=[0.5], ends=[False])
    lucky = ProbeResult(seed=2, actions=["y"], rewards=[0.2, 1.0], ends=[False, True],
                        terminated=True)
    zero = _ret(2, 0.0)
    assert spot_check_verdicts([zero], same, admitted) == (None, {})
    assert spot_check_verdicts([zero], other, admitted)[0] == "nondeterministic_in_play"
    # no solution known: full score 1.0 is the reference; 1.0 - 1.0 < 0.5
    assert spot_check_verdicts([lucky], same, admitted)[0] == "garbage_wins"
    # 0.99 for anything: solution 1.0 on the same seed, 1.0 - 0.99 = 0.01 < 0.5
    reason, details = spot_check_verdicts([_ret(2, 0.99)], None, None, [_ret(2, 1.0)])
    assert reason == "garbage_wins" and details["garbage_mean_return"] == 0.99
    assert details["solution_mean_return"] == 1.0 and details["solution_known"]
    # the old absolute rule (a reward >= 1.0) let 0.99 through; garbage 0.5 below is fine:
    # means 0.5 and 1.0 -> 1.0 - 0.5 = 0.5, not < 0.5
    assert spot_check_verdicts([_ret(2, 0.4), _ret(3, 0.6)], None, None,
                               [_ret(2, 1.0), _ret(3, 1.0)]) == (None, {})
    assert spot_check_verdicts([_ret(2, 0.4), _ret(3, 0.62)], None, None,
                               [_ret(2, 1.0), _ret(3, 1.0)])[0] == "garbage_wins"
    # a margin of 0.3: 1.0 - 0.6 = 0.4 passes
    assert spot_check_verdicts([_ret(2, 0.6)], None, None, [_ret(2, 1.0)], margin=0.3) \
        == (None, {})
    # the solution misses full score in play: its own reason (garbage is fine: 0.9 - 0 >= 0.5)
    assert spot_check_verdicts([zero], None, None, [_ret(2, 0.9)])[0] \
        == "solution_fails_in_play"
    failed = ProbeResult(seed=2, actions=["s"], error={"reason": "env_raised"})
    assert spot_check_verdicts([zero], None, None, [failed])[0] == "solution_fails_in_play"
    hung = ProbeResult(seed=2, actions=["s"], error={"reason": "timeout", "message": "m"})
    assert spot_check_verdicts([zero], None, None, [hung])[0] == "play_timeout"
    # garbage that is not terminated earns 0 whatever it was paid on the way
    unfinished = ProbeResult(seed=2, actions=["g"], rewards=[1.0], ends=[False])
    assert unfinished.episode_return == 0.0
    assert spot_check_verdicts([unfinished], None, None, [_ret(2, 1.0)]) == (None, {})
    cfg = WatchConfig(step_time_limit_s=1.0, slow_step_factor=20.0, slow_step_min_s=0.05)
    assert slow_verdict([0.019, 0.021], 0.001, cfg) == (None, {})  # 20x, under the floor
    assert slow_verdict([0.06], 0.001, cfg)[0] == "slow_in_play"  # 60x and over 0.05 s
    assert slow_verdict([0.06], 0.01, cfg) == (None, {})  # 6x
    assert slow_verdict([0.06], None, cfg) == (None, {})  # no validation timing: limit only
    assert slow_verdict([1.5], None, cfg)[0] == "slow_in_play"
    assert slow_verdict([], 0.001, cfg) == (None, {})
    # per worker and turn: 8 plays x 0.95 s = 7.6 s a turn > 5 s; 4.9 s turns are fine
    assert turn_verdict([7.6, 7.6], WatchConfig())[0] == "slow_in_play"
    assert turn_verdict([4.9, 4.9, 5.2], WatchConfig()) == (None, {})  # mean 5.0, not over
    assert turn_verdict([], WatchConfig()) == (None, {})
    for bad in ({"spot_checks": -1}, {"slow_step_factor": 0}, {"step_time_limit_s": "1"},
                {"turn_time_limit_s": 0}, {"action_margin": 0}, {"action_margin": 1.5}):
        with pytest.raises(ConfigError):
            WatchConfig(**bad)


reward = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(reward, min_size=1, max_size=6), st.lists(reward, min_size=1, max_size=8),
       st.booleans(), st.booleans(), st.floats(min_value=0.05, max_value=1.0))
def test_verdicts_hold_for_any_episode(garbage_returns, validated_rewards, ended, replay_ended,
                                       margin):
    """Garbage retires exactly when its mean return is not ``margin`` below the solution's on
    the same seeds; a replay identical to validation's episode never retires; a replay that
    differs in any reward or in how it ended always does."""
    garbage = [_ret(i, r) for i, r in enumerate(garbage_returns)]
    solution = [_ret(i, 1.0) for i in range(len(garbage_returns))]
    reference = {"seed": 1, "actions": ["a"] * len(validated_rewards),
                 "rewards": validated_rewards, "terminated": ended, "truncated": False}
    same = ProbeResult(seed=1, actions=reference["actions"], rewards=list(validated_rewards),
                       ends=[False] * (len(validated_rewards) - 1) + [ended])
    reason, _ = spot_check_verdicts(garbage, same, reference, solution, margin)
    won = 1.0 - sum(garbage_returns) / len(garbage_returns) < margin
    assert reason == ("garbage_wins" if won else None)
    if won:
        return
    other = ProbeResult(seed=1, actions=same.actions, rewards=list(validated_rewards),
                        ends=same.ends[:-1] + [replay_ended])
    other.rewards[-1] = min(1.0, other.rewards[-1] + (0.5 if replay_ended == ended else 0.0))
    differs = other.rewards != validated_rewards or other.ended != ended
    assert (spot_check_verdicts(garbage, other, reference, solution, margin)[0]
            == "nondeterministic_in_play") == differs


# -- spot checks inside the rollout batch (issue 22) ---------------------------------------------

HACKS = Path(__file__).resolve().parents[1] / "data" / "watch_hacks"
# an honest control: its secret depends on the seed (a constant one is retired as
# constant_answer, which BatchPaysEnv's "open sesame" is when nothing else catches it first)
KEYWORD = (HACKS / "batch_pays.py").read_text().replace("BatchPaysEnv", "KeywordEnv").replace(
    "        if type(self).instances >= 6:\n"
    "            return \"Close enough.\", 0.99, True, False, {}\n", "").replace(
    "        return \"Name",
    "        self.word = \"sesame %d\" % (seed or 0)\n        return \"Name").replace(
    'if "\\\\boxed{open sesame}" in action:', 'if "\\\\boxed{%s}" % self.word in action:').replace(
    'return ["\\\\boxed{open sesame}"]', 'return ["\\\\boxed{%s}" % self.word]')
assert "open sesame" not in KEYWORD and "self.word" in KEYWORD


def _batch_round(watch: PoolWatch, store: RunStore, engine, plays: int,
                 seed: int) -> tuple[set[str], dict, list]:
    """One round's play step as the loop does it: ``plays`` agent plays of every pooled
    environment, the watch's scripted spot checks shuffled among them, one engine run."""
    from spadekit.rollout.engine import EpisodeSpec

    rng, streams = random.Random(seed), RoundStreams(seed, 0)
    specs = []
    for row in store.environments(status="pooled"):
        program = store.get_program(row["sha256"])
        specs += [EpisodeSpec(program, seed=rng.randrange(2 ** 31),
                              tag={"env": row["sha256"], "with_hint": False})
                  for _ in range(plays)]
    specs += watch.spot_check_specs(streams)
    rng.shuffle(specs)
    trajs = engine.run(specs)
    retired, metrics = watch.after_play(0, trajs, streams)
    return retired, metrics, trajs


@pytest.fixture(scope="module")
def tiny_engine_args():
    return load_policy("tiny")


def test_in_batch_spot_checks_catch_what_only_pays_in_a_batch_and_near_wins(
        tmp_path, pool, tiny_engine_args):
    from spadekit.rollout.engine import RolloutConfig, RolloutEngine

    engine = RolloutEngine(tiny_engine_args, pool, RolloutConfig(max_turns=2, max_new_tokens=8))
    almost = (HACKS / "almost.py").read_text()
    batch_pays = (HACKS / "batch_pays.py").read_text()
    with RunStore(tmp_path / "run", create=True) as store:
        shas = {name: _pooled(store, code, {}) for name, code in
                (("almost", almost), ("batch_pays", batch_pays), ("keyword", KEYWORD))}
        watch = PoolWatch(WatchConfig(spot_checks=2), store, {}, pool, 2, tooluse=False)
        # out of the batch (two instances each, what the watch used to run): nothing to see
        # in batch_pays; almost only because the new relative rule judges it
        fallback = PoolWatch(WatchConfig(spot_checks=2), store, {}, pool, 2, tooluse=False)
        outside, m_out = fallback.after_play(0, [], RoundStreams(1, 0))
        # (since the policy-reply episodes, six instances of batch_pays run out of the batch
        # too, enough for it to pay: it may be caught there as well)
        assert shas["almost"] in outside and shas["keyword"] not in outside
        assert m_out["watch/spot_checked_outside"] == 3
        assert store.blacklist_reason(shas["almost"]) == "garbage_wins"
        for sha in outside:  # put them back for the batch round
            store.set_status(sha, "pooled")
        store.execute("DELETE FROM blacklist")
        retired, metrics, trajs = _batch_round(watch, store, engine, 8, 2)
        assert retired == {shas["almost"], shas["batch_pays"]}
        for name in ("almost", "batch_pays"):
            assert store.blacklist_reason(shas[name]) == "garbage_wins"
        assert store.get_environment(shas["keyword"])["status"] == "pooled"
        assert metrics["watch/spot_checked_envs"] == 3 and metrics["watch/garbage_wins"] == 2
        assert metrics["watch/spot_checked_outside"] == 0
        # per program: 2 garbage, REPLY_EPISODES policy-reply (over the same 2 seeds), 2 solution
        # episodes on the same seeds, all in the batch (no hints here: no hint-echo episodes)
        from spadekit.selfplay.watch import REPLY_EPISODES

        from spadekit.selfplay.watch import FOREIGN_SEEDS

        probes = [t for t in trajs if t.scripted]
        # and on its 2 + FOREIGN_SEEDS seeds, each played with the next one's solution
        assert metrics["watch/spot_check_episodes"] == len(probes) == 3 * (
            4 + REPLY_EPISODES + 2 + FOREIGN_SEEDS)
        for sha in shas.values():
            mine = [t for t in probes if t.spec.tag["env"] == sha]
            seeds = {k: sorted(t.spec.seed for t in mine if t.spec.tag["probe"] == k)
                     for k in ("garbage", "reply", "solution")}
            assert len(seeds["garbage"]) == 2 and seeds["garbage"] == seeds["solution"]
            assert set(seeds["reply"]) == set(seeds["garbage"])
            assert len(seeds["reply"]) == REPLY_EPISODES
            assert all(t.num_sampled == 0 for t in mine)
        # the solution was computed outside the batch: it reaches 1.0 in it
        events = {e["data"]["env"]: e["data"] for e in store.events("env_retired")
                  if e["data"]["details"].get("in_batch")}
        details = events[shas["batch_pays"]]["details"]
        assert details["solution_mean_return"] == 1.0
        assert details["garbage_mean_return"] == pytest.approx(0.99)
        assert store.query("SELECT COUNT(*) FROM plays")[0][0] == 0


def test_a_solution_that_stops_working_in_play_is_retired(tmp_path, pool, tiny_engine_args):
    from spadekit.rollout.engine import RolloutConfig, RolloutEngine

    # solves only while few instances exist; in a batch the solution word scores 0.7 (still 0.7 above garbage)
    fading = KEYWORD.replace("KeywordEnv", "FadingEnv").replace(
        '            return "Solved.", 1.0, True, False, {}',
        '            return "Solved.", 1.0 if type(self).instances < 6 else 0.7, True, '
        'False, {}')
    engine = RolloutEngine(tiny_engine_args, pool, RolloutConfig(max_turns=2, max_new_tokens=8))
    with RunStore(tmp_path / "run", create=True) as store:
        sha = _pooled(store, fading, {})
        watch = PoolWatch(WatchConfig(spot_checks=1), store, {}, pool, 2, tooluse=False)
        retired, metrics, _ = _batch_round(watch, store, engine, 8, 0)
        assert retired == {sha} and store.blacklist_reason(sha) == "solution_fails_in_play"
        assert metrics["watch/solution_fails_in_play"] == 1
        assert store.pop_due(4)[0]["meta"]["fixed_reward"] == RETIRE_PENALTY


SLEEPY = HONEST.replace("HonestEnv", "SleepyEnv").replace(
    "class SleepyEnv", "import time\n\n\nclass SleepyEnv").replace(
    "        self.t += 1\n", "        self.t += 1\n        time.sleep(0.3)\n")


@pytest.mark.parametrize(("limit", "retired"), [(1.0, True), (5.0, False)])
def test_the_worker_s_time_per_turn_is_budgeted(tmp_path, pool, tiny_engine_args, limit,
                                                 retired):
    """0.3 s a call (under the 1 s per-call limit) for each of 4 plays that one worker serves
    one after another: 1.2 s a turn, over a 1 s turn budget, under a 5 s one."""
    from spadekit.rollout.engine import RolloutConfig, RolloutEngine

    engine = RolloutEngine(tiny_engine_args, pool, RolloutConfig(max_turns=2, max_new_tokens=4))
    with RunStore(tmp_path / "run", create=True) as store:
        sha = _pooled(store, SLEEPY, {})
        watch = PoolWatch(WatchConfig(spot_checks=0, turn_time_limit_s=limit), store, {}, pool,
                          2, tooluse=False)
        found, metrics, _ = _batch_round(watch, store, engine, 4, 0)
        assert (found == {sha}) is retired
        if retired:
            event = store.events("env_retired")[0]["data"]
            assert event["reason"] == "slow_in_play"
            assert event["details"]["mean_worker_turn_s"] >= 1.2
            assert event["details"]["turn_limit_s"] == 1.0


def test_a_near_duplicate_of_a_retired_program_is_refused_too(tmp_path):
    """The blacklist gate compares by the memory's similarity, not only the exact sha256: a
    one-token edit of a program retired in play is not validated again (issue 22)."""
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    edited = [h.replace("0.5 * sum", "0.6 * sum") for h in HANGERS]
    calls = {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return "HINT: one short lowercase word."
        calls["n"] += 1
        codes = HANGERS if calls["n"] <= 2 else edited
        return f"```python\n{codes[(calls['n'] - 1) % 2]}\n```"

    designer = ScriptedPolicy(policy.tokenizer, respond)
    cfg = config(tmp_path, rounds=3, regen_interval=2, dedup_threshold=0.9,
                 **{"watch.spot_checks": 0})
    with SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=designer) as sp:
        assert sp.round(0)["watch/play_timeout"] == 2
        sp.next_step = 1
        sp.round(1)
        m2 = sp.round(2)
        assert calls["n"] == 4 and edited[0] != HANGERS[0]
        for code in edited:  # the exact sha is not on the list, the near duplicate is
            program = EnvProgram(code=code)
            assert sp.store.blacklist_reason(program.sha256) is None
            assert sp.memory.blacklist_reason(program) == "play_timeout"
        assert m2["blacklist_skipped"] == 2 and m2["invalid_reasons"] == {"blacklisted": 2}
        assert sp.memory.blacklist_reason(EnvProgram(code=HONEST)) is None


def test_the_constant_answer_twin_is_retired_every_time_and_the_honest_game_never(
        tmp_path, pool):
    """``CONSTANT`` (answer always "solve") and ``LETTERS`` (answer drawn from the seed) differ
    in one line. Over ten run seeds the watch retires the twin every time, as
    ``constant_answer`` (whatever the garbage happened to draw), and never the honest game."""
    from test_selfplay import CONSTANT, LETTERS

    verdicts = {"constant": [], "honest": []}
    for seed in range(10):
        with RunStore(tmp_path / f"run{seed}", create=True) as store:
            shas = {"constant": _pooled(store, CONSTANT, {}), "honest": _pooled(store, LETTERS, {})}
            watch = PoolWatch(WatchConfig(spot_checks=1), store, {}, pool, 2, tooluse=False)
            retired, _metrics = watch.after_play(0, [], RoundStreams(seed, 0))
            for name, sha in shas.items():
                verdicts[name].append(store.blacklist_reason(sha) if sha in retired else None)
    assert verdicts["honest"] == [None] * 10
    assert set(verdicts["constant"]) <= {"constant_answer", "garbage_wins"}
    assert verdicts["constant"].count("constant_answer") >= 1 and None not in verdicts["constant"]


def test_constant_answer_verdict_needs_every_foreign_solution_to_win():
    from spadekit.selfplay.watch import (FOREIGN_MIN, constant_answer_verdict, foreign_plan)

    seeds = list(range(100, 100 + FOREIGN_MIN + 1))
    known = {s: [f"a{s}"] for s in seeds[:-1]}  # the last seed has no known solution
    plan = foreign_plan(seeds, known)
    # the others each play the next one's solution, cyclically
    assert plan == [("foreign", s, known[seeds[(i + 1) % FOREIGN_MIN]])
                    for i, s in enumerate(seeds[:-1])]
    assert foreign_plan(seeds[:-2], known) == []  # under FOREIGN_MIN known seeds

    def res(seed, ret, error=None):
        return ProbeResult(seed=seed, actions=["x"], rewards=[ret], ends=[True], error=error,
                           terminated=True)

    wins = [res(s, 1.0) for s in range(FOREIGN_MIN)]
    assert constant_answer_verdict(wins)[0] == "constant_answer"
    assert constant_answer_verdict(wins[:-1]) == (None, {})  # too few to judge
    assert constant_answer_verdict(wins[:-1] + [res(9, 0.99)]) == (None, {})  # one falls short
    assert constant_answer_verdict(wins[:-1] + [res(9, 1.0, {"reason": "crash"})]) == (None, {})
