"""The self-play loop as several processes (one per GPU, DDP or FSDP; ``torchrun`` or
``accelerate launch ... -m spadekit selfplay``): where each step runs and where the ranks meet.

Each step of the loop declares its placement with :func:`placed`: rank 0 alone (:data:`MAIN`:
the run directory and the environment side), rank 0 with its result sent to all
(:data:`SHARED`), or every rank (:data:`EVERY`: loading, wrapping, training, saving). After
each step the ranks meet (:func:`meet`, over a gloo group with a long timeout): a failure on
any rank makes every rank raise (the others :class:`PeerFailed`), nothing of the round is
committed, and ``--resume`` continues. Steps that generate run inside
:func:`generation_context` on every rank (FSDP gathers the full weights for rank 0). With one
process a placed step just runs. ``docs/scaling.md`` has the launch commands.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
from typing import Any, Callable

from spadekit.common.errors import ConfigError, SpadekitError

__all__ = ["CONTROL_TIMEOUT_S", "EVERY", "MAIN", "PeerFailed", "SHARED", "control_group",
           "generation_context", "join_launch", "meet", "placed"]


class PeerFailed(SpadekitError):
    """Another process of a multi-process run failed (``rank``, ``what`` it was doing): this
    one stops too, with nothing of the round committed."""

    reason = "distributed"


CONTROL_TIMEOUT_S = 7 * 24 * 3600
"""How long the ranks wait for each other at a meeting point of the round (the others wait
there while rank 0 designs and plays, which may take hours): a failure is reported there
at once; this bounds only a rank 0 that hangs."""


def meet(dist_ctx: Any, control: Any, work: Callable[[], Any] | None, what: str, *,
         share: bool = True) -> Any:
    """A meeting point of the ranks. Each rank runs ``work`` (None: nothing to do on this rank);
    then, with several processes, the ranks exchange their outcomes: when any failed, every
    rank raises (the failed one its own exception, the others ``PeerFailed``); else returns
    rank 0's result on every rank (``share``), or each rank's own. Every rank must reach the
    same meeting points in the same order; one process just runs ``work``."""
    if dist_ctx is None or not dist_ctx.enabled:
        return work() if work is not None else None
    import torch.distributed as tdist

    value = error = None
    try:
        if work is not None:
            value = work()
    except BaseException as exc:  # noqa: BLE001 - re-raised below, once the others know
        error = exc
    note = None if error is None else f"{type(error).__name__}: {error}"[:1000]
    notes: list[Any] = [None] * dist_ctx.world_size
    tdist.all_gather_object(notes, note, group=control)
    if error is not None:
        raise error
    failed = [(r, n) for r, n in enumerate(notes) if n is not None]
    if failed:
        rank, note = failed[0]
        raise PeerFailed(f"rank {rank} failed to {what}: {note}", rank=rank, what=what)
    if share:
        box = [value if dist_ctx.is_main else None]
        tdist.broadcast_object_list(box, src=0, group=control)
        value = box[0]
    return value


@contextlib.contextmanager
def generation_context(trainer: Any):
    """``trainer.gathered_for_generation()`` (a collective under FSDP: every rank enters).

    Two FSDP2 details the trainer's context leaves to its caller: FSDP names its root at the
    first forward, so a generation through the decoder layers before any training forward
    (round 0, or right after a resume) would make each layer a root of its own ("FSDP state
    has already been lazily initialized"): the trainer's root (``LogprobModule``) is
    initialised first (local, idempotent). And each generation forward is recorded in FSDP's
    forward order, which only a backward clears: left there, rank 0's backward prefetches
    would differ from the other ranks' and the collectives would deadlock, so the iteration
    state is reset afterwards (local; the weights are resharded by then)."""
    root = getattr(trainer, "_lp", None) if getattr(trainer, "_fsdp", False) else None
    if root is not None and hasattr(root, "_get_fsdp_state"):
        root._get_fsdp_state()._lazy_init()
    try:
        with trainer.gathered_for_generation():
            yield
    finally:
        if root is not None:
            _forget_generation_forwards(root)


def join_launch(config: Any):
    """This process's ``DistContext``: one process (``world_size`` 1) without a launcher, else
    the launcher's process group, joined (or initialised) with the trainer's settings."""
    from spadekit.train.distributed import DistContext, setup_distributed

    try:
        import torch.distributed as tdist

        joined = tdist.is_available() and tdist.is_initialized()
    except ImportError:
        return DistContext()
    world = tdist.get_world_size() if joined else int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    tc = config.train
    if tc.distributed_strategy == "no":
        raise ConfigError(f"launched as {world} processes, but train.distributed_strategy=no "
                          "would make every process a separate run of the same directory: "
                          "use auto (the default), ddp or fsdp, or launch one process")
    return setup_distributed(tc.distributed_strategy, tc.ddp_backend, tc.ddp_timeout)


_CONTROL: tuple[Any, Any] | None = None  # (the default group, its control group)


def control_group(ctx):
    """A gloo group over all ranks with a long timeout, for the round's meeting points (the
    other ranks wait there while rank 0 plays); made once per process group."""
    global _CONTROL
    if not ctx.enabled:
        return None
    import torch.distributed as tdist

    world = tdist.group.WORLD
    if _CONTROL is None or _CONTROL[0] is not world:
        _CONTROL = (world, tdist.new_group(
            backend="gloo", timeout=datetime.timedelta(seconds=CONTROL_TIMEOUT_S)))
    return _CONTROL[1]


def _forget_generation_forwards(root: Any) -> None:
    """Clear FSDP2's per-iteration forward record (see :func:`generation_context`)."""
    if hasattr(root, "reset_iter_state"):  # torch >= 2.10
        root.reset_iter_state()
        return
    state = root._get_fsdp_state()
    state._comm_ctx.post_forward_order.clear()
    for sub in state._state_ctx.all_states:
        for group in sub._fsdp_param_groups:
            group._post_forward_indices.clear()


# -- where each step of the loop runs ---------------------------------------------------------

MAIN = "main"
"""Rank 0 runs the step; the other ranks wait at its meeting point and get None."""
SHARED = "shared"
"""Rank 0 runs the step; every rank gets its result (broadcast)."""
EVERY = "every"
"""Every rank runs the step (collectives inside: loading, wrapping, training, saving)."""


def placed(where: str, *, full_weights: bool = False) -> Callable[[Callable], Callable]:
    """Declare where a step runs (:data:`MAIN`, :data:`SHARED` or :data:`EVERY`) and run it
    there: the ranks meet after it (:func:`meet`); ``full_weights`` (a step that generates):
    every rank enters ``generation_context`` around it. The step's object has ``dist`` and
    ``control`` (and ``trainer`` for ``full_weights``); with one process the step just runs.
    The mark is ``step.placement``."""
    if where not in (MAIN, SHARED, EVERY):
        raise ValueError(f"unknown placement {where!r}")

    def mark(step: Callable) -> Callable:
        @functools.wraps(step)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            dist = self.dist
            here = where == EVERY or not dist.enabled or dist.is_main
            work = (lambda: step(self, *args, **kwargs)) if here else None
            label = step.__name__.replace("_", " ")
            if args and isinstance(getattr(args[0], "step", None), int):  # a round's step
                label += f" in round {args[0].step}"
            with (generation_context(self.trainer) if full_weights
                  else contextlib.nullcontext()):
                return meet(dist, self.control, work, label, share=where == SHARED)

        run.placement = where
        return run

    return mark
