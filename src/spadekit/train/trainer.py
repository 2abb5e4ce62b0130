"""``PolicyTrainer``: the GRPO update of the one SPADE policy, both roles in one batch.

``train_step(samples)`` takes agent and designer ``Sample`` records and makes ``num_iterations``
AdamW steps: drop samples of an importance-sampled role without behaviour logprobs, truncated
ones under ``mask_truncated_completions`` and ones without loss tokens (each counted); pack the
rest longest first into micro-batches within the token budget; compute old logprobs (the
detached gradient-pass logprobs when ``num_iterations == 1``) and reference logprobs (``beta >
0``) once per batch; apply ``grpo_loss`` per micro-batch, normalised so the gradient is that of
the whole batch however it was split; clip, step, report. The policy's model is updated in
place. Multi-process runs give the single-process update (``spadekit.train.distributed``).
``save``/``load`` write and read a checkpoint atomically (``spadekit.train.checkpoint``).
Design notes: docs/design/train.md.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import shutil
import time
import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.utils.checkpoint
from torch import Tensor

from spadekit.common.faults import fault_point
from spadekit.common.packing import pack_in_order
from spadekit.train.sample import Sample
from spadekit.train.checkpoint import (
    CHECKPOINT_FORMAT,
    STATE_FILE,
    _fsync_tree,
    _load_in_place,
    _read_safetensors,
    _resolve_checkpoint,
    _swap_into_place,
    rng_state,
    set_rng_state,
)
from spadekit.train.config import TrainConfig
from spadekit.train.distributed import (
    LogprobModule,
    clip_grad_norm,
    fsdp_reshard_default,
    full_optimizer_state,
    full_state_dict,
    gathered_parameters,
    load_full_optimizer_state,
    load_sharded,
    place_on_local_device,
    setup_distributed,
    shard_indices,
    wrap_model,
)
from spadekit.train.loss import grpo_loss
from spadekit.train.model_prep import (
    add_lora,
    enable_checkpointing,
    frozen_copy,
    is_peft,
    split_head,
)

__all__ = ["PolicyTrainer", "pack_microbatches", "CHECKPOINT_FORMAT"]

_STAT_KEYS = ("pg_loss", "clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean", "tis_mean",
              "tis_capped_frac", "tis_sq_mean", "mismatch_kl", "kl")
def pack_microbatches(lengths: Sequence[int], max_tokens: int, max_rows: int) -> list[list[int]]:
    """Group sequence indices into micro-batches, longest first: a micro-batch holds at most
    ``max_rows`` sequences and ``rows * longest <= max_tokens`` padded tokens (a sequence longer
    than the budget gets one of its own). Deterministic: ties keep the input order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return pack_in_order(order, lengths, max_rows,
                         lambda rows, widest: rows * widest <= max_tokens)


@dataclass
class _MicroBatch:
    """A right-padded micro-batch and where its loss tokens are, in a compact ``[B, L]`` layout
    (row ``b``, column ``j`` = the ``j``-th loss token of sequence ``b``)."""

    indices: list[int]
    input_ids: Tensor  # [B, T]
    rows: Tensor  # [N] row of each loss token
    cols: Tensor  # [N] position of each loss token in its row (always >= 1)
    slot: Tensor  # [N] its column in the compact layout
    mask: Tensor  # [B, L] bool
    advantages: Tensor  # [B]
    weights: Tensor  # [B]
    behaviour: Tensor | None  # [B, L] (NaN where a row is not importance-weighted)
    tis_rows: Tensor  # [B] bool
    padded_tokens: int

    @property
    def num_tokens(self) -> int:
        return int(self.rows.numel())

    @property
    def num_sequences(self) -> int:
        return len(self.indices)


