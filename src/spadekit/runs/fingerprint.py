"""What a run computed, without when: the content of a run directory that two runs of the same
seeded config must share (a run killed and resumed equals the run never killed).

:func:`fingerprint` reads ``run.sqlite`` and the newest checkpoint into plain, comparable values
(rounds, environments, plays, episodes, memory, delay buffer, blacklist, hint cache, rejected
designs, loop state, metrics; hashes of the checkpoint's tensors, optimizer moments, random
states and trainer state). Left out: what says when or how fast (wall-clock columns, timings,
:data:`WALL_CLOCK_METRICS`, the run directory's size, events, row ids, ``sample_id``).
:func:`differences` lists where two fingerprints differ, field by field. Details:
docs/design/runs.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

__all__ = ["WALL_CLOCK_METRICS", "differences", "fingerprint"]

WALL_CLOCK_METRICS = re.compile(
    r"(^|/)(seconds|run_dir_mb)$|_s$|_ms$|(^|/)timings|tok/s|per_s$|tokens_per_second|"
    r"_seconds$|/ms$|elapsed|wall|rss|peak_mem|memory_mb")
"""Metric names that measure time, memory or disk, not what was computed."""

_TIMING_KEYS = re.compile(r"(^|_)(s|ms|seconds|elapsed|time|times)$|step_ms|_ms_|wall")


def _h(blob: Any) -> str | None:
    if blob is None:
        return None
    if isinstance(blob, str):
        blob = blob.encode()
    return hashlib.sha256(bytes(blob)).hexdigest()[:16]


def _strip_times(value: Any) -> Any:
    """A JSON value without its timing fields (any key that names seconds or milliseconds)."""
    if isinstance(value, dict):
        return {k: _strip_times(v) for k, v in sorted(value.items())
                if not _TIMING_KEYS.search(str(k))}
    if isinstance(value, list):
        return [_strip_times(v) for v in value]
    return value


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return _strip_times(json.loads(text))
    except ValueError:
        return text


def _tensor_hash(value: Any) -> Any:
    """A JSON-comparable digest of a ``torch.load``-ed object (tensors hashed bit for bit)."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return f"{t.dtype}{list(t.shape)}:" + hashlib.sha256(
            t.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
    if isinstance(value, dict):
        return {str(k): _tensor_hash(v) for k, v in sorted(value.items(), key=lambda x: str(x[0]))}
    if isinstance(value, (list, tuple)):
        return [_tensor_hash(v) for v in value]
    if hasattr(value, "tobytes"):  # numpy arrays inside a random state
        return hashlib.sha256(value.tobytes()).hexdigest()[:16]
    return value


def _state_files(path: Path) -> dict[str, Any]:
    """The optimizer state, the random states and the trainer state of a checkpoint."""
    import torch

    out: dict[str, Any] = {}
    for name in ("optimizer.pt", "rng.pt", "rng_ranks.pt"):
        if (path / name).is_file():
            out[name] = _tensor_hash(torch.load(path / name, map_location="cpu",
                                                weights_only=False))
    state = path / "trainer_state.json"
    if state.is_file():
        out["trainer_state"] = json.loads(state.read_text())
    return out


