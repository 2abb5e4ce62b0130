"""The ``hf`` backend's loader: a Hugging Face model from a local directory, the offline hub cache,
or a GGUF file, as an ``HFPolicy``.

Specs (the ``hf:`` prefix is optional):
  ``hf:/path/to/dir``              a local ``save_pretrained`` directory
  ``hf:org/name``                  a hub id, read from the local Hugging Face cache only
  ``hf:/path/to/dir::FILE.gguf``   a GGUF file inside a directory, de-quantized by transformers
  ``hf:/path/to/FILE.gguf``        the same, naming the file directly

Nothing here reaches the network unless ``local_files_only=False`` is passed explicitly. The device
and dtype helpers are shared with the bundled model (``spadekit.policy.bundled``).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from spadekit.policy.base import PolicyError

log = logging.getLogger(__name__)

_DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
}

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")

_KNOWN_OPTIONS = ("local_files_only", "trust_remote_code", "revision", "chat_template", "name")


# -- shared helpers --------------------------------------------------------------------------

def choose_device(device: Any = None) -> str:
    """``device`` as a torch device string; ``None`` or ``"auto"`` means CUDA when available."""
    import torch

    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    name = str(device)
    try:
        parsed = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise PolicyError(f"invalid device {device!r}: {exc}") from exc
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise PolicyError(f"device {name!r} was asked for but CUDA is not available")
    return name


def choose_dtype(dtype: Any = None, device: str = "cpu"):
    """``dtype`` as a ``torch.dtype``: a dtype, a name (``float32``, ``bf16``, ``fp16`` ...), or
    ``None``/``"auto"`` for float32 on CPU and bfloat16 on CUDA."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if isinstance(dtype, str):
        name = _DTYPE_NAMES.get(dtype.lower().removeprefix("torch."))
        if name is not None:
            return getattr(torch, name)
    raise PolicyError(f"invalid dtype {dtype!r}: use float32, bfloat16 or float16")


def check_chat_template(tokenizer: Any, what: str) -> None:
    """A ``PolicyError`` when ``tokenizer`` cannot render chat messages."""
    if not getattr(tokenizer, "chat_template", None):
        raise PolicyError(
            f"the tokenizer of {what} has no chat template, so chat messages cannot be rendered; "
            "use an instruct/chat model, or pass chat_template='<jinja template>'")


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``(model path or hub id, GGUF file name or None)`` for an ``hf`` spec."""
    if not isinstance(spec, str):
        raise PolicyError(f"a model spec is a string, got {type(spec).__name__}")
    target = spec[3:] if spec.startswith("hf:") else spec
    target = target.strip()
    gguf_file = None
    if "::" in target:
        target, gguf_file = (part.strip() for part in target.split("::", 1))
        if not gguf_file:
            raise PolicyError(f"{spec!r}: the GGUF file name after '::' is empty")
    if not target:
        raise PolicyError(f"{spec!r}: the model path or id is empty")
    return target, gguf_file


def _looks_like_path(target: str) -> bool:
    return target.startswith(("/", ".", "~")) or target.endswith(".gguf") \
        or not _HUB_ID.match(target)


def resolve_source(spec: str) -> tuple[str, str | None, bool]:
    """``(where, gguf_file, is_local)`` for an ``hf`` spec; a ``PolicyError`` for a local path
    that does not exist or a malformed hub id."""
    target, gguf_file = parse_spec(spec)
    path = Path(target).expanduser()
    if path.is_file():
        if gguf_file is None and path.suffix == ".gguf":
            return str(path.parent.resolve()), path.name, True
        raise PolicyError(f"{spec!r}: {path} is a file; give a model directory, "
                          "a DIR::FILE.gguf pair, or a .gguf file")
    if path.is_dir():
        if gguf_file is not None and not (path / gguf_file).is_file():
            raise PolicyError(f"{spec!r}: no GGUF file {gguf_file!r} in {path}")
        return str(path.resolve()), gguf_file, True
    if _looks_like_path(target):
        raise PolicyError(f"{spec!r}: no such local model path {str(path)!r}, and it is not a "
                          "Hugging Face model id (org/name)")
    return target, gguf_file, False


def load_pretrained(where: str, *, gguf_file: str | None = None, device: str = "cpu",
                    dtype: Any = None, local_files_only: bool = True,
                    trust_remote_code: bool = False, revision: str | None = None,
                    what: str | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a local directory or hub id, on ``device`` in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    what = what or repr(where)
    kwargs: dict[str, Any] = {"local_files_only": local_files_only,
                              "trust_remote_code": trust_remote_code}
    if revision is not None:
        kwargs["revision"] = revision
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    torch_dtype = choose_dtype(dtype, device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
        # GGUF tensors are de-quantized to float32 first; cast afterwards
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=torch.float32 if gguf_file else torch_dtype, **kwargs)
    except PolicyError:
        raise
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as exc:
        raise PolicyError(f"could not load the model {what}: {type(exc).__name__}: {exc}") from exc
    if gguf_file is not None:
        _drop_gguf_quantizer(model)
        model = model.to(torch_dtype)
    model = model.to(device)
    model.eval()
    return model, tokenizer


def _drop_gguf_quantizer(model: Any) -> None:
    """A model loaded from GGUF holds de-quantized plain tensors but still carries the GGUF
    quantizer, which blocks ``save_pretrained`` (and so checkpoints); drop it."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "quantization_config", None) is not None:
        try:
            del config.quantization_config
        except AttributeError:
            config.quantization_config = None


