"""The self-play loop end to end, and resume after SIGKILL.

The agent is the real tiny model (it really trains); the designer's text comes from a scripted
policy that returns real environment programs, so validation, hints, plays, rewards, the delayed
designer update and the GRPO step all run on real parts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spadekit.selfplay.config import load_config
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy

SRC = str(Path(__file__).resolve().parents[2] / "src")

# A partial-credit game whose answer is drawn from the seed: the observation shows the word's
# letters shuffled, the share of letters in the reply (scaled to at most 0.36) is the reward, so
# a random model's returns vary and GRPO has signal; \boxed{<word>} is the solution. None of
# its words is one of the garbage generator's (spadekit.sandbox.probes). The quoted label
# ("solve", "train", ...) tells the variants apart; it is not the answer.
LETTERS = r'''
import random
import re

WORDS = ("amber", "birch", "cedar", "dingo", "ember", "fjord", "grove", "heron", "ivory",
         "koala", "lemur", "maple")


class LettersEnv:
    """Unscramble the word; letters score, the exact word wins."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.word = self.rng.choice(WORDS)
        letters = "".join(self.rng.sample(self.word, len(self.word)))
        self.t = 0
        return ("Puzzle %s: unscramble %s and reply with the word inside \\boxed{}. Letters "
                "score; the word wins." % ("solve", letters)), {}

    def step(self, action):
        self.t += 1
        m = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if m and m[-1] == self.word:
            return "Solved.", 1.0, True, False, {}
        letters = sum(c.isalpha() for c in action)
        score = round(0.9 * letters / max(len(action), 1) * 0.4, 4)  # at most 0.36
        return "Scored %.2f." % score, score, True, False, {}

    def solution(self):
        return ["\\boxed{%s}" % self.word]
