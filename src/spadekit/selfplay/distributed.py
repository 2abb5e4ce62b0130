"""How the self-play loop runs as several processes (one per GPU): who does what, where the ranks
meet, and generation with FSDP-sharded weights. ``spadekit.selfplay.loop`` is written as one
process's loop; :func:`place_steps` wraps its named steps with the placement below.

Several processes (one per GPU; DDP or FSDP training, ``spadekit.train.distributed``)::

    torchrun --nproc_per_node 8 -m spadekit selfplay --preset games-4b --run-dir runs/a
    accelerate launch --multi_gpu --num_processes 8 -m spadekit selfplay --preset games-4b ...
    accelerate launch --use_fsdp --num_processes 8 -m spadekit selfplay ...        # FSDP
    torchrun --nproc_per_node 8 -m spadekit selfplay --resume runs/a              # resume
    (``train.distributed_strategy``: auto, the default, picks DDP, or FSDP under
    accelerate's --use_fsdp; ``spadekit train-fixed`` runs the same loop.)

Every process runs the same program; what each rank does:

- rank 0 alone owns the run directory (run.sqlite, events.jsonl, config.yaml, TensorBoard,
  memory, corpus and curriculum state, evals/, the checkpoint files) and the environment side:
  design, validation, hints, plays (with the sandbox pool), rewards and advantages, exactly as
  one process would, with the same random streams; its ``--run-dir`` is the run's (the other
  ranks' value is ignored). The other ranks open no store, start no sandbox, write no file.
- each round, rank 0 sends the round's samples (agent + designer ``Sample``s) to every rank and
  all ranks call ``trainer.train_step(samples)`` together (each trains its shard; the update
  equals one process's); under FSDP every rank enters ``trainer.gathered_for_generation()``
  around rank 0's design + play phase and in-loop evaluation (the other ranks wait inside).
- checkpoints: every rank calls ``trainer.save(path)`` with rank 0's path (rank 0 writes);
  rank 0 alone records the pointer and commits the round. ``--resume``: rank 0 reads the
  stored config and the checkpoint pointer and sends them; every rank loads the checkpoint.
- the ranks meet after each named step of the setup and of the round (:data:`PLACEMENT` says
  where each runs; :func:`place_steps` wraps the loop's steps accordingly; over a gloo
  group with a long timeout, since the others wait while rank 0 plays): a failure on any rank
  (rank 0's design, play, commit...) reaches the others there, and every rank raises (the
  others ``PeerFailed``): the round is not committed, every process exits with an error, and
  ``--resume`` continues. A rank that dies inside a training collective is torn down by the
  launcher (or the collective times out after ``train.ddp_timeout``).
- metrics: ``world_size`` is logged every round; the training statistics are global.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from typing import Any, Callable

from spadekit.common.errors import ConfigError, SpadekitError

__all__ = ["CONTROL_TIMEOUT_S", "PeerFailed", "control_group", "generation_context",
           "join_launch", "meet", "place_steps", "PLACEMENT"]


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

PLACEMENT: dict[str, str] = {
    # setting up a run (``SelfPlay._setup``)
    "open_run": SHARED, "load_model": EVERY, "prepare_generation": MAIN, "create_run": MAIN,
    "build_trainer": EVERY, "start_environment_side": SHARED, "load_checkpoint": EVERY,
    "restore_loop_state": MAIN, "resume_pipeline": MAIN,
    # one round (``SelfPlay._round``)
    "apply_schedule": EVERY, "begin_round": MAIN, "design_environments": MAIN, "validate": MAIN, "hint": MAIN,
    "play": MAIN, "reward": MAIN, "advantages": SHARED, "update": EVERY,
    "sync_generation": MAIN, "retire": MAIN, "checkpoint_dir": SHARED, "save_checkpoint": EVERY,
    "evaluate": MAIN, "commit": SHARED,
}
"""Which ranks run each named step of the loop (every step the loop calls is listed)."""

FULL_WEIGHTS = frozenset({"design_environments", "validate", "hint", "play", "sync_generation",
                          "evaluate"})
"""Steps that generate (validation may run repair and judge turns): under FSDP every rank enters
``generation_context`` around them, so rank 0 generates with the full weights while the
others wait inside."""


def place_steps(loop: Any, dist_ctx: Any, control: Any) -> None:
    """Wrap each step of ``loop`` named in :data:`PLACEMENT` so that it runs where the table
    says, and the ranks meet after it (:func:`meet`): the loop's round stays the plain sequence
    of one process, and this is the only place that knows about ranks. With one process the
    wrapped step just runs (inside ``generation_context``, a no-op without FSDP)."""
    main = dist_ctx is None or not dist_ctx.enabled or dist_ctx.is_main
    for name, where in PLACEMENT.items():
        step = getattr(loop, name)

        def placed(*args, _step=step, _name=name, _where=where, **kwargs):
            work = (lambda: _step(*args, **kwargs)) if (main or _where == EVERY) else None
            label = _name.replace("_", " ")
            if args and isinstance(getattr(args[0], "step", None), int):  # a round's step
                label += f" in round {args[0].step}"
            weights = (generation_context(loop.trainer) if _name in FULL_WEIGHTS
                       else contextlib.nullcontext())
            with weights:
                return meet(dist_ctx, control, work, label, share=_where == SHARED)

        placed.__name__ = placed.__qualname__ = name
        placed.__doc__ = step.__doc__
        setattr(loop, name, placed)
