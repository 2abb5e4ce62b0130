"""Exact trainer logprobs from vLLM at any top_p: a logits processor that records the normaliser.

The trainer computes ``log_softmax(logits / T)`` over the whole vocabulary; no vLLM
``logprobs_mode`` gives that when top_p < 1, but ``processed_logits`` keeps the sampled token's
``logit / T``. ``TrainerLogprobs``, a logits processor that changes nothing, records
``logsumexp(logits / T)`` for every row and step under the request's key
(``SamplingParams.extra_args["spadekit_key"]``) and position; the backend returns the
difference. Greedy rows use T = 1. Needs the engine in this process (else the backend keeps
``processed_logprobs``, exact at top_p = 1 only). ``take(key)`` hands a request's records over.
"""

from __future__ import annotations

import threading
from typing import Any

KEY = "spadekit_key"
_EPS = 1e-5  # vLLM's threshold under which a temperature means greedy

_lock = threading.Lock()
_records: dict[str, dict[int, float]] = {}


def take(key: str) -> dict[int, float]:
    """``{position: logsumexp(logits / T)}`` recorded for request ``key`` (then forgotten)."""
    with _lock:
        return _records.pop(key, {})


def forget(keys: list[str]) -> None:
    with _lock:
        for k in keys:
            _records.pop(k, None)


def _base() -> Any:
    from vllm.v1.sample.logits_processor import LogitsProcessor

    return LogitsProcessor


def processor_class() -> type:
    """The ``TrainerLogprobs`` class (built on first use: importing vLLM is slow)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build()
    return _CLASS


_CLASS: type | None = None


def _build() -> type:
    from vllm.v1.sample.logits_processor import MoveDirectionality

    class TrainerLogprobs(_base()):
        """Records ``logsumexp(logits / T)`` per request and position (module docstring)."""

        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            self.rows: dict[int, tuple[str, float, list[int]]] = {}

        def is_argmax_invariant(self) -> bool:
            return False  # run in every batch, greedy ones included

        def update_state(self, batch_update: Any) -> None:
            if batch_update is None:
                return
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, params, _prompt, output in batch_update.added:
                key = (getattr(params, "extra_args", None) or {}).get(KEY)
                if key is None:
                    self.rows.pop(index, None)
                    continue
                t = float(params.temperature)
                self.rows[index] = (str(key), t if t >= _EPS else 1.0, output)
            for a, b, direction in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if direction == MoveDirectionality.SWAP and rb is not None:
                    self.rows[a] = rb

        def apply(self, logits: Any) -> Any:
            if not self.rows:
                return logits
            import torch

            index = [i for i in self.rows if i < logits.shape[0]]
            if not index:
                return logits
            temps = torch.tensor([self.rows[i][1] for i in index], dtype=torch.float32,
                                 device=logits.device)
            rows = logits[index].to(torch.float32) / temps.unsqueeze(1)
            norms = torch.logsumexp(rows, dim=-1).tolist()
            with _lock:
                for i, z in zip(index, norms):
                    key, _, output = self.rows[i]
                    _records.setdefault(key, {})[len(output)] = float(z)
            return logits

    return TrainerLogprobs
