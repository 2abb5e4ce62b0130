"""The ``vllm`` backend: in-process vLLM (``vllm.LLM``), token ids in, sampled ids and logprobs out.

``vllm:ID_OR_PATH``. Needs a GPU and ``pip install vllm``; importing this module never imports
vllm (constructing a ``VLLMPolicy`` does, and raises ``PolicyError`` with the install hint when
it is missing).

Requests go to one ``LLM.generate`` call per batch, prompts as token ids
(``{"prompt_token_ids": ids}``, vLLM's ``TokensPrompt``), one ``vllm.SamplingParams`` per request:
``temperature``, ``top_p``, ``max_tokens``, ``stop``, ``seed``, ``logprobs=0`` (the sampled
token's logprob only), ``stop_token_ids`` = the tokenizer's end-of-turn tokens (the same stop
set as the ``hf`` backend), ``include_stop_str_in_output=True`` (spadekit keeps the stop string).
Sampled token ids include the token that ended generation; the text is re-decoded from them and
cut after the first stop string, as every backend does.

Logprob semantics. spadekit's logprob is ``log_softmax(logits / temperature)`` before top-p
truncation (what a training forward pass computes). vLLM's V1 engine returns, by default
(``logprobs_mode="raw_logprobs"``), ``log_softmax(logits)`` *before* temperature: the wrong
numbers for temperature != 1. This backend therefore builds the engine with
``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2), which are the logprobs after
temperature (and after penalties, which spadekit never sets) but also *after* top-k/top-p
masking, i.e. renormalised over the nucleus. Consequences:

- top_p = 1 (the default): vLLM's logprobs equal spadekit's, up to kernel numerics (bf16 vs
  fp32 forward passes differ by ~1e-2; compare in the same dtype);
- temperature = 0 (greedy): vLLM skips the temperature step and returns ``log_softmax(logits)``,
  which is also spadekit's convention;
- top_p < 1: vLLM's logprobs are those of the truncated, renormalised distribution; a trainer
  that needs the untruncated ones must recompute them (``logprobs_exact(params)`` says False).

On a vLLM without ``logprobs_mode`` the engine is built without it (a warning says so) and
``logprobs_exact`` is True only at temperature 1 (raw logprobs) or 0.

Weights live inside vLLM: the policy has no ``train`` capability. A trainer that updates a
transformers copy of the model pushes its weights with ``load_weights(named_tensors)``
(Hugging Face parameter names, e.g. ``model.state_dict().items()``; vLLM's own
``model.load_weights`` fuses q/k/v and gate/up). That method reaches vLLM's model through
``LLM.apply_model`` where vLLM has it (in V1 with multiprocessing this pickles the tensors to the
engine process; set ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, or ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
to keep the engine in-process), else through the in-process model runner, then resets the
prefix cache. NEEDS A GPU CHECK: ``benchmarks/vllm_check.py`` exercises it.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from typing import Any, Iterable

from spadekit.policy.base import (Generation, GenerationRequest, PolicyError, SamplingParams,
                                  cut_at_stop, encode_text, render_text)

INSTALL_HINT = ("the vllm backend needs vLLM and a CUDA GPU: pip install vllm "
                "(see https://docs.vllm.ai/en/latest/getting_started/installation/)")

PROCESSED = "processed_logprobs"


def _import_vllm() -> Any:
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise PolicyError(f"{INSTALL_HINT} ({exc})") from exc
    except Exception as exc:  # a broken install (CUDA mismatch, ...) must still be a PolicyError
        raise PolicyError(f"vllm is installed but failed to import: "
                          f"{type(exc).__name__}: {exc}. {INSTALL_HINT}") from exc


class VLLMPolicy:
    """An in-process ``vllm.LLM`` as a ``Policy`` (token_ids, logprobs; no in-process training)."""

    capabilities = frozenset({"token_ids", "logprobs"})

    def __init__(self, model: str | None = None, *, llm: Any = None, tokenizer: Any = None,
                 name: str | None = None, logprobs_mode: str = PROCESSED,
                 **llm_kwargs: Any) -> None:
        """``model`` is a Hugging Face id or path handed to ``vllm.LLM(model=...)`` together with
        ``llm_kwargs`` (``dtype``, ``gpu_memory_utilization``, ``max_model_len``, ``seed``,
        ``enforce_eager``, ``tensor_parallel_size``...). ``llm=`` wraps an engine built
        elsewhere instead (build it with ``logprobs_mode="processed_logprobs"``)."""
        vllm = _import_vllm()
        self._SamplingParams = vllm.SamplingParams
        self.logprobs_mode = logprobs_mode
        if llm is None:
            if not model:
                raise PolicyError("the vllm backend needs a model id or path (vllm:ID_OR_PATH)")
            llm = self._build(vllm, model, logprobs_mode, llm_kwargs)
        else:  # an engine built by the caller: read its mode where vLLM records it
            mode = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None),
                           "logprobs_mode", None)
            self.logprobs_mode = str(getattr(mode, "value", mode)) if mode is not None \
                else "unknown (engine built by the caller)"
        self.llm = llm
        self.name = name or f"vllm:{model or 'engine'}"
        self.tokenizer = _tokenizer(tokenizer, llm)
        if getattr(self.tokenizer, "chat_template", None) is None:
            warnings.warn(f"{self.name}: the tokenizer has no chat template; messages requests "
                          "will fail", stacklevel=2)
        self.stop_ids = _stop_ids(self.tokenizer, llm)
        self._lock = threading.Lock()

    def _build(self, vllm: Any, model: str, mode: str, kwargs: dict[str, Any]) -> Any:
        try:
            return vllm.LLM(model=model, logprobs_mode=mode, **kwargs)
        except TypeError as exc:  # a vLLM without logprobs_mode (< 0.10.2)
            if "logprobs_mode" not in str(exc):
                raise PolicyError(f"vllm.LLM({model!r}) failed: {exc}") from exc
        except Exception as exc:
            if "logprobs_mode" not in str(exc):
                raise PolicyError(f"vllm.LLM({model!r}) failed: {type(exc).__name__}: "
                                  f"{exc}") from exc
        warnings.warn("this vLLM has no logprobs_mode: its logprobs ignore temperature, so they "
                      "match training logprobs only at temperature 0 or 1", stacklevel=3)
        self.logprobs_mode = "raw_logprobs"
        try:
            return vllm.LLM(model=model, **kwargs)
        except Exception as exc:
            raise PolicyError(f"vllm.LLM({model!r}) failed: {type(exc).__name__}: {exc}") \
                from exc

    # -- Policy API --------------------------------------------------------------------------

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               tools: list[dict] | None = None,
               chat_template_kwargs: dict | None = None) -> list[int]:
        return encode_text(self.tokenizer, render_text(self.tokenizer, messages,
                                                       add_generation_prompt, tools,
                                                       chat_template_kwargs))

    def sampling_params(self, p: SamplingParams) -> Any:
        """The ``vllm.SamplingParams`` for one request."""
        kwargs: dict[str, Any] = {
            "n": 1, "temperature": float(p.temperature), "top_p": float(p.top_p),
            "max_tokens": int(p.max_new_tokens), "logprobs": 0,
            "stop_token_ids": sorted(self.stop_ids), "include_stop_str_in_output": True,
            "skip_special_tokens": True,
        }
        if p.stop:
            kwargs["stop"] = list(p.stop)
        if p.seed is not None:
            kwargs["seed"] = int(p.seed)
        return self._SamplingParams(**kwargs)

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        prompts = [list(r.prompt_ids) if r.prompt_ids is not None
                   else self.render(r.messages, True, r.tools, r.chat_template_kwargs)
                   for r in requests]
        if any(not p for p in prompts):
            raise PolicyError("empty prompt")
        inputs = [{"prompt_token_ids": p} for p in prompts]  # a vllm TokensPrompt
        params = [self.sampling_params(r.params) for r in requests]
        with self._lock:
            try:
                outputs = self.llm.generate(inputs, sampling_params=params, use_tqdm=False)
            except Exception as exc:
                raise PolicyError(f"{self.name}: generation failed: {type(exc).__name__}: "
                                  f"{exc}") from exc
        if len(outputs) != len(requests):
            raise PolicyError(f"{self.name}: vLLM returned {len(outputs)} outputs for "
                              f"{len(requests)} prompts")
        return [self._generation(p, o, r.params) for p, o, r in zip(prompts, outputs, requests)]

    def _generation(self, prompt: list[int], output: Any, params: SamplingParams) -> Generation:
        seq = output.outputs[0]
        ids = [int(t) for t in seq.token_ids]
        lps = _sampled_logprobs(seq.logprobs, ids, self.name)
        reason = seq.finish_reason
        if reason not in ("stop", "length"):
            raise PolicyError(f"{self.name}: vLLM finished a request with {reason!r}")
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        text, _ = cut_at_stop(text, params.stop)
        return Generation(prompt_ids=prompt, token_ids=ids, logprobs=lps, text=text,
                          finish_reason=reason)

    def logprobs_exact(self, params: SamplingParams) -> bool:
        """Whether vLLM's logprobs for ``params`` are spadekit's (see the module docstring)."""
        if params.temperature == 0:
            return True
        if self.logprobs_mode == PROCESSED:
            return params.top_p >= 1.0
        if self.logprobs_mode == "raw_logprobs":
            return params.temperature == 1.0
        return False

    def explain_capabilities(self) -> str:
        return (f"{self.name}: token ids and logprobs of sampled tokens (logprobs_mode="
                f"{self.logprobs_mode}; exact training logprobs need top_p = 1). The weights live "
                "in vLLM: push trainer updates with load_weights().")

    # -- weight sync -------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, Any]] | dict[str, Any]) -> int:
        """Copy ``(name, tensor)`` pairs (Hugging Face names) into vLLM's model; returns how many.

        NEEDS A GPU CHECK (``benchmarks/vllm_check.py``): written against vLLM's documented
        ``LLM.apply_model`` and the V0/V1 in-process worker layout, not run here."""
        items = list(weights.items()) if isinstance(weights, dict) else list(weights)
        if not items:
            return 0
        llm = self.llm
        with self._lock:
            model = _inprocess_model(llm)
            if model is not None:
                model.load_weights(items)
            elif hasattr(llm, "apply_model"):
                llm.apply_model(_WeightLoader(items))
            else:
                raise PolicyError(f"{self.name}: cannot reach vLLM's model to load weights (no "
                                  "LLM.apply_model and no in-process model runner); set "
                                  "VLLM_ENABLE_V1_MULTIPROCESSING=0 or upgrade vLLM")
            reset = getattr(llm, "reset_prefix_cache", None)
            if callable(reset):
                reset()  # cached KV blocks were computed with the old weights
        return len(items)


class _WeightLoader:
    """A picklable callable for ``LLM.apply_model``: runs in each worker on its model."""

    def __init__(self, items: list[tuple[str, Any]]) -> None:
        self.items = items

    def __call__(self, model: Any) -> None:
        model.load_weights(self.items)


def _inprocess_model(llm: Any) -> Any:
    """vLLM's ``nn.Module`` when the engine runs in this process (V1 without multiprocessing:
    ``...model_executor.driver_worker.worker.model_runner.model``, the executor reached from
    ``llm_engine`` or its in-process engine core; V0: ``driver_worker.model_runner.model``)."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)  # V1 in-process
    for executor in (getattr(engine, "model_executor", None),
                     getattr(core, "model_executor", None)):
        worker = getattr(executor, "driver_worker", None)
        for holder in (getattr(worker, "worker", None), worker):
            runner = getattr(holder, "model_runner", None)
            model = getattr(runner, "model", None)
            if model is not None and callable(getattr(model, "load_weights", None)):
                return model
    return None


