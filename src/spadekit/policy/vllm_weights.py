"""Weight pushes into an in-process vLLM engine: checked before they touch it, undone on failure.

Pushes go through the worker's in-place ``reload_weights`` (``collective_rpc``; in one process a
callable with the tensors by reference, across processes a private safetensors file loaded by
``vllm_server.WorkerExtension``). ``check_items`` refuses, before the engine sees anything,
duplicate or unknown names, wrong shapes and incomplete fused groups (q/k/v, gate/up), which
would leave vLLM half-initialised. ``EngineWeights`` keeps a CPU copy of every confirmed push:
``restore`` reloads the checkpoint and re-applies it. A tied ``lm_head`` is tied again to the
new embeddings after each reload. Why each rule: docs/scaling.md ("Weight sync").
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterable

from spadekit.policy.weight_items import WeightSyncError

FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Projections vLLM fuses into one parameter: pushed together or not at all."""

TIED_HEAD, TIED_EMBED = "lm_head.weight", "model.embed_tokens.weight"
"""A checkpoint without ``lm_head.weight`` ties it to the embeddings: a pushed ``state_dict()``
that has both gives the head once, as the embeddings."""


def checkpoint_shapes(model_dir: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every tensor in the ``*.safetensors`` files of ``model_dir``, read
    from their headers only (no tensor data). Empty when the directory holds none."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as fh:
                shapes.update({n: tuple(fh.get_slice(n).get_shape()) for n in fh.keys()})
        except Exception as exc:
            raise WeightSyncError(f"{path}: not a readable safetensors file: {exc}") from exc
    return shapes


def without_tied_head(items: list[tuple[str, Any]],
                      shapes: dict[str, tuple[int, ...]]) -> list[tuple[str, Any]]:
    """``items`` without ``lm_head.weight`` when the checkpoint ties it to the embeddings (it has
    no head of its own) and the embeddings are sent too: a tied model's state_dict() names both."""
    names = {n for n, _ in items}
    if shapes and TIED_HEAD not in shapes and {TIED_HEAD, TIED_EMBED} <= names:
        return [(n, t) for n, t in items if n != TIED_HEAD]
    return items


def check_items(items: list[tuple[str, Any]], shapes: dict[str, tuple[int, ...]],
                what: str) -> None:
    """Refuse a push the engine cannot take whole (module docstring); ``shapes`` from
    ``checkpoint_shapes`` (an empty mapping skips the name and shape checks)."""
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise WeightSyncError(f"{what}: tensor names sent twice: {dup[:5]}")
    problems = []
    if shapes:
        unknown = [n for n in names if n not in shapes]
        wrong = [f"{n}: {tuple(t.shape)} != {shapes[n]}" for n, t in items
                 if n in shapes and tuple(t.shape) != shapes[n]]
        if unknown:
            problems.append(f"{len(unknown)} unknown names, e.g. {unknown[:5]}")
        if wrong:
            problems.append(f"{len(wrong)} shape mismatches, e.g. {wrong[:3]}")
    given = set(names)
    missing = []
    for name in names:
        for group in FUSED_GROUPS:
            m = re.search(r"\.(" + "|".join(group) + r")\.", name)
            if m is None:
                continue
            for part in group:
                other = name[:m.start(1)] + part + name[m.end(1):]
                if other not in given and (not shapes or other in shapes):
                    missing.append(other)
    if missing:
        problems.append(f"fused projections must be pushed together; missing "
                        f"{sorted(set(missing))[:5]}")
    if problems:
        raise WeightSyncError(f"{what}: the engine cannot take these weights (nothing was "
                              "loaded): " + "; ".join(problems))


def save_private(tensors: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``tensors`` as a safetensors file at ``path`` (in a private folder, e.g. from
    ``tempfile.mkdtemp``) that is created 0600: no other user can read the weights, not even
    while they are being written (whatever the umask)."""
    from safetensors.torch import save_file

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)  # safetensors truncates and fills the file; its mode stays 0600
    os.chmod(path, 0o600)
    save_file(tensors, str(path))


def check_private(path: str | os.PathLike) -> None:
    """Refuse (``WeightSyncError``) to load a push file that is not a regular 0600 file of this
    user in a 0700 folder of this user (what ``save_private`` writes): the reload route then
    cannot be pointed at any other file on the engine's machine."""
    import stat

    p = Path(path)
    try:
        folder, file = os.stat(p.parent), os.lstat(p)
    except OSError as exc:
        raise WeightSyncError(f"{path}: cannot load the pushed weights: {exc}") from None
    me = os.getuid()
    if not (stat.S_ISREG(file.st_mode) and file.st_uid == me and folder.st_uid == me
            and not stat.S_IMODE(file.st_mode) & 0o077
            and not stat.S_IMODE(folder.st_mode) & 0o077):
        raise WeightSyncError(f"{path}: not a private push file of this user (a 0600 file in a "
                              "0700 folder, as spadekit writes them): refused")


def _reload(worker: Any, items: list[tuple[str, Any]] | None) -> None:
    """Runs on vLLM's worker: the in-place reload (``None``: the checkpoint from disk), then
    the output layer tied again to the embeddings where the model ties them."""
    if items is None:
        worker.reload_weights()
    else:
        worker.reload_weights(weights_iterator=items)
    _retie(worker)


def _retie(worker: Any) -> None:
    """vLLM's tied ``lm_head`` is skipped by the reload (its checkpoint has no such tensor), which
    then puts the OLD kernel tensors back ("ParallelLMHead: Failed to load weights"): the head
    would keep the old embeddings. Tie it to the new ones and let its quant method prepare them
    (on CPU that repacks the matrix for oneDNN)."""
    runner = getattr(worker, "model_runner", worker)
    model = runner.get_model()
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    config = worker.vllm_config.model_config.hf_config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if head is None or embed is None or not getattr(text, "tie_word_embeddings", False):
        return
    head.quant_method.tie_weights(head, embed)
    head.quant_method.process_weights_after_loading(head)


def in_process(llm: Any) -> bool:
    """Whether vLLM's engine core runs in this process (its executor is reachable here)."""
    engine = getattr(llm, "llm_engine", None)
    return getattr(engine, "model_executor", None) is not None or \
        getattr(getattr(getattr(engine, "engine_core", None), "engine_core", None),
                "model_executor", None) is not None


class EngineWeights:
    """The weight side of one ``VLLMPolicy``: staging, checks, the push, the undo copy."""

    def __init__(self, llm: Any, name: str, model_dir: str | None,
                 keep_copy: bool = True) -> None:
        self.llm, self.name, self.keep_copy = llm, name, keep_copy
        self.shapes = checkpoint_shapes(model_dir) if model_dir else {}
        self.route = "in-process collective_rpc" if in_process(llm) \
            else "collective_rpc to the engine process (spadekit_reload, a safetensors file)"
        self.version = 0
        self.pushes = 0
        self._staged: list[tuple[str, Any]] = []
        self._copy: dict[str, Any] = {}
        self._pending: dict[str, Any] | None = None
        self._undo_version = 0

    def load(self, items: Iterable[tuple[str, Any]], final: bool = True,
             version: int | None = None) -> int:
        """Stage ``items``; at ``final`` check everything staged and push it in one reload."""
        from spadekit.policy.weight_items import as_items

        self._staged += as_items(items)
        if not final:
            return 0
        batch, self._staged = self._staged, []
        if not batch:
            return 0
        batch = without_tied_head(batch, self.shapes)
        check_items(batch, self.shapes, self.name)
        try:
            self._rpc(batch)
        except Exception as exc:
            restored = self._try_restore()
            raise WeightSyncError(f"{self.name}: vLLM failed to load the weights "
                                  f"({type(exc).__name__}: {exc}); "
                                  + ("the previous weights were restored" if restored else
                                     "restoring the previous weights failed too")) from exc
        self.confirm()  # the push before this one stands: it was not undone
        self._undo_version = self.version
        self._pending = {n: t.detach().to("cpu", copy=True) for n, t in batch} \
            if self.keep_copy else {}
        self.pushes += 1
        self.version = int(version) if version is not None else self.version + 1
        return len(batch)

    def confirm(self) -> None:
        """The last push stands (``push_weights`` calls this once its check passed): it becomes
        what ``restore`` goes back to."""
        if self._pending is not None:
            self._copy.update(self._pending)
            self._pending = None

    def restore(self) -> None:
        """Undo the last push that was not confirmed: back to the confirmed weights (the
        checkpoint if none was): the checkpoint from disk, then the kept copy
        (``WeightSyncError`` if no copy is kept)."""
        if self.pushes and not self.keep_copy:
            raise WeightSyncError(f"{self.name}: cannot restore the previous weights: the "
                                  "policy keeps no copy (keep_weights_copy=False)")
        if self._pending is not None:
            self.version = self._undo_version  # the undone push never happened
        self._pending = None
        self._rpc(None)
        if self._copy:
            self._rpc(list(self._copy.items()))

    def cannot_restore(self) -> str | None:
        """Why ``restore`` could not undo a push (None: it can)."""
        return None if self.keep_copy else ("the vLLM engine keeps no copy of its weights "
                                             "(keep_weights_copy=False)")

    def _try_restore(self) -> bool:
        try:
            self.restore()
            return True
        except Exception:
            return False

    def _rpc(self, items: list[tuple[str, Any]] | None) -> None:
        if in_process(self.llm):
            self.llm.collective_rpc(_reload, args=(items,))
        elif items is None:
            self.llm.collective_rpc("spadekit_restore")
        else:  # through a file: no pickled callables or tensors cross to the engine process
            with tempfile.TemporaryDirectory(prefix="spadekit-vllm-push-") as folder:  # 0700
                path = os.path.join(folder, "model.safetensors")
                save_private({n: t.detach().to("cpu").contiguous() for n, t in items}, path)
                self.llm.collective_rpc("spadekit_reload", args=(path,))
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if callable(reset):
            reset()  # cached KV blocks were computed with the old weights
