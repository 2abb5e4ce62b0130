"""``spadekit generate``: a frozen policy designs environment programs into a pool directory.

The designer role writes ``n`` programs in batches (skills round robin unless one is given, each
prompt grounded on a sampled corpus document with the library's same-skill programs as seeds);
outputs are validated in the sandbox and valid ones get a hint (regenerated once if it leaks,
else kept without one). The format is :mod:`spadekit.runs.pool`'s. Crash safety: records are
appended, flushed and fsynced one at a time, a program file precedes its pool line, the summary
is replaced atomically, a partial last line moves to ``<file>.partial``. Re-running into the
same directory never duplicates (known sha256s and the same job's recorded indices are
skipped), so an interrupted run resumes and a larger ``n`` extends it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

from spadekit.selfplay.corpus import Corpus, load_corpus
from spadekit.sandbox.batch import start_many
from spadekit.selfplay.leak_probe import MAX_DECOYS, MAX_SEEDS, MIN_GROUP
from spadekit.selfplay.leaks import SolutionTrace, program_constants
from spadekit.selfplay.prompts import (DOC_WORDS, build_designer_messages, build_hint_messages,
                               leaked_fragments, normalize_skill, parse_hint, skills_for)
from spadekit.envs.extract import ExtractionError, extract_program
from spadekit.envs.program import EnvProgram
from spadekit.common.errors import SandboxError
from spadekit.common.jsonl import JsonlAppender
from spadekit.runs.pool import (POOL_FILE, PROGRAMS_DIR, REJECTED_FILE, SUMMARY_FILE,  # noqa: F401
                                PoolError, _atomic_write, _header, _now, _read_jsonl,
                                _report_summary, _sha, load_pool, write_pool)

__all__ = ["GenerateSummary", "PoolError", "load_pool", "run_generate", "write_pool"]

HINT_MODES = ("second_call", "designer")
_LEAK_SEEDS = (0, 1, 2)


@dataclasses.dataclass
class GenerateSummary:
    """What one ``run_generate`` call did (also written as ``summary.json``)."""

    out: str
    model: str
    setting: str
    skills: list[str]
    requested: int
    status: str = "running"
    attempted: int = 0
    resumed: int = 0
    valid: int = 0
    invalid: int = 0
    duplicates: int = 0
    reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    stages: dict[str, int] = dataclasses.field(default_factory=dict)
    per_skill: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    hints: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(
        ("written", "from_designer", "second_call", "retried", "leaks_rejected",
         "unparseable", "missing"), 0))
    tokens: dict[str, Any] = dataclasses.field(default_factory=dict)
    timings_s: dict[str, float] = dataclasses.field(default_factory=dict)
    pool_total: int = 0
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    corpus: dict[str, Any] = dataclasses.field(default_factory=dict)
    started_at: str = ""
    finished_at: str = ""
    error: str | None = None

    @property
    def valid_share(self) -> float | None:
        """Share of this run's designer outputs that are valid programs (duplicates of pool
        programs count as valid); ``None`` when nothing was generated."""
        return (self.valid + self.duplicates) / self.attempted if self.attempted else None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        share = self.valid_share
        out["valid_share"] = None if share is None else round(share, 4)
        return out


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------


def _derive(seed: int, *parts: Any) -> int:
    """A 31-bit seed derived from ``seed`` and ``parts`` (stable across processes)."""
    text = "/".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


def solution_actions(pool: Any, code: str, max_turns: int, seeds: Iterable[int] = (),
                     rng: random.Random | None = None) -> SolutionTrace | None:
    """The program's solution actions over the public leak seeds and ``seeds`` (the design
    phase draws them per hint), for the hint leak check: a
    :class:`~spadekit.selfplay.leaks.SolutionTrace` (a list of the actions, seed after seed,
    which also holds them per seed, each seed's first observation and the program's constants),
    or ``None`` when the program does not load or its ``solution()`` fails. Read in play's
    shape, so a program cannot tell it by instance order: one worker, a group of at least
    ``MIN_GROUP`` instances (the seeds plus a drawn number of decoys on drawn seeds) created,
    all reset, then asked for their ``solution()``, in a shuffled order."""
    rng = rng if rng is not None else random.Random(len(code))
    wanted = list(_LEAK_SEEDS) + [s for s in seeds if isinstance(s, int)][:MAX_SEEDS]
    decoys = max(MIN_GROUP - len(wanted), 0) + rng.randint(0, MAX_DECOYS)
    order = list(range(len(wanted) + decoys))
    rng.shuffle(order)
    all_seeds = wanted + [rng.randrange(2 ** 31) for _ in range(decoys)]
    try:
        sb = pool.acquire(code)
    except SandboxError:
        return None
    try:
        started = start_many([(sb, max_turns, all_seeds[k], None) for k in order])
        if any(isinstance(r, SandboxError) for r in started):
            return None
        at = {k: started[n] for n, k in enumerate(order)}
        per_seed = [list(at[k][0].solution()) for k in range(len(wanted))]
        observations = [at[k][1] for k in range(len(wanted))]
        return SolutionTrace([a for actions in per_seed for a in actions], per_seed=per_seed,
                             observations=observations, constants=program_constants(code))
    except SandboxError:
        return None
    finally:
        pool.release(sb)


@dataclasses.dataclass
class _Item:
    """One designer output travelling through the pipeline."""

    index: int
    skill: str
    doc_id: str | None
    doc_words: int
    seed: int
    references: list[str]
    text: str = ""
    gen: dict[str, Any] = dataclasses.field(default_factory=dict)
    program: EnvProgram | None = None
    extraction: dict[str, Any] = dataclasses.field(default_factory=dict)
    report: Any = None
    actions: list[str] | None = None
    hint: str | None = None
    hint_info: dict[str, Any] = dataclasses.field(default_factory=dict)
    designed_at: str = ""


# ---------------------------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------------------------


def run_generate(model: Any, setting: str = "games", skill: str | None = None, n: int = 8,
                 out: str | Path = "pool", corpus: str | Corpus | None = None, seed: int = 0,
                 temperature: float = 0.6, max_new_tokens: int = 4096,
                 hint_mode: str = "second_call", workers: int = 2, batch_size: int = 8,
                 top_p: float = 1.0, hint_temperature: float = 0.3,
                 hint_max_new_tokens: int = 256, max_turns: int = 12, references: int = 2,
                 doc_words: int | None = None, validate_timeout: float = 60.0,
                 sandbox_config: Any = None, pool: Any = None, console: Any = None
                 ) -> GenerateSummary:
    """Design ``n`` programs with a frozen policy into the pool directory ``out``.

    ``model``: a registry name (``load_policy``) or a ready ``Policy``. ``skill``: one skill,
    several separated by commas, or ``None`` for all of the setting's skills, round robin.
    ``corpus``: see :func:`spadekit.selfplay.corpus.load_corpus`. ``references``: library programs of the
    same skill shown as positive seeds (0 for none). ``doc_words``: document budget (default
    6000 games / 4000 tool use). ``pool``: an existing ``SandboxPool`` (else one is made from
    ``sandbox_config`` with ``workers`` warm workers). ``console``: a rich Console for progress.
    """
    from spadekit.selfplay.prompts import SETTINGS

    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    if hint_mode not in HINT_MODES:
        raise ValueError(f"hint_mode must be one of {HINT_MODES}, got {hint_mode!r}")
    if n < 0 or batch_size < 1 or workers < 1:
        raise ValueError("n must be >= 0, batch_size and workers >= 1")
    skills = (skills_for(setting) if not skill else
              [normalize_skill(setting, s) for s in skill.split(",") if s.strip()])
    t_start = time.monotonic()
    out = Path(out)
    (out / PROGRAMS_DIR).mkdir(parents=True, exist_ok=True)
    docs = load_corpus(corpus)
    limit = DOC_WORDS[setting] if doc_words is None else doc_words
    summary = GenerateSummary(out=str(out), model="", setting=setting, skills=skills,
                              requested=n, started_at=_now())
    summary.corpus = {k: v for k, v in docs.describe().items()
                      if k in ("name", "description", "documents", "words", "path")}

    t = time.monotonic()
    policy = model
    if isinstance(model, str):
        from spadekit.policy import load_policy

        policy = load_policy(model)
    model_name = getattr(policy, "name", str(model))
    summary.model = model if isinstance(model, str) else model_name
    summary.timings_s["load_model"] = round(time.monotonic() - t, 3)

    settings = {"skill_arg": skill, "seed": seed, "temperature": temperature, "top_p": top_p,
                "max_new_tokens": max_new_tokens, "hint_mode": hint_mode,
                "hint_temperature": hint_temperature, "hint_max_new_tokens": hint_max_new_tokens,
                "max_turns": max_turns, "references": references, "doc_words": limit}
    # the job: everything that decides the outputs (not batch size or worker count)
    job = _sha(json.dumps({"model": summary.model, "setting": setting, "skills": skills,
                           "corpus": summary.corpus.get("name"), **settings}, sort_keys=True))[:16]
    summary.settings = {**settings, "batch_size": batch_size, "workers": workers, "job": job}

    # what earlier runs already did
    seen = {rec.get("sha256") for _, rec in _read_jsonl(out / POOL_FILE, strict=False)}
    done = {rec["generation"]["index"] for _, rec in _read_jsonl(out / POOL_FILE, strict=False)
            if isinstance(rec.get("generation"), dict) and rec["generation"].get("job") == job}
    done |= {rec.get("index") for _, rec in _read_jsonl(out / REJECTED_FILE, strict=False)
             if rec.get("job") == job}
    todo = [i for i in range(n) if i not in done]
    summary.resumed = n - len(todo)

    from spadekit.envs.library import list_library, source
    from spadekit.policy.base import GenerationRequest, SamplingParams
    from spadekit.sandbox.validate import Validator, ValidatorSettings

    library = [e for e in list_library() if e.setting == setting]
    pool_out, rejected_out = JsonlAppender(out / POOL_FILE), JsonlAppender(out / REJECTED_FILE)
    own_pool = pool is None
    if own_pool:
        from spadekit.sandbox import SandboxConfig, SandboxPool

        try:
            pool = SandboxPool(sandbox_config or SandboxConfig(), warm=min(workers, 4))
        except BaseException:
            pool_out.close()
            rejected_out.close()
            raise
    validator = Validator(pool, ValidatorSettings(max_turns=max_turns,
                                                  total_timeout=validate_timeout))
    progress = None
    prompt_tokens: list[int] = []
    completion_tokens: list[int] = []
    finish: dict[str, int] = {}
    timings = dict.fromkeys(("design", "validate", "hint", "write"), 0.0)

    def hint_requests(items: list[_Item], retry: bool) -> list[Any]:
        reqs = []
        for it in items:
            prev = it.hint_info.get("attempts", [{}])[-1] if retry else {}
            messages = build_hint_messages(it.program.code, setting, prev.get("text"),
                                           prev.get("problem"))
            reqs.append(GenerationRequest(messages=messages, params=SamplingParams(
                temperature=hint_temperature, top_p=top_p, max_new_tokens=hint_max_new_tokens,
                seed=_derive(seed, "hint", it.index, int(retry)))))
        return reqs

    def judge_hint(it: _Item, text: str | None, source_name: str) -> bool:
        hint = parse_hint(text)
        problem = None
        if hint is None:
            problem = "unparseable"
            summary.hints["unparseable"] += 1
        else:
            leaked = leaked_fragments(hint, it.actions or [])
            if leaked:
                problem = "leak: spells out " + ", ".join(repr(x) for x in leaked[:3])
                summary.hints["leaks_rejected"] += 1
        it.hint_info.setdefault("attempts", []).append(
            {"source": source_name, "text": (text or "")[:2000], "problem": problem})
        if problem is None:
            it.hint, it.hint_info["source"] = hint, source_name
        return problem is None

    def reject(it: _Item, stage: str, reason: str, message: str, details: Any = None) -> None:
        record = {"job": job, "index": it.index, "skill": it.skill, "setting": setting,
                  "stage": stage, "reason": reason, "message": message[:2000],
                  "doc_id": it.doc_id, "seed": it.seed, **it.gen,
                  "code_sha256": it.program.sha256 if it.program else None,
                  "text_sha256": _sha(it.text), "raw_text": it.text, "at": _now()}
        if details:
            record["details"] = details
        rejected_out.write(record)

    try:
        if console is not None and todo:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)

            progress = Progress(TextColumn("{task.description:<9}"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), console=console)
            progress.start()
            bars = {name: progress.add_task(name, total=len(todo) if name != "hint" else 0)
                    for name in ("design", "validate", "hint")}
        for start in range(0, len(todo), batch_size):
            items: list[_Item] = []
            requests = []
            for index in todo[start:start + batch_size]:
                sk = skills[index % len(skills)]
                doc = docs.sample(random.Random(_derive(seed, "doc", index))) if len(docs) else None
                refs = [e for e in library if e.skill == sk][:references]
                item = _Item(index, sk, doc.id if doc else None,
                             min(doc.words, limit) if doc else 0, _derive(seed, "design", index),
                             [e.name for e in refs])
                messages = build_designer_messages(setting, sk, doc.text if doc else None,
                                                   [source(e.name) for e in refs],
                                                   max_turns=max_turns, doc_words=limit)
                requests.append(GenerationRequest(messages=messages, params=SamplingParams(
                    temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                    seed=item.seed)))
                items.append(item)
            # design --------------------------------------------------------------------------
            t = time.monotonic()
            generations = policy.generate(requests)
            timings["design"] += time.monotonic() - t
            stamp = _now()
            for item, g in zip(items, generations):
                item.text, item.designed_at = g.text, stamp
                item.gen = {"prompt_tokens": len(g.prompt_ids), "completion_tokens": g.num_tokens,
                            "finish_reason": g.finish_reason}
                prompt_tokens.append(len(g.prompt_ids))
                completion_tokens.append(g.num_tokens)
                finish[g.finish_reason] = finish.get(g.finish_reason, 0) + 1
            summary.attempted += len(items)
            if progress:
                progress.advance(bars["design"], len(items))
            # extract + validate --------------------------------------------------------------
            t = time.monotonic()
            candidates = []
            for item in items:
                per = summary.per_skill.setdefault(item.skill, {"attempted": 0, "valid": 0})
                per["attempted"] += 1
                try:
                    ex = extract_program(item.text)
                except ExtractionError as exc:
                    summary.invalid += 1
                    summary.reasons[exc.reason] = summary.reasons.get(exc.reason, 0) + 1
                    summary.stages["extract"] = summary.stages.get("extract", 0) + 1
                    reject(item, "extract", exc.reason, exc.message)
                    continue
                item.extraction = {"method": ex.method, "notes": list(ex.notes),
                                   "designer_hint": ex.hint}
                item.program = EnvProgram(
                    code=ex.code, skill=item.skill, domain=setting, class_name=ex.class_name,
                    source=f"designer:{model_name}/{job}/{item.index}")
                if item.program.sha256 in seen:
                    summary.duplicates += 1
                    per["valid"] += 1
                    reject(item, "dedup", "duplicate", "this program is already in the pool")
                    continue
                candidates.append(item)

            def check(it: _Item) -> None:
                it.report = validator.validate(it.program)
                if it.report.ok and it.report.details.get("solution") == "replayed":
                    it.actions = solution_actions(pool, it.program.code, max_turns)

            valid: list[_Item] = []
            with ThreadPoolExecutor(max_workers=workers) as ex_pool:
                for it, _ in zip(candidates, ex_pool.map(check, candidates)):
                    if progress:
                        progress.advance(bars["validate"])
                    if it.report.ok and it.program.sha256 not in seen:
                        seen.add(it.program.sha256)
                        valid.append(it)
                    elif it.report.ok:
                        summary.duplicates += 1
                        summary.per_skill[it.skill]["valid"] += 1
                        reject(it, "dedup", "duplicate", "this program is already in the pool")
                    else:
                        r = it.report
                        summary.invalid += 1
                        summary.reasons[r.reason] = summary.reasons.get(r.reason, 0) + 1
                        summary.stages[r.stage] = summary.stages.get(r.stage, 0) + 1
                        reject(it, r.stage, r.reason, r.message, _report_summary(r))
            if progress:
                progress.advance(bars["validate"], len(items) - len(candidates))
            timings["validate"] += time.monotonic() - t
            # hints ---------------------------------------------------------------------------
            t = time.monotonic()
            if progress and valid:
                progress.update(bars["hint"], total=progress.tasks[bars["hint"]].total
                                + len(valid))
            retry: list[_Item] = []
            if hint_mode == "designer":
                for it in valid:
                    it.hint_info["leak_checked"] = it.actions is not None
                    if not judge_hint(it, it.extraction.get("designer_hint"), "designer"):
                        retry.append(it)
            elif valid:
                gens = policy.generate(hint_requests(valid, retry=False))
                for it, g in zip(valid, gens):
                    it.hint_info["leak_checked"] = it.actions is not None
                    if not judge_hint(it, g.text, "second_call"):
                        retry.append(it)
            if retry:
                summary.hints["retried"] += len(retry)
                gens = policy.generate(hint_requests(retry, retry=True))
                for it, g in zip(retry, gens):
                    judge_hint(it, g.text, "second_call_retry")
            timings["hint"] += time.monotonic() - t
            # write ---------------------------------------------------------------------------
            t = time.monotonic()
            for it in valid:
                if it.hint is None:
                    summary.hints["missing"] += 1
                else:
                    summary.hints["written"] += 1
                    key = "from_designer" if it.hint_info["source"] == "designer" else "second_call"
                    summary.hints[key] += 1
                program = dataclasses.replace(it.report.program or it.program, hint=it.hint,
                                              skill=it.skill, domain=setting,
                                              source=it.program.source)
                _atomic_write(out / PROGRAMS_DIR / f"{program.short_id}.py",
                              _header(program, setting) + program.code)
                record = program.to_dict()
                record["validation"] = _report_summary(it.report)
                record["generation"] = {
                    "job": job, "index": it.index, "skill": it.skill, "setting": setting,
                    "model": summary.model, "doc_id": it.doc_id, "doc_words": it.doc_words,
                    "references": it.references, **it.gen, "seed": it.seed, "run_seed": seed,
                    "temperature": temperature, "top_p": top_p, "extraction": it.extraction,
                    "hint": {"mode": hint_mode, **it.hint_info},
                    "designed_at": it.designed_at, "written_at": _now()}
                pool_out.write(record)
                summary.valid += 1
                summary.per_skill[it.skill]["valid"] += 1
                if progress:
                    progress.advance(bars["hint"])
            timings["write"] += time.monotonic() - t
        summary.status = "done"
    except BaseException as exc:
        summary.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        summary.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if progress:
            progress.stop()
        pool_out.close()
        rejected_out.close()
        validator.close()
        if own_pool:
            pool.close()
        summary.timings_s.update({k: round(v, 3) for k, v in timings.items()})
        summary.timings_s["total"] = round(time.monotonic() - t_start, 3)
        summary.tokens = {
            "prompt_mean": round(sum(prompt_tokens) / len(prompt_tokens), 1)
            if prompt_tokens else None,
            "prompt_max": max(prompt_tokens, default=None),
            "completion_mean": round(sum(completion_tokens) / len(completion_tokens), 1)
            if completion_tokens else None,
            "completion_max": max(completion_tokens, default=None),
            "finish_reasons": finish}
        summary.pool_total = sum(1 for _ in _read_jsonl(out / POOL_FILE, strict=False))
        summary.finished_at = _now()
        _atomic_write(out / SUMMARY_FILE, json.dumps(summary.to_dict(), indent=2) + "\n")
    if console is not None:
        share = summary.valid_share
        console.print(f"generate: {summary.valid} new valid of {summary.attempted} outputs "
                      f"(valid share {'n/a' if share is None else f'{share:.0%}'}, "
                      f"{summary.duplicates} duplicates, {summary.resumed} already done); "
                      f"pool {summary.pool_total} programs in {out}")
    return summary