'''

VARIANT = LETTERS.replace("LettersEnv", "WordsEnv").replace('"solve"', '"train"')
WORDS = [LETTERS.replace('"solve"', f'"{w}"') for w in
         ("solve", "train", "learn", "guess", "think", "plans", "rules", "games")]

# The dishonest twin: the answer never changes (and "solve" is one of the garbage generator's
# words). A game whose answer is a constant teaches nothing; the watch must retire it.
CONSTANT = LETTERS.replace("LettersEnv", "ConstantEnv").replace(
    "self.word = self.rng.choice(WORDS)", 'self.word = "solve"')


def designer_responder(programs):
    counter = {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return "HINT: Answer with one short lowercase word that names the goal."
        program = programs[counter["n"] % len(programs)]
        counter["n"] += 1
        return f"Here is the environment.\n```python\n{program}\n```\nHINT: use letters."

    return respond


def config(tmp: Path, rounds: int = 2, **extra):
    sets = ["model=tiny", f"rounds={rounds}", "envs_per_round=2", "num_generations=4",
            "hint_generations=2", "regen_interval=1", "bootstrap=null",
            "memory_seed_library=false", "rollout.max_turns=2", "rollout.max_new_tokens=12",
            "rollout.temperature=1.0", "designer.temperature=1.0",
            "rollout.max_context_tokens=8192", "designer.max_new_tokens=8192",
            "train.learning_rate=0.01", "sandbox.step_timeout=3.0",
            "dedup_threshold=1.01",  # the scripted variants differ only in a constant
            "stream_key=tests"]  # fixed: two fresh runs of one config are the same run
    sets += [f"{k}={v}" for k, v in extra.items()]
    return load_config(preset=None, overrides=sets)


def test_end_to_end_rounds_design_play_reward_update(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    with SelfPlay(config(tmp_path), tmp_path / "run", policy=policy,
                  designer_policy=designer) as sp:
        m0, m1 = sp.run()
        store = sp.store
        envs = store.environments()
        assert m0["valid"] == 2 and m0["pooled"] == 2 and m0["hints_ok"] == 2
        assert m0["agent_episodes"] == 8 and 0 < m0["agent_mean_return"] < 1
        assert m0["train/optimizer_steps"] == 1
        # round 1 trains round 0's designer samples (delay k = regen_interval = 1)
        assert m1["designer_samples"] == 2
        assert m1["designer_weight"] == pytest.approx(min(8 / 2 * 1, 50.0))
        assert {e["status"] for e in envs} >= {"retired"}
        first = envs[0]["sha256"]
        stats = store.env_stats(first)
        assert stats["n_plays"] == 4 and stats["n_plays_with_hint"] == 2
        assert stats["regret_at_gen"] is not None
        assert store.latest_complete_step() == 1 and store.latest_checkpoint()["step"] == 1
        assert len(sp.memory) >= 2
    changed = any(not before[k].equal(v) for k, v in policy.model.state_dict().items())
    assert changed, "the GRPO update did not change the weights"
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e.get("kind") == "round"] == [0, 1]
    assert (tmp_path / "run" / "config.yaml").is_file()


@pytest.mark.extra("tensorboard")
def test_every_round_reaches_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    with SelfPlay(config(tmp_path), tmp_path / "run", policy=policy,
                  designer_policy=designer) as sp:
        metrics = sp.run()
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    scalars = acc.Scalars("agent_mean_return")  # TensorBoard keeps float32
    assert [e.step for e in scalars] == [m["step"] for m in metrics]
    assert [e.value for e in scalars] == pytest.approx(
        [m["agent_mean_return"] for m in metrics], rel=1e-6)


def test_invalid_and_hanging_designs_get_fixed_rewards_and_blacklist(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    hang = LETTERS.replace("self.t += 1", "while True: pass")
    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder([hang, "no code at all"]))
    with SelfPlay(config(tmp_path, rounds=2, bootstrap="library", bootstrap_per_round=1),
                  tmp_path / "run", policy=policy, designer_policy=designer) as sp:
        m0, m1 = sp.run()
        assert m0["valid"] == 0 and m0["invalid_reasons"] == {"timeout": 1, "no_env_class": 1}
        assert len(sp.store.blacklisted()) == 1
        rejected = sp.store.rejected()
        # round 1 writes the same hanging program again: the blacklist is read first, so it is
        # not validated (no second timeout) and earns the hang penalty again
        assert sorted(r["reason"] for r in rejected) == ["blacklisted", "no_env_class",
                                                         "no_env_class", "timeout"]
        assert [r["step"] for r in rejected if r["reason"] == "blacklisted"] == [1]
        assert (m0["blacklist_skipped"], m1["blacklist_skipped"]) == (0, 1)
        assert m1["invalid_reasons"] == {"blacklisted": 1, "no_env_class": 1}
        assert {r["step"] for r in rejected} == {0, 1}
        assert any("while True" in r["text"] for r in rejected)
        # due designer samples carry -0.5 (hang) and 0 (invalid)
        assert m1["designer_reward"] == pytest.approx((-0.5 + 0.0) / 2)


DRIVER = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
from test_selfplay import config, designer_responder, WORDS
from pathlib import Path
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.selfplay.loop import SelfPlay
run = Path(sys.argv[3])
policy = load_policy("tiny")
designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS * 20))
sp = SelfPlay(config(run.parent, rounds=50), run, policy=policy, designer_policy=designer,
              resume=(run / "run.sqlite").exists())
while True:
    step = sp.next_step
    sp.round(step)
    sp.next_step += 1
    print(json.dumps({"done": step}), flush=True)
'''


