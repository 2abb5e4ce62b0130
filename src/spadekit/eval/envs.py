"""``envs:SOURCE``: a held-out set of environment programs as an evaluation suite.

SOURCE is anything :func:`spadekit.runs.sources.load_programs` reads (``library``, a pool
directory, a run directory). Each program is played ``k`` times (default 16) in the sandbox
without hints; its score is the episode return. Besides ``win_rate`` the summary reports
``any_credit_rate`` (return > 0), the win rate SPADE's curriculum uses. Programs are untrusted:
:meth:`EnvPoolSuite.screen` runs the self-play validator on each first, on the very seeds the
evaluation will play, and only valid ones become items; the others are listed in ``invalid``
and never scored (``trusted=True`` skips this). Items cannot be loaded before screening, and a
run with another seed or more samples is screened again (``needs_screen``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from spadekit.envs.program import EnvProgram
from spadekit.eval.base import EvalError, EvalItem, Suite, SuiteDefaults, safe_score
from spadekit.rollout.engine import EpisodeSpec


class EnvPoolSuite(Suite):
    defaults = SuiteDefaults(k=4, temperature=0.6, top_p=0.95, max_new_tokens=256,
                             max_turns=8, system_prompt="")
    """Sized for a CPU: a folder of a few programs finishes in minutes with a small model (k=4
    samples, 8 turns of 256 tokens). The paper's self-play plays an environment 8 times,
    up to 25 turns of up to 8,192 tokens (SPEC point 12): ``--k 8 --max-turns 25
    --max-new-tokens 8192``. ``system_prompt`` empty: the rollout
    engine's built-in prompt of each program's setting (``\\boxed{}`` commands for games,
    ``<tool_call>`` for tool use), as during self-play."""
    sandboxed = True

    def __init__(self, source: str, setting: str | None = None, trusted: bool = False):
        from spadekit.runs.sources import load_programs

        self.source = source
        self.name = f"envs:{source}"
        self.programs = {p.sha256: p for p in load_programs(source, setting)}
        self.trusted = trusted
        """Play every program without validating it (only for folders you trust)."""
        self.invalid: list[dict[str, Any]] = []
        """The programs the validator refused: ``{id, sha256, program, skill, stage, reason,
        message}`` each, in source order. Never items, never scored."""
        self.screened_with: tuple | None = None
        """The ``(max_turns, seed, limit, samples)`` of the last :meth:`screen` (None: not
        screened yet)."""
        self._valid: dict[str, EnvProgram] = {}

    @property
    def ready(self) -> bool:
        """Whether items may be loaded: screened, or trusted."""
        return self.trusted or self.screened_with is not None

    def needs_screen(self, seed: int, samples: int) -> bool:
        """Whether an evaluation with this seed and ``samples`` per item would play seeds the
        last :meth:`screen` did not validate (never for a trusted suite)."""
        if self.trusted:
            return False
        if self.screened_with is None:
            return True
        _turns, screened_seed, _limit, screened_samples = self.screened_with
        return screened_seed != seed or screened_samples < samples

    def screen(self, pool: Any, max_turns: int, seed: int = 0, settings: Any = None,
               limit: int | None = None, workers: int = 2,
               samples: int | None = None) -> list[dict[str, Any]]:
        """Validate the programs in ``pool`` with self-play's validator (``settings``, default those
        of ``max_turns``) and keep only the valid ones as items; returns :attr:`invalid`. With
        ``limit``, validation stops once each skill has ``limit`` valid programs. Each validation
        seed comes from ``seed`` and the program's hash (a rerun repeats every verdict);
        ``play_seeds`` are the evaluation's own ``samples`` seeds. Repeating a call, or screening a
        trusted suite, does nothing.
        """
        if self.trusted:
            return self.invalid
        if pool is None:
            raise EvalError(f"{self.name}: validating its programs needs a SandboxPool")
        samples = self.defaults.k if samples is None else int(samples)
        if samples < 1:
            raise EvalError(f"{self.name}: samples must be >= 1, got {samples}")
        key = (max_turns, seed, limit, samples)
        if self.screened_with == key:
            return self.invalid
        from spadekit.eval.runner import sample_seed
        from spadekit.sandbox.validate import Validator, ValidatorSettings

        if settings is None:
            settings = ValidatorSettings(max_turns=max_turns)
        self._valid, self.invalid = {}, []
        valid_per_skill: dict[str, int] = {}
        todo = list(self.programs.values())
        validator = Validator(pool, settings)
        try:
            while todo:
                batch = [p for p in todo if limit is None or
                         valid_per_skill.get(p.skill or "unknown", 0) < limit]
                batch = batch if limit is None else batch[:max(1, workers)]
                if not batch:
                    break
                chosen = {p.sha256 for p in batch}
                todo = [p for p in todo if p.sha256 not in chosen]
                reports = validator.validate_many(
                    batch, workers=workers, seeds=[validation_seed(seed, p.sha256)
                                                   for p in batch],
                    play_seeds=[[sample_seed(seed, item_id(p.sha256), j) for j in range(samples)]
                                for p in batch])
                for program, report in zip(batch, reports):
                    self._record(program, report, valid_per_skill)
        finally:
            validator.close()
        order = {sha: i for i, sha in enumerate(self.programs)}  # source order, whatever the
        self._valid = dict(sorted(self._valid.items(), key=lambda kv: order[kv[0]]))  # batches
        self.screened_with = key
        return self.invalid

    def _record(self, program: EnvProgram, report: Any, valid_per_skill: dict[str, int]
                ) -> None:
        skill = program.skill or "unknown"
        if report.ok:
            self._valid[program.sha256] = program
            valid_per_skill[skill] = valid_per_skill.get(skill, 0) + 1
            return
        self.invalid.append({
            "id": program.sha256[:16], "sha256": program.sha256, "program": _label(program),
            "skill": skill, "stage": report.stage, "reason": report.reason,
            "message": str(report.message)[:500]})

    def load_items(self, limit: int | None = None) -> list[EvalItem]:
        """The valid programs (all of them when trusted), at most ``limit`` per skill;
        ``EvalError`` before :meth:`screen`."""
        if not self.ready:
            raise EvalError(f"{self.name}: its programs are untrusted and not validated yet "
                            "(screen the suite with a SandboxPool first, or trust it)")
        playable = self.programs if self.trusted else self._valid
        items, per_skill = [], {}
        for sha, program in playable.items():
            skill = program.skill or "unknown"
            if limit is not None and per_skill.get(skill, 0) >= limit:
                continue
            per_skill[skill] = per_skill.get(skill, 0) + 1
            items.append(EvalItem(id=item_id(sha), dataset=skill, group=skill,
                                  prompt=_label(program),
                                  data={"sha256": sha, "domain": program.domain}))
        return items

    def playable(self, item: EvalItem) -> bool:
        """Whether ``item`` may be played: one of this suite's programs that passed the
        validator (or any of them when trusted)."""
        sha = item.data.get("sha256") if isinstance(item.data, dict) else None
        return sha in (self.programs if self.trusted else self._valid)

    def validation(self) -> dict[str, Any]:
        """What the result file says about validation: trusted or not, and how many programs
        were valid, invalid and left unchecked (``limit`` reached for their skill)."""
        valid = len(self.programs) if self.trusted else len(self._valid)
        return {"trusted": self.trusted, "validated": self.screened_with is not None,
                "programs": len(self.programs), "valid": valid, "invalid": len(self.invalid),
                "unchecked": len(self.programs) - valid - len(self.invalid)}

    def program(self, item: EvalItem) -> EnvProgram:
        return self.programs[item.data["sha256"]]

    def score(self, item: EvalItem, completion: Any) -> float:
        """``completion`` is the episode's return (or a trajectory carrying one)."""
        value = getattr(completion, "episode_return", completion)
        return safe_score(lambda: float(value))

    def episode_spec(self, item: EvalItem, seed: int, max_turns: int, system: str | None,
                     tag: dict[str, Any]) -> EpisodeSpec:
        return EpisodeSpec(self.program(item), seed=seed, tag=tag, system=system or None)


def item_id(sha256: str) -> str:
    """The id of a program's item (what its evaluation seeds are drawn from)."""
    return sha256[:16]


def validation_seed(seed: int, sha256: str) -> int:
    """The validation seed of one program in an evaluation seeded with ``seed`` (63 bits)."""
    digest = hashlib.sha256(f"spadekit-eval:{seed}:{sha256}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _label(program: EnvProgram) -> str:
    """What names a program in reports: its file when it came from one, else its class, its
    source or its hash."""
    meta = program.meta if isinstance(program.meta, Mapping) else {}
    lineage = meta.get("lineage")
    file = lineage.get("file") if isinstance(lineage, Mapping) else None
    if isinstance(file, str) and file:
        return file
    return program.class_name or program.source or program.sha256[:12]
