"""Which checkpoints a run keeps, how much disk they take, and which one a resume loads.

A checkpointing round writes ``checkpoints/step-N`` and commits its pointer with the round; the
same commit forgets the pointers ``checkpoint.keep_last``/``keep_every`` no longer keep
(:func:`forget_unkept`), and their folders are deleted right after (:func:`sweep`), so a crash
leaves at most an orphan folder, never a pointer to a deleted checkpoint (:func:`sweep_orphans`
on resume; :func:`prune_checkpoints` does both between rounds). :func:`checkpoint_budget` is the
disk bound ``--dry-run`` prints. :func:`load_latest_good` loads the newest checkpoint that
loads, else falls back to the previous one with a warning and a ``checkpoint_fallback`` event;
damaged ones are set aside as ``damaged-step-N`` (:func:`set_aside_damaged`).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from spadekit.common.config_fields import Count, PosInt, section
from spadekit.common.errors import SpadekitError

__all__ = ["CheckpointConfig", "CheckpointWriteError", "checkpoint_budget", "disk_use",
           "forget_unkept", "kept_steps", "load_latest_good", "max_kept", "parameters_from_name",
           "prune_checkpoints", "set_aside_damaged", "sweep", "sweep_orphans", "unkept_folders"]

log = logging.getLogger(__name__)

_STEP = re.compile(r"^\.?step-(\d+)(?:$|\.)")


class CheckpointWriteError(SpadekitError):
    """A checkpoint could not be written (a full disk, a read-only or vanished folder); the
    round is not committed and the previous checkpoint is untouched."""

    reason = "checkpoint_write"


@section(knob="checkpoint")
class CheckpointConfig:
    """How many checkpoints a run keeps (``checkpoint:`` in a config)."""

    keep_last: PosInt = 2
    """The newest checkpoints kept (at least 1; 2 keeps a previous good one for the fallback
    when the newest is damaged)."""
    keep_every: Count = 0
    """Also keep the checkpoint of every round that is a multiple of this (rounds counted
    from 1); 0: none beyond ``keep_last``."""


def kept_steps(steps: list[int], config: CheckpointConfig) -> set[int]:
    """The steps (0-based rounds) of ``steps`` that ``config`` keeps."""
    ordered = sorted(set(int(s) for s in steps))
    keep = set(ordered[-config.keep_last:])
    if config.keep_every:
        keep |= {s for s in ordered if (s + 1) % config.keep_every == 0}
    return keep


def disk_use(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 when it does not exist)."""
    total = 0
    if not Path(path).exists():
        return 0
    for f in Path(path).rglob("*"):
        try:
            if f.is_file() and not f.is_symlink():
                total += f.stat().st_size
        except OSError:  # removed while we looked
            continue
    return total


def forget_unkept(store: Any, config: CheckpointConfig) -> set[int]:
    """Drop the pointers of the checkpoints ``config`` does not keep (inside the open round's
    transaction when there is one, so they go with the commit of the newer pointer). Returns
    the kept steps."""
    recorded = [row["step"] for row in store.checkpoints()]
    keep = kept_steps(recorded, config)
    drop = sorted(set(recorded) - keep)
    if drop:
        store.forget_checkpoints(drop)
    return keep


