"""The evaluation contract every suite adapter implements, and the answer environment they share.

A :class:`Suite` implements ``load_items(limit)`` (:class:`EvalItem` rows, ``limit`` per
dataset), ``score(item, completion)`` (a number in [0, 1]; never raises, a malformed completion
scores 0) and ``make_env(item)`` (a trusted in-process text environment). :class:`AnswerEnv`
serves single-answer suites: each reply is scored, one scoring >= 1.0 ends the episode, else the
model may retry up to ``max_turns`` replies; the return is the last reply's score. A win is a
score >= ``WIN_THRESHOLD`` (1.0).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Callable

from spadekit.envs.actions import extract_answer, extract_boxed
from spadekit.common.errors import SpadekitError
from spadekit.rollout.engine import EpisodeSpec

WIN_THRESHOLD = 1.0
ANSWER_SYSTEM = (
    "Solve the problem. Think step by step if it helps, then give your final answer inside "
    "<answer>...</answer> (or \\boxed{...}); only the last one counts.")
RETRY_TEXT = ("Your answer is not correct. Check your reasoning and reply with a corrected final "
              "answer inside <answer>...</answer>.")


class EvalError(SpadekitError):
    """An evaluation cannot run: unknown suite, unreadable suite file, missing optional package."""

    reason = "eval"


@dataclass(frozen=True)
class SuiteDefaults:
    """Sampling settings of a suite (the paper's where it states them); the CLI overrides them."""

    k: int = 1
    """Samples per item (Avg@k)."""
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 8192
    """Per assistant turn."""
    max_turns: int = 1
    """Assistant turns an item may take."""
    system_prompt: str = ANSWER_SYSTEM


@dataclass
class EvalItem:
    """One benchmark item. ``id`` is unique within its suite (it keys head-to-head comparisons)."""

    id: str
    dataset: str
    """The finest named grouping (a Reasoning Gym dataset, a BFCL category, a JSONL file)."""
    group: str
    """The roll-up bucket the summary reports (RG-Math, a skill, a BFCL category, ...)."""
    prompt: str
    """The first user message, as the model sees it."""
    answer: Any = None
    """The gold answer where there is one (shown in reports; adapters may score from ``data``)."""
    data: dict[str, Any] = field(default_factory=dict)
    """What the adapter needs to build the environment and score (JSON-safe)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Suite(ABC):
    """A benchmark adapter. Subclasses set ``name`` and ``defaults`` and implement the two
    abstract methods; most override ``make_env`` only when the item is not a single answer."""

    name: str = ""
    defaults: SuiteDefaults = SuiteDefaults()

    @abstractmethod
    def load_items(self, limit: int | None = None) -> list[EvalItem]:
        """The suite's items, at most ``limit`` per dataset, in a stable order."""

    @abstractmethod
    def score(self, item: EvalItem, completion: Any) -> float:
        """Score a completion in [0, 1]; never raises (malformed input scores 0.0)."""

    def make_env(self, item: EvalItem, max_turns: int | None = None) -> Any:
        """The environment the policy plays for ``item`` (default: an :class:`AnswerEnv`)."""
        return AnswerEnv(item.prompt, lambda text: self.score(item, text),
                         max_turns or self.defaults.max_turns)

    def episode_spec(self, item: EvalItem, seed: int, max_turns: int, system: str | None,
                     tag: dict[str, Any]) -> EpisodeSpec:
        """How the runner plays one sample of ``item`` (default: ``make_env`` in-process)."""
        return EpisodeSpec(None, seed=seed, tag=tag, system=system or None,
                           env_factory=partial(self.make_env, item, max_turns))

    def groups(self) -> dict[str, str] | None:
        """Optional: dataset -> group mapping, for reports that list empty groups too."""
        return None


def safe_score(fn: Callable[[], Any]) -> float:
    """Run a scorer; anything it raises, or a non-finite or non-numeric result, scores 0.0.
    The result is clipped into [0, 1]."""
    try:
        value = fn()
        value = float(value)
    except Exception:
        return 0.0
    if not math.isfinite(value):
        return 0.0
    return min(1.0, max(0.0, value))


def final_answer(text: Any) -> str | None:
    """The answer a reply commits to: the last ``<answer>...</answer>``, else the last top-level
    ``\\boxed{...}``, else None. Never raises."""
    if not isinstance(text, str):
        return None
    found = extract_answer(text)
    if found is not None:
        return found
    return extract_boxed(text)


class AnswerEnv:
    """A question answered in up to ``max_turns`` replies (Gymnasium contract over text).

    ``scorer(reply_text) -> float`` must not raise (wrap it with :func:`safe_score`; this class
    does so again). Reward per step is that reply's score; the episode terminates on a win or on
    the last allowed reply, so the episode return is the final reply's score.
    """

    def __init__(self, question: str, scorer: Callable[[str], float], max_turns: int = 1,
                 retry_text: str = RETRY_TEXT):
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        self.question = question
        self.scorer = scorer
        self.max_turns = max_turns
        self.retry_text = retry_text
        self.turn = 0
        self.scores: list[float] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[str, dict]:
        self.turn = 0
        self.scores = []
        return self.question, {"max_turns": self.max_turns}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turn += 1
        score = safe_score(lambda: self.scorer(action))
        self.scores.append(score)
        done = score >= WIN_THRESHOLD or self.turn >= self.max_turns
        info = {"score": score, "attempt": self.turn}
        if done:
            return "", score, True, False, info
        return self.retry_text, score, False, False, info
