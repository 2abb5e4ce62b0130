"""``envs:SOURCE``: a held-out set of environment programs as an evaluation suite.

SOURCE is anything :func:`spadekit.runs.sources.load_programs` reads: ``library``, a pool
directory from ``spadekit generate`` (for instance one written by a checkpoint the run never
trained on), or a run directory (its validated designer programs, to compare two models on the
same environments). Every program is played ``k`` times (default 16, as SPADE plays each
environment) in the sandbox, without hints. An item is one program; its score is the episode
return (the last reward if the episode terminated, else 0). The summary groups by skill; besides
the shared ``win_rate`` (return >= 1.0, solved) it reports ``any_credit_rate`` (return > 0),
which is the win rate SPADE's curriculum uses during training.
"""

from __future__ import annotations

from typing import Any

from spadekit.envs.program import EnvProgram
from spadekit.eval.base import EvalItem, Suite, SuiteDefaults, safe_score
from spadekit.rollout.engine import EpisodeSpec


class EnvPoolSuite(Suite):
    defaults = SuiteDefaults(k=16, temperature=0.6, top_p=0.95, max_new_tokens=1024,
                             max_turns=25, system_prompt="")
    """``system_prompt`` empty: the rollout engine's built-in prompt of each program's setting
    (``\\boxed{}`` commands for games, ``<tool_call>`` for tool use), as during self-play."""
    sandboxed = True

    def __init__(self, source: str, setting: str | None = None):
        from spadekit.runs.sources import load_programs

        self.source = source
        self.name = f"envs:{source}"
        self.programs = {p.sha256: p for p in load_programs(source, setting)}

    def load_items(self, limit: int | None = None) -> list[EvalItem]:
        items, per_skill = [], {}
        for sha, program in self.programs.items():
            skill = program.skill or "unknown"
            if limit is not None and per_skill.get(skill, 0) >= limit:
                continue
            per_skill[skill] = per_skill.get(skill, 0) + 1
            label = program.source or program.class_name or sha[:12]
            items.append(EvalItem(id=sha[:16], dataset=skill, group=skill, prompt=label,
                                  data={"sha256": sha, "domain": program.domain}))
        return items

    def program(self, item: EvalItem) -> EnvProgram:
        return self.programs[item.data["sha256"]]

    def score(self, item: EvalItem, completion: Any) -> float:
        """``completion`` is the episode's return (or a trajectory carrying one)."""
        value = getattr(completion, "episode_return", completion)
        return safe_score(lambda: float(value))

    def episode_spec(self, item: EvalItem, seed: int, max_turns: int, system: str | None,
                     tag: dict[str, Any]) -> EpisodeSpec:
        return EpisodeSpec(self.program(item), seed=seed, tag=tag, system=system or None)
