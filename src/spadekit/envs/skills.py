"""The skill taxonomy of both settings (SPEC point 1): names, descriptions, canonical spelling.

The designer's prompts describe a skill with its text here; imported programs, pools and
memories name skills in this spelling (``normalize_skill``). Standard library only: sandbox
workers import this package.
"""

from __future__ import annotations

import re

__all__ = ["SETTINGS", "SKILLS", "normalize_skill", "skills_for"]

SETTINGS = ("games", "tooluse")

SKILLS: dict[str, dict[str, str]] = {
    "games": {
        "Mathematical_Reasoning": (
            "The agent has to compute or derive an exact quantity (number theory, algebra, "
            "combinatorics, probability, geometry), using commands that return partial numeric "
            "information about a hidden object and combining those facts correctly before it "
            "commits to one final value."),
        "Logical_Deduction": (
            "Hidden facts are tied together by rules or by feedback on the agent's queries; the "
            "agent gathers evidence, keeps track of which possibilities remain consistent with "
            "everything seen so far, and commits once a single assignment survives."),
        "Spatial_Reasoning": (
            "A grid, map, board or shape arrangement is described in text and partly hidden; "
            "the agent must track positions, directions, distances and obstacles across moves, "
            "build a mental map from local observations, and navigate, place or rearrange "
            "objects accordingly."),
        "Pattern_Recognition": (
            "A hidden rule generates sequences, grids, strings or transformations; the agent "
            "requests further examples or tests hypotheses, infers the rule and applies it to "
            "produce an item it has not been shown."),
        "Optimization": (
            "The agent chooses among many options under constraints (budget, capacity, time, "
            "distance) to maximise or minimise an objective; details may be revealed gradually, "
            "and the final score measures how close the committed choice is to the optimum."),
        "Causal_Inference": (
            "A hidden cause-and-effect structure (which control drives which outcome, which "
            "factor matters) must be identified; passive observations can be confounded or "
            "misleading, so the agent runs interventions and compares outcomes before naming "
            "the true causes."),
    },
    "tooluse": {
        "API_Orchestration": (
            "Several API-like tools must be chained: the output of one call (ids, slots, "
            "tokens, prices) is the input of the next, each tool has preconditions, and the "
            "agent completes a composite request only by calling them in a valid order with "
            "the right values passed along."),
        "Data_Retrieval": (
            "A hidden store of records (directory, catalogue, logs, inventory) is reachable "
            "only through search, filter, pagination and detail tools with partial views; the "
            "agent must locate the exact record or aggregate the question asks for and submit "
            "it."),
        "State_Modification": (
            "The agent must change hidden state (stock levels, calendars, accounts, settings) "
            "through write tools until it matches a target described in the task; success is "
            "checked on the final state, including that nothing outside the request changed."),
        "Error_Recovery": (
            "Tools fail in realistic ways (transient errors, rate limits, invalid arguments, "
            "stale or partial data); the agent must read the error messages, retry or correct "
            "its calls, or switch to another route, and still finish the task correctly."),
        "Tool_Selection": (
            "Many tools are offered and several look plausible but are wrong for the task "
            "(distractors, deprecated or side-effecting ones); the agent must read the "
            "descriptions and use exactly the tools each subtask needs."),
        "Multi-Step_Workflows": (
            "A long procedure with ordered, dependent stages (check, reserve, pay, ship, "
            "notify): later steps need results from earlier ones, stages must run in the "
            "right order, and skipping or reordering a stage loses credit."),
    },
}


def _check_setting(setting: str) -> str:
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    return setting


def skills_for(setting: str) -> list[str]:
    """The skills of a setting, in SPEC order."""
    return list(SKILLS[_check_setting(setting)])


def normalize_skill(setting: str, skill: str) -> str:
    """The canonical spelling of ``skill`` (case, ``-``/``_``/space insensitive); ValueError
    naming the valid skills otherwise."""
    def key(s: str) -> str:
        return re.sub(r"[\s_-]+", "_", s.strip().lower())
    for name in skills_for(setting):
        if key(name) == key(skill):
            return name
    raise ValueError(f"unknown {setting} skill {skill!r}; choose from {', '.join(SKILLS[setting])}")
