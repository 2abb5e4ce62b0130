"""What a designer writes, measured: valid, multi-turn and novel shares (issue 23).

``sample_designs`` asks a policy for ``n`` environment programs with the loop's own designer
prompt (``build_designer_messages`` in the run's prompt style, the run's token budget, format
aid and chat template), each for a skill and a grounding document given by the caller (a
benchmark passes skills and documents the warm start never saw), with the same-skill programs
of ``references`` as the memory's references. Every output goes through the real validator in
the sandbox, the one the loop uses (solution required, garbage and random-policy margins,
lockstep determinism). A valid program is

- **multi-turn** when every replay of its ``solution()`` took at least two turns;
- **novel** when it is not a near-duplicate (the memory's own fingerprint and threshold,
  ``spadekit.selfplay.memory``) of any program in ``known`` (the warm-start pool, the memory)
  nor of an earlier valid sample of the same call: exactly what the loop's dedup gate lets
  into the pool.

``summarize`` turns the samples into the shares, the invalid reasons and tokens per program.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from spadekit.envs.program import EnvProgram

__all__ = ["DesignSample", "sample_designs", "summarize"]


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _multiturn(details: dict[str, Any]) -> bool:
    turns = details.get("solution_turns") or []
    return bool(turns) and min(turns) >= 2


def sample_designs(policy: Any, config: Any, validator: Any, *, n: int, seed: int,
                   skills: Sequence[str], documents: Sequence[tuple[str | None, str]],
                   references: Sequence[EnvProgram] = (), known: Sequence[EnvProgram] = ()
                   ) -> list[DesignSample]:
    """``n`` designer outputs of ``policy`` under ``config``, validated and classified (see
    the module). Sample ``i`` is for ``skills[i % len]`` and a document drawn by ``seed``."""
    from spadekit.policy.base import SamplingParams
    from spadekit.rollout.aids import designer_request, with_prefix
    from spadekit.selfplay.memory import DUPLICATE_THRESHOLD, fingerprint, jaccard
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
            seed=rng.randrange(2 ** 31)), config.chat_template.for_role("designer"),
            dcfg.response_prefix))
    gens = with_prefix(policy.generate(requests), dcfg.response_prefix)
    reports = validator.validate_many([g.text for g in gens], workers=2,
                                      seeds=[rng.randrange(2 ** 63) for _ in gens])
    prints = [(p.sha256, fingerprint(p.code)) for p in known]
    out = []
    for (skill, doc_id), gen, report in zip(plan, gens, reports):
        sample = DesignSample(skill, doc_id, len(gen.token_ids), report.reason, report.stage,
                              gen.text)
        if report.ok and report.program is not None:
            program = report.program
            mine = fingerprint(program.code)
            best = max(((jaccard(mine, fp), sha) for sha, fp in prints), default=(0.0, None))
            sample.sha256, sample.class_name = program.sha256, program.class_name
            sample.multiturn = _multiturn(report.details)
            sample.similarity, sample.closest = round(best[0], 4), best[1]
            sample.novel = best[0] < DUPLICATE_THRESHOLD
            prints.append((program.sha256, mine))
        out.append(sample)
    return out


def summarize(samples: Sequence[DesignSample]) -> dict[str, Any]:
    """Shares (valid of all, multi-turn and novel of valid), invalid reasons, tokens."""
    valid = [s for s in samples if s.reason == "ok"]
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
            "tokens_mean": round(sum(s.tokens for s in samples) / len(samples), 1)
            if samples else None}