def test_sigkill_at_any_moment_resumes_losing_at_most_the_round_in_flight(tmp_path):
    run = tmp_path / "run"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    tests_dir = str(Path(__file__).resolve().parent)
    proc = subprocess.Popen([sys.executable, str(script), SRC, tests_dir, str(run)],
                            stdout=subprocess.PIPE, text=True)
    done = []
    deadline = time.monotonic() + 120
    while len(done) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            done.append(json.loads(line)["done"])
    time.sleep(0.4)  # now somewhere inside round 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert done == [0, 1]

    from spadekit.runs.store import RunStore

    with RunStore.open(run) as store:
        last = store.latest_complete_step()
        assert last in (1, 2)  # round 2 either committed whole or not at all
        envs_before = {e["sha256"] for e in store.environments()}
        memory_before = store.query("SELECT COUNT(*) FROM memory")[0][0]
        assert store.latest_checkpoint()["step"] == last
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS[::-1]))
    with SelfPlay(config(tmp_path, rounds=1), run, policy=policy, designer_policy=designer,
                  resume=True) as sp:
        assert sp.next_step == last + 1
        assert sp.trainer.step == last + 1 or sp.trainer.step >= 1
        sp.run(1)
        assert sp.store.latest_complete_step() == last + 1
        assert envs_before <= {e["sha256"] for e in sp.store.environments()}
        assert sp.store.query("SELECT COUNT(*) FROM memory")[0][0] >= memory_before
    assert os.path.isdir(run / "checkpoints")


def test_resume_with_a_broken_checkpoint_is_a_typed_error(tmp_path):
    from spadekit.selfplay.loop import ResumeError, SelfPlay

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    with SelfPlay(config(tmp_path, rounds=1), tmp_path / "run", policy=policy,
                  designer_policy=designer) as sp:
        sp.run()
        ckpt = Path(sp.store.latest_checkpoint()["path"])
    for weights in ckpt.rglob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    with pytest.raises(ResumeError, match="does not load"):
        SelfPlay(config(tmp_path, rounds=1), tmp_path / "run", policy=load_policy("tiny"),
                 designer_policy=designer, resume=True)


def test_a_policy_that_cannot_train_is_refused_clearly(tmp_path):
    from spadekit.common.errors import ConfigError
    from spadekit.selfplay.loop import SelfPlay

    scripted = ScriptedPolicy(load_policy("tiny").tokenizer, lambda _i, _t: "x")
    with pytest.raises(ConfigError, match="cannot be trained"):
        SelfPlay(config(tmp_path), tmp_path / "run", policy=scripted)
    assert not (tmp_path / "run").exists()  # nothing half-created to trip a retry


def test_a_run_made_before_the_layout_change_resumes(tmp_path):
    """``tests/data/run_before_layout`` was written by the code before the module move
    (tiny model, cpu-tiny, one round); the CLI resumes it after the move: round 1 runs from
    round 0's checkpoint and round 0's records are kept."""
    import shlex
    import shutil
    import sqlite3

    # a path longer than the console, with a space, a bracket, an emoji code and a trailing
    # backslash: the resume command is printed whole, quoted for a shell, character for character
    run = tmp_path / ("old-run-" + "x" * 120 + " [gw0] :x:\\")
    shutil.copytree(Path(__file__).parents[1] / "data" / "run_before_layout", run)
    before = sqlite3.connect(run / "run.sqlite")
    envs_before = {r[0] for r in before.execute("SELECT sha256 FROM environments")}
    metrics_before = before.execute(
        "SELECT name, value FROM metrics WHERE step = 0 ORDER BY name").fetchall()
    assert metrics_before
    before.close()
    done = subprocess.run([sys.executable, "-m", "spadekit", "selfplay", "--resume", str(run),
                           "--rounds", "1"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": "120"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "starting at round 1" in done.stdout
    assert f"(resume with --resume {shlex.quote(str(run))})" in done.stdout, done.stdout[-2000:]
    after = sqlite3.connect(run / "run.sqlite")
    steps = [r[0] for r in after.execute("SELECT DISTINCT step FROM metrics ORDER BY step")]
    assert steps == [0, 1]
    assert after.execute("SELECT name, value FROM metrics WHERE step = 0 ORDER BY name"
                         ).fetchall() == metrics_before
    assert envs_before <= {r[0] for r in after.execute("SELECT sha256 FROM environments")}
    after.close()
