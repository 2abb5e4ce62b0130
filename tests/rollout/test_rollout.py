"""The rollout engine: token exactness, logprob alignment, hints, endings, hostile programs."""

from __future__ import annotations

import re

import pytest

from conftest import ECHO
from spadekit.envs import library
from spadekit.envs.program import EnvProgram
from spadekit.policy.hf import sequence_logprobs
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.policy.tiny import tiny_tokenizer
from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine

TOK = tiny_tokenizer()


def lib(name: str) -> EnvProgram:
    return library.program(library.get(name))


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny")


def consistent(tr) -> None:
    assert len(tr.token_ids) == len(tr.loss_mask) == len(tr.logprobs)
    assert tr.loss_mask[:tr.prompt_len] == [0] * tr.prompt_len
    assert sum(tr.loss_mask) == sum(t.new_tokens for t in tr.turns) or tr.failure


def test_sampled_tokens_and_logprobs_match_a_fresh_forward_pass(pool, tiny):
    """The training view: one forward pass over the whole conversation gives, at every sampled
    position, the logprob the sampler recorded, so the tokens are exactly those sampled."""
    engine = RolloutEngine(tiny, pool, RolloutConfig(max_turns=3, max_new_tokens=24, seed=3,
                                                     temperature=0.9))
    specs = [EpisodeSpec(lib("games_code_breaker"), seed=i) for i in range(2)] + \
        [EpisodeSpec(lib("tools_record_lookup"), seed=5)]
    trajs = engine.run(specs)
    for tr in trajs:
        assert tr.failure is None, tr.failure
        consistent(tr)
        ref = sequence_logprobs(tiny.model, tr.token_ids[:1], tr.token_ids[1:], 0.9)
        for pos in range(1, len(tr.token_ids)):
            if tr.loss_mask[pos]:
                assert abs(ref[pos - 1] - tr.logprobs[pos]) < 1e-4
        # every assistant message is exactly the decoded sampled span before it
        spans = _spans(tr.loss_mask)
        texts = [m["content"] for m in tr.messages if m["role"] == "assistant"]
        assert len(spans) == len(texts) == len(tr.turns)
        for (a, b), text in zip(spans, texts):
            assert TOK.decode(tr.token_ids[a:b], skip_special_tokens=True) == text


def _spans(mask):
    spans, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def solution_player(program: EnvProgram, seed: int):
    """A scripted agent that plays the program's solution (computed in-process for the test)."""
    ns: dict = {"__name__": "scripted_program"}
    exec(compile(program.code, "env", "exec"), ns)
    cls = next(v for k, v in ns.items() if k.endswith("Env") and isinstance(v, type)
               and v.__module__ == "scripted_program")
    env = cls()
    env.reset(seed=seed)
    actions = iter(env.solution())
    return lambda _ids, _text: next(actions, "")


def test_full_rerender_equals_the_training_tokens(pool):
    """With canonical answers, the incrementally built sequence equals a full re-render of the
    finished conversation by the chat template: no drift from incremental rendering."""
    program = lib("games_modular_search")
    policy = ScriptedPolicy(TOK, solution_player(program, 4))
    tr = RolloutEngine(policy, pool, RolloutConfig(max_turns=12)).run(
        [EpisodeSpec(program, seed=4, hint="think about remainders")])[0]
    assert tr.stop_reason == "terminated" and tr.episode_return == 1.0
    rendered = TOK.apply_chat_template(tr.messages, tokenize=False, add_generation_prompt=False)
    assert tr.token_ids == TOK(rendered, add_special_tokens=False)["input_ids"]
    assert all(t.exact_render for t in tr.turns)


def test_hint_is_appended_to_the_first_observation_only(pool):
    program = EnvProgram(code=ECHO)
    policy = ScriptedPolicy(TOK, lambda _i, _t: "\\boxed{x}")
    tr = RolloutEngine(policy, pool, RolloutConfig(max_turns=3)).run(
        [EpisodeSpec(program, seed=1, hint="go left")])[0]
    users = [m["content"] for m in tr.messages if m["role"] == "user"]
    assert users[0] == "echo ready\n\nHINT: go left"
    assert all("HINT" not in u for u in users[1:])


