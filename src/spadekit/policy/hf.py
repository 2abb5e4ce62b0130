"""The ``hf`` backend: a Hugging Face causal LM, batched sampling with exact logprobs.

A batch is left-padded and decoded with a KV cache, split so that rows x longest prompt² stays
within ``max_batch_cells``; each row has its own temperature, top-p, budget, stop strings,
seeded stream and grammar, and leaves the batch when it finishes. Each sampled token's logprob
is ``log_softmax(logits / temperature)`` at its position, what a training forward pass computes
(under a grammar: renormalised over the allowed tokens). ``load_weights(named)`` copies Hugging
Face-named tensors into the model in place.
"""

from __future__ import annotations

import threading
from typing import Any

from spadekit.common.cpus import usable_cpus
from spadekit.common.packing import DEFAULT_BATCH_CELLS, within_cells
from spadekit.policy.base import (Generation, GenerationRequest, PolicyError, TemplatePolicy,
                                  cut_at_stop)

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


class HFPolicy(TemplatePolicy):
    """A transformers model and tokenizer as a ``Policy``."""

    capabilities = frozenset({"token_ids", "logprobs", "train"})

    def __init__(self, model: Any, tokenizer: Any, name: str = "hf", max_batch_size: int = 64,
                 seed: int = 0, max_batch_cells: int | None = DEFAULT_BATCH_CELLS) -> None:
        import torch

        if getattr(tokenizer, "chat_template", None) is None:
            raise PolicyError(f"the tokenizer of {name!r} has no chat template")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.max_batch_size = max_batch_size
        if max_batch_cells is not None and max_batch_cells < 0:
            raise PolicyError(f"max_batch_cells must be >= 0, got {max_batch_cells}")
        self.max_batch_cells = max_batch_cells
        """At most rows x longest prompt² per batch (one request always fits; 0 or None: no
        bound); ``common.packing.within_cells`` plans the calls."""
        self.device = next(model.parameters()).device
        if self.device.type == "cpu":
            configure_cpu_threads()
        self.stop_ids = self._stop_ids()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
            else min(self.stop_ids)
        self._rng = torch.Generator(device="cpu").manual_seed(seed)
        import inspect

        # transformers 5.2x renamed ``past_key_values`` to ``cache``; support both
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters \
            else "past_key_values"
        self._lock = threading.Lock()
        self.weights_version = 0
        """Counts ``load_weights`` calls (or the version the last one was given)."""

    def _stop_ids(self) -> frozenset[int]:
        ids = set()
        eos = self.tokenizer.eos_token_id
        if eos is not None:
            ids.add(int(eos))
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for e in (gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]):
            if e is not None:
                ids.add(int(e))
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
        if not ids:
            raise PolicyError(f"{self.name}: the tokenizer has no end-of-sequence token")
        return frozenset(ids)

    # -- Policy API --------------------------------------------------------------------------

    def generate(self, requests: list[GenerationRequest],
                 max_batch_cells: int | None | object = ...) -> list[Generation]:
        """The generations of ``requests``, in order; ``max_batch_cells`` overrides the
        policy's bound for this call (0: none)."""
        prompts = [list(r.prompt_ids) if r.prompt_ids is not None
                   else self.render(r.messages, True, r.tools, r.chat_template_kwargs)
                   for r in requests]
        cells = self.max_batch_cells if max_batch_cells is ... else max_batch_cells
        out: list[Any] = [None] * len(requests)
        with self._lock:  # one model, one batch at a time
            for call in within_cells([len(p) for p in prompts], self.max_batch_size, cells):
                gens = self._generate_batch([prompts[i] for i in call],
                                            [requests[i] for i in call])
                for i, g in zip(call, gens):
                    out[i] = g
        return out

    def load_weights(self, weights: Any, version: int | None = None) -> int:
        """Copy ``(name, tensor)`` pairs (or a mapping) into the model's tensors in place, under
        ``torch.no_grad()``, cast to each target's dtype and device; returns how many. Names are
        those of ``model.state_dict()`` (tied aliases included). Every name and shape is checked
        before anything is copied: unknown names or shape mismatches raise ``WeightSyncError``
        listing a few, and the model is left unchanged. Runs under the generation lock, so
        never in the middle of a batch; no KV cache outlives a ``generate`` call, so nothing
        else needs resetting. A model with LoRA layers injected is refused (push merged
        weights into a plain copy)."""
        import torch

        from spadekit.policy.weight_items import WeightSyncError, as_items

        items = as_items(weights)
        targets = self.model.state_dict(keep_vars=True)
        if any(".base_layer." in n or ".lora_" in n for n in targets):
            raise WeightSyncError(f"{self.name}: the model has LoRA adapters injected; load "
                                  "merged weights into a plain copy instead")
        unknown = [n for n, _ in items if n not in targets]
        shapes = [f"{n}: {tuple(t.shape)} != {tuple(targets[n].shape)}" for n, t in items
                  if n in targets and tuple(t.shape) != tuple(targets[n].shape)]
        if unknown or shapes:
            parts = ([f"{len(unknown)} unknown names, e.g. {unknown[:5]}"] if unknown else []) \
                + ([f"{len(shapes)} shape mismatches, e.g. {shapes[:3]}"] if shapes else [])
            raise WeightSyncError(f"{self.name}: cannot load the weights: " + "; ".join(parts),
                                  unknown=unknown[:20], shape_mismatch=shapes[:20])
        with self._lock, torch.no_grad():
            for name, tensor in items:
                targets[name].copy_(tensor)
            self.weights_version = int(version) if version is not None \
                else self.weights_version + 1
        return len(items)

    # -- the decoding loop -------------------------------------------------------------------

    def _generate_batch(self, prompts: list[list[int]], requests: list[GenerationRequest]):
        import torch

        if not prompts:
            return []
        if any(not p for p in prompts):
            raise PolicyError("empty prompt")
        vocab = self.model.get_input_embeddings().num_embeddings
        bad = sorted({t for p in prompts for t in p if not 0 <= t < vocab})
        if bad:  # an embedding lookup would fail (on CUDA: a device assert that kills the context)
            raise PolicyError(f"prompt token ids outside the vocabulary (0..{vocab - 1}): "
                              f"{bad[:5]}")
        b = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        params = [r.params for r in requests]
        temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params],
                             dtype=torch.float32).unsqueeze(1)
        greedy = [p.temperature == 0 for p in params]
        gens = [torch.Generator().manual_seed(p.seed) if p.seed is not None else self._rng
                for p in params]
        from spadekit.policy.grammar import constraint

        grammars = [constraint(self, p.grammar, self.stop_ids) for p in params]
        new_ids: list[list[int]] = [[] for _ in range(b)]
        new_lp: list[list[float]] = [[] for _ in range(b)]
        finish = [""] * b
        rows = list(range(b))  # batch row -> request index, for the rows still running
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                step_in = ids.to(self.device)
                attn = mask.to(self.device)
                pos = positions.to(self.device)
                past = None
                while rows:
                    out = self.model(input_ids=step_in, attention_mask=attn, position_ids=pos,
                                     use_cache=True, logits_to_keep=1,
                                     **{self._cache_arg: past})
                    past = out[self._cache_arg]
                    logits = out.logits[:, -1, :].float().cpu()
                    logp = torch.log_softmax(logits / temps[rows], dim=-1)
                    chosen = []
                    for k, i in enumerate(rows):
                        row = logp[k]
                        if grammars[i] is not None:  # the distribution within the grammar
                            row = row.masked_fill(~grammars[i].allowed(row.shape[-1]),
                                                  float("-inf"))
                            row = row - torch.logsumexp(row, 0)
                        tok = self._pick(row, params[i].top_p, greedy[i], gens[i])
                        if grammars[i] is not None:
                            grammars[i].consume(tok)
                        chosen.append(tok)
                        new_ids[i].append(tok)
                        new_lp[i].append(float(row[tok]))
                        finish[i] = self._finished(new_ids[i], params[i])
                    keep = [k for k, i in enumerate(rows) if not finish[i]]
                    if not keep:
                        break
                    if len(keep) < len(rows):
                        index = torch.tensor(keep, device=self.device)
                        past = _select_cache(past, index)
                        attn = attn.index_select(0, index)
                        pos = pos.index_select(0, index)
                    rows = [rows[k] for k in keep]
                    step_in = torch.tensor([[chosen[k]] for k in keep], device=self.device)
                    attn = torch.cat([attn, attn.new_ones((len(rows), 1))], dim=1)
                    pos = pos[:, -1:] + 1
        finally:
            self.model.train(was_training)
        result = []
        for i, p in enumerate(prompts):
            text = self.tokenizer.decode(new_ids[i], skip_special_tokens=True)
            text, _ = cut_at_stop(text, params[i].stop)
            result.append(Generation(prompt_ids=p, token_ids=new_ids[i], logprobs=new_lp[i],
                                     text=text, finish_reason=finish[i] or "length"))
        return result

    @staticmethod
    def _pick(logp, top_p: float, greedy: bool, gen) -> int:
        import torch

        if greedy:
            return int(torch.argmax(logp))
        probs = logp.exp()
        if top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = sorted_p.cumsum(0) - sorted_p < top_p
            keep[0] = True  # the likeliest token always (a top_p below float32's least is 0)
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        return int(torch.multinomial(probs, 1, generator=gen))

    def _finished(self, ids: list[int], params) -> str:
        if ids[-1] in self.stop_ids:
            return "stop"
        if params.stop:
            tail = self.tokenizer.decode(ids[-64:], skip_special_tokens=True)
            if cut_at_stop(tail, params.stop)[1]:
                return "stop"
        if len(ids) >= params.max_new_tokens:
            return "length"
        return ""


