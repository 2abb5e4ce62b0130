"""The designer's learning signals end to end, read back from the run database (issue 12).

A real run: the tiny model trains, programs run in the real sandbox, everything lands in the
real SQLite run database. The designer is scripted (it writes ``KeyEnv`` programs: the right
key word scores 1, the word ``part`` scores 0.3, anything else 0), and so is the agent, whose
answers are fixed in advance per environment and per play, with and without the hint. So every
return is known, and with them the regret, the lifetime win rate, the EMAs and each signal:

    env A: round 0 no hint 1 1 0 0, hinted 1 1 .3 0; round 1 no hint 0 0 0 0
           regret .575 - .5 = .075 (norm .5), lifetime win rate 2/8 = .25, solve rate .25,
           per-round win rates .5, 0
    env B: round 0 no hint 1 1 0 0, hinted 1 1 1 0; round 1 no hint 1 1 1 0
           regret .75 - .5 = .25 (norm 1), lifetime win rate 5/8 = .625, per-round .5, .75

Both are written at round 0 for one skill; their designer samples are due at round 2
(``regen_interval`` 2), when the pool holds the 2 environments written then (8 no-hint plays):
weight ``min(8 / 2 * 2, 50) = 8``. The test reads the rewards, advantages and weights from the
``designer_samples`` events and the memory table, and the importance weights from the update's
``train/tis_mean`` metric, for the default config, a changed plateau band, a schedule entry,
and every ablation signal.
"""

from __future__ import annotations

import math
import re

import pytest

from spadekit.selfplay.config import load_config
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy

KEY_ENV = r'''
class KeyEnv:
    """Name the key word of NAME inside \\boxed{}."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        return "Say the key word of NAME inside \\boxed{}.", {}

    def step(self, action):
        if "\\boxed{WORD}" in action:
            return "Right.", 1.0, True, False, {}
        if "\\boxed{part}" in action:
            return "Close.", 0.3, True, False, {}
        return "Wrong.", 0.0, True, False, {}

    def solution(self):
        return ["\\boxed{WORD}"]
'''

# per environment: the agent's answers to its no-hint plays (in order, over the run) and to
# its hinted plays: "w" the key word, "p" the word part, "x" a wrong word
SCRIPT = {
    "alpha": ("wwxx" "xxxx" "xxxx", "wwpx"),
    "bravo": ("wwxx" "wwwx" "xxxx", "wwwx"),
    "charlie": ("wxxx" "wxxx" "wxxx", "wwxx"),
    "delta": ("wwwx" "wwwx" "wwwx", "wwww"),
}
HINT = "HINT: Answer with one short lowercase word that names the goal."


def program(name: str) -> str:
    return KEY_ENV.replace("NAME", name).replace("WORD", name)