def _sampled_logprobs(logprobs: Any, ids: list[int], name: str) -> list[float]:
    """The sampled tokens' logprobs from vLLM's per-position ``{token_id: Logprob}`` maps (a
    list, or vLLM's ``FlatLogprobs``, which indexes the same way)."""
    if logprobs is None:
        raise PolicyError(f"{name}: vLLM returned no logprobs although logprobs=0 was asked")
    if len(logprobs) != len(ids):
        raise PolicyError(f"{name}: vLLM returned {len(logprobs)} logprob positions for "
                          f"{len(ids)} tokens")
    out = []
    for k, tok in enumerate(ids):
        entry = logprobs[k]
        if tok not in entry:
            raise PolicyError(f"{name}: no logprob for the sampled token {tok} at position {k}")
        lp = entry[tok]
        out.append(float(getattr(lp, "logprob", lp)))
    return out


def _tokenizer(tokenizer: Any, llm: Any) -> Any:
    if tokenizer is None:
        get = getattr(llm, "get_tokenizer", None)
        if not callable(get):
            raise PolicyError("no tokenizer: pass tokenizer= (the engine has no get_tokenizer)")
        return get()
    if isinstance(tokenizer, str):
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise PolicyError("loading a tokenizer from a path needs transformers") from exc
        return AutoTokenizer.from_pretrained(tokenizer)
    return tokenizer


def _stop_ids(tokenizer: Any, llm: Any) -> frozenset[int]:
    """The end-of-sequence id and the end-of-turn tokens the tokenizer knows (as ``hf``)."""
    from spadekit.policy.hf import END_OF_TURN_TOKENS  # hf.py imports torch lazily: cheap

    ids = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ids.update(int(vocab[t]) for t in END_OF_TURN_TOKENS if t in vocab)
    return frozenset(ids)


def load_vllm(spec: str, **options: Any) -> VLLMPolicy:
    """The registry's ``vllm`` backend: ``vllm:ID_OR_PATH``; options go to ``VLLMPolicy`` (and
    from there to ``vllm.LLM``)."""
    model = spec.split(":", 1)[1] if spec.startswith("vllm:") else spec
    if not model:
        raise PolicyError("the vllm backend needs a model: vllm:ID_OR_PATH")
    return VLLMPolicy(model, **options)
