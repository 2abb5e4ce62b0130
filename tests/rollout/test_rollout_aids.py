"""Format aids (issue 17): the agent's response prefix and demonstrations, the designer's prefix.

The prefix is prompt text: its tokens carry loss mask 0, the environment receives prefix + the
sampled reply exactly, and the finished sequence is the chat template's rendering of the
conversation (so nothing drifts). Demonstrations are earlier turns of the prompt, never trained.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spadekit.envs import library
from spadekit.common.errors import ConfigError
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.policy.tiny import tiny_tokenizer
from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from spadekit.rollout.aids import DEMONSTRATIONS, designer_request, with_prefix
from test_rollout import _spans  # noqa: E402  (the same mask spans as the engine tests)

TOK = tiny_tokenizer()


class Recorder:
    """Trusted in-process game that keeps every action it receives; ends after three turns."""

    seen: list[str] = []

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return f"round {seed}", {}

    def step(self, action):
        Recorder.seen.append(action)
        self.t += 1
        return f"got {len(action)} chars", 0.5, self.t >= 3, False, {}


def _play(config: RolloutConfig, reply: str):
    Recorder.seen = []
    policy = ScriptedPolicy(TOK, lambda _ids, _text: reply)
    [tr] = RolloutEngine(policy, None, config).run(
        [EpisodeSpec(None, seed=7, env_factory=Recorder)])
    return tr


def test_prefix_reaches_the_environment_and_is_never_trained():
    tr = _play(RolloutConfig(max_turns=5, response_prefix={"games": "\\boxed{"}), "pack 1 2}")
    assert tr.stop_reason == "terminated" and len(tr.turns) == 3
    assert Recorder.seen == ["\\boxed{pack 1 2}"] * 3
    assert [t.action for t in tr.turns] == Recorder.seen
    assistant = [m["content"] for m in tr.messages if m["role"] == "assistant"]
    assert assistant == ["\\boxed{pack 1 2}"] * 3
    # the sampled spans are the reply alone; the prefix sits just before each, unmasked
    spans = _spans(tr.loss_mask)
    assert len(spans) == 3
    for a, b in spans:
        assert TOK.decode(tr.token_ids[a:b], skip_special_tokens=True) == "pack 1 2}"
        assert TOK.decode(tr.token_ids[:a]).endswith("\\boxed{")
    # the whole sequence is the template's rendering of the conversation: no drift
    rendered = TOK.apply_chat_template(tr.messages, tokenize=False, add_generation_prompt=False)
    assert TOK.decode(tr.token_ids) == rendered


def test_prefix_is_per_setting():
    tr = _play(RolloutConfig(max_turns=2, response_prefix={"tooluse": "<tool_call>"}), "x}")
    assert Recorder.seen == ["x}"] * 2  # an in-process game without tools is the games setting


def test_demonstrations_open_the_conversation_as_prompt_tokens():
    plain = _play(RolloutConfig(max_turns=1), "\\boxed{a}")
    tr = _play(RolloutConfig(max_turns=1, demonstrations=("games",)), "\\boxed{a}")
    demos = list(DEMONSTRATIONS["games"])
    assert tr.messages[1:1 + len(demos)] == demos
    assert tr.messages[1 + len(demos)] == {"role": "user", "content": "round 7"}
    assert tr.prompt_len > plain.prompt_len
    assert sum(tr.loss_mask) == sum(plain.loss_mask)  # only the reply is trained
    text = TOK.decode(tr.token_ids[:tr.prompt_len])
    assert all(m["content"] in text for m in demos)
    rendered = TOK.apply_chat_template(tr.messages, tokenize=False, add_generation_prompt=False)
    assert TOK.decode(tr.token_ids) == rendered


def test_prefix_on_a_sandboxed_library_game(pool):
    """A real program in the sandbox scores the prefixed reply: the knapsack's pack command."""
    program = library.program(library.get("games_knapsack_reveal"))
    policy = ScriptedPolicy(TOK, lambda _ids, _text: "pack 1}")
    cfg = RolloutConfig(max_turns=2, response_prefix={"games": "\\boxed{"})
    [tr] = RolloutEngine(policy, pool, cfg).run([EpisodeSpec(program, seed=3)])
    [bare] = RolloutEngine(policy, pool, RolloutConfig(max_turns=2)).run(
        [EpisodeSpec(program, seed=3)])
    assert tr.stop_reason == "terminated" and tr.turns[0].action == "\\boxed{pack 1}"
    assert "Packed weight" in tr.turns[0].observation
    assert not bare.terminated and bare.episode_return == 0.0  # "pack 1}" alone: no command


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix=st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=12),
       reply=st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), min_size=1,
                     max_size=24))
def test_environment_gets_prefix_plus_reply_exactly(prefix, reply):
    tr = _play(RolloutConfig(max_turns=2, response_prefix={"games": prefix}), reply)
    assert [t.action for t in tr.turns] == [prefix + reply] * len(tr.turns)
    for a, b in _spans(tr.loss_mask):
        assert TOK.decode(tr.token_ids[a:b], skip_special_tokens=True) == reply


@pytest.mark.parametrize("kwargs", [{"response_prefix": {"chess": "x"}},
                                    {"response_prefix": {"games": 3}},
                                    {"response_prefix": "\\boxed{"},
                                    {"demonstrations": ("games", "poker")},
                                    {"demonstrations": "poker"}])
def test_bad_aids_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        RolloutConfig(**kwargs)


def test_one_setting_given_as_a_string_is_a_list_of_one():
    """A bare string names one setting (never read as its letters)."""
    assert RolloutConfig(demonstrations="games").demonstrations == ("games",)
    assert RolloutConfig(action_grammar="games").action_grammar == ("games",)