def configure_cpu_threads() -> int:
    """Torch's CPU thread count: ``SPADEKIT_TORCH_THREADS``, else one CPU fewer than this process
    may use (at least 1; ``spadekit.common.cpus``: the affinity mask and the cgroup's quota, not
    the host's cores): one CPU stays free for the sandbox workers and the trainer's threads."""
    import os

    import torch

    want = os.environ.get("SPADEKIT_TORCH_THREADS")
    threads = int(want) if want and want.isdigit() and int(want) > 0 else \
        max(1, usable_cpus() - 1)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def _select_cache(past: Any, index) -> Any:
    """Keep only the batch rows ``index`` of a KV cache (DynamicCache or legacy tuples)."""
    if hasattr(past, "layers"):  # transformers >= 4.56 DynamicCache
        for layer in past.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys.index_select(0, index)
                layer.values = layer.values.index_select(0, index)
        return past
    if hasattr(past, "key_cache"):
        past.key_cache = [k.index_select(0, index) for k in past.key_cache]
        past.value_cache = [v.index_select(0, index) for v in past.value_cache]
        return past
    return tuple(tuple(t.index_select(0, index) for t in layer) for layer in past)


def sequence_logprobs(model: Any, prompt: list[int], completion: list[int],
                      temperature: float = 1.0) -> list[float]:
    """Logprobs of ``completion`` after ``prompt`` from one fresh forward pass (the training
    computation); used to check the sampler's logprobs."""
    import torch

    ids = torch.tensor([prompt + completion], device=next(model.parameters()).device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / t, dim=-1)
    return [float(logp[k, tok]) for k, tok in enumerate(completion)]
