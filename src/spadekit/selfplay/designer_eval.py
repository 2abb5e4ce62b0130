"""What a designer writes, measured: valid, multi-turn and novel shares.

``sample_designs`` asks a policy for ``n`` programs with the loop's own designer prompt, for
skills and documents the caller gives, and validates each with the loop's validator. A valid
program is **multi-turn** when every solution replay took two or more turns and the game does
not give its answer away (``gives_answer_away``), and **novel** when it is no near-duplicate
(``memory.similarity_of``, ``dedup_threshold``) of ``known`` nor of an earlier sample of the
call. A kit program also records its ``composition``, whether it honours the requested skill and
whether it is **kit-novel** (a composition or own code ``known`` lacks; ``kit_identity``).
``summarize`` turns samples into shares, invalid reasons and tokens per program.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from spadekit.envs.program import EnvProgram

__all__ = ["DesignSample", "gives_answer_away", "sample_designs", "summarize"]


@dataclass
class DesignSample:
    skill: str
    doc_id: str | None
    tokens: int
    reason: str
    """``ok`` or the validator's reason."""
    stage: str
    text: str
    sha256: str | None = None
    class_name: str | None = None
    multiturn: bool | None = None
    novel: bool | None = None
    similarity: float | None = None
    """The highest similarity to a known program (or an earlier valid sample)."""
    closest: str | None = None
    composition: str | None = None
    """A kit program's parts (``number+probe+steep+budget``; None for a whole program)."""
    skill_honoured: bool | None = None
    kit_novel: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


GIVEAWAY_SEEDS = (3, 4)
"""Seeds read besides the leak check's public ones (0, 1, 2): five in all."""
_BOX = re.compile(r"\\boxed\{([^{}]*)\}")
_TOKEN = re.compile(r"[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*")


def _multiturn(details: dict[str, Any], pool: Any, program: EnvProgram, cap: int) -> bool:
    turns = details.get("solution_turns") or []
    if not turns or min(turns) < 2:
        return False
    return not gives_answer_away(pool, program, cap)


def gives_answer_away(pool: Any, program: EnvProgram, cap: int,
                      seeds: Sequence[int] = GIVEAWAY_SEEDS) -> bool:
    """True when the first observation names the answer: on every seed (the public leak
    seeds and ``seeds``) each value of the solution's last command (the words after its
    command word, in its last ``\\boxed{}`` or the whole action) appears in that seed's first
    observation, and the observation is specific to its answer (another seed's different
    answer is missing from it; a list of every option, as in "one of a, b, c", gives nothing
    away). The solutions and first observations are read by the leak check's
    ``solution_actions`` (in play's shape); False when that fails."""
    from spadekit.selfplay.generate import solution_actions

    trace = solution_actions(pool, program.code, cap, seeds)
    if trace is None:
        return False
    seen = []
    for actions, observation in zip(trace.per_seed, trace.observations):
        if not actions or not isinstance(actions[-1], str):
            return False
        boxes = _BOX.findall(actions[-1])
        values = tuple(v.lower() for v in _TOKEN.findall(boxes[-1] if boxes
                                                         else actions[-1])[1:])
        shown = set(_TOKEN.findall(str(observation).lower()))
        if not values or any(v not in shown for v in values):
            return False
        seen.append((values, shown))
    return any(a != b and any(v not in shown for v in b)
               for a, shown in seen for b, _other in seen)


