"""Reasoning Gym as an evaluation suite: ``rg-hard`` and ``rg-easy``.

Items come from ``reasoning-gym`` (offline, procedural) and are scored with each dataset's own
scorer. ``rg-hard`` uses Reasoning Gym's hard evaluation parameters (``data/rg_hard.yaml``: 100
datasets, 50 items, seed 45); ``rg-easy`` the default parameters. Item ``i`` is the same whatever
``limit`` is; failing items are retried with derived seeds and otherwise listed in
``suite.skipped``. Items may be cached on disk (:mod:`spadekit.eval.rg_cache`). Buckets
(RG-Math/Algo/Cog/Logic) are an assumption: ``narrow`` (default), ``broad`` or a dict; unmapped
categories go to ``RG-Other``. A win is a score >= 1.0. Upstream scorer problems handled here:
docs/design/eval.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections import deque
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from spadekit.eval import rg_cache
from spadekit.eval.base import EvalError, EvalItem, Suite, SuiteDefaults, final_answer, safe_score

RG_SYSTEM = (
    "Solve the task below. Reason step by step if that helps, then write your final answer "
    "inside <answer></answer> tags, in exactly the form the task asks for. Only the last "
    "<answer> block is graded.")

LEVELS = ("hard", "easy")
OTHER = "RG-Other"
NARROW: dict[str, str] = {
    "algebra": "RG-Math", "arithmetic": "RG-Math", "geometry": "RG-Math",
    "algorithmic": "RG-Algo", "cognition": "RG-Cog", "logic": "RG-Logic",
}
BROAD: dict[str, str] = {
    **NARROW, "graphs": "RG-Algo", "code": "RG-Algo", "arc": "RG-Cog", "induction": "RG-Cog",
    "games": "RG-Logic",
}
MAPPINGS: dict[str, dict[str, str]] = {"narrow": NARROW, "broad": BROAD}

RESEED_TRIES = 8
"""Derived seeds tried for an item after the configured seed fails."""
MAX_ANSWER_CHARS = 65_536
"""Longer committed answers score 0 without reaching a scorer (the longest gold answer, a
10-disk ``tower_of_hanoi`` solution, has 32,736 characters; some scorers parse with sympy)."""


@lru_cache(maxsize=1)
def load_config() -> dict[str, Any]:
    """The packaged config: ``{"defaults": {"size", "seed"}, "datasets": {name: {category,
    params}}}`` in evaluation order."""
    path = resources.files("spadekit.eval") / "data" / "rg_hard.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict) or not isinstance(config.get("datasets"), dict):
        raise EvalError(f"malformed Reasoning Gym config {path}")
    return config


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise EvalError("the rg suites need Reasoning Gym: pip install reasoning-gym==0.1.25"
                        ) from exc
    return reasoning_gym


def derived_seed(dataset: str, seed: int, index: int, attempt: int) -> int:
    """A deterministic 32-bit seed for retry ``attempt`` (>= 1) of one item."""
    digest = hashlib.sha256(f"{dataset}/{seed}/{index}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


class ReasoningGymSuite(Suite):
    """Reasoning Gym's 100 evaluation datasets at the ``hard`` (default) or ``easy`` level.

    ``mapping`` is ``"narrow"``, ``"broad"`` or a dict category -> bucket; ``datasets`` restricts
    the suite to some of the 100 (config order is kept). After ``load_items``, ``skipped`` lists
    ``(dataset, reason)`` for every item that could not be generated.
    """

    def __init__(self, level: str = "hard", mapping: str | dict[str, str] = "narrow",
                 datasets: list[str] | None = None, cache: Any = False):
        if level not in LEVELS:
            raise EvalError(f"unknown Reasoning Gym level {level!r}; known: {', '.join(LEVELS)}")
        if isinstance(mapping, str):
            if mapping not in MAPPINGS:
                raise EvalError(f"unknown Reasoning Gym mapping {mapping!r}; known: "
                                f"{', '.join(MAPPINGS)}, or a dict category -> bucket")
            mapping = MAPPINGS[mapping]
        elif not isinstance(mapping, dict):
            raise EvalError("a Reasoning Gym mapping is 'narrow', 'broad' or a dict")
        self.level = level
        self.name = f"rg-{level}"
        self.defaults = SuiteDefaults(k=1, temperature=0.6, top_p=0.95, max_new_tokens=8192,
                                      max_turns=2, system_prompt=RG_SYSTEM)
        self.mapping: dict[str, str] = {str(k): str(v) for k, v in mapping.items()}
        config = load_config()
        self.size = int(config["defaults"]["size"])
        self.seed = int(config["defaults"]["seed"])
        specs: dict[str, dict[str, Any]] = config["datasets"]
        if datasets is not None:
            unknown = sorted(set(datasets) - set(specs))
            if unknown:
                raise EvalError(f"not in the Reasoning Gym config: {', '.join(unknown)}")
            specs = {name: spec for name, spec in specs.items() if name in set(datasets)}
        self.categories: dict[str, str] = {name: spec["category"] for name, spec in specs.items()}
        self.skipped: list[tuple[str, str]] = []
        self._generators: dict[tuple[str, int, int], Any] = {}
        self._entries: dict[str, tuple[Any, dict[str, Any]]] = {}
        # generated items on disk (``spadekit.eval.rg_cache``): True the default directory, a
        # path, or False/None for none (the suite registry, used by ``spadekit eval`` and the
        # in-loop evaluation, turns it on)
        self.cache = None if not cache else rg_cache.ItemCache(
            rg_cache.default_dir() if cache is True else cache, rg_cache.suite_key(
                level, self.seed, self.size, config["datasets"] if level == "hard" else {}))

    # -- items --------------------------------------------------------------------------------

    def bucket(self, category: str) -> str:
        return self.mapping.get(category, OTHER)

    def groups(self) -> dict[str, str]:
        return {name: self.bucket(cat) for name, cat in self.categories.items()}

    def params(self, dataset: str) -> dict[str, Any]:
        """Generator keyword arguments of ``dataset`` at this suite's level."""
        if self.level == "easy":
            return {}
        return dict(load_config()["datasets"][dataset].get("params") or {})

    def load_items(self, limit: int | None = None) -> list[EvalItem]:
        per_dataset = self.size if limit is None else max(0, min(self.size, int(limit)))
        self.skipped = []
        items: list[EvalItem] = []
        for name, category in self.categories.items():
            records = self.cache.load(name) if self.cache else {}
            fresh = 0
            for index in range(per_dataset):
                rec = records.get(str(index))
                if rec is None:  # not cached: generate it (and remember it, or its failure)
                    made = self._generate(name, index)
                    rec = {"error": made} if isinstance(made, str) else {
                        **rg_cache.record_of(made[0], made[2]),
                        "answer": _json_safe(made[2].get("answer"))}
                    records[str(index)], fresh = rec, fresh + 1
                    if not isinstance(made, str):
                        self._entries[f"{name}/{index}"] = (made[1], made[2])
                elif "entry" in rec:
                    self._entries[f"{name}/{index}"] = (None, rg_cache.decode(rec["entry"]))
                if "error" in rec:
                    self.skipped.append((name, f"item {index}: {rec['error']}"))
                    continue
                items.append(EvalItem(
                    id=f"{name}/{index}", dataset=name, group=self.bucket(category),
                    prompt=rec["question"], answer=rec.get("answer"),
                    data={"level": self.level, "category": category, "seed": rec["seed"],
                          "index": index, "size": self.size}))
            if self.cache:
                self.cache.stats.hits += per_dataset - fresh
                self.cache.stats.misses += fresh
                if fresh:
                    self.cache.save(name, records)
        return items

    def _generator(self, dataset: str, seed: int, size: int | None = None) -> Any:
        size = size or self.size
        key = (dataset, seed, size)
        if key not in self._generators:
            rg = _reasoning_gym()
            with contextlib.redirect_stdout(io.StringIO()):  # some generators print progress
                self._generators[key] = rg.create_dataset(
                    dataset, size=size, seed=seed, **self.params(dataset))
        return self._generators[key]

    def _generate(self, dataset: str, index: int) -> tuple[int, Any, dict[str, Any]] | str:
        """``(seed, generator, entry)`` for one item, or why no seed could produce it."""
        error = "no attempt made"
        seeds = [self.seed] + [derived_seed(dataset, self.seed, index, attempt)
                               for attempt in range(1, RESEED_TRIES + 1)]
        for seed in seeds:
            try:
                generator = self._generator(dataset, seed)
                with contextlib.redirect_stdout(io.StringIO()):
                    entry = generator[index]
                if not isinstance(entry, dict) or "question" not in entry:
                    raise ValueError("generator returned no question")
                return seed, generator, entry
            except Exception as exc:  # an upstream generator may raise anything
                error = f"{type(exc).__name__}: {exc}"[:300]
        return error

    def entry(self, item: EvalItem) -> tuple[Any, dict[str, Any]]:
        """The generator and original Reasoning Gym entry behind ``item`` (regenerated from
        ``item.data`` when this suite object did not load it). Raises if it cannot be rebuilt."""
        found = self._entries.get(item.id)
        if found is not None and found[0] is None:  # a cached entry: build its generator only
            found = (self._generator(item.dataset, int(item.data["seed"]),
                                     int(item.data["size"])), found[1])
            self._entries[item.id] = found
        if found is None:
            data = item.data
            if data.get("level", self.level) != self.level:
                raise EvalError(f"{item.id} belongs to rg-{data.get('level')}, not {self.name}")
            generator = self._generator(item.dataset, int(data["seed"]), int(data["size"]))
            with contextlib.redirect_stdout(io.StringIO()):
                found = (generator, generator[int(data["index"])])
            self._entries[item.id] = found
        if found[1]["question"] != item.prompt:
            raise EvalError(f"{item.id}: the prompt is not the one Reasoning Gym generates "
                            "(another reasoning-gym version, or an edited item?)")
        return found

    # -- scoring ------------------------------------------------------------------------------

    def score(self, item: EvalItem, completion: Any) -> float:
        answer = final_answer(completion)
        if answer is None or not answer or len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        return safe_score(lambda: self._score_answer(item, answer))

    def _score_answer(self, item: EvalItem, answer: str) -> float:
        generator, entry = self.entry(item)
        if item.dataset == "game_of_life_halting":
            return float(_truth(answer) is not None and _truth(answer) == _truth(entry["answer"]))
        return generator.score_answer(answer, entry)

    def gold_completion(self, item: EvalItem) -> str | None:
        """A reply that should win ``item``, or None when Reasoning Gym keeps no solution."""
        try:
            _, entry = self.entry(item)
            answer = gold_answer(item.dataset, entry)
        except Exception:
            return None
        return None if answer is None else f"<answer>{answer}</answer>"


