"""Evaluation suites: an explicit registry of benchmark adapters, one module each.

Layer 5: eval.
May import: common, envs, sandbox, runs, policy, rollout, train.

A suite spec is ``NAME`` or ``NAME:ARGUMENT``: ``rg-hard``/``rg-easy`` (Reasoning Gym, 100
datasets x 50 items, ``rg-hard:broad`` or ``rg-hard:gcd,chain_sum``), ``bfcl-mt`` (BFCL v4
multi-turn, ``bfcl-mt:base,miss_func``), ``qa:FILE`` (a JSONL file of questions, Avg@k) and
``envs:SOURCE`` (environment programs in the sandbox). Adapters import their optional packages
only when built, so ``import spadekit.eval`` is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from spadekit.eval.base import EvalError, EvalItem, Suite, SuiteDefaults

__all__ = ["SUITES", "EvalError", "EvalItem", "Suite", "SuiteDefaults", "make_suite",
           "suite_label", "suite_names"]


@dataclass(frozen=True)
class SuiteEntry:
    name: str
    build: Callable[[str | None], Suite]
    argument: str
    """What goes after ``NAME:`` ('' when nothing may follow; 'required ...' when needed)."""
    summary: str


def _rg(level: str) -> Callable[[str | None], Suite]:
    def build(arg: str | None) -> Suite:
        from spadekit.eval.rg import MAPPINGS, ReasoningGymSuite

        if not arg or arg in MAPPINGS:
            return ReasoningGymSuite(level=level, mapping=arg or "narrow", cache=True)
        return ReasoningGymSuite(level=level, datasets=[d.strip() for d in arg.split(",")
                                                        if d.strip()], cache=True)
    return build


def _bfcl(arg: str | None) -> Suite:
    from spadekit.eval.bfcl import BFCLMultiTurnSuite

    if arg:
        return BFCLMultiTurnSuite(categories=[c.strip() for c in arg.split(",") if c.strip()])
    return BFCLMultiTurnSuite()


def _qa(arg: str | None) -> Suite:
    from spadekit.eval.qa import QASuite

    return QASuite(arg)


def _envs(arg: str | None) -> Suite:
    from spadekit.eval.envs import EnvPoolSuite

    return EnvPoolSuite(arg)


SUITES: dict[str, SuiteEntry] = {e.name: e for e in (
    SuiteEntry("rg-hard", _rg("hard"), "optional: narrow (default) or broad, or datasets a,b",
               "Reasoning Gym hard config, 100 datasets, win at score >= 1.0, 2 turns"),
    SuiteEntry("rg-easy", _rg("easy"), "optional: narrow (default) or broad, or datasets a,b",
               "Reasoning Gym default (easy) parameters, same datasets and seed"),
    SuiteEntry("bfcl-mt", _bfcl, "optional categories: base,miss_func,miss_param,long_context",
               "BFCL v4 multi-turn: tool calls against simulated APIs, state checker"),
    SuiteEntry("qa", _qa, "required: a JSONL file", "your question/answer file, Avg@k"),
    SuiteEntry("envs", _envs, "required: library, a pool dir or a run dir",
               "environment programs in the sandbox, mean return per skill"),
)}


def suite_names() -> list[str]:
    return list(SUITES)


def suite_label(spec: str) -> str:
    """A short name without slashes for metric keys: ``qa:/data/aime25.jsonl`` -> ``qa:aime25``."""
    name, sep, arg = spec.partition(":")
    if "/" not in arg:
        return spec
    stem = arg.rstrip("/").rsplit("/", 1)[-1]
    return f"{name}:{stem.rsplit('.', 1)[0] if '.' in stem else stem}"


def make_suite(spec: str) -> Suite:
    """Build the suite named by ``spec`` (``NAME`` or ``NAME:ARGUMENT``); ``EvalError`` when
    the name is unknown or a required argument is missing."""
    if not isinstance(spec, str) or not spec.strip():
        raise EvalError("a suite spec must be a non-empty string")
    name, sep, arg = spec.strip().partition(":")
    entry = SUITES.get(name)
    if entry is None:
        raise EvalError(f"unknown suite {name!r}; known: {', '.join(SUITES)} "
                        "(qa and envs take an argument, e.g. qa:aime25.jsonl, envs:library)")
    if entry.argument.startswith("required") and not arg:
        raise EvalError(f"suite {name!r} needs an argument: {name}:<{entry.argument[10:]}>")
    return entry.build(arg or None)
