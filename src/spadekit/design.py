"""The designer phase of a self-play round: prompts -> programs -> validation -> hints -> pool.

For each environment to design: pick a skill (round robin over the active skills), a grounding
document, positive and negative memory seeds; one batched ``generate`` call writes all programs.
Each output is extracted and validated in the sandbox; near-duplicates of remembered programs are
turned away; valid programs get a hint (a second call of the same policy reading the code, or the
designer's own ``HINT:`` line) that must not spell out the solution. Every designer sample (its
prompt, sampled ids and behaviour logprobs) goes to the delay buffer, due ``regen_interval``
rounds later; invalid ones carry their fixed reward (0, or -0.5 and a blacklist entry for a hang).
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from spadekit.config import SelfPlayConfig
from spadekit.designer import (build_designer_messages, build_hint_messages, leaked_fragments,
                               parse_hint, skills_for)
from spadekit.envs.extract import ExtractionError, extract_program
from spadekit.envs.program import EnvProgram
from spadekit.generate import solution_actions
from spadekit.memory import EnvironmentMemory
from spadekit.policy.base import GenerationRequest, Policy, SamplingParams
from spadekit.rewards import designer_reward_for_failure
from spadekit.sandbox.pool import SandboxPool
from spadekit.store import RunStore
from spadekit.validate import Validator


def active_skills(setting: str, per_epoch: int, epoch: int) -> list[str]:
    """SPEC point 11: ``per_epoch`` skills active per regeneration epoch, round robin."""
    skills = skills_for(setting)
    start = (epoch * per_epoch) % len(skills)
    return [skills[(start + i) % len(skills)] for i in range(min(per_epoch, len(skills)))]


@dataclass
class DesignOutcome:
    """What one designer phase produced, for metrics and the round summary."""

    attempted: int = 0
    valid: int = 0
    pooled: list[str] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    hints: dict[str, int] = field(default_factory=lambda: {"ok": 0, "missing": 0, "leaks": 0})
    designer_tokens: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def valid_share(self) -> float:
        return self.valid / self.attempted if self.attempted else 0.0


class DesignPhase:
    def __init__(self, config: SelfPlayConfig, policy: Policy, pool: SandboxPool,
                 validator: Validator, store: RunStore, memory: EnvironmentMemory,
                 corpus: Any) -> None:
        self.config = config
        self.policy = policy
        self.pool = pool
        self.validator = validator
        self.store = store
        self.memory = memory
        self.corpus = corpus

    def run(self, step: int, rng: random.Random, phase=None) -> DesignOutcome:
        """One designer phase; ``phase(text)`` is an optional context manager that shows each
        sub-phase (design, validate, hint) while it runs."""
        cfg, dcfg = self.config, self.config.designer
        out = DesignOutcome()
        phase = phase or (lambda _text: contextlib.nullcontext())
        clock = time.perf_counter()
        skills = active_skills(cfg.setting, cfg.skills_per_epoch, step // cfg.regen_interval)
        plan = []
        for i in range(cfg.envs_per_round):
            skill = skills[i % len(skills)]
            doc = self.corpus.sample(rng) if self.corpus is not None else None
            positives = self.memory.positive_seeds(skill, dcfg.positive_seeds, rng)
            negative = self.memory.negative_seed(skill, rng)
            neg = None if negative is None else (negative[0].code, negative[1])
            messages = build_designer_messages(cfg.setting, skill, doc.text if doc else None,
                                               positives, neg, cfg.env_max_turns,
                                               doc_words=dcfg.max_words)
            plan.append({"skill": skill, "doc_id": getattr(doc, "id", None),
                         "parents": [p.sha256 for p in positives]})
            plan[-1]["request"] = GenerationRequest(messages=messages, params=SamplingParams(
                temperature=dcfg.temperature, top_p=dcfg.top_p,
                max_new_tokens=dcfg.max_new_tokens, seed=rng.randrange(2 ** 31)))
        with phase(f"round {step}: design ({len(plan)} environments)"):
            gens = self.policy.generate([p["request"] for p in plan])
        out.attempted = len(gens)
        out.timings["design"] = time.perf_counter() - clock
        clock = time.perf_counter()
        with phase(f"round {step}: validate"):
            reports = self.validator.validate_many([g.text for g in gens], workers=2)
        out.timings["validate"] = time.perf_counter() - clock
        valid_items = []
        for item, gen, report in zip(plan, gens, reports):
            out.designer_tokens += len(gen.token_ids)
            item["sample"] = {"sample_id": uuid.uuid4().hex, "prompt_len": len(gen.prompt_ids),
                              "token_ids": gen.prompt_ids + gen.token_ids,
                              "loss_mask": [0] * len(gen.prompt_ids) + [1] * len(gen.token_ids),
                              "logprobs": None if gen.logprobs is None else
                              [0.0] * len(gen.prompt_ids) + list(gen.logprobs),
                              "generated_step": step, "due_step": step + cfg.regen_interval,
                              "skill": item["skill"]}
            reason = report.reason
            program = report.program
            if report.ok and program is not None:
                dup, closest, sim = self.memory.is_near_duplicate(program.code)
                if dup or self.store.has_environment(program.sha256):
                    reason = "near_duplicate"
                    report.details["near_duplicate_of"] = closest
                    report.details["similarity"] = sim
            if reason != "ok":
                out.reasons[reason] = out.reasons.get(reason, 0) + 1
                failure = designer_reward_for_failure(reason)
                if failure.blacklist and program is not None:
                    self.store.blacklist(program.sha256, reason, step)
                self.store.record_rejected(
                    step=step, skill=item["skill"], stage=report.stage, reason=reason,
                    message=report.message, sha256=program.sha256 if program else None,
                    text=gen.text, details=_jsonable_details(report.details))
                item["sample"]["meta"] = {"fixed_reward": failure.reward, "reason": reason}
                self.store.push_delayed(item["sample"])
                continue
            out.valid += 1
            own_hint = _designer_hint(gen.text)
            valid_items.append((item, program, report, own_hint))
        clock = time.perf_counter()
        with phase(f"round {step}: hint ({len(valid_items)} valid)"):
            self._hints(valid_items, out, step, rng)
        out.timings["hint"] = time.perf_counter() - clock
        for item, program, report, hint in valid_items:
            program = EnvProgram(code=program.code, hint=hint, skill=item["skill"],
                                 domain=cfg.setting, source=f"designer:step-{step}",
                                 class_name=program.class_name)
            sha = self.store.add_environment(program, step=step, parents=item["parents"],
                                             validation=report,
                                             designer_sample_id=item["sample"]["sample_id"],
                                             lineage={"doc_id": item["doc_id"]})
            if hint:
                self.store.put_hint(sha, hint, dcfg.hint_mode, step)
            self.memory.add(program, step=step, parents=item["parents"], validation=report)
            item["sample"]["env_sha"] = sha
            item["sample"]["meta"] = {"reason": "ok"}
            self.store.push_delayed(item["sample"])
            out.pooled.append(sha)
        return out

    def _hints(self, items: list, out: DesignOutcome, step: int, rng: random.Random) -> None:
        """Fill each valid item's hint in place (index 3); a leaking hint is rejected."""
        dcfg = self.config.designer
        actions = {i: solution_actions(self.pool, it[1].code, self.config.env_max_turns)
                   for i, it in enumerate(items)}
        todo = list(range(len(items)))
        if dcfg.hint_mode == "designer":
            todo = [i for i in todo if not self._accept(items, i, items[i][3], actions, out)]
        if todo:
            gens = self.policy.generate([GenerationRequest(
                messages=build_hint_messages(items[i][1].code, self.config.setting),
                params=SamplingParams(temperature=dcfg.hint_temperature,
                                      max_new_tokens=dcfg.hint_max_new_tokens,
                                      seed=rng.randrange(2 ** 31))) for i in todo])
            for i, gen in zip(todo, gens):
                self._accept(items, i, parse_hint(gen.text), actions, out)
        out.hints["missing"] = sum(1 for it in items if it[3] is None)

    def _accept(self, items: list, i: int, hint: str | None, actions: dict,
                out: DesignOutcome) -> bool:
        item, program, report, _own = items[i]
        if hint and leaked_fragments(hint, actions.get(i) or []):
            out.hints["leaks"] += 1
            hint = None
        elif hint:
            out.hints["ok"] += 1
        items[i] = (item, program, report, hint)
        return hint is not None


def _designer_hint(text: str) -> str | None:
    try:
        return parse_hint(extract_program(text).hint)
    except ExtractionError:
        return None


def _jsonable_details(details: dict) -> dict:
    """The JSON-safe part of a validation report's details (for the rejected table)."""
    import json

    out = {}
    for key, value in (details or {}).items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = repr(value)[:500]
        out[key] = value
    return out