def gold_answer(dataset: str, entry: dict[str, Any]) -> str | None:
    """A winning answer for one Reasoning Gym entry.

    Most entries carry it in ``answer``. Four datasets have ``answer=None`` and a verifier:
    ``graph_color`` keeps a valid colouring and ``propositional_logic`` an example conclusion in
    the metadata; ``rubiks_cube`` keeps the scramble, whose inverse solves the cube (rewritten
    into moves the scorer's parser keeps, see :func:`undo_scramble`); ``rush_hour`` keeps only
    the board and the minimum move count, so there is no gold answer for it. ``jugs`` sometimes
    stores ``["No solution"]`` for a solvable puzzle (its generator's search gives up; the scorer
    rejects that answer), so those puzzles are solved here (:func:`solve_jugs`).
    """
    meta = entry.get("metadata") or {}
    if dataset == "jugs" and entry.get("answer") == '["No solution"]':
        puzzle = meta.get("puzzle") or {}
        moves = solve_jugs(list(puzzle["jug_capacities"]), int(puzzle["target"]))
        return None if moves is None else json.dumps(moves)
    if isinstance(entry.get("answer"), str):
        return entry["answer"]
    if dataset == "graph_color" and "possible_answer" in meta:
        return json.dumps({str(k): v for k, v in meta["possible_answer"].items()})
    if dataset == "propositional_logic" and meta.get("example_answer"):
        return str(meta["example_answer"])
    if dataset == "rubiks_cube" and meta.get("scramble_moves"):
        return undo_scramble(str(meta["scramble_moves"]))
    return None