def sample_designs(policy: Any, config: Any, validator: Any, *, n: int, seed: int,
                   skills: Sequence[str], documents: Sequence[tuple[str | None, str]],
                   references: Sequence[EnvProgram] = (), known: Sequence[EnvProgram] = ()
                   ) -> list[DesignSample]:
    """``n`` designer outputs of ``policy`` under ``config``, validated and classified (see
    the module). Sample ``i`` is for ``skills[i % len]`` and a document drawn by ``seed``."""
    from spadekit.policy.base import SamplingParams
    from spadekit.rollout.aids import designer_request, with_prefix
    from spadekit.selfplay.memory import fingerprint, similarity_of
    from spadekit.selfplay.kit_grammar import designer_grammar
    from spadekit.selfplay.kit_identity import kit_identity
    from spadekit.selfplay.prompts import build_designer_messages

    dcfg = config.designer
    rng = random.Random(seed)
    plan, requests = [], []
    for i in range(n):
        skill = skills[i % len(skills)]
        doc_id, text = documents[rng.randrange(len(documents))] if documents else (None, None)
        same = [p for p in references if p.skill == skill]
        k = min(dcfg.positive_seeds, len(same)) if config.use_memory else 0
        refs = rng.sample(same, k) if k else []
        messages = build_designer_messages(config.setting, skill, text if config.grounding
                                           else None, refs, None, config.turn_cap,
                                           doc_words=dcfg.max_words, style=dcfg.prompt_style)
        plan.append((skill, doc_id))
        requests.append(designer_request(policy, messages, SamplingParams(
            temperature=dcfg.temperature, top_p=dcfg.top_p, max_new_tokens=dcfg.max_new_tokens,
            seed=rng.randrange(2 ** 31), grammar=designer_grammar(
                dcfg.grammar, config.setting, skill, text if config.grounding else None,
                config.turn_cap, dcfg.max_words)), config.chat_template.for_role("designer"),
            dcfg.response_prefix))
    gens = with_prefix(policy.generate(requests), dcfg.response_prefix)
    reports = validator.validate_many([g.text for g in gens], workers=2,
                                      seeds=[rng.randrange(2 ** 63) for _ in gens])
    prints = [(p.sha256, fingerprint(p.code)) for p in known]
    known_kits = [i for i in (kit_identity(p.code) for p in known) if i is not None]
    known_compositions = {i.composition for i in known_kits}
    known_own = {own for i in known_kits for own in i.own}
    out = []
    for (skill, doc_id), gen, report in zip(plan, gens, reports):
        sample = DesignSample(skill, doc_id, len(gen.token_ids), report.reason, report.stage,
                              gen.text)
        if report.ok and report.program is not None:
            program = report.program
            mine = fingerprint(program.code)
            best = max(((similarity_of(mine, fp), sha) for sha, fp in prints),
                       default=(0.0, None))
            sample.sha256, sample.class_name = program.sha256, program.class_name
            sample.multiturn = _multiturn(report.details, validator.pool, program,
                                          config.turn_cap)
            sample.similarity, sample.closest = round(best[0], 4), best[1]
            sample.novel = best[0] < config.dedup_threshold
            prints.append((program.sha256, mine))
            ident = kit_identity(program.code)
            if ident is not None:
                sample.composition = ident.composition
                sample.skill_honoured = _kit_skill(ident) == skill
                sample.kit_novel = (ident.composition not in known_compositions or
                                    any(own not in known_own for own in ident.own))
        out.append(sample)
    return out


def _choices(sample: DesignSample) -> str:
    """The parts of a kit sample other than the one its skill's prompt names."""
    from spadekit.envs.procedural.kit import SKILL_PARTS
    from spadekit.selfplay.kit_identity import PART_KEYS

    given = PART_KEYS.get(SKILL_PARTS.get(sample.skill))
    return "+".join(p for p in (sample.composition or "").split("+") if p != given)


def _kit_skill(ident: Any) -> str | None:
    """The skill a kit program's parts make (``Combo.skill``), None with a part of its own."""
    from spadekit.envs.procedural import Combo

    try:
        return Combo.parse(ident.composition).skill
    except ValueError:
        return None


def summarize(samples: Sequence[DesignSample]) -> dict[str, Any]:
    """Shares (valid of all, multi-turn and novel of valid), invalid reasons, tokens; for kit
    programs also distinct compositions, the kit-novel share and the skill-honoured share."""
    valid = [s for s in samples if s.reason == "ok"]
    kits = [s for s in valid if s.composition is not None]
    reasons: dict[str, int] = {}
    for s in samples:
        if s.reason != "ok":
            reasons[s.reason] = reasons.get(s.reason, 0) + 1

    def share(part: int, whole: int) -> float | None:
        return round(part / whole, 4) if whole else None

    return {"samples": len(samples), "valid": len(valid),
            "valid_share": share(len(valid), len(samples)) or 0.0,
            "multiturn_share": share(sum(bool(s.multiturn) for s in valid), len(valid)),
            "novel_share": share(sum(bool(s.novel) for s in valid), len(valid)),
            "invalid_reasons": reasons,
            "kit_programs": len(kits),
            "distinct_compositions": len({s.composition for s in kits}),
            "kit_novel_share": share(sum(bool(s.kit_novel) for s in kits), len(kits)),
            # the choices the designer makes itself (the prompt names the skill's part): the
            # other three parts, so that a collapse onto one of them shows even when
            # compositions look new because the skill's part varies
            "distinct_choices": len({_choices(s) for s in kits}),
            "skill_honoured_share": share(sum(bool(s.skill_honoured) for s in kits), len(kits)),
            "tokens_mean": round(sum(s.tokens for s in samples) / len(samples), 1)
            if samples else None}
