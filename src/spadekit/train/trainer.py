"""``PolicyTrainer``: the GRPO update of the one SPADE policy, both roles in one batch.

``train_step(samples)`` takes agent and designer ``Sample`` records (``spadekit.advantages``) and
makes ``num_iterations`` AdamW steps on them:

1. Filter: samples of an importance-sampled role (default: the designer's delayed samples)
   without behaviour logprobs are dropped, truncated episodes are dropped when
   ``mask_truncated_completions`` is set, and samples without loss tokens are dropped; each kind
   is counted in the returned stats.
2. Pack the rest, longest first, into right-padded micro-batches that fit the token budget.
3. Old logprobs: with ``num_iterations == 1`` the old policy *is* the current one, so the old
   logprobs are the detached logprobs of the gradient pass itself (same weights, same numbers;
   the PPO ratio is exactly 1 and no extra forward pass is spent). With more iterations they are
   computed once, without gradient, before the first step. Reference logprobs (``beta > 0``)
   come from a frozen copy of the initial weights, or for LoRA from the same model with the
   adapter disabled; they are computed once per batch too.
4. Per micro-batch: ``grpo_loss`` (clip-higher surrogate, truncated importance weights for the
   off-policy rows, per-sample weights, optional KL), scaled so the gradient sums to the loss of
   the WHOLE batch: with token-level aggregation every micro-batch is normalised by the batch's
   total number of loss tokens, so the result does not depend on how the batch was split.
5. Clip the gradient norm, step, report.

Logits are computed only at loss positions, chunk by chunk through the output head, and
recomputed in the backward (activation checkpointing of the head), so neither memory nor time
is spent on ``[batch, length, vocab]`` logits of prompt and observation tokens. Models whose
logits are post-processed (soft-capping, logit scales) take the plain forward instead.

The policy keeps generating with the trained weights: the trainer updates ``policy.model`` in
place (with LoRA, the adapter layers are injected into that same module object).

``save(dir)``/``load(dir)`` write and read a checkpoint atomically (temp dir, then rename):
the model in ``save_pretrained`` form (the adapter only, with LoRA), the tokenizer, the
optimizer state, the RNG states, the step counter and the config.
The file helpers (fsync, swap into place, finding the newest complete checkpoint, reading
safetensors) live in ``spadekit.train.checkpoint``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import resource
import shutil
import time
import uuid
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.utils.checkpoint
from torch import Tensor

from spadekit.advantages import Sample
from spadekit.train.checkpoint import (
    CHECKPOINT_FORMAT,
    STATE_FILE,
    _fsync_tree,
    _load_in_place,
    _read_safetensors,
    _resolve_checkpoint,
    _swap_into_place,
)
from spadekit.train.config import TrainConfig
from spadekit.train.loss import grpo_loss, token_logprobs

__all__ = ["PolicyTrainer", "pack_microbatches", "CHECKPOINT_FORMAT"]

_LOGIT_SCALE_ATTRS = ("final_logit_softcapping", "logit_scale", "output_multiplier",
                      "lm_head_multiplier", "logits_scaling")


def pack_microbatches(lengths: Sequence[int], max_tokens: int, max_rows: int) -> list[list[int]]:
    """Group sequence indices into micro-batches, longest first: a micro-batch holds at most
    ``max_rows`` sequences and ``rows * longest <= max_tokens`` padded tokens (a sequence longer
    than the budget gets one of its own). Deterministic: ties keep the input order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]  # longest first: row 0 is widest
        if current and (len(current) >= max_rows or (len(current) + 1) * width > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


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
        base = policy.model
        self.is_peft = False
        if cfg.use_peft or _is_peft(base):
            self.model = base if _is_peft(base) else _add_lora(base, cfg)
            self.inner = self.model.get_base_model()  # the module the policy runs, adapters in
            self.is_peft = True
        else:
            self.model = self.inner = base
        if cfg.gradient_checkpointing:
            _enable_checkpointing(self.inner)
        self.device = next(self.inner.parameters()).device
        self.vocab_size = self.inner.get_input_embeddings().num_embeddings
        self._split = _split_head(self.inner)
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
        self.ref_model = None
        if cfg.beta > 0 and not self.is_peft:
            self.ref_model = _frozen_copy(self.inner)
        self.step = 0

    # -- public API ---------------------------------------------------------------------------

    def train_step(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """``num_iterations`` optimizer steps on ``samples``; returns the step's statistics.

        Counts: ``num_samples``, ``num_samples_trained``, ``dropped_no_logprobs``,
        ``dropped_truncated``, ``dropped_empty``, ``skipped_zero_advantage`` (kept, counted in the
        normaliser, not computed: their gradient is exactly zero), ``num_importance_weighted``,
        ``num_tokens`` (loss tokens), ``num_padded_tokens`` (forward tokens), ``num_microbatches``.
        Loss statistics (averaged over the ``optimizer_steps``): ``loss``, ``pg_loss``, ``kl``
        (only with ``beta > 0``), ``clip_frac``/``_low``/``_high``, ``ratio_mean``, ``tis_mean``,
        ``tis_capped_frac`` (token means over the batch), ``grad_norm`` (before clipping),
        ``grad_clipped``. Then ``step`` (optimizer steps so far), ``learning_rate``,
        ``seconds``, ``tokens_per_second``, ``peak_rss_mb`` (the process's peak resident set so
        far) and, on CUDA, ``peak_device_mb`` (this step's peak allocated device memory).
        A batch with nothing to train on makes no optimizer step (``optimizer_steps == 0``)."""
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        stats: dict[str, Any] = {}
        batches, norm = self._prepare(samples, stats)
        cfg = self.config
        old = ref = None
        if cfg.num_iterations > 1 and batches:
            old = self._score(batches, reference=False)
        if cfg.beta > 0 and batches:
            ref = self._score(batches, reference=True)
        runs: list[dict[str, float]] = []
        for _ in range(cfg.num_iterations):
            if not batches:
                break
            runs.append(self._update(batches, norm, old, ref))
        stats.update(loss=0.0, grad_norm=0.0)
        for key in (runs[0] if runs else {}):
            stats[key] = sum(r[key] for r in runs) / len(runs)
        stats.update(step=self.step, optimizer_steps=len(runs),
                     learning_rate=self.optimizer.param_groups[0]["lr"],
                     seconds=time.perf_counter() - t0)
        stats["tokens_per_second"] = (stats["num_padded_tokens"] * len(runs)
                                      / max(stats["seconds"], 1e-9))
        stats.update(_memory_stats(self.device))
        return stats

    def compute_gradients(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """The gradient of the batch loss, left in the parameters' ``.grad`` (no optimizer step,
        no clipping); for tests and diagnostics."""
        stats: dict[str, Any] = {}
        batches, norm = self._prepare(samples, stats)
        ref = self._score(batches, reference=True) if self.config.beta > 0 and batches else None
        self.optimizer.zero_grad(set_to_none=True)
        if batches:
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
        norm = float(n_tokens if cfg.loss_type == "token" else len(kept))
        # A row with a zero advantage or weight adds exactly nothing to the gradient of the
        # surrogate; without a KL term it is counted in the normaliser and not computed.
        work = [i for i, s in enumerate(kept)
                if cfg.beta > 0 or (s.advantage != 0 and s.weight != 0)]
        counts["skipped_zero_advantage"] = len(kept) - len(work)
        groups = pack_microbatches([len(kept[i].token_ids) for i in work],
                                   cfg.max_tokens_per_microbatch, cfg.per_device_train_batch_size)
        batches = [self._collate([kept[work[k]] for k in g], [work[k] for k in g])
                   for g in groups]
        stats.update(counts, num_samples=len(samples), num_samples_trained=len(kept),
                     num_tokens=n_tokens, num_microbatches=len(batches),
                     num_importance_weighted=sum(int(b.tis_rows.sum()) for b in batches),
                     num_padded_tokens=sum(b.padded_tokens for b in batches))
        return batches, norm

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

    def _logprobs(self, model: Any, mb: _MicroBatch, grad: bool) -> Tensor:
        """Logprobs of the loss tokens of ``mb`` in the compact ``[B, L]`` layout (0 elsewhere).

        Right padding needs no attention mask: under causal attention a real token never sees
        the padding after it, so the model runs its mask-free causal path."""
        temperature = self.config.temperature
        targets = mb.input_ids[mb.rows, mb.cols]
        split = _split_head(model) if model is not self.inner else self._split
        if split is not None:
            backbone, head = split
            hidden = backbone(input_ids=mb.input_ids, use_cache=False).last_hidden_state
            picked = hidden[mb.rows, mb.cols - 1]
            del hidden
            chunks = []
            size = self.config.logprob_chunk_size
            for start in range(0, picked.shape[0], size):
                h, t = picked[start:start + size], targets[start:start + size]
                if grad:
                    chunks.append(torch.utils.checkpoint.checkpoint(
                        _head_logprobs, head, h, t, temperature, use_reentrant=False))
                else:
                    chunks.append(_head_logprobs(head, h, t, temperature))
            flat = torch.cat(chunks) if chunks else picked.new_zeros(0, dtype=torch.float32)
        else:
            logits = model(input_ids=mb.input_ids, use_cache=False).logits
            picked = logits[mb.rows, mb.cols - 1].float()
            del logits
            flat = token_logprobs(picked / temperature, targets)
        out = flat.new_zeros(mb.mask.shape)
        return out.index_put((mb.rows, mb.slot), flat)

    @torch.no_grad()
    def _score(self, batches: list[_MicroBatch], reference: bool) -> list[Tensor]:
        """Gradient-free logprobs of every micro-batch: the current weights (old policy), or the
        reference (frozen copy; the adapter-disabled base with LoRA)."""
        out = []
        if reference and self.ref_model is not None:
            model, ctx = self.ref_model, nullcontext()
        elif reference:
            model, ctx = self.inner, self.model.disable_adapter()
        else:
            model, ctx = self.inner, nullcontext()
        was_training = model.training
        model.eval()
        try:
            with ctx:
                for mb in batches:
                    out.append(self._logprobs(model, mb, grad=False).detach())
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
        try:
            for k, mb in enumerate(batches):
                logprobs = self._logprobs(self.inner, mb, grad=True)
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
                (loss * share).backward()
                totals["loss"] = totals.get("loss", 0.0) + float(loss.detach()) * share
                w = float(mb.num_tokens)  # token-weighted means of the per-token statistics
                weight_sum += w
                for key in ("pg_loss", "clip_frac", "clip_frac_low", "clip_frac_high",
                            "ratio_mean", "tis_mean", "tis_capped_frac", "kl"):
                    if key in st:
                        totals.setdefault("_" + key, 0.0)
                        totals["_" + key] += st[key] * (share if key == "pg_loss" else w)
        finally:
            self.inner.train(was_training)
        out = {"loss": totals.get("loss", 0.0)}
        for key, value in totals.items():
            if key.startswith("_"):
                name = key[1:]
                out[name] = value if name == "pg_loss" else value / max(weight_sum, 1.0)
        return out

    def _update(self, batches, norm, old, ref) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        stats = self._accumulate(batches, norm, old, ref)
        limit = self.config.max_grad_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, limit if limit else math.inf)
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
        (or none) readable. Returns ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed save
            shutil.rmtree(stale, ignore_errors=True)
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            self.model.save_pretrained(tmp / "model")  # adapter only for peft
            self.policy.tokenizer.save_pretrained(tmp / "model")
            if self.ref_model is not None:
                self.ref_model.save_pretrained(tmp / "ref")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(self._rng_state(), tmp / "rng.pt")
            state = {"format": CHECKPOINT_FORMAT, "step": self.step, "peft": self.is_peft,
                     "config": self.config.to_dict()}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))  # written last
            _fsync_tree(tmp)
            _swap_into_place(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path

    def load(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore a checkpoint written by ``save`` into this trainer, in place (the policy's
        module object keeps its identity): weights (the adapter with LoRA), optimizer, RNG
        states and step. Returns the saved state (``step``, ``config``)."""
        path = _resolve_checkpoint(Path(path))
        state = json.loads((path / STATE_FILE).read_text())
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: unsupported checkpoint format {state.get('format')}")
        if bool(state.get("peft")) != self.is_peft:
            raise ValueError(f"{path}: checkpoint peft={state.get('peft')} but this trainer "
                             f"peft={self.is_peft}")
        if self.is_peft:
            from peft import set_peft_model_state_dict

            weights = _read_safetensors(path / "model")
            result = set_peft_model_state_dict(self.model, weights)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise ValueError(f"{path}: unexpected adapter keys {unexpected[:5]}")
        else:
            _load_in_place(self.inner, path / "model")
        if self.ref_model is not None and (path / "ref").is_dir():
            _load_in_place(self.ref_model, path / "ref")
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=self.device,
                                                  weights_only=True))
        self._set_rng_state(torch.load(path / "rng.pt", weights_only=True))
        self.step = int(state["step"])
        return state

    def _rng_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        gen = getattr(self.policy, "_rng", None)  # the policy's sampling stream
        if isinstance(gen, torch.Generator):
            state["policy"] = gen.get_state()
        try:
            import numpy as np

            kind, key, pos, has_gauss, gauss = np.random.get_state()
            state["numpy"] = (kind, torch.from_numpy(key.astype("int64")), int(pos),
                              int(has_gauss), float(gauss))
        except ImportError:  # pragma: no cover
            pass
        return state

    def _set_rng_state(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
        gen = getattr(self.policy, "_rng", None)
        if "policy" in state and isinstance(gen, torch.Generator):
            gen.set_state(state["policy"])
        if "numpy" in state:
            import numpy as np

            kind, key, pos, has_gauss, gauss = state["numpy"]
            np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, gauss))


# -- helpers ------------------------------------------------------------------------------------

def _head_logprobs(head: Any, hidden: Tensor, targets: Tensor, temperature: float) -> Tensor:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    return token_logprobs(logits, targets)


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _add_lora(model: Any, cfg: TrainConfig) -> Any:
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft reads a property transformers 5.2x renamed
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*",
                                category=FutureWarning)
        return get_peft_model(model, lora)


def _split_head(model: Any):
    """``(backbone, head)`` when the logits are exactly ``head(backbone(...).last_hidden_state)``,
    else None (then the plain forward is used)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
        else model.config
    for attr in _LOGIT_SCALE_ATTRS:
        value = getattr(config, attr, None)
        if value not in (None, 1, 1.0):
            return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    prefix = getattr(model, "base_model_prefix", "")
    backbone = getattr(model, prefix, None) if prefix else None
    if head is None or backbone is None or backbone is model:
        return None
    return backbone, head


def _enable_checkpointing(model: Any) -> None:
    """Activation checkpointing of every decoder layer, non-reentrant (works with frozen inputs,
    as under LoRA). transformers 5.2x renamed ``gradient_checkpointing_enable``."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _frozen_copy(model: Any) -> Any:
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def _memory_stats(device: torch.device) -> dict[str, float]:
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    if device.type == "cuda":
        out["peak_device_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out
