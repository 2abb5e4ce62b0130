"""The designer phase of a self-play round: prompts -> programs -> validation -> hints -> pool.

For each environment: a skill (round robin), a grounding document, positive and negative memory
seeds; one batched ``generate`` writes all programs. Each is extracted and validated in the
sandbox; blacklisted programs earn -0.5 again without validation; near-duplicates of remembered
programs are turned away; valid ones get a hint that must pass the leak check
(``spadekit.selfplay.leaks`` literal, ``leak_probe`` empirical; counted in ``hints["leaks"]``).
Every designer sample goes to the delay buffer, due ``regen_interval`` rounds later; invalid
ones carry their fixed reward. Optional extras (``DesignerConfig``): ``judge``,
``repair_attempts``, ``hint_model`` (a failing hint model leaves hints missing, never stops the
round). Details: docs/design/selfplay.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from spadekit.selfplay.config import SelfPlayConfig
from spadekit.selfplay.leak_probe import empirical_leak
from spadekit.selfplay.leaks import leaked_fragments
from spadekit.selfplay.prompts import (build_designer_messages, build_hint_messages, parse_hint,
                                       skills_for)
from spadekit.common.errors import ConfigError
from spadekit.common.streams import RoundStreams
from spadekit.envs.extract import ExtractionError, extract_program
from spadekit.envs.program import EnvProgram
from spadekit.selfplay.generate import solution_actions
from spadekit.selfplay.judge import build_judge_messages, judge_enabled, parse_judgement
from spadekit.selfplay.memory import EnvironmentMemory
from spadekit.selfplay.kit_grammar import designer_grammar
from spadekit.policy.base import GenerationRequest, Policy, SamplingParams
from spadekit.selfplay.repair import build_repair_messages
from spadekit.selfplay.rewards import FailureReward, designer_reward_for_failure
from spadekit.rollout.aids import designer_request, with_prefix
from spadekit.sandbox.pool import SandboxPool
from spadekit.runs.store import RunStore
from spadekit.rollout.thinking import count_thinking_cut
from spadekit.sandbox.validate import DEFAULT_SEEDS, ValidationReport, Validator, to_program
from spadekit.selfplay.watch import RETIRE_PENALTY

log = logging.getLogger(__name__)

#: Seeds drawn per hint for both leak checks (the program cannot tell them from play's).
LEAK_SEEDS = 16


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
    hints: dict[str, int] = field(default_factory=lambda: {
        "ok": 0, "missing": 0, "leaks": 0, "leaks_literal": 0, "leaks_empirical": 0})
    leak_details: list[dict] = field(default_factory=list)
    """One entry per leaking hint: the program's sha256, ``literal`` or ``empirical`` and the
    evidence (the fragments spelled out, or the winning actions)."""
    designer_tokens: int = 0
    repaired: int = 0
    """Programs pooled only after repair turns (not counted in ``valid``)."""
    repair_calls: int = 0
    blacklisted: int = 0
    """Outputs (first attempts and repairs) whose program was blacklisted: never validated."""
    judge: dict[str, int] = field(default_factory=lambda: {"accept": 0, "reject": 0,
                                                           "no_verdict": 0})
    timings: dict[str, float] = field(default_factory=dict)
    thinking_cut: dict[str, int] = field(default_factory=lambda: {"designer": 0, "hint": 0})
    """Replies that ended inside an unclosed <think> (the budget ran out mid-thought)."""

    @property
    def valid_share(self) -> float:
        return self.valid / self.attempted if self.attempted else 0.0


@dataclass
class Drafts:
    """The designer's outputs of one round on their way to the pool: ``plan`` (one prompt item
    per output), ``gens`` (the generations), ``outcome`` (the running counts) and, once
    validated, ``valid`` (``(item, program, report, designer's own hint)`` per valid program)."""

    step: int
    plan: list[dict]
    gens: list[Any]
    outcome: DesignOutcome
    valid: list[tuple] = field(default_factory=list)


class DesignPhase:
    """The designer's side of a round: :meth:`design`, :meth:`validate`, :meth:`hint`."""

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
        try:
            judge_enabled(config.designer.judge, config.setting)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if int(config.designer.repair_attempts) < 0:
            raise ConfigError("designer.repair_attempts must be >= 0")
        self._judge_counts: dict[str, int] = DesignOutcome().judge
        self.blacklist_skipped = 0
        self.hint_policy = self._load_hint_policy()

    def _load_hint_policy(self) -> Policy:
        """The policy that writes hints: the designer policy, or ``designer.hint_model`` (loaded
        once; an ``openai:`` spec gets the designer policy's tokenizer)."""
        spec = getattr(self.config.designer, "hint_model", None)
        if not spec:
            return self.policy
        from spadekit.policy.registry import load_beside

        return load_beside(spec, self.policy)

    def run(self, step: int, streams: RoundStreams, phase=None) -> DesignOutcome:
        """One designer phase: :meth:`design`, :meth:`validate`, :meth:`hint` in turn;
        ``phase(text)`` is an optional context manager that shows each while it runs."""
        drafts = self.design(step, streams, phase)
        return self.hint(self.validate(drafts, streams, phase), streams, phase)

    def design(self, step: int, streams: RoundStreams, phase=None) -> Drafts:
        """SPEC point 1: ``envs_per_round`` designer prompts for the active skills (grounded on a
        corpus document, seeded from memory), generated in one batch. The documents, the memory
        references and the sampling seeds come from the round's ``corpus``, ``memory`` and
        ``design`` streams."""
        cfg, dcfg = self.config, self.config.designer
        out = DesignOutcome()
        self._judge_counts = out.judge
        self.blacklist_skipped = 0
        phase = phase or (lambda _text: contextlib.nullcontext())
        clock = time.perf_counter()
        skills = active_skills(cfg.setting, cfg.skills_per_epoch, step // cfg.regen_interval)
        plan = []
        for i in range(cfg.envs_per_round):
            skill = skills[i % len(skills)]
            doc = (self.corpus.sample(streams.get("corpus")) if self.corpus is not None
                   else None)
            positives = self.memory.positive_seeds(skill, dcfg.positive_seeds,
                                                   streams.get("memory"))
            negative = self.memory.negative_seed(skill, streams.get("memory"))
            neg = None if negative is None else (negative[0].code, negative[1])
            messages = build_designer_messages(cfg.setting, skill, doc.text if doc else None,
                                               positives, neg, cfg.turn_cap,
                                               doc_words=dcfg.max_words,
                                               style=dcfg.prompt_style)
            plan.append({"skill": skill, "doc_id": getattr(doc, "id", None),
                         "parents": [p.sha256 for p in positives], "messages": messages})
            plan[-1]["request"] = designer_request(self.policy, messages, SamplingParams(
                temperature=dcfg.temperature, top_p=dcfg.top_p,
                max_new_tokens=dcfg.max_new_tokens,
                seed=streams.get("design").randrange(2 ** 31),
                grammar=designer_grammar(dcfg.grammar, cfg.setting, skill,
                                         doc.text if doc else None, cfg.turn_cap,
                                         dcfg.max_words)),
                cfg.chat_template.for_role("designer"), dcfg.response_prefix)
        with phase(f"round {step}: design ({len(plan)} environments)"):
            gens = with_prefix(self.policy.generate([p["request"] for p in plan]),
                               dcfg.response_prefix)
        out.thinking_cut["designer"] += count_thinking_cut(
            gens, getattr(self.policy, "tokenizer", None))
        out.attempted = len(gens)
        out.timings["design"] = time.perf_counter() - clock
        return Drafts(step, plan, gens, out)

    def validate(self, drafts: Drafts, streams: RoundStreams, phase=None) -> Drafts:
        """SPEC point 3: every output extracted and checked in the sandbox (an invalid one gets
        its fixed designer reward now), failed ones optionally repaired; ``drafts.valid`` lists
        the programs that passed."""
        cfg, dcfg = self.config, self.config.designer
        step, plan, gens, out = drafts.step, drafts.plan, drafts.gens, drafts.outcome
        phase = phase or (lambda _text: contextlib.nullcontext())
        clock = time.perf_counter()
        seen: set[str] = set()
        with phase(f"round {step}: validate"):
            checks = self._check([g.text for g in gens], seen, streams)
        out.timings["validate"] = time.perf_counter() - clock
        valid_items, failed = [], []
        for item, gen, (reason, report) in zip(plan, gens, checks):
            out.designer_tokens += len(gen.token_ids)
            item["sample"] = {"sample_id": uuid.uuid4().hex, "prompt_len": len(gen.prompt_ids),
                              "token_ids": gen.prompt_ids + gen.token_ids,
                              "loss_mask": [0] * len(gen.prompt_ids) + [1] * len(gen.token_ids),
                              "logprobs": None if gen.logprobs is None or len(
                                  gen.logprobs) != len(gen.token_ids) else
                              [0.0] * len(gen.prompt_ids) + list(gen.logprobs),
                              "generated_step": step, "due_step": step + cfg.regen_interval,
                              "skill": item["skill"]}
            if reason != "ok":
                out.reasons[reason] = out.reasons.get(reason, 0) + 1
                failure = self._reject(step, item, report, reason, gen.text)
                # the designer trains on this first attempt only, with its fixed reward, even
                # if a repair turn below succeeds (SPEC point 3)
                item["sample"]["meta"] = {"fixed_reward": failure.reward, "reason": reason}
                self.store.push_delayed(item["sample"])
                if dcfg.repair_attempts > 0 and reason != "near_duplicate":
                    failed.append((item, gen.text, report))
                continue
            out.valid += 1
            own_hint = _designer_hint(gen.text)
            valid_items.append((item, report.program, report, own_hint))
        if failed:
            clock = time.perf_counter()
            with phase(f"round {step}: repair ({len(failed)} invalid)"):
                valid_items += self._repair(failed, step, streams, seen, out)
            out.timings["repair"] = time.perf_counter() - clock
        drafts.valid = valid_items
        return drafts

    def hint(self, drafts: Drafts, streams: RoundStreams, phase=None) -> DesignOutcome:
        """SPEC point 2: the hint writer reads each valid program and writes its privileged hint
        (a leaking hint is rejected); each program then joins the pool and the memory, and its
        designer sample waits ``regen_interval`` rounds for its reward."""
        dcfg = self.config.designer
        cfg = self.config
        step, out, valid_items = drafts.step, drafts.outcome, drafts.valid
        phase = phase or (lambda _text: contextlib.nullcontext())
        clock = time.perf_counter()
        with phase(f"round {step}: hint ({len(valid_items)} valid)"):
            self._hints(valid_items, out, step, streams)
        out.timings["hint"] = time.perf_counter() - clock
        for item, program, report, hint in valid_items:
            repaired = item.get("repaired")
            lineage = {"doc_id": item["doc_id"]}
            if repaired:
                lineage["repaired"] = repaired
                report.details["repaired"] = repaired
            program = EnvProgram(code=program.code, hint=hint, skill=item["skill"],
                                 domain=cfg.setting, source=f"designer:step-{step}",
                                 class_name=program.class_name)
            sha = self.store.add_environment(program, step=step, parents=item["parents"],
                                             validation=report,
                                             designer_sample_id=item["sample"]["sample_id"],
                                             lineage=lineage)
            if hint:
                self.store.put_hint(sha, hint, dcfg.hint_mode, step)
            self.memory.add(program, step=step, parents=item["parents"], validation=report)
            out.pooled.append(sha)
            if repaired:  # its designer sample (the invalid first attempt) is already queued
                continue
            item["sample"]["env_sha"] = sha
            item["sample"]["meta"] = {"reason": "ok"}
            self.store.push_delayed(item["sample"])
        out.blacklisted = self.blacklist_skipped
        return out

    def _check(self, texts: list[str], seen: set[str], streams: RoundStreams
               ) -> list[tuple[str, ValidationReport]]:
        """``(reason, report)`` per output: the sandbox stages, the near-duplicate check (memory,
        store and this round's earlier programs in ``seen``) and the judge when it is on."""
        known = [self._blacklisted(text) for text in texts]
        todo = [text for text, hit in zip(texts, known) if hit is None]
        # validation seeds from the round's validation stream, keyed by the output itself: a
        # run's validations repeat from its seed (and across a resume), one more or one fewer
        # output moves no other's, and they stay unknown to the programs
        seeds = [streams.get("validation", _text_key(text)).randrange(2 ** 63) for text in todo]
        validated = iter(self.validator.validate_many(todo, workers=2, seeds=seeds)
                         if todo else [])
        reports = [hit if hit is not None else next(validated) for hit in known]
        out = []
        for report in reports:
            if report.reason == "blacklisted":
                out.append(("blacklisted", report))
                continue
            reason, program = report.reason, report.program
            if report.ok and program is not None:
                dup, closest, sim = self.memory.is_near_duplicate(program.code)
                if dup or self.store.has_environment(program.sha256) or program.sha256 in seen:
                    reason = "near_duplicate"
                    report.details["near_duplicate_of"] = closest
                    report.details["similarity"] = sim
                else:
                    seen.add(program.sha256)
            out.append((reason, report))
        if judge_enabled(self.config.designer.judge, self.config.setting):
            todo = [i for i, (reason, _r) in enumerate(out) if reason == "ok"]
            for i, (verdict, why, raw) in zip(todo, self._judge([out[i][1].program.code
                                                                 for i in todo],
                                                                streams.get("design"))):
                if verdict != "reject":
                    continue
                program = out[i][1].program
                seen.discard(program.sha256)
                report = ValidationReport(
                    ok=False, stage="judge", reason="judge_rejected",
                    message=why or "the judge found a fatal bug",
                    details={**out[i][1].details, "judge_reply": raw[-2000:]}, program=program)
                out[i] = ("judge_rejected", report)
        return out

    def _blacklisted(self, text: str) -> ValidationReport | None:
        """A failed report for an output whose program is blacklisted (it is not validated
        again), else None. Outputs without an extractable program go to the validator."""
        try:
            program = to_program(text)
        except ExtractionError:
            return None
        reason = self.memory.blacklist_reason(program)  # exact or near-duplicate
        if reason is None:
            return None
        self.blacklist_skipped += 1
        return ValidationReport(ok=False, stage="blacklist", reason="blacklisted",
                                message=f"program {program.short_id} is blacklisted ({reason}); "
                                "not validated again", details={"blacklist_reason": reason},
                                program=program)

    def _judge(self, codes: list[str], rng: random.Random) -> list[tuple[str, str, str]]:
        """``(verdict, reason, reply)`` per program; no verdict or a failed call: accept."""
        if not codes:
            return []
        dcfg = self.config.designer
        requests = [GenerationRequest(messages=build_judge_messages(code, self.config.setting),
                                      params=SamplingParams(
                                          temperature=dcfg.judge_temperature,
                                          max_new_tokens=dcfg.judge_max_new_tokens,
                                          seed=rng.randrange(2 ** 31)),
                                      chat_template_kwargs=self.config.chat_template.for_role(
                                          "designer")) for code in codes]
        try:
            gens = self.policy.generate(requests)
        except Exception as exc:  # noqa: BLE001 - a failing judge accepts (never blocks a round)
            log.warning("judge call failed (%s); accepting %d programs", exc, len(codes))
            self._judge_counts["no_verdict"] += len(codes)
            return [("accept", "", "")] * len(codes)
        results = []
        for gen in gens:
            verdict, why = parse_judgement(gen.text)
            self._judge_counts[verdict or "no_verdict"] += 1
            results.append((verdict or "accept", why, gen.text))
        return results

    def _reject(self, step: int, item: dict, report: ValidationReport, reason: str, text: str,
                extra: dict | None = None):
        """Record one output that is not pooled (and blacklist a hang); returns its fixed
        designer reward."""
        program = report.program
        failure = designer_reward_for_failure(reason)
        if reason == "blacklisted":  # a known hang or hack: the penalty it was blacklisted with
            failure = FailureReward(RETIRE_PENALTY, False)
        if failure.blacklist and program is not None:
            self.store.blacklist(program.sha256, reason, step)
        self.store.record_rejected(
            step=step, skill=item["skill"], stage=report.stage, reason=reason,
            message=report.message, sha256=program.sha256 if program else None, text=text,
            details={**_jsonable_details(report.details), **(extra or {})})
        return failure

    def _repair(self, failed: list, step: int, streams: RoundStreams, seen: set[str],
                out: DesignOutcome) -> list:
        """Up to ``repair_attempts`` inference-only repair turns per failed output; returns the
        valid items (marked ``item["repaired"]``). Repair generations are never trained."""
        dcfg = self.config.designer
        pending = [(item, text, report, report.reason if report.reason != "ok" else "invalid",
                    report.stage) for item, text, report in failed]
        valid = []
        for attempt in range(1, dcfg.repair_attempts + 1):
            if not pending:
                break
            gens = self.policy.generate([GenerationRequest(
                messages=build_repair_messages(item["messages"], text, report),
                params=SamplingParams(temperature=dcfg.temperature, top_p=dcfg.top_p,
                                      max_new_tokens=dcfg.max_new_tokens,
                                      seed=streams.get("design").randrange(2 ** 31)),
                chat_template_kwargs=self.config.chat_template.for_role("designer"))
                for item, text, report, _r, _s in pending])
            out.repair_calls += len(gens)
            checks = self._check([g.text for g in gens], seen, streams)
            still = []
            for (item, _t, _rep, first_reason, first_stage), gen, (reason, report) in zip(
                    pending, gens, checks):
                if reason == "ok":
                    item["repaired"] = {"attempts": attempt, "first_reason": first_reason,
                                        "first_stage": first_stage}
                    out.repaired += 1
                    valid.append((item, report.program, report, _designer_hint(gen.text)))
                    continue
                self._reject(step, item, report, reason, gen.text,
                             {"repair_attempt": attempt, "first_reason": first_reason})
                if reason != "near_duplicate":
                    still.append((item, gen.text, report, first_reason, first_stage))
            pending = still
        return valid

    def _hints(self, items: list, out: DesignOutcome, step: int, streams: RoundStreams
               ) -> None:
        """Fill each valid item's hint in place (index 3); a leaking hint is rejected. Each
        program's leak-check seeds and hint sampling seed come from the round's ``hints``
        stream keyed by the program."""
        dcfg = self.config.designer
        rngs = [streams.get("hints", it[1].sha256) for it in items]
        self._leak_draws = {i: ([rng.randrange(2 ** 31) for _ in range(LEAK_SEEDS)],
                                rng.randrange(2 ** 63)) for i, rng in enumerate(rngs)}
        actions = {i: solution_actions(self.pool, it[1].code, self.config.turn_cap, seeds,
                                       random.Random(draw))
                   for i, (it, (seeds, draw)) in enumerate(zip(items, self._leak_draws.values()))}
        todo = list(range(len(items)))
        if dcfg.hint_mode == "designer":
            todo = [i for i in todo if not self._accept(items, i, items[i][3], actions, out)]
        if todo:
            requests = [GenerationRequest(
                messages=build_hint_messages(items[i][1].code, self.config.setting),
                params=SamplingParams(temperature=dcfg.hint_temperature,
                                      max_new_tokens=dcfg.hint_max_new_tokens,
                                      seed=rngs[i].randrange(2 ** 31)),
                chat_template_kwargs=self.config.chat_template.for_role("hint")) for i in todo]
            if self.hint_policy is self.policy:
                gens = self.policy.generate(requests)
            else:
                try:
                    gens = self.hint_policy.generate(requests)
                except Exception as exc:  # noqa: BLE001 - a remote hint model may be down
                    log.warning("hint model %s failed: %s", dcfg.hint_model, exc)
                    gens = []
            out.thinking_cut["hint"] += count_thinking_cut(
                gens, getattr(self.hint_policy, "tokenizer", None))
            for i, gen in zip(todo, gens):
                self._accept(items, i, parse_hint(gen.text), actions, out)
        out.hints["missing"] = sum(1 for it in items if it[3] is None)

    def _accept(self, items: list, i: int, hint: str | None, actions: dict,
                out: DesignOutcome) -> bool:
        """Keep ``hint`` for item ``i`` unless it leaks: literally (it spells out part of the
        solution, ``leaks.leaked_fragments``, on the public seeds and the ones drawn for this
        item) or empirically (actions copied out of it win on 3/4 of the drawn seeds, played in
        play's shape, ``leak_probe.empirical_leak``). A leak counts in
        ``hints["leaks"]`` and in ``hints["leaks_literal"]`` or ``hints["leaks_empirical"]``,
        with what gave it away in ``out.leak_details``."""
        item, program, report, _own = items[i]
        reason, evidence = None, None
        if hint:
            evidence = leaked_fragments(hint, actions.get(i))
            reason = "literal" if evidence else None
        if hint and reason is None:
            drawn, probe = getattr(self, "_leak_draws", {}).get(i, (None, 0))
            settings = getattr(self.validator, "settings", None)
            evidence = empirical_leak(self.pool, program.code, hint, setting=self.config.setting,
                                      seeds=drawn or getattr(settings, "seeds", None)
                                      or DEFAULT_SEEDS, max_turns=self.config.turn_cap,
                                      solution=actions.get(i), rng=random.Random(probe))
            reason = "empirical" if evidence else None
        if reason is not None:
            out.hints["leaks"] += 1
            out.hints[f"leaks_{reason}"] += 1
            out.leak_details.append({"sha256": program.sha256, "reason": reason,
                                     "evidence": [str(e)[:200] for e in evidence[:5]],
                                     "hint": hint[:500]})
            log.info("hint for %s leaks (%s): %s", program.sha256[:12], reason, evidence[:3])
            hint = None
        elif hint:
            out.hints["ok"] += 1
        items[i] = (item, program, report, hint)
        return hint is not None


def _text_key(text: str) -> str:
    """The key of one designer output in the round's ``validation`` stream."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


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