def undo_scramble(scramble: str) -> str | None:
    """The inverse of a Reasoning Gym cube scramble, in moves its scorer understands.

    Reasoning Gym's answer parser silently drops moves with a layer prefix (``2U``, ``1Uw'``),
    so the inverse is written without them: ``1Xw`` is the face turn ``X`` and the inner slice
    ``2X`` is ``Xw X'`` (wide turn, face turned back). Other prefixes give None.
    """
    moves: list[str] = []
    for token in reversed(scramble.split()):
        prime = token.endswith("'")
        body = token[:-1] if prime else token
        inverse = "" if prime else "'"  # the suffix that turns this move back
        same = "'" if prime else ""  # the suffix of this move's own direction
        if body[:1].isdigit():
            layer, face = body[0], body[1:]
            if layer == "1" and face.endswith("w"):
                moves.append(face[:-1] + inverse)
            elif layer == "2" and len(face) == 1:
                moves += [face + "w" + inverse, face + same]
            else:
                return None
        elif body and not body[-1].isdigit():
            moves.append(body + inverse)
        else:
            return None
    return " ".join(moves)


def solve_jugs(capacities: list[int], target: int, max_states: int = 500_000
               ) -> list[str] | None:
    """A shortest list of ``fill X`` / ``empty X`` / ``pour X->Y`` moves (jugs ``A``, ``B``, ...
    start empty) after which some jug holds ``target``, or None (breadth-first search)."""
    names = [chr(ord("A") + i) for i in range(len(capacities))]
    start = tuple(0 for _ in capacities)
    came_from: dict[tuple[int, ...], tuple[tuple[int, ...], str] | None] = {start: None}
    queue = deque([start])
    while queue and len(came_from) <= max_states:
        state = queue.popleft()
        if target in state:
            moves: list[str] = []
            while came_from[state] is not None:
                state, move = came_from[state]  # type: ignore[misc]
                moves.append(move)
            return moves[::-1]
        for i, cap in enumerate(capacities):
            steps = [(f"fill {names[i]}", i, cap - state[i]), (f"empty {names[i]}", i, -state[i])]
            for step, jug, delta in steps:
                nxt = tuple(v + delta if k == jug else v for k, v in enumerate(state))
                if nxt not in came_from:
                    came_from[nxt] = (state, step)
                    queue.append(nxt)
            for j, room in enumerate(c - v for c, v in zip(capacities, state)):
                amount = min(state[i], room)
                if j == i or amount == 0:
                    continue
                nxt = tuple(v - amount if k == i else v + amount if k == j else v
                            for k, v in enumerate(state))
                if nxt not in came_from:
                    came_from[nxt] = (state, f"pour {names[i]}->{names[j]}")
                    queue.append(nxt)
    return None


def _truth(text: Any) -> bool | None:
    """``True``/``False`` (any case, quotes or a final period allowed) as a bool, else None."""
    if not isinstance(text, str):
        return None
    word = text.strip().rstrip(".").strip().strip("'\"`").strip().lower()
    return {"true": True, "false": False}.get(word)


def _json_safe(value: Any) -> Any:
    """``value`` if JSON can hold it, else its string form."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)
