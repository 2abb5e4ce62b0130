"""Multi-process training of ``PolicyTrainer``: DDP and FSDP under ``accelerate launch``/``torchrun``.

``setup_distributed`` initialises ``torch.distributed`` from the launcher's ``RANK``,
``WORLD_SIZE``, ... unless a process group already exists (then it is reused). Strategy
``"auto"`` picks ``"no"`` in one process, else ``"fsdp"`` or ``"deepspeed"`` from accelerate's
exported flags, else ``"ddp"``; ``"deepspeed"`` raises (not implemented; use ``"fsdp"``).
Guarantee: every rank gets the same global batch, trains a deterministic shard of it
(:func:`shard_indices`), and the summed gradient equals the single-process gradient of the whole
batch; ranks make the same number of collective passes; clipping uses the global norm; the
returned statistics are global. Rank 0 writes single-process-format checkpoints, every rank
reads them (FSDP+LoRA checkpoints are not supported). Launch commands: docs/design/train.md.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import Tensor, nn

from spadekit.train.loss import token_logprobs

__all__ = ["DistContext", "LogprobModule", "STRATEGIES", "resolve_strategy", "setup_distributed",
           "shard_indices", "wrap_model", "clip_grad_norm", "full_tensor", "gathered_parameters",
           "full_state_dict", "full_optimizer_state", "load_full_state_dict",
           "load_full_optimizer_state", "load_sharded", "place_on_local_device"]

STRATEGIES = ("auto", "no", "ddp", "fsdp", "deepspeed")


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def resolve_strategy(requested: str, world_size: int,
                     env: dict[str, str] | None = None) -> str:
    """The strategy actually used: ``"no"`` in one process; ``"auto"`` reads accelerate's
    launcher environment (``ACCELERATE_USE_FSDP``, ``ACCELERATE_USE_DEEPSPEED``), else DDP."""
    env = os.environ if env is None else env
    if requested not in STRATEGIES:
        raise ValueError(f"distributed_strategy must be one of {STRATEGIES}, got {requested!r}")
    if world_size <= 1:
        return "no"
    if requested != "auto":
        return requested
    if _truthy(env.get("ACCELERATE_USE_DEEPSPEED")):
        return "deepspeed"
    if _truthy(env.get("ACCELERATE_USE_FSDP")):
        return "fsdp"
    return "ddp"


def fsdp_reshard_default(configured: bool | None, env: dict[str, str] | None = None) -> bool:
    """``fsdp_reshard_after_forward``: the config's value, else accelerate's
    ``FSDP_RESHARD_AFTER_FORWARD`` (``true``/``false`` or a FSDP1 sharding strategy name),
    else True (ZeRO-3-like)."""
    if configured is not None:
        return configured
    value = (os.environ if env is None else env).get("FSDP_RESHARD_AFTER_FORWARD")
    if value is None:
        return True
    value = value.strip().upper()
    return value in ("TRUE", "1", "FULL_SHARD", "HYBRID_SHARD")


@dataclass
class DistContext:
    """This process's place in the job and the strategy in use."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    strategy: str = "no"

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """Sum (or max) of ``values`` over the ranks, in one float64 collective."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t.tolist()

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def _comm_device() -> torch.device:
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def setup_distributed(strategy: str = "auto", backend: str | None = None,
                      timeout_s: int = 1800) -> DistContext:
    """Join (or initialise from the launcher's environment) the process group; one process
    without a launcher gives ``DistContext()`` (strategy ``"no"``)."""
    if dist.is_available() and dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
    else:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        if world > 1 and strategy != "no":
            if backend is None:
                backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    resolved = resolve_strategy(strategy, world if strategy != "no" else 1)
    if resolved == "deepspeed":
        raise NotImplementedError(
            "PolicyTrainer: DeepSpeed is not supported (its engine owns backward, clipping and "
            "the optimizer step, which this trainer does itself); launch without the DeepSpeed "
            "config and use distributed_strategy='fsdp' (ZeRO-3-like) or 'ddp'")
    if resolved == "no":
        return DistContext()
    return DistContext(world_size=world, rank=rank, local_rank=local, strategy=resolved)


def shard_indices(loads: Sequence[int], world_size: int, rank: int) -> list[int]:
    """The indices of ``loads`` (e.g. padded lengths) that ``rank`` trains: longest first, each
    to the rank with the least load so far (ties: lowest rank), returned in input order.
    Deterministic, so every rank computes the same partition from the same list; works for
    any count (uneven splits; a rank may get nothing)."""
    totals = [0] * world_size
    mine: list[int] = []
    for i in sorted(range(len(loads)), key=lambda i: (-loads[i], i)):
        r = min(range(world_size), key=lambda k: (totals[k], k))
        totals[r] += max(int(loads[i]), 1)
        if r == rank:
            mine.append(i)
    return sorted(mine)


class LogprobModule(nn.Module):
    """``forward(input_ids, rows, cols)``: the logprobs of the tokens at ``(rows, cols)`` (each
    predicted from position ``col - 1``), flat ``[N]`` float32.

    With a split head (``split = (backbone, head)``) logits are computed only at those positions,
    chunk by chunk, and recomputed in the backward (``checkpoint_head``); otherwise the plain
    forward. Right padding needs no attention mask under causal attention. This is the module
    that DDP/FSDP wrap, so the whole computation runs inside their forward hooks."""

    def __init__(self, model: nn.Module, split: tuple[nn.Module, nn.Module] | None,
                 temperature: float, chunk_size: int) -> None:
        super().__init__()
        self.model = model
        self._split = split  # submodules of ``model``; not registered twice
        self.temperature = temperature
        self.chunk_size = chunk_size

    def forward(self, input_ids: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
        targets = input_ids[rows, cols]
        temperature = self.temperature
        if self._split is None:
            logits = self.model(input_ids=input_ids, use_cache=False).logits
            picked = logits[rows, cols - 1].float()
            del logits
            return token_logprobs(picked / temperature, targets)
        backbone, head = self._split
        hidden = backbone(input_ids=input_ids, use_cache=False).last_hidden_state
        picked = hidden[rows, cols - 1]
        del hidden
        chunks = []
        size = self.chunk_size
        grad = torch.is_grad_enabled()
        for start in range(0, picked.shape[0], size):
            h, t = picked[start:start + size], targets[start:start + size]
            if grad:
                chunks.append(torch.utils.checkpoint.checkpoint(
                    _head_logprobs, head, h, t, temperature, use_reentrant=False))
            else:
                chunks.append(_head_logprobs(head, h, t, temperature))
        return torch.cat(chunks) if chunks else picked.new_zeros(0, dtype=torch.float32)


def _head_logprobs(head: Any, hidden: Tensor, targets: Tensor, temperature: float) -> Tensor:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    return token_logprobs(logits, targets)


def wrap_model(module: LogprobModule, ctx: DistContext, *, find_unused_parameters: bool = False,
               bucket_cap_mb: int | None = None, reshard_after_forward: bool = True) -> nn.Module:
    """``module`` wrapped for ``ctx.strategy``: DDP, FSDP2 (in place: the parameters become
    sharded DTensors; decoder layers are their own units), or ``module`` itself."""
    if ctx.strategy == "no":
        return module
    params = list(module.parameters())
    device = params[0].device if params else torch.device("cpu")
    if ctx.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        import inspect

        # Buffers (rotary tables) are equal on every rank: no sync before each forward.
        sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(
            DistributedDataParallel).parameters else "broadcast_buffers")
        kwargs: dict[str, Any] = {sync: False, "find_unused_parameters": find_unused_parameters}
        if bucket_cap_mb is not None:
            kwargs["bucket_cap_mb"] = bucket_cap_mb
        if device.type == "cuda":
            kwargs.update(device_ids=[device.index], output_device=device.index)
        return DistributedDataParallel(module, **kwargs)  # broadcasts rank 0's weights
    if ctx.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        with torch.no_grad():  # same starting point on every rank, like DDP
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        mesh = init_device_mesh(device.type, (ctx.world_size,))
        names = set(getattr(module.model, "_no_split_modules", None) or ())
        for sub in module.model.modules():
            if type(sub).__name__ in names:
                fully_shard(sub, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)
        return module
    raise ValueError(f"unsupported distributed strategy {ctx.strategy!r}")


def full_tensor(t: Tensor) -> Tensor:
    """A DTensor's full value (a collective: every rank must call it), else ``t``."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _local(t: Tensor) -> Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def clip_grad_norm(params: Sequence[Tensor], max_norm: float, ctx: DistContext) -> float:
    """Clip the gradients to the GLOBAL L2 norm ``max_norm`` (``inf``: report only); returns the
    norm before clipping. Replicated gradients (one process, DDP) use torch's
    ``clip_grad_norm_``; FSDP shards add their squared norms over the ranks first, then apply
    torch's formula ``coef = min(1, max_norm / (norm + 1e-6))``."""
    if ctx.strategy != "fsdp":
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    grads = [p.grad for p in params if p.grad is not None]
    local = sum((_local(g).double().pow(2).sum() for g in grads),
                torch.zeros((), dtype=torch.float64))
    total = math.sqrt(ctx.all_reduce([float(local)])[0])
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        with torch.no_grad():
            for g in grads:
                _local(g).mul_(coef)
    return total


def fsdp_modules(module: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered_parameters(module: nn.Module, ctx: DistContext) -> Iterator[None]:
    """Within: every FSDP unit of ``module`` holds its full parameters and forwards make no
    collectives, so each rank may generate on its own (different lengths, different counts).
    Entering and leaving are collectives. A no-op without FSDP."""
    if ctx.strategy != "fsdp":
        yield
        return
    units = fsdp_modules(module)
    for m in units:
        m.set_reshard_after_forward(False)
        m.unshard()
    try:
        yield
    finally:
        for m in units:
            m.reshard()
            m.set_reshard_after_forward(True)


def full_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """``module.state_dict()`` with every DTensor gathered to a full CPU tensor (collective)."""
    return {k: full_tensor(v).detach().cpu() for k, v in module.state_dict().items()}


def load_full_state_dict(module: nn.Module, weights: dict[str, Tensor]) -> list[str]:
    """Copy full tensors into ``module``'s (possibly sharded) parameters and buffers, each rank
    taking its own shard locally; returns the state keys absent from ``weights``."""
    from torch.distributed.tensor import distribute_tensor

    missing = []
    with torch.no_grad():
        for name, target in module.state_dict().items():
            if name not in weights:
                missing.append(name)
                continue
            value = weights[name]
            if hasattr(target, "device_mesh"):
                value = distribute_tensor(value.to(target.device, target.dtype),
                                          target.device_mesh, target.placements,
                                          src_data_rank=None)
            _local(target).copy_(_local(value))
    return missing


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` (keyed by parameter index, as in one process) with DTensor
    state gathered to full CPU tensors (collective; deterministic order on every rank)."""
    sd = optimizer.state_dict()
    state = {}
    for idx in sorted(sd["state"]):
        state[idx] = {k: full_tensor(v).cpu() if isinstance(v, Tensor) else v
                      for k, v in sorted(sd["state"][idx].items())}
    return {"state": state, "param_groups": sd["param_groups"]}


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, sd: dict[str, Any]) -> None:
    """Load a full (single-process format) optimizer state into an optimizer over FSDP shards."""
    from torch.distributed.tensor import distribute_tensor

    params = [p for g in optimizer.param_groups for p in g["params"]]
    state = {}
    for idx, entry in sd["state"].items():
        p = params[int(idx)]
        out = {}
        for k, v in entry.items():
            if hasattr(p, "device_mesh") and isinstance(v, Tensor) and v.shape == p.shape:
                v = distribute_tensor(v.to(p.device), p.device_mesh, p.placements,
                                      src_data_rank=None)
            out[k] = v
        state[idx] = out
    optimizer.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


def load_sharded(model: Any, folder: Path) -> None:
    """``_load_in_place`` for FSDP-sharded models: each rank copies its shard of each tensor."""
    from spadekit.train.checkpoint import _read_safetensors

    weights = _read_safetensors(folder)
    unexpected = sorted(set(weights) - set(model.state_dict()))
    if unexpected:
        raise ValueError(f"{folder}: unexpected weights {unexpected[:5]}")
    missing = load_full_state_dict(model, weights)
    named = dict(model.named_parameters(remove_duplicate=False))
    loaded = {id(named[k]) for k in weights if k in named}
    missing = [k for k in missing if k not in named or id(named[k]) not in loaded]
    if missing:
        raise ValueError(f"{folder}: missing weights {missing[:5]}")


def place_on_local_device(policy: Any, model: Any, local_rank: int) -> None:
    """On CUDA, each rank trains (and generates) on ``cuda:LOCAL_RANK``; a model loaded
    elsewhere is moved there (and the policy's ``device`` follows)."""
    if not torch.cuda.is_available():
        return
    target = torch.device("cuda", local_rank)
    if next(model.parameters()).device != target:
        model.to(target)
        if hasattr(policy, "device"):
            policy.device = target
