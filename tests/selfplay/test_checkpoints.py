"""Checkpoint retention and the fallback to the last good checkpoint (issue 25, items 1 and 3).

The loop is real (the tiny model trains, a scripted designer writes real programs, real
sandboxes); the retention rule and the dry-run's disk bound are checked against hand counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spadekit.common.errors import ConfigError
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.selfplay.checkpoints import (CheckpointConfig, checkpoint_budget, kept_steps,
                                           max_kept, parameters_from_name, prune_checkpoints)
from spadekit.selfplay.config import load_config

from test_selfplay import WORDS, config, designer_responder

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_kept_steps_by_hand():
    assert kept_steps(list(range(10)), CheckpointConfig(keep_last=2)) == {8, 9}
    # rounds 3, 6, 9 (steps 2, 5, 8) are multiples of 3, and the last two
    assert kept_steps(list(range(10)), CheckpointConfig(2, 3)) == {2, 5, 8, 9}
    assert kept_steps([4], CheckpointConfig(3, 0)) == {4}
    assert max_kept(10, 1, CheckpointConfig(2, 3)) == 4
    assert max_kept(400, 1, CheckpointConfig(2, 0)) == 2
    assert max_kept(30, 2, CheckpointConfig(1, 10)) == 1 + 2  # rounds 10, 20 (30 is the last)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_keep_last_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match="checkpoint.keep_last"):
        CheckpointConfig(keep_last=bad)


def test_dry_run_states_the_disk_bound_of_every_paper_preset():
    assert parameters_from_name("hf:Qwen/Qwen3-4B-Instruct-2507") == 4e9
    assert parameters_from_name("hf:Qwen/Qwen3-30B-A3B-Instruct-2507") == 30e9
    assert parameters_from_name("smollm2-135m") == 135e6
    assert parameters_from_name("tiny") is None
    for preset in ("games-4b", "games-30b", "tooluse-4b", "games-8b-thinking"):
        cfg = load_config(preset)
        figures = checkpoint_budget(cfg, parameters_from_name(cfg.model))
        params = parameters_from_name(cfg.model)
        assert figures["checkpoints_kept_max"] == 2, preset  # 400 rounds, 2 kept
        assert figures["checkpoints_on_disk_max"] == 3  # and the next one while it is written
        assert figures["checkpoint_disk_bound_gb"] == round(3 * params * 10 / 1e9, 1)
    out = subprocess.run([sys.executable, "-m", "spadekit", "selfplay", "--preset",
                          "games-4b", "--dry-run", "--json"], capture_output=True, text=True,
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["checkpoint_disk_bound_gb"] == 120.0 and data["checkpoints_kept_max"] == 2


def _run(tmp_path: Path, rounds: int, **extra):
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    cfg = config(tmp_path, rounds=rounds, **extra)
    return SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=designer)


def _folders(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def test_thirty_rounds_keep_the_bound(tmp_path):
    """30 rounds with keep_last 2 and keep_every 10: after every round at most 2 + the
    multiples of 10 so far are on disk, the pointers match the folders, and the disk use the
    round reports stays flat once the bound is reached."""
    from spadekit.selfplay.checkpoints import disk_use

    sizes = []
    with _run(tmp_path, 1, **{"checkpoint.keep_last": 2, "checkpoint.keep_every": 10,
                              "rollout.max_new_tokens": 4, "num_generations": 2,
                              "hint_generations": 1, "envs_per_round": 1}) as sp:
        run = sp.run_dir
        for step in range(30):
            metrics = sp.round(step)
            sp.next_step += 1
            on_disk = _folders(run)
            expected = {f"step-{s}" for s in kept_steps(list(range(step + 1)),
                                                       sp.config.checkpoint)}
            assert set(on_disk) == expected, (step, on_disk)
            assert {p["step"] for p in sp.store.checkpoints()} == {
                int(n.split("-")[1]) for n in expected}
            assert metrics["checkpoints_kept"] == len(expected)
            sizes.append(disk_use(run / "checkpoints") / max(1, len(expected)))
    assert _folders(run) == ["step-19", "step-28", "step-29", "step-9"]
    assert max(sizes) <= 1.05 * min(sizes)  # one checkpoint's size does not grow


def test_a_damaged_latest_checkpoint_falls_back_with_a_warning(tmp_path):
    from spadekit.runs.store import RunStore
    from spadekit.selfplay.loop import SelfPlay

    with _run(tmp_path, 3) as sp:
        sp.run()
        run = sp.run_dir
        kept = [p["step"] for p in sp.store.checkpoints()]
    assert kept == [1, 2]
    for weights in (run / "checkpoints" / "step-2").rglob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    with SelfPlay(config(tmp_path, rounds=1), run, policy=policy, designer_policy=designer,
                  resume=True) as sp:
        assert sp.next_step == 3
        assert sp.trainer.step == 2  # the weights of round 1's checkpoint (2 updates)
        sp.run()
    with RunStore.open(run) as store:
        events = store.events("checkpoint_fallback")
    assert len(events) == 1
    assert events[0]["data"]["loaded"] == 1 and events[0]["data"]["lost_rounds"] == [2, 2]
    assert events[0]["data"]["damaged"][0]["step"] == 2


def test_a_missing_latest_checkpoint_falls_back_and_none_left_is_a_typed_error(tmp_path):
    import shutil

    from spadekit.selfplay.loop import ResumeError, SelfPlay

    with _run(tmp_path, 2) as sp:
        sp.run()
        run = sp.run_dir
    shutil.rmtree(run / "checkpoints" / "step-1")
    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    with SelfPlay(config(tmp_path, rounds=1), run, policy=policy, designer_policy=designer,
                  resume=True) as sp:
        assert sp.trainer.step == 1
        assert [p["step"] for p in sp.store.checkpoints()] == [0]  # the missing one forgotten
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(ResumeError, match="does not load"):
        SelfPlay(config(tmp_path, rounds=1), run, policy=load_policy("tiny"),
                 designer_policy=designer, resume=True)


def test_prune_sweeps_folders_no_pointer_names(tmp_path):
    from spadekit.runs.store import RunStore

    with RunStore(tmp_path / "run", create=True) as store:
        for step in range(4):
            folder = store.checkpoint_dir(step, create=True)
            (folder / "trainer_state.json").write_text("{}")
            store.record_checkpoint(step, folder)
        orphan = store.checkpoint_dir(7, create=True)  # a round that died while saving
        (orphan / "x.safetensors").write_bytes(b"0" * 100)
        aside = store.run_dir / "checkpoints" / ".step-0.old-abcd1234"
        aside.mkdir()
        result = prune_checkpoints(store, CheckpointConfig(keep_last=2))
        assert result["kept"] == [2, 3] and result["removed"] == [0, 1, 7]
        assert _folders(store.run_dir) == ["step-2", "step-3"]
        assert [p["step"] for p in store.checkpoints()] == [2, 3]


# -- review of issue 25, findings 5-8 (the red team's tests, kept) ----------------------------

def test_fingerprint_compares_optimizer_and_rng_state(tmp_path):
    """Two runs whose newest checkpoints have the same weights but different optimizer
    moments, RNG streams and trainer step must not fingerprint equal (they did when only
    ``*.safetensors`` were hashed)."""
    import json

    import torch
    from safetensors.torch import save_file

    from spadekit.runs.fingerprint import differences, fingerprint
    from spadekit.runs.store import RunStore

    prints = []
    for i in range(2):
        run = tmp_path / f"run{i}"
        with RunStore(run, create=True) as store:
            with store.round(0):
                folder = store.checkpoint_dir(0, create=True)
                (folder / "model").mkdir()
                save_file({"w": torch.ones(4)}, str(folder / "model" / "model.safetensors"))
                torch.save({"state": {0: {"exp_avg": torch.full((4,), float(i))}}},
                           folder / "optimizer.pt")
                torch.save({"torch": torch.tensor([i])}, folder / "rng.pt")
                (folder / "trainer_state.json").write_text(json.dumps({"step": 10 + i}))
                store.record_checkpoint(0, folder)
        prints.append(fingerprint(run))
    assert differences(*prints), "different optimizer/RNG/step state fingerprinted equal"


def _selfplay(tmp_path, rounds, resume=False, run=None, **extra):
    from spadekit.policy.registry import load_policy
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.loop import SelfPlay
    from test_selfplay import WORDS, config, designer_responder

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    return SelfPlay(config(tmp_path, rounds=rounds, **extra), run or tmp_path / "run",
                    policy=policy, designer_policy=designer, resume=resume)


def test_dry_run_disk_bound_covers_the_checkpoint_being_written(tmp_path):
    """The round's checkpoint is written before the older ones are deleted (after the
    commit), so ``keep_last + 1`` checkpoints are on disk at the peak of every save. The
    bound ``--dry-run`` prints is of that peak (``checkpoints_on_disk_max``; review of issue
    25: it was ``checkpoints_kept_max``, one checkpoint short)."""
    from spadekit.selfplay.checkpoints import checkpoint_budget

    sp = _selfplay(tmp_path, 3, **{"checkpoint.keep_last": 1})
    peak = [0]
    save = sp.trainer.save

    def counting_save(path):
        out = save(path)
        peak[0] = max(peak[0], sum(1 for p in Path(path).parent.iterdir()
                                   if p.name.startswith("step-")))
        return out

    sp.trainer.save = counting_save
    try:
        sp.run()
        stated = checkpoint_budget(sp.config, 1e9)["checkpoints_on_disk_max"]
    finally:
        sp.close()
    assert peak[0] <= stated, f"{peak[0]} checkpoints on disk at once, bound says {stated}"


def test_resume_after_lowering_keep_last_still_falls_back(tmp_path):
    """A user short of disk lowers ``checkpoint.keep_last`` in the run's config.yaml and
    resumes; the newest checkpoint is damaged. The resume must not prune to the new keep_last
    before it has loaded (it used to delete the good older checkpoints, then fail)."""
    import yaml

    from spadekit.selfplay.loop import ResumeError  # noqa: F401

    with _selfplay(tmp_path, 3, **{"checkpoint.keep_last": 3}) as sp:
        sp.run()
        run = sp.run_dir
    for f in (run / "checkpoints" / "step-2").rglob("*.safetensors"):
        f.write_bytes(b"damaged")
    cfg_file = run / "config.yaml"
    data = yaml.safe_load(cfg_file.read_text())
    data["checkpoint"]["keep_last"] = 1
    cfg_file.write_text(yaml.safe_dump(data))
    with _selfplay(tmp_path, 1, resume=True, run=run) as sp:
        assert sp.trainer.step == 2  # round 1's checkpoint (two updates)


def test_after_a_fallback_the_damaged_checkpoint_does_not_displace_the_good_one(tmp_path):
    """After a fallback from a damaged step-2 to step-1, the damaged one is set aside (its
    pointer forgotten, its folder ``damaged-step-2``): the next commit keeps [1, 3], both
    loadable (it used to keep [2, 3] and delete the good step-1)."""
    from spadekit.train.checkpoint import STATE_FILE  # noqa: F401

    with _selfplay(tmp_path, 3) as sp:
        sp.run()
        run = sp.run_dir
    for f in (run / "checkpoints" / "step-2").rglob("*.safetensors"):
        f.write_bytes(b"damaged")
    with _selfplay(tmp_path, 1, resume=True, run=run) as sp:
        sp.run()  # round 3, after falling back to round 1's checkpoint
        kept = [p["step"] for p in sp.store.checkpoints()]
        loads = {}
        for p in sp.store.checkpoints():
            try:
                sp.trainer.load(p["path"])
                loads[p["step"]] = True
            except Exception:
                loads[p["step"]] = False
    assert all(loads.values()), f"kept checkpoints {kept}, loadable {loads}"
    assert kept == [1, 3] and (run / "checkpoints" / "damaged-step-2").is_dir()