class PolicyTrainer:
    """GRPO updates of an ``HFPolicy``'s model (see the module docstring)."""

    def __init__(self, policy: Any, config: TrainConfig | None = None) -> None:
        self.policy = policy
        self.config = cfg = config or TrainConfig()
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        try:  # a checkpoint carries numpy's global stream too: start it from the seed as well
            import numpy as np

            np.random.seed(cfg.seed % 2**32)
        except ImportError:  # pragma: no cover
            pass
        base = policy.model
        self.is_peft = False
        if cfg.use_peft or is_peft(base):
            self.model = base if is_peft(base) else add_lora(base, cfg)
            self.inner = self.model.get_base_model()  # the module the policy runs, adapters in
            self.is_peft = True
        else:
            self.model = self.inner = base
        if cfg.gradient_checkpointing:
            enable_checkpointing(self.inner)
        self.dist = setup_distributed(cfg.distributed_strategy, cfg.ddp_backend, cfg.ddp_timeout)
        if self.dist.enabled:
            place_on_local_device(policy, self.model, self.dist.local_rank)
        self.device = next(self.inner.parameters()).device
        self.vocab_size = self.inner.get_input_embeddings().num_embeddings
        self._split = split_head(self.inner)
        self.ref_model = None
        if cfg.beta > 0 and not self.is_peft:
            self.ref_model = frozen_copy(self.inner)
        wrap = {"find_unused_parameters": cfg.ddp_find_unused_parameters,
                "bucket_cap_mb": cfg.ddp_bucket_cap_mb,
                "reshard_after_forward": fsdp_reshard_default(cfg.fsdp_reshard_after_forward)}
        self._lp = LogprobModule(self.inner, self._split, cfg.temperature, cfg.logprob_chunk_size)
        self._engine = wrap_model(self._lp, self.dist, **wrap)  # DDP wrapper, or _lp itself
        self._ref_lp = None
        if self.ref_model is not None:
            self._ref_lp = LogprobModule(self.ref_model, split_head(self.ref_model),
                                         cfg.temperature, cfg.logprob_chunk_size)
            if self.dist.strategy == "fsdp":
                wrap_model(self._ref_lp, self.dist, **wrap)
        self._fsdp = self.dist.strategy == "fsdp"
        self._n_steps = 0  # micro-batch passes of the current batch (max over the ranks)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not self.trainable:
            raise ValueError("PolicyTrainer: the model has no trainable parameters")
        decay = [p for p in self.trainable if p.dim() >= 2]
        no_decay = [p for p in self.trainable if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW([g for g in groups if g["params"]],
                                           lr=cfg.learning_rate,
                                           betas=(cfg.adam_beta1, cfg.adam_beta2),
                                           eps=cfg.adam_epsilon)
        self.step = 0

    # -- public API ---------------------------------------------------------------------------

    def train_step(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """``num_iterations`` optimizer steps on ``samples``; returns the step's statistics.

        Counts: ``num_samples``, ``num_samples_trained``, ``dropped_no_logprobs``,
        ``dropped_truncated``, ``dropped_empty``, ``skipped_zero_advantage`` (in the normaliser, not
        computed), ``num_importance_weighted``, ``num_tokens``, ``num_padded_tokens``,
        ``num_microbatches``. Loss statistics averaged over ``optimizer_steps``: ``loss``,
        ``pg_loss``, ``kl`` (``beta > 0``), ``clip_frac``/``_low``/``_high``, ``ratio_mean``,
        ``tis_mean``, ``tis_capped_frac``, ``tis_std``, ``mismatch_kl``, ``grad_norm`` (before
        clipping), ``grad_clipped``; then ``step``, ``learning_rate``, ``seconds``,
        ``tokens_per_second``, ``peak_rss_mb`` and on CUDA ``peak_device_mb``. Nothing to train on:
        ``optimizer_steps == 0``.
        """
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        stats: dict[str, Any] = {}
        batches, norm = self._prepare(samples, stats)
        cfg = self.config
        old = ref = None
        if cfg.num_iterations > 1 and self._n_steps:
            old = self._score(batches, reference=False)
        if cfg.beta > 0 and self._n_steps:
            ref = self._score(batches, reference=True)
        runs: list[dict[str, float]] = []
        for _ in range(cfg.num_iterations):
            if not self._n_steps:  # nothing to train on any rank
                break
            runs.append(self._update(batches, norm, old, ref))
        stats.update(loss=0.0, grad_norm=0.0)
        for key in (runs[0] if runs else {}):
            stats[key] = sum(r[key] for r in runs) / len(runs)
        if "tis_sq_mean" in stats:  # the spread of the importance weights
            stats["tis_std"] = math.sqrt(max(stats.pop("tis_sq_mean") - stats["tis_mean"] ** 2,
                                             0.0))
        stats.update(step=self.step, optimizer_steps=len(runs),
                     learning_rate=self.optimizer.param_groups[0]["lr"],
                     seconds=time.perf_counter() - t0)
        stats["tokens_per_second"] = (stats["num_padded_tokens"] * len(runs)
                                      / max(stats["seconds"], 1e-9))
        stats.update(_memory_stats(self.device))
        return stats

    def compute_gradients(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """The gradient of the batch loss, left in the parameters' ``.grad`` (no optimizer step,
        no clipping); for tests and diagnostics. Under DDP every rank holds the global gradient;
        under FSDP each rank holds its shard of it (DTensors)."""
        stats: dict[str, Any] = {}
        batches, norm = self._prepare(samples, stats)
        ref = self._score(batches, reference=True) if self.config.beta > 0 and self._n_steps \
            else None
        self.optimizer.zero_grad(set_to_none=True)
        if self._n_steps:
            stats.update(self._accumulate(batches, norm, None, ref))
        return stats

    # -- batching -------------------------------------------------------------------------------

    def _prepare(self, samples: Sequence[Sample], stats: dict[str, Any]):
        cfg = self.config
        kept: list[Sample] = []
        counts = {"dropped_no_logprobs": 0, "dropped_truncated": 0, "dropped_empty": 0,
                  "skipped_zero_advantage": 0}
        for s in samples:
            if s.role in cfg.importance_sampling_roles and s.behaviour_logprobs is None:
                counts["dropped_no_logprobs"] += 1
            elif cfg.mask_truncated_completions and s.truncated:
                counts["dropped_truncated"] += 1
            elif not any(s.loss_mask[1:]):  # position 0 has no context to be predicted from
                counts["dropped_empty"] += 1
            else:
                kept.append(s)
        for s in kept:
            if min(s.token_ids) < 0 or max(s.token_ids) >= self.vocab_size:
                raise ValueError(f"PolicyTrainer: token ids outside the vocabulary "
                                 f"(0..{self.vocab_size - 1})")
        n_tokens = sum(sum(s.loss_mask[1:]) for s in kept)
        # A row with a zero advantage or weight adds exactly nothing to the gradient of the
        # surrogate; without a KL term it is counted in the normaliser and not computed.
        work = [i for i, s in enumerate(kept)
                if cfg.beta > 0 or (s.advantage != 0 and s.weight != 0)]
        counts["skipped_zero_advantage"] = len(kept) - len(work)
        totals = dict(counts, num_samples=len(samples), num_samples_trained=len(kept),
                      num_tokens=n_tokens)
        dist = self.dist
        if dist.enabled and cfg.split_batches:  # this rank's share of the global batch
            work = [work[j] for j in shard_indices([len(kept[i].token_ids) for i in work],
                                                   dist.world_size, dist.rank)]
        groups = pack_microbatches([len(kept[i].token_ids) for i in work],
                                   cfg.max_tokens_per_microbatch, cfg.per_device_train_batch_size)
        batches = [self._collate([kept[work[k]] for k in g], [work[k] for k in g])
                   for g in groups]
        local = dict(num_microbatches=len(batches),
                     num_importance_weighted=sum(int(b.tis_rows.sum()) for b in batches),
                     num_padded_tokens=sum(b.padded_tokens for b in batches))
        self._n_steps = len(batches)
        if dist.enabled:  # global counts; every rank makes the same number of passes
            if not cfg.split_batches:  # each rank brought its own samples
                local.update(totals)
            names = list(local)
            summed = dist.all_reduce([local[k] for k in names])
            local = {k: int(v) for k, v in zip(names, summed)}
            self._n_steps = int(dist.all_reduce([len(batches)], op="max")[0])
        totals.update(local)
        stats.update(totals)
        norm = float(totals["num_tokens"] if cfg.loss_type == "token"
                     else totals["num_samples_trained"])
        return batches, norm

    def _dummy(self) -> _MicroBatch:
        """A zero-weight two-token micro-batch, for a rank with fewer passes than the others."""
        s = Sample(role="agent", group_id="", token_ids=[0, 0], loss_mask=[0, 1],
                   behaviour_logprobs=None, advantage=0.0, weight=0.0)
        return self._collate([s], [-1])

    def _passes(self, batches: list[_MicroBatch], collective: bool):
        """``(k, micro-batch, real)``: the local micro-batches, then dummies up to the global
        count when every pass is a collective (the backward always; forwards under FSDP)."""
        total = self._n_steps if collective else len(batches)
        for k in range(total):
            yield k, (batches[k] if k < len(batches) else self._dummy()), k < len(batches)

    def _collate(self, rows: list[Sample], indices: list[int]) -> _MicroBatch:
        width = max(len(s.token_ids) for s in rows)
        pad = getattr(self.policy, "pad_id", 0) or 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        r_idx, c_idx, slots = [], [], []
        longest = 1
        for b, s in enumerate(rows):
            ids[b, :len(s.token_ids)] = torch.tensor(s.token_ids, dtype=torch.long)
            cols = [t for t in range(1, len(s.token_ids)) if s.loss_mask[t]]
            r_idx += [b] * len(cols)
            c_idx += cols
            slots += list(range(len(cols)))
            longest = max(longest, len(cols))
        rows_t, cols_t, slot_t = (torch.tensor(x, dtype=torch.long) for x in (r_idx, c_idx, slots))
        mask = torch.zeros((len(rows), longest), dtype=torch.bool)
        mask[rows_t, slot_t] = True
        tis_rows = torch.tensor([s.role in self.config.importance_sampling_roles
                                 and s.behaviour_logprobs is not None for s in rows])
        behaviour = None
        if bool(tis_rows.any()):
            behaviour = torch.full((len(rows), longest), float("nan"), dtype=torch.float32)
            for b, s in enumerate(rows):
                if tis_rows[b]:
                    sel = (rows_t == b)
                    behaviour[b, slot_t[sel]] = torch.tensor(
                        [float(s.behaviour_logprobs[t]) for t in cols_t[sel].tolist()])
        dev = self.device
        return _MicroBatch(
            indices=indices, input_ids=ids.to(dev), rows=rows_t.to(dev), cols=cols_t.to(dev),
            slot=slot_t.to(dev), mask=mask.to(dev),
            advantages=torch.tensor([float(s.advantage) for s in rows], device=dev),
            weights=torch.tensor([float(s.weight) for s in rows], device=dev),
            behaviour=None if behaviour is None else behaviour.to(dev),
            tis_rows=tis_rows.to(dev), padded_tokens=len(rows) * width)

    # -- logprobs -------------------------------------------------------------------------------

    def _logprobs(self, module: Any, mb: _MicroBatch) -> Tensor:
        """Logprobs of the loss tokens of ``mb`` in the compact ``[B, L]`` layout (0 elsewhere),
        through ``module`` (a ``LogprobModule``, or its DDP wrapper)."""
        flat = module(mb.input_ids, mb.rows, mb.cols)
        out = flat.new_zeros(mb.mask.shape)
        return out.index_put((mb.rows, mb.slot), flat)

    @torch.no_grad()
    def _score(self, batches: list[_MicroBatch], reference: bool) -> list[Tensor]:
        """Gradient-free logprobs of every micro-batch: the current weights (old policy), or the
        reference (frozen copy; the adapter-disabled base with LoRA)."""
        out = []
        if reference and self._ref_lp is not None:
            model, ctx = self._ref_lp, nullcontext()
        elif reference:
            model, ctx = self._lp, self.model.disable_adapter()
        else:
            model, ctx = self._lp, nullcontext()
        was_training = model.training
        model.eval()
        try:
            with ctx:  # under FSDP every forward is a collective: all ranks make the same count
                for _k, mb, real in self._passes(batches, collective=self._fsdp):
                    lp = self._logprobs(model, mb).detach()
                    if real:
                        out.append(lp)
        finally:
            model.train(was_training)
        return out

    # -- the update -----------------------------------------------------------------------------

    def _accumulate(self, batches: list[_MicroBatch], norm: float, old: list[Tensor] | None,
                    ref: list[Tensor] | None) -> dict[str, float]:
        """Forward and backward over every micro-batch; gradients add up to the batch loss."""
        cfg = self.config
        totals: dict[str, float] = {}
        weight_sum = 0.0
        was_training = self.inner.training
        self.inner.train()
        # DDP/FSDP average the ranks' gradients; each rank's loss is its share of the GLOBAL
        # batch loss, so scale by the world size to get their sum.
        scale = float(self.dist.world_size)
        ddp = self.dist.strategy == "ddp"
        try:
            for k, mb, real in self._passes(batches, collective=self.dist.enabled):
                last = k == (self._n_steps if self.dist.enabled else len(batches)) - 1
                sync = self._engine.no_sync() if ddp and not last else nullcontext()
                with sync:
                    logprobs = self._logprobs(self._engine, mb)
                    if not real:  # zero-weight pass: keeps the ranks' collectives in step
                        (logprobs.sum() * 0.0).backward()
                        continue
                    stats_k = self._micro_loss(mb, logprobs, k, norm, old, ref, scale)
                for key, value in stats_k.items():
                    totals[key] = totals.get(key, 0.0) + value
                weight_sum += float(mb.num_tokens)
        finally:
            self.inner.train(was_training)
        keys = [k for k in _STAT_KEYS if k != "kl" or cfg.beta != 0]
        sums = [totals.get("loss", 0.0)] + [totals.get("_" + k, 0.0) for k in keys] + [weight_sum]
        sums = self.dist.all_reduce(sums)  # global sums (as is, in one process)
        out = {"loss": sums[0]}
        for i, name in enumerate(keys):
            if "_" + name in totals or self.dist.enabled:
                value = sums[1 + i]
                out[name] = value if name == "pg_loss" else value / max(sums[-1], 1.0)
        return out

    def _micro_loss(self, mb: _MicroBatch, logprobs: Tensor, k: int, norm: float,
                    old: list[Tensor] | None, ref: list[Tensor] | None,
                    scale: float) -> dict[str, float]:
        """Loss of one micro-batch, backward of its share of the batch loss; its statistics."""
        cfg = self.config
        old_lp = old[k] if old is not None else logprobs.detach()
        behaviour = None
        if mb.behaviour is not None:  # rows without correction get weight exactly 1
            behaviour = torch.where(mb.tis_rows.unsqueeze(1), mb.behaviour, old_lp)
        loss, st = grpo_loss(
            logprobs, old_lp, mb.advantages, mb.mask, sample_weights=mb.weights,
            behaviour_logprobs=behaviour, is_cap=cfg.importance_sampling_cap,
            ref_logprobs=None if ref is None else ref[k], beta=cfg.beta,
            epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high, loss_type=cfg.loss_type)
        share = (mb.num_tokens if cfg.loss_type == "token" else mb.num_sequences) / norm
        (loss * (share * scale)).backward()
        totals = {"loss": float(loss.detach()) * share}
        w = float(mb.num_tokens)  # token-weighted means of the per-token statistics
        for key in _STAT_KEYS:
            if key in st:
                totals["_" + key] = st[key] * (share if key == "pg_loss" else w)
        return totals

    def _update(self, batches, norm, old, ref) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        stats = self._accumulate(batches, norm, old, ref)
        limit = self.config.max_grad_norm
        grad_norm = clip_grad_norm(self.trainable, limit if limit else math.inf, self.dist)
        stats["grad_norm"] = float(grad_norm)
        stats["grad_clipped"] = float(bool(limit) and float(grad_norm) > limit)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return stats

    # -- checkpoints ----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write a checkpoint to ``path`` atomically: everything goes to a temp dir beside it,
        which is then renamed into place; a crash at any moment leaves the previous checkpoint
        (or none) readable. Returns ``path``.

        Multi-process: every rank must call it (FSDP gathers the full weights and optimizer
        state, every rank's RNG states are collected); rank 0 alone writes, in the
        single-process format, and the others wait for it (its failure raises on every rank)."""
        path = Path(path)
        if self._fsdp and self.is_peft:
            raise NotImplementedError("PolicyTrainer.save: FSDP + LoRA checkpoints are not "
                                      "supported; use DDP for LoRA")
        model_sd = full_state_dict(self.inner) if self._fsdp else None
        ref_sd = full_state_dict(self.ref_model) if self._fsdp and self.ref_model else None
        optim_sd = (full_optimizer_state(self.optimizer) if self._fsdp
                    else self.optimizer.state_dict())
        rngs = self.dist.all_gather_object(rng_state(self.policy))
        failed: BaseException | None = None
        if self.dist.is_main:
            try:
                self._write(path, model_sd, ref_sd, optim_sd, rngs)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others know
                failed = exc
        if self.dist.all_reduce([failed is not None])[0]:
            raise failed if failed is not None else RuntimeError(
                f"PolicyTrainer.save: rank 0 failed to write {path}")
        return path

    def _write(self, path: Path, model_sd: dict | None, ref_sd: dict | None, optim_sd: dict,
               rngs: list[dict[str, Any]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed save
            shutil.rmtree(stale, ignore_errors=True)
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            if model_sd is None:
                self.model.save_pretrained(tmp / "model")  # adapter only for peft
            else:
                self.inner.save_pretrained(tmp / "model", state_dict=model_sd)
            self.policy.tokenizer.save_pretrained(tmp / "model")
            if self.ref_model is not None:
                self.ref_model.save_pretrained(tmp / "ref", **(
                    {"state_dict": ref_sd} if ref_sd is not None else {}))
            torch.save(optim_sd, tmp / "optimizer.pt")
            fault_point("save:weights")  # a kill here leaves a temp dir without its state
            torch.save(rngs[0], tmp / "rng.pt")
            if len(rngs) > 1:
                torch.save(rngs, tmp / "rng_ranks.pt")
            state = {"format": CHECKPOINT_FORMAT, "step": self.step, "peft": self.is_peft,
                     "world_size": len(rngs), "config": self.config.to_dict()}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))  # written last
            _fsync_tree(tmp)
            _swap_into_place(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def load(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore a checkpoint written by ``save`` into this trainer, in place (the policy's
        module object keeps its identity): weights (the adapter with LoRA), optimizer, RNG
        states and step. Returns the saved state (``step``, ``config``).

        Multi-process: every rank reads the files (FSDP takes its shard of each tensor); the
        checkpoint may come from any number of processes. Each rank gets its own saved RNG
        states when the world size matches, else those of rank 0."""
        path = _resolve_checkpoint(Path(path))
        state = json.loads((path / STATE_FILE).read_text())
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: unsupported checkpoint format {state.get('format')}")
        if bool(state.get("peft")) != self.is_peft:
            raise ValueError(f"{path}: checkpoint peft={state.get('peft')} but this trainer "
                             f"peft={self.is_peft}")
        if self._fsdp and self.is_peft:
            raise NotImplementedError("PolicyTrainer.load: FSDP + LoRA checkpoints are not "
                                      "supported; use DDP for LoRA")
        if self.is_peft:
            from peft import set_peft_model_state_dict

            weights = _read_safetensors(path / "model")
            result = set_peft_model_state_dict(self.model, weights)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise ValueError(f"{path}: unexpected adapter keys {unexpected[:5]}")
        elif self._fsdp:
            load_sharded(self.inner, path / "model")
        else:
            _load_in_place(self.inner, path / "model")
        if self.ref_model is not None and (path / "ref").is_dir():
            (load_sharded if self._fsdp else _load_in_place)(self.ref_model, path / "ref")
        optim_sd = torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True)
        if self._fsdp:
            load_full_optimizer_state(self.optimizer, optim_sd)
        else:
            self.optimizer.load_state_dict(optim_sd)
        rng = torch.load(path / "rng.pt", weights_only=True)
        if (self.dist.enabled and state.get("world_size") == self.dist.world_size
                and (path / "rng_ranks.pt").is_file()):
            rng = torch.load(path / "rng_ranks.pt", weights_only=True)[self.dist.rank]
        set_rng_state(self.policy, rng)
        self.step = int(state["step"])
        return state

    @contextmanager
    def gathered_for_generation(self) -> Iterator[None]:
        """Within, ``policy.model`` holds its full weights and may generate on each rank
        independently. Needed under FSDP (entering and leaving are collectives: every rank
        must enter together); a no-op in one process and under DDP."""
        with gathered_parameters(self._lp, self.dist):
            yield


# -- helpers ------------------------------------------------------------------------------------

def _memory_stats(device: torch.device) -> dict[str, float]:
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    if device.type == "cuda":
        out["peak_device_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out