def unkept_folders(run_dir: Path, keep: set[int]) -> list[Path]:
    """The checkpoint folders under ``run_dir/checkpoints`` of steps not in ``keep`` (also the
    aside and temporary copies a save leaves, ``.step-N.*``)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    out = []
    for entry in sorted(root.iterdir()):
        match = _STEP.match(entry.name)
        if match is not None and int(match.group(1)) not in keep:
            out.append(entry)
    return out


def sweep(folders: list[Path]) -> int:
    """Delete ``folders``; returns the bytes freed."""
    freed = 0
    for entry in folders:
        size = disk_use(entry)
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            freed += size
    return freed


def prune_checkpoints(store: Any, config: CheckpointConfig) -> dict[str, Any]:
    """Forget, then delete, the checkpoints ``config`` does not keep, and any folder no pointer
    names (see the module docstring). Call it between rounds. Returns ``{"removed": [steps],
    "freed_bytes": n, "kept": [steps]}``."""
    keep = forget_unkept(store, config)
    folders = unkept_folders(store.run_dir, keep)
    freed = sweep(folders)
    removed = sorted({int(_STEP.match(f.name).group(1)) for f in folders if not f.exists()})
    return {"removed": removed, "freed_bytes": freed, "kept": sorted(keep)}


def max_kept(rounds: int, checkpoint_every: int, config: CheckpointConfig) -> int:
    """The most checkpoints a run of ``rounds`` keeps at once (after a prune)."""
    steps = [s for s in range(rounds) if (s + 1) % max(1, checkpoint_every) == 0]
    every = 0
    if config.keep_every:
        every = sum((s + 1) % config.keep_every == 0 for s in steps[:-config.keep_last])
    return min(len(steps), config.keep_last) + every


FULL_BYTES_PER_PARAMETER = 2 + 8
"""A full fine-tune's checkpoint per parameter: bf16 weights and fp32 Adam's two moments."""


def checkpoint_budget(config: Any, parameters: float | None) -> dict[str, Any]:
    """``--dry-run``'s disk figures: the checkpoints kept at most between rounds, the most on
    disk at once (one more while a round's new checkpoint is written before the oldest goes)
    and, for a full fine-tune of a model of ``parameters`` parameters (None when unknown), the
    disk bound (of that peak) at
    :data:`FULL_BYTES_PER_PARAMETER`. A LoRA checkpoint holds only the adapters and their
    optimizer state, whose size depends on the model's shapes: the run prints its measured
    disk use instead (``checkpoint_bytes_estimate`` is None)."""
    ckpt = config.checkpoint
    kept = max_kept(config.rounds, config.checkpoint_every, ckpt)
    # a new checkpoint is written (and committed) before the oldest kept one is deleted
    peak = kept + 1 if config.rounds > kept * max(1, config.checkpoint_every) else kept
    out: dict[str, Any] = {"checkpoints_kept_max": kept, "checkpoints_on_disk_max": peak,
                           "checkpoint_keep_last": ckpt.keep_last,
                           "checkpoint_keep_every": ckpt.keep_every,
                           "checkpoint_bytes_estimate": None, "checkpoint_disk_bound_gb": None}
    if parameters and not config.train.use_peft:
        each = parameters * FULL_BYTES_PER_PARAMETER
        out["checkpoint_bytes_estimate"] = int(each)
        out["checkpoint_disk_bound_gb"] = round(peak * each / 1e9, 1)
    return out


def parameters_from_name(model: str) -> float | None:
    """A parameter count read from a model name (``Qwen3-4B``: 4e9, ``smollm2-135m``:
    1.35e8), or None."""
    found = re.findall(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)([bm])(?![a-z0-9])", model.lower())
    if not found:
        return None
    number, unit = found[-1]
    return float(number) * (1e9 if unit == "b" else 1e6)


def set_aside_damaged(store: Any, damaged: list[dict[str, Any]]) -> None:
    """Forget the pointers of ``damaged`` checkpoints and rename their folders to
    ``checkpoints/damaged-step-N`` (kept for a look, never pruned, never loaded)."""
    store.forget_checkpoints([p["step"] for p in damaged])
    for pointer in damaged:
        folder = Path(pointer["path"])
        if folder.exists():
            target = folder.parent / f"damaged-{folder.name}"
            if target.exists():
                shutil.rmtree(target, ignore_errors=True)
            folder.rename(target)


def sweep_orphans(store: Any) -> int:
    """Delete the checkpoint folders no pointer names (a round that died while saving); the
    recorded ones stay, whatever ``keep_last`` says now (a resume may need to fall back)."""
    recorded = {int(p["step"]) for p in store.checkpoints()}
    return sweep(unkept_folders(store.run_dir, recorded))


def load_latest_good(pointers: list[dict[str, Any]], load: Callable[[str], None],
                     last_round: int | None, warn: Callable[[str], None] | None = None,
                     record: Callable[[dict[str, Any]], None] | None = None,
                     set_aside: Callable[[list[dict[str, Any]]], None] | None = None
                     ) -> dict[str, Any] | None:
    """Load the newest of ``pointers`` (checkpoint pointers, newest first) with ``load(path)``;
    when it fails, the one before, and so on. Returns the pointer that loaded (None when there
    are none). A fallback is never silent: ``warn`` (and the log) get a message naming the
    damaged checkpoint and the rounds whose weight updates are lost, and ``record`` gets a
    ``checkpoint_fallback`` event for the run database, and ``set_aside`` the damaged pointers
    (:func:`set_aside_damaged`: so a damaged checkpoint never counts as one of the kept ones
    and never displaces the good one just loaded). When none loads, the newest one's failure is
    raised again."""
    if not pointers:
        return None
    failures: list[tuple[dict[str, Any], BaseException]] = []
    for pointer in pointers:
        try:
            load(str(pointer["path"]))
        except Exception as exc:  # any file problem: try the one before
            failures.append((pointer, exc))
            continue
        if failures:
            bad = failures[0][0]["step"]
            upto = last_round if last_round is not None else bad
            text = (f"the checkpoint of round {bad} does not load ({failures[0][1]}); "
                    f"resuming from the checkpoint of round {pointer['step']}: the weight and "
                    f"optimizer updates of rounds {pointer['step'] + 1}-{upto} are lost (their "
                    f"environments, memory and metrics are kept)")
            log.warning(text)
            if warn is not None:
                warn(text)
            if set_aside is not None:
                set_aside([p for p, _e in failures])
            if record is not None:
                record({"kind": "checkpoint_fallback", "loaded": pointer["step"],
                        "lost_rounds": [pointer["step"] + 1, upto],
                        "damaged": [{"step": p["step"], "error": str(e)[:500]}
                                    for p, e in failures]})
        return pointer
    raise failures[0][1]