def designer_policy(tokenizer):
    names = list(SCRIPT)
    count = {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return HINT
        name = names[count["n"] % len(names)]
        count["n"] += 1
        return f"```python\n{program(name)}\n```"

    return ScriptedPolicy(tokenizer, respond)


def agent_policy(tokenizer):
    seen: dict[tuple[str, bool], int] = {}

    def respond(_ids, text):
        name = re.findall(r"key word of (\w+)", text)[-1]
        hinted = HINT in text
        k = seen.get((name, hinted), 0)
        seen[(name, hinted)] = k + 1
        plan = SCRIPT[name][1 if hinted else 0]
        answer = {"w": name, "p": "part", "x": "nope"}[plan[k % len(plan)]]
        return f"\\boxed{{{answer}}}"

    return ScriptedPolicy(tokenizer, respond)


def config(tmp, **extra):
    sets = ["model=tiny", "rounds=3", "envs_per_round=2", "num_generations=4",
            "hint_generations=4", "regen_interval=2", "skills_per_epoch=1", "bootstrap=null",
            "memory_seed_library=false", "dedup_threshold=1.01", "rollout.max_turns=2",
            "rollout.max_new_tokens=16", "rollout.temperature=1.0", "designer.temperature=1.0",
            "designer.max_new_tokens=8192", "rollout.max_context_tokens=8192",
            "tensorboard=false", "checkpoint_every=100", "seed=0",
            # KeyEnv's key word is a constant, which the watch retires (constant_answer): these
            # runs test the reward arithmetic on scripted returns, the watch has its own tests
            "watch.spot_checks=0",
            "stream_key=tests"]  # fixed: two fresh runs are compared (the lottery's returns)
    return load_config(preset=None, overrides=sets + [f"{k}={v}" for k, v in extra.items()])


def run(tmp_path, **extra):
    """Three rounds; returns the designer records by environment name, the round-2 metrics,
    and the hand-computed truncated-importance-weighted token mean of round 2's update."""
    import torch

    from spadekit.rollout.engine import RolloutEngine
    from spadekit.selfplay.loop import SelfPlay
    from spadekit.runs.schema import decode_delay

    policy = load_policy("tiny")
    cfg = config(tmp_path, **extra)
    with SelfPlay(cfg, tmp_path / "run", policy=policy,
                  designer_policy=designer_policy(policy.tokenizer)) as sp:
        # the agent's answers are scripted; its tokens are still trained into the tiny model
        sp.engine = RolloutEngine(agent_policy(policy.tokenizer), sp.env_backend, cfg.rollout)
        sp.run(2)
        # round 2's old policy is the current one: hand-compute the designer samples' weights
        due = [decode_delay(r) for r in sp.store.query("SELECT * FROM delay_buffer")]
        expected = []
        with torch.no_grad():
            for item in due:
                ids = torch.tensor([item["token_ids"]])
                logp = torch.log_softmax(policy.model(ids).logits[0, :-1].float(), -1)
                old = logp.gather(-1, ids[0, 1:, None])[:, 0]
                for t in range(1, len(item["token_ids"])):
                    if item["loss_mask"][t]:
                        w = math.exp(float(old[t - 1]) - item["logprobs"][t])
                        expected.append(min(w, cfg.train.importance_sampling_cap))
        m2 = sp.run(1)[0]
        names = {row["sha256"]: re.findall(r"key word of (\w+)", row["code"])[0]
                 for row in sp.store.query("SELECT sha256, code FROM memory")}
        events = [e for e in sp.store.events("designer_samples") if e["step"] == 2]
        memory = {names[r["sha256"]]: r["designer_reward"]
                  for r in sp.store.query("SELECT sha256, designer_reward FROM memory")}
        plays = sp.store.query("SELECT COUNT(*) FROM plays WHERE step = 2 AND with_hint = 0")
    [event] = events
    records = {names[s["env_sha"]]: s for s in event["data"]["samples"]}
    n_agent_tokens = m2["train/num_tokens"] - sum(sum(i["loss_mask"]) for i in due)
    tis = (n_agent_tokens + math.fsum(expected)) / m2["train/num_tokens"]
    return records, memory, m2, tis, plays[0][0]


def check(records, memory, expected_rewards):
    mean = sum(expected_rewards.values()) / len(expected_rewards)
    assert set(records) == set(expected_rewards)
    for name, reward in expected_rewards.items():
        assert records[name]["reward"] == pytest.approx(reward, rel=1e-9, abs=1e-12)
        assert memory[name] == pytest.approx(reward, rel=1e-9, abs=1e-12)
        # centred within the skill (both share it), no std division
        assert records[name]["advantage"] == pytest.approx(reward - mean, rel=1e-9, abs=1e-12)
        assert records[name]["weight"] == 8.0   # min(8 agent / 2 designer * 2, 50)


@pytest.mark.parametrize("budget", [
    {},                                                         # num_generations: 4 per env
    {"agent_samples_per_round": 8, "num_generations": "null"},  # ceil(8 / 2 pooled) = 4
])
def test_default_blend_weights_and_importance_weights(tmp_path, budget):
    records, memory, m2, tis, n_plays = run(tmp_path, **budget)
    assert n_plays == 8 and m2["agent_episodes"] == 8
    # A: .4 * .5 + .6 * plateau(.25) = .2 + .6 * .4 ; B: .4 * 1 + .6 * plateau(.625) = .4 + .54
    check(records, memory, {"alpha": 0.44, "bravo": 0.94})
    assert m2["designer_weight"] == 8.0 and m2["designer_samples"] == 2
    # truncated importance weights min(pi_old / pi_behaviour, 2) of the designer tokens (the
    # scripted designer reported logprob 0), agent tokens at 1, token-weighted
    assert m2["train/tis_mean"] == pytest.approx(tis, rel=1e-5)


def test_a_changed_plateau_band(tmp_path):
    records, memory, *_ = run(tmp_path, **{"reward.plateau_low": 0.2,
                                           "reward.plateau_high": 0.4})
    # A: plateau(.25) = 1 -> .2 + .6 ; B: plateau(.625) = 1 - .225 / .25 = .1 -> .4 + .06
    check(records, memory, {"alpha": 0.8, "bravo": 0.46})


@pytest.mark.parametrize(("from_round", "expected"), [
    (2, {"alpha": 0.8, "bravo": 0.46}),    # in force when the samples are rewarded
    (3, {"alpha": 0.44, "bravo": 0.94}),   # not yet
])
def test_a_schedule_entry(tmp_path, from_round, expected):
    entry = (f"[{{from_round: {from_round}, set: {{reward.plateau_low: 0.2, "
             f"reward.plateau_high: 0.4}}}}]")
    records, memory, *_ = run(tmp_path, schedule=entry)
    check(records, memory, expected)


@pytest.mark.parametrize(("signal", "expected"), [
    ("regret", {"alpha": 0.5, "bravo": 1.0}),                   # clip(regret / .15, 0, 1)
    ("plateau", {"alpha": 0.4, "bravo": 0.9}),
    ("solve_rate", {"alpha": 0.25, "bravo": 0.625}),            # lifetime returns >= 1
    ("azr", {"alpha": 0.75, "bravo": 0.375}),                   # 1 - solve rate
    # per-round win rates A .5, 0: fast .5 - .3 * .5 = .35, slow .5 - .05 * .5 = .475
    #                    B .5, .75: fast .5 + .3 * .25 = .575, slow .5 + .05 * .25 = .5125
    ("learning_potential", {"alpha": 0.125, "bravo": 0.0625}),
])
def test_each_ablation_signal(tmp_path, signal, expected):
    records, memory, *_ = run(tmp_path, **{"reward.signal": signal})
    check(records, memory, expected)


# -- issue 22: rewards a program cannot buy with a lottery or a near-win for anything ----------

HACKS = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "watch_hacks"


def lottery_run(tmp_path, **extra):
    """A real run on the tiny model whose scripted designer writes the lottery (0.2 on half the
    seeds whatever the action, 1.0 for its secret word, which the tiny agent never says):
    returns its designer_samples record (round 2), its no-hint returns and round 2's metrics."""
    from spadekit.selfplay.loop import SelfPlay

    lottery = (HACKS / "lottery.py").read_text()
    policy = load_policy("tiny")

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return HINT
        return f"```python\n{lottery}\n```"

    cfg = config(tmp_path, **{"envs_per_round": 1, "num_generations": 8, **extra})
    with SelfPlay(cfg, tmp_path / "run", policy=policy,
                  designer_policy=ScriptedPolicy(policy.tokenizer, respond)) as sp:
        m0, _m1, m2 = sp.run(3)
        assert m0["valid"] == 1 and m0["watch/retired"] == 0
        [event] = [e for e in sp.store.events("designer_samples") if e["step"] == 2]
        [record] = event["data"]["samples"]
        returns = [r[0] for r in sp.store.query(
            "SELECT episode_return FROM plays WHERE env_sha = ? AND with_hint = 0 "
            "ORDER BY id", (record["env_sha"],))]
        regret = sp.store.env_stats(record["env_sha"])["regret_at_gen"]
    return record, returns, regret, m2


def test_a_lottery_earns_no_plateau(tmp_path):
    from spadekit.selfplay.rewards import plateau, regret_norm

    record, returns, regret, m2 = lottery_run(tmp_path / "a")
    assert len(returns) == 16 and set(returns) == {0.0, 0.2}  # 8 plays in each of 2 rounds
    mean = sum(returns) / len(returns)
    share = sum(r > 0 for r in returns) / len(returns)
    assert record["win_rate"] == pytest.approx(mean) and mean <= 0.15
    # plateau(mean) = 0: the designer gets only the regret part
    assert record["reward"] == pytest.approx(0.4 * regret_norm(regret) + 0.6 * plateau(mean))
    assert plateau(mean) == 0.0
    variance = sum((r - mean) ** 2 for r in returns) / len(returns)
    assert record["win_rate_variance"] == pytest.approx(variance)
    assert m2["designer/win_rate_variance"] == pytest.approx(variance)
    # the old input, positive share, put the same program in (or near) the band
    old, returns_old, regret_old, _ = lottery_run(tmp_path / "b",
                                                  **{"reward.win_rate_input": "positive_share"})
    assert returns_old == returns and old["win_rate"] == pytest.approx(share)
    assert plateau(share) > 0.5
    assert old["reward"] == pytest.approx(0.4 * regret_norm(regret_old) + 0.6 * plateau(share))
    assert old["reward"] > record["reward"] + 0.3


def test_anything_scores_099_is_retired_by_the_in_batch_spot_check(tmp_path):
    """The near-win for any action is pooled directly (validation would turn it away; what is
    tested is the watch in play): round 0's batch carries its spot checks, and it is retired."""
    from spadekit.envs.program import EnvProgram
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    from test_selfplay import LETTERS, designer_responder

    # the designed game is an honest one (its answer drawn from the seed), watched as well
    cfg = config(tmp_path, **{"envs_per_round": 1, "rounds": 1, "watch.spot_checks": 1})
    with SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=ScriptedPolicy(
            policy.tokenizer, designer_responder([LETTERS]))) as sp:
        almost = sp.store.add_environment(EnvProgram(code=(HACKS / "almost.py").read_text()),
                                          step=0, validation={"ok": True, "details": {}})
        sp.store.push_delayed({"token_ids": [1, 2], "loss_mask": [0, 1],
                               "logprobs": [0.0, -1.0], "generated_step": 0, "due_step": 2,
                               "env_sha": almost, "skill": "s", "meta": {"reason": "ok"}})
        m0 = sp.round(0)
        assert m0["valid"] == 1 and m0["watch/retired"] == 1 and m0["watch/garbage_wins"] == 1
        assert sp.store.blacklist_reason(almost) == "garbage_wins"
        [event] = sp.store.events("env_retired")
        details = event["data"]["details"]
        assert details["in_batch"] and details["garbage_mean_return"] == pytest.approx(0.99)
        assert details["solution_mean_return"] == pytest.approx(0.99)  # its "solution" too
        assert m0["watch/spot_checked_outside"] == 0 and m0["watch/spot_check_episodes"] >= 4
        # its plays were recorded (they happened) but not trained on; spot checks are not plays
        assert m0["watch/episodes_dropped"] == 4 and m0["agent_episodes"] == 4
        n = sp.store.query("SELECT COUNT(*) FROM plays WHERE env_sha = ? AND with_hint = 0",
                           (almost,))[0][0]
        assert n == 4
        [meta] = [r[0] for r in sp.store.query("SELECT meta FROM delay_buffer WHERE env_sha = ?",
                                               (almost,))]
        assert '"fixed_reward": -0.5' in meta