def test_runner_cap_context_limit_and_env_truncation(pool):
    never_ends = EnvProgram(code=ECHO.replace("self.t >= self.max_turns", "False"))
    policy = ScriptedPolicy(TOK, lambda _i, _t: "\\boxed{x}")
    tr = RolloutEngine(policy, pool, RolloutConfig(max_turns=4)).run(
        [EpisodeSpec(never_ends, seed=0)])[0]
    assert (tr.stop_reason, len(tr.turns), tr.truncated, tr.episode_return) == \
        ("max_turns", 4, True, 0.0)
    tr = RolloutEngine(policy, pool, RolloutConfig(max_turns=50, max_context_tokens=300)).run(
        [EpisodeSpec(never_ends, seed=0)])[0]
    assert tr.stop_reason == "context" and tr.truncated and len(tr.token_ids) <= 300 + 40
    tr = RolloutEngine(policy, pool, RolloutConfig(max_turns=12)).run(
        [EpisodeSpec(EnvProgram(code=ECHO), seed=0)])[0]  # ECHO truncates itself at max_turns
    assert tr.stop_reason == "truncated" and tr.episode_return == 0.0


def test_hostile_programs_fail_alone(pool, tiny):
    hang = EnvProgram(code=ECHO.replace('self.t += 1', 'while True: pass'))
    crash = EnvProgram(code=ECHO.replace('self.t += 1', 'import os; os._exit(1)'))
    broken = EnvProgram(code="class BrokenEnv:\n    def reset(self, seed=None, options=None):\n"
                              "        raise RuntimeError('no')\n")
    good = lib("games_sequence_rule")
    engine = RolloutEngine(tiny, pool, RolloutConfig(max_turns=3, max_new_tokens=8, seed=0))
    trajs = engine.run([EpisodeSpec(hang, 0), EpisodeSpec(good, 1), EpisodeSpec(crash, 2),
                        EpisodeSpec(good, 2), EpisodeSpec(broken, 3)])
    assert trajs[0].failure["reason"] == "timeout" and trajs[0].stop_reason == "env_error"
    assert trajs[2].failure["reason"] == "worker_died"
    assert trajs[4].failure["type"] == "EnvRaised"
    for tr in (trajs[1], trajs[3]):
        assert tr.failure is None and len(tr.turns) == 3
        consistent(tr)


def test_malformed_tool_calls_become_error_observations(pool):
    program = lib("tools_inventory_update")
    answers = iter(["<tool_call>{not json}</tool_call>",
                    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                    "<answer>done</answer>"])
    policy = ScriptedPolicy(TOK, lambda _i, _t: next(answers))
    tr = RolloutEngine(policy, pool, RolloutConfig(max_turns=5)).run(
        [EpisodeSpec(program, seed=0)])[0]
    assert tr.failure is None and len(tr.turns) == 3
    assert re.search(r"error|invalid|unknown", tr.turns[0].observation, re.I)
    assert re.search(r"error|unknown|no tool", tr.turns[1].observation, re.I)
    assert tr.terminated and tr.episode_return < 1.0
    assert tr.tools and tr.spec.tag["setting"] == "tooluse"


def test_solutions_reach_return_one_in_both_settings(pool):
    for name in ("games_knapsack_reveal", "tools_order_pipeline"):
        program = lib(name)
        policy = ScriptedPolicy(TOK, solution_player(program, 7))
        # the tiny tokenizer is byte-level: a tool-use conversation needs a long context
        tr = RolloutEngine(policy, pool, RolloutConfig(max_context_tokens=32768, max_new_tokens=2048)).run(
            [EpisodeSpec(program, seed=7)])[0]
        assert tr.terminated and tr.episode_return == 1.0, (name, tr.stop_reason, tr.failure)


def test_seeded_rollouts_are_reproducible(pool, tiny):
    cfg = RolloutConfig(max_turns=2, max_new_tokens=16, seed=11)
    specs = [EpisodeSpec(lib("games_switchboard"), seed=s) for s in (0, 1)]
    a = RolloutEngine(tiny, pool, cfg).run(specs)
    b = RolloutEngine(tiny, pool, cfg).run(specs)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    c = RolloutEngine(tiny, pool, RolloutConfig(max_turns=2, max_new_tokens=16, seed=12)).run(
        specs)
    assert [t.token_ids for t in a] != [t.token_ids for t in c]


def test_trajectories_serialise(pool):
    import json

    policy = ScriptedPolicy(TOK, lambda _i, _t: "\\boxed{1}")
    tr = RolloutEngine(policy, pool, RolloutConfig(max_turns=2)).run(
        [EpisodeSpec(EnvProgram(code=ECHO), seed=0, tag={"env": "echo"})])[0]
    d = json.loads(json.dumps(tr.to_dict()))
    assert d["tag"]["env"] == "echo" and d["num_sampled"] == sum(d["loss_mask"])
    assert d["turns"][0]["action"] == "\\boxed{1}"


