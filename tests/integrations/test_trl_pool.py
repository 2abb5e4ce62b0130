"""A pool's environments in TRL's GRPOTrainer (``spadekit.integrations.trl``).

Real parts throughout: programs in spadekit's sandbox, trl 1.16.0's ``GRPOTrainer`` with
``environment_factory``, and the tiny transformer, which first learns the ``act`` tool-call
format by a few supervised steps (a random model never calls a tool, so every reward would be 0
and GRPO would have nothing to learn from), then really trains. Rewards are checked against hand
computations from the test programs; the cheapest policies (no tool call, acting after the end,
a huge action, crashing the program) are shown to earn no more than honest play.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.extra("trl")

ROOT = Path(__file__).resolve().parents[2]
HINT = "ZEBRA-HINT: always answer with the first letter of the alphabet"

PICK = f'''
HINT_ECHO = {HINT!r}


def extract_boxed(text):
    start = text.rfind("\\\\boxed{{")
    if start < 0 or not text.endswith("}}"):
        return None
    return text[start + 7:-1].strip()


class PickEnv:
    """Pick a letter: a scores 1.0, b 0.25, anything else 0."""

    max_turns = 4

    def reset(self, seed=None, options=None):
        self.done = False
        return "Pick a letter, a or b. " + (HINT_ECHO if seed == 99 else ""), {{}}

    def step(self, action):
        if self.done:
            return "over", 0.0, True, False, {{}}
        choice = extract_boxed(action)
        reward = {{"a": 1.0, "b": 0.25}}.get(choice, 0.0)
        self.done = choice in ("a", "b")
        return f"You picked {{choice!r}}.", reward, self.done, False, {{}}

    def solution(self):
        return ["\\\\boxed{{b}}"]  # the partial-credit answer: GRPO has to find a
'''

LADDER = '''
import os


class LadderEnv:
    """Climb: 'up' adds a rung (0.2 each, paid at 'stop'), 'crash' raises, 'escape' writes a file,
    'wait' returns partial credit 0.3 without ending."""

    max_turns = 6

    def reset(self, seed=None, options=None):
        self.height = 0
        return "height 0, pid %d" % os.getpid(), {}

    def step(self, action):
        command = action[len("\\\\boxed{"):-1] if action.startswith("\\\\boxed{") else action
        if command == "up":
            self.height += 1
            return "height %d" % self.height, 0.0, False, False, {}
        if command == "stop":
            return "stopped at %d" % self.height, round(0.2 * self.height, 6), True, False, {}
        if command == "wait":
            return "waiting", 0.3, False, False, {}
        if command == "crash":
            raise RuntimeError("the program crashed")
        if command.startswith("escape "):
            with open(command[len("escape "):], "w") as handle:
                handle.write("escaped")
            return "wrote it", 0.0, False, False, {}
        return "unknown command", 0.0, False, False, {}
'''


def _pool(tmp_path: Path, *sources: str) -> Path:
    from spadekit.envs.program import EnvProgram
    from spadekit.runs.pool import write_pool

    out = tmp_path / "pool"
    write_pool(out, [(EnvProgram(code=code, hint=HINT, domain="games"), None) for code in sources])
    return out


@pytest.fixture
def pick_pool(tmp_path):
    return _pool(tmp_path, PICK)


@pytest.fixture
def ladder(tmp_path):
    from spadekit.integrations.trl import PoolEnvironments

    with PoolEnvironments(_pool(tmp_path, LADDER), max_turns=5, warm=0) as envs:
        yield envs


def _play(envs, actions, seed=0):
    env = envs.factory()
    env_id = next(iter(envs.programs))
    first = env.reset(env_id=env_id, seed=seed, prompt=[])
    replies = [env.act(a) for a in actions]
    return env, first, replies


# -- (b) the reward is the program's own return ----------------------------------------------


@pytest.mark.parametrize("actions, expected", [
    (["up", "up", "stop"], 0.4),  # 2 rungs, paid at stop: 0.2 * 2
    (["up", "up", "up", "stop"], 0.6),
    (["stop"], 0.0),
    (["up", "up"], 0.0),  # not ended: SPEC's return is 0
    (["wait", "up"], 0.0),  # partial credit mid-episode is not a return
    (["up", "up", "up", "up", "up", "stop"], 0.0),  # turn cap 5 hit before stop
])
def test_reward_is_the_programs_return(ladder, actions, expected):
    env, _first, replies = _play(ladder, actions)
    assert env.get_reward() == pytest.approx(expected)
    if len(actions) > 5:
        assert "turn limit" in replies[4] and "over" in replies[5]


def test_boxed_action_is_sent_once(ladder):
    env, _first, replies = _play(ladder, ["\\boxed{up}", "stop"])
    assert replies[0] == "height 1"
    assert env.get_reward() == pytest.approx(0.2)


@pytest.mark.parametrize("setting", ["games", "tooluse"])
def test_library_solutions_through_act_earn_the_programs_return(setting):
    """Every library program's own solution(), played through act, scores what the program
    gives it when played directly in a sandbox (the last reward, episode terminated)."""
    from spadekit.integrations.trl import PoolEnvironments
    from spadekit.sandbox.gym_adapter import SandboxedTextEnv

    with PoolEnvironments(f"library:{setting}", max_turns=25, warm=0) as envs:
        env = envs.factory()
        for env_id, program in envs.programs.items():
            direct = SandboxedTextEnv(program, pool=envs.pool, max_turns=25)
            direct.reset(seed=3)
            actions, rewards, terminated = direct.solution(), [], False
            for action in actions:
                _obs, reward, terminated, truncated, _info = direct.step(action)
                rewards.append(reward)
                if terminated or truncated:
                    break
            direct.close()
            first = env.reset(env_id=env_id, seed=3)
            assert program.hint not in first
            if setting == "tooluse":
                assert "The environment's tools" in first
            for action in actions:
                env.act(action)
            assert terminated and env.get_reward() == rewards[-1] > 0, program.source


# -- (e) the cheapest policies -------------------------------------------------------------


def test_cheap_policies_earn_no_more_than_honest_play(ladder):
    honest, _, _ = _play(ladder, ["up", "up", "stop"])
    honest_return = honest.get_reward()
    assert honest_return == pytest.approx(0.4)

    silent, _, _ = _play(ladder, [])  # never calls the tool
    assert silent.get_reward() == 0.0

    late, _, replies = _play(ladder, ["stop", "up", "up", "stop", "stop"])  # acts after the end
    assert late.get_reward() == 0.0
    assert all("episode is over" in r for r in replies[1:])

    huge, _, replies = _play(ladder, ["up" * 200_000, "u" + "p" * 10**6])
    assert huge.get_reward() == 0.0 and replies[0] == "unknown command"

    crashed, _, replies = _play(ladder, ["up", "up", "up", "crash", "stop"])
    assert crashed.get_reward() == 0.0 < honest_return
    assert "failed" in replies[3] and "failed" in replies[4]
    assert crashed.failure is not None and crashed.failure["type"] == "EnvRaised"

    # a crash right after partial credit, and a crash before anything: both 0
    waited, _, _ = _play(ladder, ["wait", "crash"])
    assert waited.get_reward() == 0.0
    assert max(e.get_reward() for e in (silent, late, huge, crashed, waited)) <= honest_return


def test_act_never_raises_into_trl(ladder):
    env, _first, _ = _play(ladder, [])
    assert "failed" in env.act("crash")
    for weird in ("", "}", "\\boxed{", "\x00" * 10, 12345):
        assert isinstance(env.act(weird), str)


BROKEN = """
class BrokenEnv:
    def reset(self, seed=None, options=None):
        raise ValueError("cannot start")

    def step(self, action):
        return "x", 1.0, True, False, {}