def test_designer_prefix_is_prompt_and_joins_the_text():
    from spadekit.policy.base import SamplingParams

    seen = []
    policy = ScriptedPolicy(TOK, lambda _ids, text: seen.append(text) or "Env:\n    pass\n```")
    messages = [{"role": "system", "content": "write"}, {"role": "user", "content": "a game"}]
    req = designer_request(policy, messages, SamplingParams(max_new_tokens=64), None,
                           "```python\nclass ")
    [gen] = with_prefix(policy.generate([req]), "```python\nclass ")
    assert seen[0].endswith("```python\nclass ")
    assert gen.text == "```python\nclass Env:\n    pass\n```"
    assert TOK.decode(gen.token_ids, skip_special_tokens=True) == "Env:\n    pass\n```"
    assert TOK.decode(gen.prompt_ids).endswith("```python\nclass ")
    plain = designer_request(policy, messages, SamplingParams(), None, "")
    assert plain.messages == messages and plain.prompt_ids is None


def test_designer_prefix_needs_token_ids():
    from spadekit.policy.base import SamplingParams

    class TextOnly:
        name, capabilities, tokenizer = "text-only", frozenset({"logprobs"}), TOK

    with pytest.raises(ConfigError):
        designer_request(TextOnly(), [{"role": "user", "content": "x"}], SamplingParams(),
                         None, "```python\n")


def _grammar_play(config: RolloutConfig, seed: int):
    from spadekit.policy.tiny import load_tiny_policy

    Recorder.seen = []
    [tr] = RolloutEngine(load_tiny_policy(seed=0), None, config).run(
        [EpisodeSpec(None, seed=seed, env_factory=Recorder)])
    return tr


@pytest.mark.parametrize("prefix", ["\\boxed{", ""])
def test_the_action_grammar_makes_every_reply_one_closed_box(prefix):
    """The random tiny model writes anything; under the action grammar every action the game
    receives is one closed box of at most ACTION_WORDS short words, with or without the games
    prefix, and every sampled token stays trainable."""
    pytest.importorskip("llguidance")
    import re

    from spadekit.rollout.aids import ACTION_WORD_CHARS, ACTION_WORDS

    word = r"[A-Za-z0-9,.:;()+*/=_-]{1,%d}" % ACTION_WORD_CHARS
    pattern = re.compile(r"\\boxed\{%s( %s){0,%d}\}" % (word, word, ACTION_WORDS - 1))
    prefixes = {"games": prefix} if prefix else {}
    # a byte-level tokenizer: a token per character, so the budget holds the longest action
    config = RolloutConfig(max_turns=3, max_new_tokens=200, temperature=1.0, seed=3,
                           response_prefix=prefixes, action_grammar=("games",))
    for seed in range(3):
        tr = _grammar_play(config, seed)
        assert tr.stop_reason == "terminated" and len(Recorder.seen) == 3
        assert all(pattern.fullmatch(a) for a in Recorder.seen), Recorder.seen
        assert sum(tr.loss_mask) > 0
    free = _grammar_play(RolloutConfig(max_turns=3, max_new_tokens=200, temperature=1.0,
                                       seed=3, response_prefix=prefixes), 0)
    assert not all(pattern.fullmatch(a) for a in Recorder.seen), free.turns


def test_the_action_grammar_is_for_games_only():
    from spadekit.rollout.aids import action_grammar_for

    with pytest.raises(ConfigError, match="action_grammar"):
        RolloutConfig(action_grammar=("tooluse",))
    with pytest.raises(ConfigError, match="action_grammar"):
        RolloutConfig(action_grammar="tooluse")
    config = RolloutConfig(action_grammar=("games",))
    assert action_grammar_for(config, "tooluse") is None
    assert action_grammar_for(RolloutConfig(), "games") is None
    assert action_grammar_for(config, "games").startswith('start: "\\\\boxed{" ACTION')


def test_every_library_and_procedural_kit_solution_fits_the_action_grammar(pool):
    """What a game needs the agent to say fits the action grammar: the solutions of the
    bundled library games and of one procedural kit program per composition (the longest
    items the kit grammar offers) on a few seeds, read in the sandbox, are accepted by the
    grammar's matcher token by token."""
    pytest.importorskip("llguidance")
    import random

    import llguidance
    import llguidance.hf

    from spadekit.envs.procedural import all_combos, compose_kit
    from spadekit.rollout.aids import action_grammar_for
    from spadekit.selfplay.warmstart import _solutions

    end = TOK.convert_tokens_to_ids("<|im_end|>")
    llt = llguidance.hf.from_tokenizer(TOK, eos_token=end)
    grammar = llguidance.LLMatcher.grammar_from_lark(action_grammar_for(
        RolloutConfig(action_grammar=("games",)), "games"))
    words = ["harbor", "lanterns", "meadowland", "copperish", "thistles", "willowing",
             "garnets", "pebbly", "orchidist", "junipers"]
    programs = [p for p in (library.program(e) for e in library.list_library())
                if (p.domain or "games") == "games"]
    programs += [compose_kit(c, words, i, 8) for i, c in enumerate(all_combos())
                 if c.info == "probe"]
    actions = set()
    for program in programs:
        for seq in _solutions(pool, program, [random.Random(program.sha256).randrange(1000)
                                              for _ in range(3)], 8).values():
            actions.update(seq)
    assert len(actions) > 50
    for action in sorted(actions):
        matcher = llguidance.LLMatcher(llt, grammar, log_level=0)
        ids = TOK.encode(action, add_special_tokens=False)
        assert matcher.consume_tokens(ids) and matcher.consume_token(end), action
