"""Thinking models: the environment sees only the text after ``</think>``, every sampled token is
still trained, and per-turn samples (``train.sample_granularity="turn"``)."""

from __future__ import annotations

import time

import pytest
import yaml

from conftest import ECHO
from spadekit.selfplay.advantages import Sample, per_turn_samples, turn_spans
from spadekit.envs.program import EnvProgram
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.policy.tiny import tiny_tokenizer
from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from spadekit.rollout.thinking import split_thinking
from spadekit.train.config import TrainConfig

TOK = tiny_tokenizer()

# Echoes what it got; wins only when the action is exactly \boxed{right}.
JUDGE = r'''
class JudgeEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
    def reset(self, seed=None, options=None):
        self.t = 0
        return "answer", {}
    def step(self, action):
        self.t += 1
        won = action == "\\boxed{right}"
        return "got:" + action, 1.0 if won else 0.0, won, self.t >= self.max_turns, {}
'''

THINKING = "<think>long reasoning " * 20 + "with \\boxed{wrong}</think> \\boxed{right}"


class LocalJudge:
    def __init__(self):
        self.got = []

    def reset(self, *, seed=None, options=None):
        return "answer", {}

    def step(self, action):
        self.got.append(action)
        won = action == "\\boxed{right}"
        return "got:" + action, 1.0 if won else 0.0, won, len(self.got) >= 3, {}


def scripted(*answers: str) -> ScriptedPolicy:
    state = {"n": 0}

    def respond(_ids, _text):
        state["n"] += 1
        return answers[(state["n"] - 1) % len(answers)]

    return ScriptedPolicy(TOK, respond)


def prog(code: str) -> EnvProgram:
    return EnvProgram(code=code)


# -- split_thinking ----------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("<think>a \\boxed{x}</think> \\boxed{y}", ("<think>a \\boxed{x}</think>", "\\boxed{y}")),
    ("<THINK>a</ Think >b< think >c</think>\n\n d",
     ("<THINK>a</ Think >b< think >c</think>", "d")),
    ("</think>\n\nanswer", ("</think>", "answer")),  # template opened the block in the prompt
    ("draft <think> ran out of tok", ("<think> ran out of tok", "draft")),  # unclosed
    ("<think>a</think> ans <think> more", ("<think>a</think><think> more", "ans")),
    ("plain \\boxed{x}  ", ("", "plain \\boxed{x}  ")),
    ("I think so", ("", "I think so")),
    ("", ("", "")),
])
def test_split_thinking(text, expected):
    assert split_thinking(text) == expected


def test_split_thinking_is_linear_on_huge_inputs():
    for big in ("<think>" + "x <" * 2_000_000 + "</think> ok",
                "< / think" * 500_000 + "</think>ok",
                "<think" * 1_000_000,
                "<" + " " * 3_000_000):
        t = time.perf_counter()
        split_thinking(big)
        assert time.perf_counter() - t < 2.0


# -- the rollout ---------------------------------------------------------------------------------

def test_env_sees_only_the_visible_text_and_thinking_tokens_are_trained(pool):
    engine = RolloutEngine(scripted(THINKING), pool,
                           RolloutConfig(max_turns=3, max_new_tokens=2048))
    local = LocalJudge()
    tr, tr_local = engine.run([EpisodeSpec(prog(JUDGE), seed=0),
                               EpisodeSpec(None, seed=0, env_factory=lambda: local)])
    for t in (tr, tr_local):
        assert t.failure is None, t.failure
        assert t.stop_reason == "terminated" and t.episode_return == 1.0
        assert [x.observation for x in t.turns] == ["got:\\boxed{right}"]
        assert t.turns[0].action == "\\boxed{right}"
        assert t.turns[0].thinking_chars == len(THINKING) - len(" \\boxed{right}")
        assert t.messages[-1] == {"role": "assistant", "content": THINKING}  # full text kept
        # every sampled token, the thinking's included, is in the loss mask
        (a, b), = turn_spans(t.loss_mask, t.turns)
        assert b - a == t.turns[0].new_tokens
        assert TOK.decode(t.token_ids[a:b], skip_special_tokens=True) == THINKING
        assert all(t.loss_mask[a:b])
    assert local.got == ["\\boxed{right}"]


