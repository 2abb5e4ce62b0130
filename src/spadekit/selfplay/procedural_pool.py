"""A pool of procedural games for CPU-scale warm starts: composed, validated in the sandbox,
deduplicated, with a held-out split.

``split_combos`` divides every combination of parts (``spadekit.envs.procedural``) into the
ones a warm start may see and the held-out ones (every combination with a held-out part, default
``turns=gated``, plus a drawn share), so novelty is measurable. ``build_pool`` writes
``per_combo`` candidates per combination, validates each with the real validator and keeps a
valid one only when it is no near-duplicate of one kept (kit programs by ``kit_identity``);
``raw_near_duplicate_share`` is the share before that filter. ``style``: ``whole`` or ``kit``
programs. Everything is fixed by ``seed``.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from spadekit.envs.procedural import (Combo, all_combos, compose, compose_kit, surface_words,
                                     theme_words)
from spadekit.envs.program import EnvProgram
from spadekit.envs.procedural.kit import COMMANDS
from spadekit.selfplay.kit_identity import kit_identity
from spadekit.selfplay.memory import DUPLICATE_THRESHOLD, fingerprint, jaccard

__all__ = ["HELD_OUT_PART", "STYLES", "PoolBuild", "Split", "build_pool", "candidates",
           "draw_combos", "split_combos",
           "split_documents", "write_split"]

HELD_OUT_PART = "turns=gated"
"""The part whose every combination is held out by default."""
STYLES = ("whole", "kit")
"""How a procedural program is written: a whole program, or a game-kit program."""


@dataclass(frozen=True)
class Split:
    """Which combinations a warm start may see (``train``) and which are held out."""

    train: tuple[Combo, ...]
    held_out: tuple[Combo, ...]
    held_out_part: str
    seed: int

    def of(self, name: str) -> tuple[Combo, ...]:
        if name not in ("train", "held_out"):
            raise ValueError(f"a split is 'train' or 'held_out', got {name!r}")
        return self.train if name == "train" else self.held_out

    def to_dict(self) -> dict[str, Any]:
        return {"train": [c.key for c in self.train], "held_out": [c.key for c in self.held_out],
                "held_out_part": self.held_out_part, "seed": self.seed}


def split_combos(seed: int = 0, held_out_share: float = 0.2,
                 held_out_part: str = HELD_OUT_PART) -> Split:
    """Every combination using ``held_out_part`` (``kind=name``, e.g. ``hidden=order``) is held
    out, and a drawn ``held_out_share`` of the rest."""
    kind, _, name = held_out_part.partition("=")
    if kind not in ("hidden", "info", "scoring", "turns") or not name:
        raise ValueError(f"held_out_part is kind=name with kind hidden, info, scoring or "
                         f"turns, got {held_out_part!r}")
    if not 0.0 <= held_out_share < 1.0:
        raise ValueError(f"held_out_share must lie in [0, 1), got {held_out_share!r}")
    combos = all_combos()
    whole = [c for c in combos if getattr(c, kind) == name]
    if not whole:
        raise ValueError(f"no combination uses {held_out_part!r}")
    rest = [c for c in combos if getattr(c, kind) != name]
    random.Random(seed).shuffle(rest)
    k = round(len(rest) * held_out_share)
    order = {c: i for i, c in enumerate(combos)}
    return Split(tuple(sorted(rest[k:], key=order.get)),
                 tuple(sorted(whole + rest[:k], key=order.get)), held_out_part, seed)


def draw_combos(combos: Sequence[Combo], n: int, seed: int = 0) -> tuple[Combo, ...]:
    """``n`` of ``combos`` (all when fewer), a draw fixed by ``seed`` that uses every part the
    given combinations use (redrawn until it does, then the first draw that comes closest),
    in their given order."""
    combos = list(dict.fromkeys(combos))
    if n >= len(combos):
        return tuple(combos)
    needed = {(kind, getattr(c, kind)) for c in combos
              for kind in ("hidden", "info", "scoring", "turns")}
    rng = random.Random(f"draw-combos:{seed}")
    best: list[Combo] = []
    best_cover = -1
    for _ in range(200):
        chosen = rng.sample(combos, n)
        cover = len({(kind, getattr(c, kind)) for c in chosen
                     for kind in ("hidden", "info", "scoring", "turns")})
        if cover > best_cover:
            best, best_cover = chosen, cover
        if cover == len(needed):
            break
    keep = set(best)
    return tuple(c for c in combos if c in keep)


def split_documents(texts: Sequence[tuple[str | None, str]], seed: int = 0,
                    held_out_share: float = 0.5
                    ) -> tuple[list[tuple[str | None, str]], list[tuple[str | None, str]]]:
    """``(training documents, held-out documents)`` of ``(doc_id, text)`` pairs: a document is
    held out when the hash of its id (or text) and ``seed`` falls below ``held_out_share``, so
    the split of a document never depends on which others are in the corpus. A warm start is
    themed on the training half; a designer benchmark prompts with the held-out half."""
    import hashlib

    train, held = [], []
    for doc_id, text in texts:
        name = doc_id if doc_id is not None else text
        digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
        (held if int.from_bytes(digest[:8], "big") / 2 ** 64 < held_out_share
         else train).append((doc_id, text))
    if texts and not train:  # a one-document corpus still themes a pool
        train = list(held)
    return train, held


def candidates(combos: Sequence[Combo], texts: Sequence[tuple[str | None, str]], seed: int,
               per_combo: int = 1, max_turns: int | None = None, style: str = "whole"
               ) -> list[EnvProgram]:
    """``per_combo`` programs of each combination, each themed on a document drawn from
    ``texts`` (``(doc_id, text)`` pairs) and numbered by a drawn seed; shuffled by ``seed``.
    ``max_turns``: every program's turn limit (what a run's turn cap makes it); None: drawn
    (whole programs) or 8 (kit programs). ``style``: one of :data:`STYLES`."""
    if not texts:
        raise ValueError("candidates needs at least one document for the surface text")
    if style not in STYLES:
        raise ValueError(f"a procedural style is one of {STYLES}, got {style!r}")
    rng = random.Random(seed)
    order = [c for c in combos for _ in range(max(1, per_combo))]
    rng.shuffle(order)
    out = []
    # a kit program copies its items from the prompt's theme words: documents with too few
    # of them would teach padding words instead
    rich = ([t for t in texts if len([w for w in theme_words(t[1]) if w not in COMMANDS]) >= 10]
            if style == "kit" else [])
    for combo in order:
        doc_id, text = (rich or texts)[rng.randrange(len(rich or texts))]
        if style == "kit":  # the words in the document's order: the prompt's theme words
            words = [w for w in theme_words(text) if w not in COMMANDS]
            if len(words) < 10:
                words += [w for w in surface_words("", rng, 10) if w not in words]
            program = compose_kit(combo, words, rng.randrange(2 ** 31), max_turns)
        else:
            words = surface_words(text, rng)
            program = compose(combo, words, rng.randrange(2 ** 31), max_turns)
        meta = dict(program.meta)
        meta["procedural"] = {**meta["procedural"], "doc_id": doc_id}
        out.append(dataclasses.replace(program, meta=meta))
    return out


@dataclass
class PoolBuild:
    """What ``build_pool`` kept and why it dropped the rest."""

    kept: list[tuple[EnvProgram, Any]] = field(default_factory=list)
    rejected: list[tuple[EnvProgram, Any]] = field(default_factory=list)
    """Invalid candidates with their reports."""
    near_duplicates: list[tuple[EnvProgram, str, float]] = field(default_factory=list)
    """Valid candidates dropped as near-duplicates: (program, kept sha256, similarity)."""

    @property
    def valid(self) -> int:
        return len(self.kept) + len(self.near_duplicates)

    @property
    def raw_near_duplicate_share(self) -> float:
        """The share of valid candidates that were near-duplicates of an earlier valid one."""
        return len(self.near_duplicates) / self.valid if self.valid else 0.0

    def summary(self) -> dict[str, Any]:
        reasons: dict[str, int] = {}
        for _p, report in self.rejected:
            reasons[report.reason] = reasons.get(report.reason, 0) + 1
        combos = {p.meta["procedural"]["combo"] for p, _r in self.kept}
        skills: dict[str, int] = {}
        for p, _r in self.kept:
            skills[p.skill] = skills.get(p.skill, 0) + 1
        return {"kept": len(self.kept), "invalid": len(self.rejected),
                "near_duplicates": len(self.near_duplicates),
                "raw_near_duplicate_share": round(self.raw_near_duplicate_share, 4),
                "combos": len(combos), "skills": skills, "invalid_reasons": reasons}


def build_pool(programs: Sequence[EnvProgram], validator: Any, *,
               dedup_threshold: float = DUPLICATE_THRESHOLD, seed: int = 0,
               progress: Callable[[int, int], None] | None = None) -> PoolBuild:
    """Validate every program (``validator.validate``, seeds drawn from ``seed``) and keep the
    valid ones that are not near-duplicates of one kept before (kit programs: the same kit
    identity, or the same composition at shingle similarity ``>= dedup_threshold``; others:
    shingle similarity ``>= dedup_threshold``)."""
    rng = random.Random(seed)
    build = PoolBuild()
    prints: list[tuple[str, frozenset]] = []
    identities: dict[tuple, str] = {}
    kits: list[tuple[str, frozenset, str]] = []
    for i, program in enumerate(programs):
        report = validator.validate(program, seed=rng.getrandbits(63))
        if not report.ok:
            build.rejected.append((program, report))
        elif (ident := kit_identity(program.code)) is not None:
            mine = fingerprint(program.code)
            same = [(sha, fp) for sha, fp, comp in kits if comp == ident.composition]
            best = max(((jaccard(mine, fp), sha) for sha, fp in same), default=(0.0, ""))
            if ident.key in identities:
                build.near_duplicates.append((program, identities[ident.key], 1.0))
            elif best[0] >= dedup_threshold:
                build.near_duplicates.append((program, best[1], best[0]))
            else:
                identities[ident.key] = program.sha256
                kits.append((program.sha256, mine, ident.composition))
                build.kept.append((report.program or program, report))
        else:
            mine = fingerprint(program.code)
            best = max(((jaccard(mine, fp), sha) for sha, fp in prints), default=(0.0, ""))
            if best[0] >= dedup_threshold:
                build.near_duplicates.append((program, best[1], best[0]))
            else:
                prints.append((program.sha256, mine))
                build.kept.append((report.program or program, report))
        if progress is not None:
            progress(i + 1, len(programs))
    return build


def write_split(split: Split, out: str | Path) -> Path:
    """The split as ``split.json`` beside a pool (what a benchmark reads to tell novel
    combinations)."""
    import json

    path = Path(out) / "split.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(split.to_dict(), indent=1) + "\n")
    return path