def build_policy(model: Any, tokenizer: Any, name: str, seed: int = 0, max_batch_size: int = 64,
                 chat_template: str | None = None):
    """An ``HFPolicy`` after checking the tokenizer can render chats."""
    from spadekit.policy.hf import HFPolicy

    if chat_template:
        tokenizer.chat_template = chat_template
    check_chat_template(tokenizer, repr(name))
    if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) \
            or max_batch_size < 1:
        raise PolicyError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
    return HFPolicy(model, tokenizer, name=name, max_batch_size=max_batch_size, seed=int(seed))


# -- the loader ------------------------------------------------------------------------------

def load_hf(spec: str, device: Any = None, dtype: Any = None, seed: int = 0,
            max_batch_size: int = 64, **options: Any):
    """The registry's ``hf`` backend (see the module docstring for the specs).

    Options: ``local_files_only`` (default True: never download), ``trust_remote_code``,
    ``revision``, ``chat_template`` (a Jinja template for a tokenizer that lacks one), ``name``.
    """
    unknown = sorted(set(options) - set(_KNOWN_OPTIONS))
    if unknown:
        log.warning("hf backend: ignoring unknown options %s", ", ".join(unknown))
    local_files_only = bool(options.get("local_files_only", True))
    where, gguf_file, is_local = resolve_source(spec)
    dev = choose_device(device)
    choose_dtype(dtype, dev)  # validate before the slow part
    name = options.get("name") or (spec if spec.startswith("hf:") else f"hf:{spec}")
    try:
        model, tokenizer = load_pretrained(
            where, gguf_file=gguf_file, device=dev, dtype=dtype,
            local_files_only=local_files_only or is_local,
            trust_remote_code=bool(options.get("trust_remote_code", False)),
            revision=options.get("revision"), what=repr(spec))
    except PolicyError as exc:
        if is_local or not local_files_only:
            raise
        raise PolicyError(
            f"the model {where!r} is not available offline: it is not a local directory and not "
            "in the local Hugging Face cache (HF_HOME / HF_HUB_CACHE). Download it where there "
            f"is network (huggingface-cli download {where}) and copy the cache or a "
            "save_pretrained directory here, or pass local_files_only=False to allow a "
            f"download. ({exc.message})") from exc
    return build_policy(model, tokenizer, name, seed=seed, max_batch_size=max_batch_size,
                        chat_template=options.get("chat_template"))


def quiet_transformers() -> None:
    """Turn off transformers' own progress bars (weight loading, shard writing): spadekit's
    commands show their own progress, and the bars would interleave with it."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