def test_unclosed_thinking_and_no_thinking_and_the_knob_off(pool):
    cases = [("<think>still thinking \\boxed{right}", "", 3),   # unclosed: nothing visible
             ("\\boxed{wrong}", "\\boxed{wrong}", 3),            # no thinking: unchanged
             ("  \\boxed{right} ", "  \\boxed{right} ", 3)]      # unchanged, whitespace too
    for text, action, n in cases:
        engine = RolloutEngine(scripted(text), pool, RolloutConfig(max_turns=3))
        tr, = engine.run([EpisodeSpec(prog(JUDGE), seed=0)])
        assert [t.action for t in tr.turns] == [action] * n
        assert [t.observation for t in tr.turns] == ["got:" + action] * n
        assert all(t.thinking_chars == (len(text) if "<think>" in text else 0)
                   for t in tr.turns)
        assert sum(tr.loss_mask) == sum(t.new_tokens for t in tr.turns)
    engine = RolloutEngine(scripted(THINKING), pool,
                           RolloutConfig(max_turns=2, max_new_tokens=2048, strip_thinking=False))
    tr, = engine.run([EpisodeSpec(prog(JUDGE), seed=0)])
    assert [t.action for t in tr.turns] == [THINKING] * 2 and tr.episode_return == 0.0
    assert all(t.thinking_chars == 0 for t in tr.turns)


# -- per-turn samples ----------------------------------------------------------------------------

def test_per_turn_samples_of_a_real_three_turn_trajectory(pool):
    engine = RolloutEngine(scripted("<think>hmm</think> one", "two", "<think>x</think> three"),
                           pool, RolloutConfig(max_turns=3))
    tr, = engine.run([EpisodeSpec(prog(ECHO), seed=0)])  # ECHO truncates at max_turns
    assert len(tr.turns) == 3 and tr.failure is None
    for i, t in enumerate(tr.logprobs):  # distinct behaviour logprobs, to check the alignment
        tr.logprobs[i] = float(i) if tr.loss_mask[i] else 0.0
    samples = per_turn_samples(tr, 0.75, group_id="env", truncated=True)
    assert len(samples) == 3
    assert all(isinstance(s, Sample) and s.role == "agent" and s.group_id == "env"
               and s.advantage == 0.75 and s.weight == 1.0 and s.truncated for s in samples)
    summed = [0] * len(tr.loss_mask)
    for s, turn in zip(samples, tr.turns):
        n = len(s.token_ids)
        assert s.token_ids == tr.token_ids[:n]                   # a prefix of the episode
        assert s.behaviour_logprobs == tr.logprobs[:n]           # aligned with it
        assert sum(s.loss_mask) == turn.new_tokens
        assert s.loss_mask[-1] == 1                              # ends with the turn's tokens
        for i, m in enumerate(s.loss_mask):
            summed[i] += m
    assert summed == tr.loss_mask                                # the masks partition the mask
    assert [len(s.token_ids) for s in samples] == sorted({len(s.token_ids) for s in samples})
    texts = [TOK.decode([x for x, m in zip(s.token_ids, s.loss_mask) if m],
                        skip_special_tokens=True) for s in samples]
    assert texts == ["<think>hmm</think> one", "two", "<think>x</think> three"]
    # a dict (Trajectory.to_dict()) works too; a mask that does not match the turns is refused
    assert [s.token_ids for s in per_turn_samples(tr.to_dict(), 0.0)] == \
        [s.token_ids for s in samples]
    with pytest.raises(ValueError):
        turn_spans(tr.loss_mask, tr.turns[:1])
    assert per_turn_samples({"token_ids": [1, 2], "loss_mask": [0, 0], "logprobs": None},
                            1.0) == []


def test_sample_granularity_knob():
    assert TrainConfig().sample_granularity == "episode"
    assert TrainConfig(sample_granularity="turn").to_dict()["sample_granularity"] == "turn"
    with pytest.raises(ValueError):
        TrainConfig(sample_granularity="token")


def test_selfplay_with_per_turn_samples_trains_and_records_the_choice(tmp_path):
    from test_selfplay import LETTERS, config, designer_responder

    from spadekit.policy.registry import load_policy
    from spadekit.selfplay.loop import SelfPlay

    # two turns per episode unless solved at once
    two_turns = LETTERS.replace('return "Scored %.2f." % score, score, True, False, {}',
                                'return "Scored %.2f." % score, score, self.t >= 2, False, {}')
    assert two_turns != LETTERS
    programs = [two_turns.replace('"solve"', f'"{w}"') for w in ("solve", "train")]
    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(programs))
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    cfg = config(tmp_path, rounds=1, **{"train.sample_granularity": "turn"})
    with SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=designer) as sp:
        m0, = sp.run()
    assert m0["valid"] == 2 and m0["agent_episodes"] == 8
    assert 1.0 < m0["agent_samples_per_episode"] <= 2.0
    assert m0["train/optimizer_steps"] == 1
    assert any(not before[k].equal(v) for k, v in policy.model.state_dict().items())
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["train"]["sample_granularity"] == "turn"


# -- replies cut inside <think>, and chat-template options per role (issue 12, defect 4) ------

