"""Supervised fine-tuning with a completion-only loss: the warm start before self-play.

An ``SFTExample`` is one token sequence and a loss mask (1 on what the model must learn to
write). An ``SFTRun`` trains the policy's model in place: epochs in an order drawn from ``seed``,
micro-batches of at most ``max_tokens_per_microbatch`` padded tokens, one AdamW step per
``grad_accum`` micro-batches on the token-mean cross-entropy (so the split does not change it),
full weights or LoRA (merged at export), a held-out loss every epoch. Every ``save_every`` steps
and each epoch's end the state is written atomically to ``out/state``: a killed run resumed on
the same examples continues with the same order and numbers (other examples: afresh, warned).
``export()`` writes ``out/model`` in ``save_pretrained`` form, what ``--model hf:OUT/model`` loads.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from spadekit.common.cpus import usable_cpus
from spadekit.common.errors import ConfigError
from spadekit.common.packing import pack_in_order

__all__ = ["SFTConfig", "SFTExample", "SFTRun", "completion_loss"]


@dataclass(frozen=True)
class SFTConfig:
    epochs: int = 3
    learning_rate: float = 2e-4
    weight_decay: float = 0.0
    max_tokens_per_microbatch: int = 4096
    grad_accum: int = 2
    """Micro-batches per optimizer step."""
    max_grad_norm: float | None = 1.0
    use_peft: bool = True
    lora_r: int = 32
    lora_alpha: int = 64
    lora_dropout: float = 0.0
    lora_target_modules: str | list[str] = "all-linear"
    lora_layers: int | None = None
    """LoRA on the last this many decoder layers only (the backward pass stops below them:
    about 30% faster with 15 of SmolLM2's 30); None: every layer."""
    save_every: int = 8
    """Optimizer steps between resumable states (and one at every epoch's end)."""
    seed: int = 0
    bf16: bool = False
    """Forward and backward under bfloat16 autocast (weights and optimizer stay float32): on
    a CPU with AVX-512 bf16 about 1.5x faster than float32 (``benchmarks/designer.py``)."""
    threads: int | None = None
    """Torch threads while training (restored after); None: every CPU this process may use
    (``spadekit.common.cpus``; no sandbox runs while the warm start trains)."""

    def __post_init__(self) -> None:
        for name in ("epochs", "max_tokens_per_microbatch", "grad_accum", "save_every",
                     "lora_r"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"sft.{name} must be an int >= 1, got {value!r}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ConfigError(f"sft.learning_rate must be > 0, got {self.learning_rate!r}")
        for name in ("lora_layers", "threads"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ConfigError(f"sft.{name} must be None or an int >= 1, got {value!r}")


@dataclass
class SFTExample:
    token_ids: list[int]
    loss_mask: list[int]
    kind: str = ""
    """What the example teaches (``designer``, ``agent``): counted in the stats."""

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.loss_mask) or not self.token_ids:
            raise ValueError("an SFT example needs as many mask entries as tokens (and some)")
        if not any(self.loss_mask[1:]):
            raise ValueError("an SFT example needs at least one loss token after the first")


def _compared(config: SFTConfig) -> dict[str, Any]:
    """The settings a resume must share (``threads`` changes no number)."""
    return {k: v for k, v in asdict(config).items() if k != "threads"}


def examples_digest(train: Sequence["SFTExample"], held_out: Sequence["SFTExample"]) -> str:
    """A hash of the examples' tokens and masks: a resume continues only on the same ones."""
    import hashlib

    digest = hashlib.sha256()
    for part in (train, held_out):
        for e in part:
            digest.update(json.dumps([e.token_ids, e.loss_mask]).encode())
        digest.update(b"|")
    return digest.hexdigest()


def completion_loss(model: Any, rows: Sequence[SFTExample], pad_id: int) -> tuple[Any, int]:
    """``(sum of token cross-entropies, number of loss tokens)`` over ``rows``: token ``t`` is
    predicted from the logits at ``t - 1`` wherever ``loss_mask[t]`` is 1."""
    width = max(len(r.token_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        n = len(row.token_ids)
        ids[i, :n] = torch.tensor(row.token_ids)
        attention[i, :n] = 1
        mask[i, :n] = torch.tensor(row.loss_mask, dtype=torch.bool)
    device = next(model.parameters()).device
    ids, attention, mask = ids.to(device), attention.to(device), mask.to(device)
    target, keep = ids[:, 1:], mask[:, 1:]
    from spadekit.train.model_prep import split_head

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    parts = split_head(inner)
    if parts is not None:  # the output layer only where a loss is taken (prompts are long)
        body, head = parts
        hidden = body(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1]
        picked = head(hidden[keep]).float()
    else:
        picked = model(input_ids=ids, attention_mask=attention).logits[:, :-1][keep].float()
    loss = torch.nn.functional.cross_entropy(picked, target[keep], reduction="sum")
    return loss, int(keep.sum())


@dataclass
class _Position:
    epoch: int = 0
    step_in_epoch: int = 0
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


class SFTRun:
    """Trains ``policy.model`` in place; its state and export live under ``out``."""

    def __init__(self, policy: Any, config: SFTConfig, out: str | Path) -> None:
        self.policy, self.config, self.out = policy, config, Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        model = policy.model
        if config.use_peft:
            from spadekit.train.model_prep import add_lora

            with torch.random.fork_rng():  # the adapter's initial weights come from the seed
                torch.manual_seed(config.seed)
                model = add_lora(model, config)
            policy.model = model
        self.model = model
        self.optimizer = self._new_optimizer()
        self.pos = _Position()
        tok = policy.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.examples_digest: str | None = None
        self._saved_examples: str | None = None
        self._initial: dict[str, Any] = {}
        """The trainable weights before a saved state replaced them (what ``_restart`` puts
        back)."""
        self.resumed = self._load_state()

    # -- state -------------------------------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        return self.out / "state"

    def _new_optimizer(self) -> Any:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.config.learning_rate,
                                 weight_decay=self.config.weight_decay)

    def _trainable(self) -> dict[str, Any]:
        return {n: p.detach().cpu().clone() for n, p in self.model.named_parameters()
                if p.requires_grad}

    def _save_state(self) -> None:
        tmp = self.out / "state.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save(self._trainable(), tmp / "weights.pt")
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "position.json").write_text(json.dumps({**asdict(self.pos),
                                                       "config": _compared(self.config),
                                                       "examples": self.examples_digest}))
        old = self.out / "state.old"
        shutil.rmtree(old, ignore_errors=True)
        if self.state_dir.exists():
            self.state_dir.rename(old)
        tmp.rename(self.state_dir)
        shutil.rmtree(old, ignore_errors=True)

    def _load_state(self) -> bool:
        folder = self.state_dir if self.state_dir.exists() else self.out / "state.old"
        if not (folder / "position.json").exists():
            return False
        saved = json.loads((folder / "position.json").read_text())
        if saved.get("config") != json.loads(json.dumps(_compared(self.config))):
            raise ConfigError(f"{folder} was written with other SFT settings; use a new "
                              "output folder or the same settings")
        weights = torch.load(folder / "weights.pt", weights_only=True)
        missing = set(weights) - {n for n, _ in self.model.named_parameters()}
        if missing:
            raise ConfigError(f"{folder} holds weights this model does not have: "
                              f"{sorted(missing)[:3]}")
        self._initial = self._trainable()
        self.model.load_state_dict(weights, strict=False)
        self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        self.pos = _Position(saved["epoch"], saved["step_in_epoch"], saved["step"],
                             saved.get("history", []))
        self._saved_examples = saved.get("examples")
        return True

    def _restart(self) -> None:
        """Forget a resumed state (it was written for other examples): fresh weights and
        optimizer, position 0."""
        import warnings

        warnings.warn(f"{self.state_dir}: the saved state was trained on other examples; "
                      "starting afresh", stacklevel=3)
        self.model.load_state_dict(self._initial, strict=False)
        self.optimizer = self._new_optimizer()
        self.pos = _Position()

    # -- training ----------------------------------------------------------------------------

    def _pack(self, examples: Sequence[SFTExample], order: list[int]) -> list[list[int]]:
        """Micro-batches in ``order``: rows x longest row <= ``max_tokens_per_microbatch``."""
        budget = self.config.max_tokens_per_microbatch
        return pack_in_order(order, [len(e.token_ids) for e in examples], len(order) or 1,
                             lambda rows, width: rows * width <= budget)

    def _steps(self, examples: Sequence[SFTExample], epoch: int) -> list[list[list[int]]]:
        """The optimizer steps of one epoch: each a list of micro-batches (example indices)."""
        order = list(range(len(examples)))
        random.Random(self.config.seed * 1_000_003 + epoch).shuffle(order)
        batches = self._pack(examples, order)
        k = self.config.grad_accum
        return [batches[i:i + k] for i in range(0, len(batches), k)]

    def _step(self, examples: Sequence[SFTExample], micro: list[list[int]]) -> float:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = sum(sum(examples[i].loss_mask[1:]) for rows in micro for i in rows)
        loss_sum = 0.0
        for rows in micro:
            with self._autocast():
                loss, _n = completion_loss(self.model, [examples[i] for i in rows],
                                           self.pad_id)
            (loss / total).backward()
            loss_sum += float(loss.detach())
        if self.config.max_grad_norm:
            torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters()
                                            if p.requires_grad], self.config.max_grad_norm)
        self.optimizer.step()
        return loss_sum / total

    @torch.no_grad()
    def held_out_loss(self, examples: Sequence[SFTExample]) -> float | None:
        """Mean token cross-entropy of ``examples`` (no gradient); None when there are none."""
        if not examples:
            return None
        self.model.eval()
        total, count = 0.0, 0
        order = list(range(len(examples)))
        for rows in self._pack(examples, order):
            with self._autocast():
                loss, n = completion_loss(self.model, [examples[i] for i in rows],
                                          self.pad_id)
            total, count = total + float(loss), count + n
        return total / count

    def _autocast(self) -> Any:
        device = next(self.model.parameters()).device.type
        return torch.autocast(device, dtype=torch.bfloat16, enabled=self.config.bf16)

    def fit(self, train: Sequence[SFTExample], held_out: Sequence[SFTExample] = (),
            progress: Callable[[int, int, float], None] | None = None) -> list[dict[str, Any]]:
        """Train the remaining epochs; returns one record per epoch (train and held-out loss).
        ``progress(done_steps, total_steps, last_loss)`` after every step."""
        if not train:
            raise ValueError("no training examples")
        self.examples_digest = examples_digest(train, held_out)
        if self.resumed and self._saved_examples not in (None, self.examples_digest):
            self._restart()
            self.resumed = False

        before = torch.get_num_threads()
        torch.set_num_threads(self.config.threads or usable_cpus())
        try:
            return self._fit(train, held_out, progress)
        finally:
            torch.set_num_threads(before)

    def _fit(self, train: Sequence[SFTExample], held_out: Sequence[SFTExample],
             progress: Callable[[int, int, float], None] | None) -> list[dict[str, Any]]:
        per_epoch = [self._steps(train, e) for e in range(self.config.epochs)]
        total = sum(len(s) for s in per_epoch)
        if not self.pos.history and self.pos.step == 0:
            self.pos.history.append({"epoch": 0, "step": 0, "train_loss": None,
                                     "held_out_loss": self.held_out_loss(held_out)})
        while self.pos.epoch < self.config.epochs:
            steps = per_epoch[self.pos.epoch]
            losses = []
            while self.pos.step_in_epoch < len(steps):
                losses.append(self._step(train, steps[self.pos.step_in_epoch]))
                self.pos.step_in_epoch += 1
                self.pos.step += 1
                if progress is not None:
                    progress(self.pos.step, total, losses[-1])
                if self.pos.step % self.config.save_every == 0 and \
                        self.pos.step_in_epoch < len(steps):
                    self._save_state()
            self.pos.history.append({
                "epoch": self.pos.epoch + 1, "step": self.pos.step,
                "train_loss": sum(losses) / len(losses) if losses else None,
                "held_out_loss": self.held_out_loss(held_out)})
            self.pos.epoch += 1
            self.pos.step_in_epoch = 0
            self._save_state()
        return list(self.pos.history)

    def export(self) -> Path:
        """The trained model (LoRA merged) and tokenizer under ``out/model``, atomically."""
        model = self.model
        if self.config.use_peft:
            model = model.merge_and_unload()
            self.policy.model = model
            self.model = model
        target, tmp = self.out / "model", self.out / "model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        self.policy.tokenizer.save_pretrained(tmp)
        (tmp / "warmstart.json").write_text(json.dumps({"history": self.pos.history,
                                                       "config": asdict(self.config)},
                                                      indent=1))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        return target
