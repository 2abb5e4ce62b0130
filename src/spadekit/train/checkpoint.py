"""Checkpoint files of ``PolicyTrainer``: the on-disk format and the atomic save/load helpers.

``PolicyTrainer.save`` writes everything into a temp dir beside the target, fsyncs it
(``_fsync_tree``) and renames it into place (``_swap_into_place``: an existing checkpoint is
renamed aside first and removed after); ``PolicyTrainer.load`` finds the newest complete
checkpoint (``_resolve_checkpoint``, which also finds one left aside by a save that died between
its two renames) and copies the saved safetensors weights into the existing model tensors
(``_read_safetensors``, ``_load_in_place``). ``STATE_FILE`` is written last, so its presence marks
a complete checkpoint; ``CHECKPOINT_FORMAT`` is its format version. ``rng_state``/``set_rng_state``
capture and restore the random streams a checkpoint carries.
"""

from __future__ import annotations

import os
import random
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["CHECKPOINT_FORMAT", "STATE_FILE", "rng_state", "set_rng_state"]

CHECKPOINT_FORMAT = 1
STATE_FILE = "trainer_state.json"


def _read_safetensors(folder: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no .safetensors weights")
    weights: dict[str, Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    return weights


def _load_in_place(model: Any, folder: Path) -> None:
    """Copy saved weights into ``model``'s existing tensors; weights tied to a loaded one (an
    output head tied to the embeddings) may be absent from the files."""
    weights = _read_safetensors(folder)
    result = model.load_state_dict(weights, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"{folder}: unexpected weights {result.unexpected_keys[:5]}")
    if result.missing_keys:
        named = dict(model.named_parameters(remove_duplicate=False))
        loaded = {named[k].data_ptr() for k in weights if k in named}
        missing = [k for k in result.missing_keys
                   if k not in named or named[k].data_ptr() not in loaded]
        if missing:
            raise ValueError(f"{folder}: missing weights {missing[:5]}")


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path``; an existing ``path`` is first renamed aside and removed after.
    Between the two renames only ``.NAME.old-*`` exists, which ``_resolve_checkpoint`` finds."""
    if path.exists():
        old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(path, old)
    os.rename(tmp, path)
    _fsync_dir(path.parent)
    for aside in path.parent.glob(f".{path.name}.old-*"):  # this one, and any a crash left
        shutil.rmtree(aside, ignore_errors=True)


def _resolve_checkpoint(path: Path) -> Path:
    if (path / STATE_FILE).is_file():
        return path
    if not path.exists():  # a save died between its two renames: the previous one is aside
        aside = [p for p in path.parent.glob(f".{path.name}.old-*") if (p / STATE_FILE).is_file()]
        if aside:
            return max(aside, key=lambda p: p.stat().st_mtime)
    raise FileNotFoundError(f"{path}: no complete checkpoint ({STATE_FILE} missing)")


def rng_state(policy: Any) -> dict[str, Any]:
    """The random states a checkpoint restores: python, torch (CPU and CUDA), numpy and the
    policy's sampling generator (``policy._rng``)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    gen = getattr(policy, "_rng", None)  # the policy's sampling stream
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


def set_rng_state(policy: Any, state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    gen = getattr(policy, "_rng", None)
    if "policy" in state and isinstance(gen, torch.Generator):
        gen.set_state(state["policy"])
    if "numpy" in state:
        import numpy as np

        kind, key, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, gauss))