# -- scripted episodes (the watch's in-batch spot checks) and the per-worker turn time ---------

# Every instance of one program lives in one sandbox: the class counters see them all. Each step
# reports how many instances exist and how many step calls the sandbox has served so far.
CENSUS = r'''
class CensusEnv:
    instances = 0
    calls = 0

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        type(self).instances += 1

    def reset(self, seed=None, options=None):
        self.t = 0
        return "Say anything.", {}

    def step(self, action):
        type(self).calls += 1
        self.t += 1
        obs = "%d %d %s" % (type(self).instances, type(self).calls, action.strip()[:20])
        return obs, 0.25, False, self.t >= self.max_turns, {}
'''


def test_scripted_episodes_step_in_the_same_sandbox_and_lockstep_without_the_policy(pool):
    asked = []
    policy = ScriptedPolicy(TOK, lambda _ids, text: asked.append(text) or "\\boxed{x}")
    engine = RolloutEngine(policy, pool, RolloutConfig(max_turns=3, max_new_tokens=8))
    program = EnvProgram(code=CENSUS)
    specs = [EpisodeSpec(program, seed=1), EpisodeSpec(program, seed=2, scripted=("g1", "g2")),
             EpisodeSpec(program, seed=3)]
    real_a, probe, real_b = engine.run(specs)
    assert len(asked) == 2 * 3  # the two sampled episodes, 3 turns each; the probe never asks
    assert probe.scripted and not real_a.scripted
    assert probe.token_ids == [] and probe.num_sampled == 0 and probe.logprobs == []
    assert [t.action for t in probe.turns] == ["g1", "g2"] and probe.stop_reason == "script_end"
    assert probe.episode_return == 0.0 and probe.failure is None
    assert [t.finish_reason for t in probe.turns] == ["scripted", "scripted"]
    assert all(t.new_tokens == 0 and t.generate_s == 0.0 for t in probe.turns)
    # one sandbox: every episode sees 3 instances; one lockstep: turn k's calls are 3k+1..3k+3
    for tr in (real_a, probe, real_b):
        for k, turn in enumerate(tr.turns):
            instances, calls, _ = turn.observation.split(" ", 2)
            assert int(instances) == 3 and 3 * k + 1 <= int(calls) <= 3 * k + 3
    assert [m["content"] for m in probe.messages if m["role"] == "assistant"] == ["g1", "g2"]
    assert real_a.num_sampled > 0 and real_a.stop_reason == "truncated"  # its own t >= 3


def test_only_scripted_episodes_never_call_the_policy(pool):
    def refuse(_ids, _text):
        raise AssertionError("the policy was asked")

    engine = RolloutEngine(ScriptedPolicy(TOK, refuse), pool, RolloutConfig(max_turns=4))
    (tr,) = engine.run([EpisodeSpec(EnvProgram(code=CENSUS), seed=0, scripted=["a"] * 6)])
    assert len(tr.turns) == 4 and tr.stop_reason == "truncated" and tr.num_sampled == 0
    with pytest.raises(ValueError):
        EpisodeSpec(EnvProgram(code=CENSUS), seed=0, scripted="abc")


SLEEPY = r'''
import time

class SleepyEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.t = 0
        return "Wait.", {}

    def step(self, action):
        self.t += 1
        time.sleep(0.05)
        return "Waited.", 0.25, self.t >= 2, False, {}
'''


def test_worker_turn_time_is_the_total_of_the_program_s_episodes_on_that_turn(pool, tiny):
    """Three episodes of one program step one after another in its one sandbox: the worker's
    turn is the sum of their step times (0.15 s and more), while each call alone is ~0.05 s."""
    engine = RolloutEngine(tiny, pool, RolloutConfig(max_turns=3, max_new_tokens=4))
    sleepy, fast = EnvProgram(code=SLEEPY), EnvProgram(code=CENSUS)
    trajs = engine.run([EpisodeSpec(sleepy, seed=i) for i in range(2)]
                       + [EpisodeSpec(sleepy, seed=9, scripted=("a", "b")),
                          EpisodeSpec(fast, seed=0)])
    sleepers = trajs[:3]
    for k in range(2):
        turns = [tr.turns[k] for tr in sleepers]
        total = sum(t.step_s for t in turns)
        assert all(t.worker_turn_s == pytest.approx(total) for t in turns)
        assert total >= 0.15 and all(t.step_s < total for t in turns)
    # the other program's worker is its own
    assert all(t.worker_turn_s == pytest.approx(t.step_s) for t in trajs[3].turns)