"""


def test_a_program_that_cannot_start_scores_zero_without_raising(tmp_path):
    from spadekit.integrations.trl import PoolEnvironments

    with PoolEnvironments(_pool(tmp_path, BROKEN), warm=0) as envs:
        env = envs.factory()
        row = envs.dataset()[0]
        text = env.reset(**row)
        assert "failed" in text and env.failure["type"] == "EnvRaised"
        assert "failed" in env.act("win") and env.get_reward() == 0.0
        from spadekit.common.errors import ConfigError
        from spadekit.integrations.trl import teach_act_format
        from spadekit.policy.tiny import tiny_model, tiny_tokenizer

        with pytest.raises(ConfigError, match="solution"):
            teach_act_format(tiny_model(), tiny_tokenizer(), envs)


def test_any_action_text_is_answered_and_scored_in_range(tmp_path):
    from hypothesis import HealthCheck, given, settings, strategies as st

    from spadekit.integrations.trl import PoolEnvironments

    with PoolEnvironments(_pool(tmp_path, LADDER), max_turns=3, warm=0) as envs:
        env = envs.factory()
        env_id = next(iter(envs.programs))

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.lists(st.text(max_size=300), min_size=1, max_size=4))
        def play(actions):
            env.reset(env_id=env_id, seed=0)
            for action in actions:
                assert isinstance(env.act(action), str)
            assert 0.0 <= env.get_reward() <= 1.0

        play()


# -- (c) programs never run in the trainer's process ------------------------------------------


def test_program_runs_outside_the_trainer_process(ladder, tmp_path):
    import psutil

    env, first, _ = _play(ladder, [])
    reported_pid = int(first.rsplit(" ", 1)[1])
    assert reported_pid != os.getpid()
    workers = psutil.Process().children(recursive=True)
    assert workers, "the program must live in a child process"
    target = Path.cwd() / f"escaped-{os.getpid()}.txt"
    for path in (target, tmp_path / "escaped.txt"):
        env.reset(env_id=env.env_id, seed=1)
        env.act(f"escape {path}")
        assert not path.exists()


# -- (d) the hint is withheld ---------------------------------------------------------------


def test_hint_never_shown(pick_pool):
    from transformers.utils import get_json_schema

    from spadekit.integrations.trl import PoolEnvironments

    with PoolEnvironments(pick_pool, seeds_per_env=3, first_seed=98, warm=0) as envs:
        rows = envs.dataset().to_list()
        assert len(rows) == 3 and {r["seed"] for r in rows} == {98, 99, 100}
        assert HINT not in json.dumps(rows)
        env = envs.factory()
        assert HINT not in json.dumps(get_json_schema(env.act))
        seen = []
        for row in rows:  # seed 99: the program echoes its own hint; it is cut out
            seen.append(env.reset(**row))
            seen += [env.act("c"), env.act("a"), env.act("a")]
        assert "Pick a letter" in seen[4] and "[withheld]" in seen[4]
        assert all(HINT not in text for text in seen)


# -- (f) typed errors --------------------------------------------------------------------------


def test_typed_errors(tmp_path, pick_pool):
    from spadekit.common.errors import ConfigError
    from spadekit.integrations.trl import PoolEnvironments, check_tool_template
    from spadekit.policy.tiny import tiny_tokenizer

    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no environment programs"):
        PoolEnvironments(tmp_path / "empty")
    with pytest.raises(ConfigError, match="positive int"):
        PoolEnvironments(pick_pool, max_turns=0)
    with PoolEnvironments(pick_pool, warm=0) as envs:
        env = envs.factory()
        with pytest.raises(ConfigError, match="unknown env_id"):
            env.reset(env_id="0" * 12, seed=0)
    with pytest.raises(ConfigError, match="closed"):
        envs.factory()
    with pytest.raises(ConfigError, match="tool_chat_template"):
        check_tool_template(tiny_tokenizer())  # ChatML without tools


def test_missing_trl_names_the_extra(pick_pool):
    code = ("import sys; sys.modules['trl'] = None\n"
            "from spadekit.integrations.trl import PoolEnvironments\n"
            "from spadekit.common.errors import ConfigError\n"
            f"envs = PoolEnvironments({str(pick_pool)!r}, warm=0)\n"
            "try:\n    envs.dataset()\nexcept ConfigError as exc:\n    print('ERR', exc)\n"
            "finally:\n    envs.close()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert "ERR" in out.stdout and "`trl` extra" in out.stdout and "install.sh" in out.stdout


def test_tool_chat_template_makes_chatml_tool_capable():
    from trl.chat_template_utils import supports_tool_calling

    from spadekit.integrations.trl import check_tool_template, tool_chat_template
    from spadekit.policy.tiny import tiny_tokenizer

    tokenizer = tool_chat_template(tiny_tokenizer())
    assert supports_tool_calling(tokenizer)
    check_tool_template(tokenizer)
    assert tool_chat_template(tokenizer) is tokenizer


# -- (g) no leaked workers --------------------------------------------------------------------


def test_close_leaves_no_worker(pick_pool):
    import psutil

    from spadekit.integrations.trl import PoolEnvironments

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with PoolEnvironments(pick_pool, warm=1) as envs:
        envs_list = [envs.factory() for _ in range(3)]
        row = envs.dataset()[0]
        for env in envs_list:
            env.reset(**row)
        for env in envs_list:  # reset again: the old worker goes
            env.reset(**row)
        live = {p.pid for p in psutil.Process().children(recursive=True)} - before
        assert len(live) >= 3
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [p for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"leaked sandbox processes: {left}"


# -- (a) GRPO steps with environment_factory really train ---------------------------------------


def _teach_tool_format(model, tokenizer, envs, steps=120):
    """A few supervised steps on ``act`` calls (a or b) so the tiny model calls the tool."""
    import torch

    row = envs.dataset()[0]
    env = envs.factory()
    messages = [dict(m) for m in row["prompt"]]
    messages[-1]["content"] += env.reset(**row)
    prompt = tokenizer.apply_chat_template(messages, tools=[env.act], add_generation_prompt=True,
                                           tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    targets = []
    for letter in "ab":
        call = '<tool_call>\n{"name": "act", "arguments": {"action": "%s"}}\n</tool_call>' % letter
        targets.append(tokenizer(call + "<|im_end|>", add_special_tokens=False).input_ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        batch = [prompt_ids + t for t in targets]
        ids = torch.tensor(batch)
        labels = ids.clone()
        labels[:, : len(prompt_ids)] = -100
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss)


def test_grpo_steps_with_pool_environments_change_weights(pick_pool, tmp_path):
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from spadekit.integrations.trl import PoolEnvironments, tool_chat_template
    from spadekit.policy.tiny import tiny_model, tiny_tokenizer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(0)
    model, tokenizer = tiny_model(), tool_chat_template(tiny_tokenizer())
    with PoolEnvironments(pick_pool, seeds_per_env=4, max_turns=2, warm=1) as envs:
        assert _teach_tool_format(model, tokenizer, envs) < 0.5
        before = [p.detach().clone() for p in model.parameters()]
        args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=3, num_generations=4,
                          per_device_train_batch_size=4, max_completion_length=160,
                          max_tool_calling_iterations=2, use_cpu=True, learning_rate=1e-3,
                          logging_steps=1, save_strategy="no", report_to=[], seed=0,
                          disable_tqdm=True)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args,
                              train_dataset=envs.dataset(), environment_factory=envs.factory)
        trainer.train()
        instances = list(envs._instances)
    logs = [r for r in trainer.state.log_history if "reward" in r]
    assert [tool.__name__ for tool in trainer.tools] == ["act"]
    assert trainer.state.global_step == 3 and len(logs) == 3
    assert sum(r["tools/call_frequency"] for r in logs) > 0, logs
    assert any(r["rewards/PoolEnv/std"] > 0 for r in logs), logs
    assert all(0.0 <= r["rewards/PoolEnv/mean"] <= 1.0 for r in logs)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    assert all(env._env is None for env in instances)  # closed with the pool


# -- (h) the example script ---------------------------------------------------------------------


def test_example_script_runs_on_the_tiny_model(pick_pool, tmp_path):
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "trl_pool.py"), str(pick_pool), "--model", "tiny",
         "--steps", "2", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["model"] == "tiny"
    assert summary["teach_loss"] < 0.1 and sum(summary["tool_calls_per_completion"]) > 0
    assert len(summary["mean_env_reward"]) == 2
    assert all(0.0 <= r <= 1.0 for r in summary["mean_env_reward"])
    assert summary["weights_changed"] is True
    assert time.monotonic() - started < 90