from hypothesis import given, strategies as st  # noqa: E402

from spadekit.policy.chat import ChatRenderer  # noqa: E402
from spadekit.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from spadekit.rollout.thinking import ends_inside_thinking, prompt_opens_thinking  # noqa: E402

# A hybrid-thinking template in the style of Qwen3's: with enable_thinking false the generation
# prompt closes an empty thinking block, so the model answers at once.
HYBRID_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
NO_THINK = "<think>\n\n</think>"


def hybrid_tokenizer():
    tok = tiny_tokenizer()
    tok.chat_template = HYBRID_TEMPLATE
    return tok


def _reference_cut(text: str) -> bool:
    """Independent rule for exact lowercase tags: an opening tag after the last closing one."""
    close = text.rfind("</think>")
    return text.find("<think>", close + len("</think>") if close >= 0 else 0) >= 0


@given(st.lists(st.sampled_from(["<think>", "</think>", "a", " ", "\\boxed{x}", "think", "<"]),
                max_size=12))
def test_ends_inside_thinking_matches_a_reference_rule(parts):
    text = "".join(parts)
    assert ends_inside_thinking(text) == _reference_cut(text)
    # when the prompt opened the block, only a closing tag ends it
    assert ends_inside_thinking(text, prompt_opens=True) == ("</think>" not in text
                                                             or _reference_cut(text))


@pytest.mark.parametrize("text,cut", [
    ("<think>the budget ran out in the mid", True),
    ("<think>done</think>HINT: count the corners.", False),
    ("< THINK >x</think>y<think>again", True),
    ("HINT: no thinking at all", False),
])
def test_ends_inside_thinking_cases(text, cut):
    assert ends_inside_thinking(text) is cut


def test_prompt_opens_thinking():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")


def test_chat_template_options_reach_messages_requests_and_the_renderer():
    tok = hybrid_tokenizer()
    seen = []
    policy = ScriptedPolicy(tok, lambda _ids, text: seen.append(text) or "ok")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    policy.generate([GenerationRequest(messages=messages, params=SamplingParams()),
                     GenerationRequest(messages=messages, params=SamplingParams(),
                                       chat_template_kwargs={"enable_thinking": False})])
    assert NO_THINK not in seen[0] and NO_THINK in seen[1]
    assert NO_THINK in tok.decode(ChatRenderer(tok, (), {"enable_thinking": False})
                                  .prompt_ids("s", "obs"))
    assert NO_THINK not in tok.decode(ChatRenderer(tok).prompt_ids("s", "obs"))


def test_agent_chat_template_options_reach_every_turn(pool):
    tok = hybrid_tokenizer()
    policy = ScriptedPolicy(tok, lambda _ids, _text: "\\boxed{wrong}")
    engine = RolloutEngine(policy, pool, RolloutConfig(max_turns=2, max_new_tokens=16),
                           chat_template_kwargs={"enable_thinking": False})
    [tr] = engine.run([EpisodeSpec(prog(JUDGE), seed=0)])
    text = tok.decode(tr.token_ids)
    assert text.count(NO_THINK) == 2   # the first prompt and the second turn's observation


def test_a_hint_cut_inside_thinking_is_counted_and_the_option_fixes_it(tmp_path):
    """A hybrid designer that thinks unless told not to: with a 48-token hint budget its hint
    ends inside <think> (counted, shown in the round table) unless chat_template.hint turns
    thinking off."""
    from spadekit.cli.train import _round_table
    from spadekit.policy.registry import load_policy
    from spadekit.selfplay.loop import SelfPlay
    from test_selfplay import WORDS, config, designer_responder

    results = {}
    for label, extra in (("thinking", {}), ("off", {
            "chat_template.hint": "{enable_thinking: false}"})):
        base = designer_responder(WORDS)

        def respond(ids, text, base=base):
            if "You write privileged hints" in text and NO_THINK not in text:
                return "<think>" + "let me look at the reward code first " * 20
            return base(ids, text)

        designer = ScriptedPolicy(hybrid_tokenizer(), respond)
        cfg = config(tmp_path / label, rounds=1, **{"designer.hint_max_new_tokens": 48},
                     **extra)
        with SelfPlay(cfg, tmp_path / label / "run", policy=load_policy("tiny"),
                      designer_policy=designer) as sp:
            results[label] = sp.run()[0]
    thinking, off = results["thinking"], results["off"]
    assert thinking["thinking_cut/hint"] == 2 and thinking["hints_ok"] == 0
    assert thinking["thinking_cut/designer"] == 0
    assert "thinking cut" in str(_round_table(thinking).caption)
    assert off["thinking_cut/hint"] == 0 and off["hints_ok"] == 2
