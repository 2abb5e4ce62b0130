"""What ``--model`` may name for evaluation: a policy spec, or a trained self-play checkpoint.

- a policy spec the registry knows (``tiny``, ``smollm2-135m``, ``hf:PATH``, ``openai:...``);
- a run directory (``runs/<name>``): its newest committed checkpoint;
- a checkpoint directory (``runs/<name>/checkpoints/step-N``): that one;
- a Hugging Face model directory (holding ``config.json``): as ``hf:PATH``.

A checkpoint is loaded the way the run itself resumes: the run's base model (from its
``config.yaml``) plus the saved weights (the LoRA adapter, or the full model), through
``PolicyTrainer.load``, so evaluation sees exactly the weights the run trained.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spadekit.eval.base import EvalError


def load_eval_policy(spec: str, seed: int = 0) -> tuple[Any, str]:
    """``(policy, label)`` for ``spec``; ``EvalError`` for a directory that is none of the
    above or a run without a checkpoint."""
    from spadekit.policy.registry import load_policy

    path = Path(spec).expanduser()
    if not path.is_dir():
        return load_policy(spec, seed=seed), spec
    if (path / "config.json").exists() and not (path / "trainer_state.json").exists():
        return load_policy(f"hf:{path}", seed=seed), str(path)
    run_dir, checkpoint = locate_checkpoint(path)
    return _from_checkpoint(run_dir, checkpoint, seed)


def locate_checkpoint(path: Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint_dir)`` for a run directory or one of its checkpoints."""
    from spadekit.train.checkpoint import STATE_FILE

    if (path / STATE_FILE).exists():
        run_dir = path.parent.parent
        if not (run_dir / "config.yaml").exists():
            raise EvalError(f"{path} is a checkpoint outside a run directory (no "
                            f"{run_dir / 'config.yaml'}): cannot tell its base model")
        return run_dir, path
    if (path / "run.sqlite").exists():
        from spadekit.runs.store import RunStore

        store = RunStore.open(path)
        try:
            pointer = store.latest_checkpoint()
        finally:
            store.close()
        if pointer is None:
            raise EvalError(f"{path}: the run has no checkpoint yet")
        checkpoint = Path(pointer["path"])
        if not checkpoint.is_absolute():
            checkpoint = path / checkpoint
        return path, checkpoint
    raise EvalError(f"{path}: not a model spec, a run directory (run.sqlite), a checkpoint "
                    "(trainer_state.json) or a Hugging Face model directory (config.json)")


def _from_checkpoint(run_dir: Path, checkpoint: Path, seed: int) -> tuple[Any, str]:
    import yaml

    from spadekit.policy.registry import load_policy
    from spadekit.train.checkpoint import STATE_FILE
    from spadekit.train.config import TrainConfig
    from spadekit.train.trainer import PolicyTrainer

    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    model = config.get("model")
    if not isinstance(model, str):
        raise EvalError(f"{run_dir / 'config.yaml'} names no base model")
    try:
        state = json.loads((checkpoint / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EvalError(f"{checkpoint}: unreadable checkpoint state ({exc})") from None
    policy = load_policy(model, seed=seed)
    trainer = PolicyTrainer(policy, TrainConfig.from_dict(state.get("config") or {}))
    try:
        trainer.load(checkpoint)
    except Exception as exc:
        raise EvalError(f"{checkpoint}: the checkpoint does not load: {exc}") from None
    trainer.optimizer = None  # evaluation never steps; let the optimizer state go
    return policy, f"{run_dir.name}@{checkpoint.name}"