def _weights(run_dir: Path, pointer: dict[str, Any] | None) -> dict[str, Any]:
    if pointer is None:
        return {}
    from safetensors import safe_open

    path = Path(pointer["path"])
    out: dict[str, Any] = {"step": pointer["step"], **_state_files(path)}
    for f in sorted(path.rglob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for key in sorted(fh.keys()):
                tensor = fh.get_tensor(key)
                out[f"{f.relative_to(path)}:{key}"] = hashlib.sha256(
                    tensor.contiguous().view(-1).view(dtype=__import__("torch").uint8)
                    .numpy().tobytes()).hexdigest()[:16]
    return out


def fingerprint(run_dir: str | Path, weights: bool = True) -> dict[str, Any]:
    """The comparable content of the run in ``run_dir`` (see the module docstring)."""
    from spadekit.runs.store import RunStore

    store = RunStore.open(Path(run_dir))
    try:
        q = store.query
        fp: dict[str, Any] = {"rounds": [r[0] for r in q("SELECT step FROM rounds ORDER BY step")]}
        fp["environments"] = [
            (r["sha256"], r["status"], r["created_step"], r["retired_step"], r["hint"],
             r["skill"], _json(r["lineage"]), r["parents"], _json(r["validation"]))
            for r in q("SELECT * FROM environments ORDER BY sha256")]
        fp["episodes"] = [
            (r["env_sha"], r["step"], r["with_hint"], r["seed"], r["role"], r["episode_return"],
             r["stop_reason"], r["n_turns"], r["n_tokens"], r["n_sampled"], r["hint"],
             _json(r["tag"]), _h(r["token_ids"]), _h(r["loss_mask"]), _h(r["logprobs"]),
             _h(r["messages"]))
            for r in q("SELECT * FROM episodes ORDER BY step, env_sha, with_hint, seed, id")]
        fp["turns"] = [
            (r["step"], r["env_sha"], r["seed"], r["idx"], r["action"], r["observation"],
             r["reward"], r["terminated"], r["truncated"], r["new_tokens"], r["finish_reason"])
            for r in q("SELECT e.step, e.env_sha, e.seed, t.* FROM turns t JOIN episodes e "
                       "ON e.id = t.episode_id ORDER BY e.step, e.env_sha, e.with_hint, "
                       "e.seed, e.id, t.idx")]
        fp["plays"] = [tuple(r) for r in q(
            "SELECT env_sha, step, with_hint, episode_return, failure, turns, tokens, seed "
            "FROM plays ORDER BY step, env_sha, with_hint, seed, id")]
        fp["memory"] = [
            (r["sha256"], r["skill"], r["win_rate"], r["win_rate_with_hint"], r["regret"],
             r["designer_reward"], r["n_plays"], r["step"], r["library"], r["updated_step"])
            for r in q("SELECT * FROM memory ORDER BY sha256")]
        fp["delay_buffer"] = sorted(
            (r["generated_step"], r["due_step"], r["env_sha"] or "", r["skill"] or "",
             _h(r["token_ids"]), _h(r["loss_mask"]), _h(r["logprobs"]),
             json.dumps(_json(r["meta"]), sort_keys=True))
            for r in q("SELECT * FROM delay_buffer"))
        fp["blacklist"] = [tuple(r) for r in q(
            "SELECT sha256, reason, step FROM blacklist ORDER BY sha256")]
        fp["hint_cache"] = [tuple(r) for r in q(
            "SELECT env_sha, hint, how, step FROM hint_cache ORDER BY env_sha")]
        fp["rejected"] = [
            (r["step"], r["skill"], r["stage"], r["reason"], r["sha256"], _h(r["text"]))
            for r in q("SELECT * FROM rejected ORDER BY step, sha256, reason, id")]
        fp["state"] = {r["key"]: _json(r["value"]) for r in q("SELECT * FROM kv ORDER BY key")
                       if r["key"] != "roles"}  # roles: rewritten (same) at every open
        fp["metrics"] = {f"{r['name']}@{r['step']}": r["value"]
                         for r in q("SELECT * FROM metrics ORDER BY name, step")
                         if not WALL_CLOCK_METRICS.search(r["name"])}
        fp["weights"] = _weights(store.run_dir, store.latest_checkpoint()) if weights else {}
    finally:
        store.close()
    return fp


def differences(a: dict[str, Any], b: dict[str, Any], limit: int = 20) -> list[str]:
    """Where fingerprints ``a`` and ``b`` differ: ``field: what`` lines, at most ``limit``."""
    out: list[str] = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                if x.get(k) != y.get(k):
                    out.append(f"{key}.{k}: {x.get(k)!r:.120} != {y.get(k)!r:.120}")
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                out.append(f"{key}: {len(x)} rows != {len(y)} rows")
            for i, (u, v) in enumerate(zip(x, y)):
                if u != v:
                    out.append(f"{key}[{i}]: {u!r:.160} != {v!r:.160}")
                    break
        else:
            out.append(f"{key}: {x!r:.120} != {y!r:.120}")
        if len(out) >= limit:
            break
    return out[:limit]
