"""``PolicyTrainer`` in 2 CPU processes (gloo, launched with ``torchrun``) equals one process.

One ``torchrun --nproc_per_node 2`` launch of this file (``worker``) runs every scenario and
writes what each rank saw; the tests compare it with the same computation done here in one
process: DDP gradients and updated weights (full fine-tuning, LoRA, an uneven split, a rank with
nothing to train, KL to a reference with two PPO iterations), FSDP2 gradients and weights (also
with the KL and iterations), generation with gathered FSDP weights, and
checkpoints moving between 1 and 2 processes both ways (DDP and FSDP).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from spadekit.selfplay.advantages import Sample  # noqa: E402
from spadekit.train.config import TrainConfig  # noqa: E402
from spadekit.train.distributed import resolve_strategy, shard_indices  # noqa: E402

WORLD = 2
TOL = 1e-6
REL = 1e-5
"""Relative tolerance of statistics accumulated over a whole batch (loss, grad_norm, ...): one
process and several ranks sum in a different order, and float32 sums of n terms differ by up to
about sqrt(n) * 6e-8 relative (grad_norm 3.384102919 vs 3.384101748 was seen: 3.5e-7)."""
SRC = Path(__file__).resolve().parents[2] / "src"


def global_batch(seed: int = 0, n: int = 8) -> list[Sample]:
    """Varied lengths, masks (prompt, two turns, an observation), advantages (one zero),
    weights, and designer rows with behaviour logprobs (one far enough off to be capped)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt, turn, obs = 3 + (5 * i) % 7, 2 + (3 * i) % 9, 1 + i % 3
        ids = torch.randint(0, 256, (prompt + 2 * turn + obs,), generator=g).tolist()
        mask = [0] * prompt + [1] * turn + [0] * obs + [1] * turn
        adv = 0.0 if i == 3 else float(torch.randn((), generator=g))
        if i % 3 == 2:
            beh = [0.0] * prompt + (-5.5 + (2.0 if i == 5 else 0.3) * torch.randn(
                len(ids) - prompt, generator=g)).tolist()
            out.append(Sample(role="designer", group_id="Logic", token_ids=ids, loss_mask=mask,
                              behaviour_logprobs=beh, advantage=adv, weight=3.0))
        else:
            out.append(Sample(role="agent", group_id=f"env{i % 2}", token_ids=ids,
                              loss_mask=mask, behaviour_logprobs=None, advantage=adv))
    return out


def starved_batch() -> list[Sample]:
    """Three samples, two with zero advantage: one rank has nothing to compute."""
    batch = global_batch(seed=5, n=3)
    for s in batch[1:]:
        s.advantage = 0.0
    return batch


def config(**kw) -> TrainConfig:
    base = dict(learning_rate=1e-3, max_grad_norm=0.05, max_tokens_per_microbatch=40,
                per_device_train_batch_size=2, logprob_chunk_size=7, seed=0)
    return TrainConfig(**{**base, **kw})


def make_trainer(cfg: TrainConfig, seed: int = 2):
    from spadekit.policy.hf import HFPolicy
    from spadekit.policy.tiny import tiny_model, tiny_tokenizer
    from spadekit.train.trainer import PolicyTrainer

    trainer = PolicyTrainer(HFPolicy(tiny_model(seed), tiny_tokenizer(), name="tiny", seed=seed),
                            cfg)
    if cfg.use_peft:  # a non-zero adapter, identical on every rank
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    return trainer


def full(trainer, what: str) -> dict[str, torch.Tensor]:
    """Full (gathered under FSDP) parameters or gradients, by name, on CPU."""
    from spadekit.train.distributed import full_tensor

    out = {}
    for name, p in trainer.model.named_parameters():
        t = p.grad if what == "grad" else p
        if t is not None and (what != "grad" or p.requires_grad):
            out[name] = full_tensor(t.detach()).cpu().clone()
    return out


PROMPT, COMPLETION = [1, 5, 9, 200], [17, 33, 65, 129, 7]


def run_scenarios(out: Path) -> dict:
    """Every scenario; in the worker (2 ranks) and here (1 process) alike."""
    from spadekit.policy.hf import sequence_logprobs

    rank = int(os.environ.get("RANK", "0"))
    res: dict = {}
    for name, cfg, batch in [
        ("ddp", config(distributed_strategy="ddp"), global_batch()),
        ("lora", config(distributed_strategy="ddp", use_peft=True, lora_r=4), global_batch(1)),
        ("uneven", config(distributed_strategy="ddp", loss_type="sequence"), global_batch(2, 7)),
        ("starved", config(distributed_strategy="ddp"), starved_batch()),
        ("fsdp", config(distributed_strategy="fsdp"), global_batch()),
        ("ddp-kl", config(distributed_strategy="ddp", beta=0.05, num_iterations=2),
         global_batch(8)),
        ("fsdp-kl", config(distributed_strategy="fsdp", beta=0.05, num_iterations=2),
         global_batch(8)),
    ]:
        trainer = make_trainer(cfg)
        stats = trainer.compute_gradients(batch)
        grads = full(trainer, "grad")
        step = trainer.train_step(batch)
        res[name] = {"grads": grads, "params": full(trainer, "param"), "stats": stats,
                     "strategy": trainer.dist.strategy, "local_steps": len(
                         trainer._prepare(batch, {})[0]),
                     "step": {k: v for k, v in step.items() if k not in (
                         "seconds", "tokens_per_second", "peak_rss_mb")}}
        if name == "fsdp":  # generation with the gathered weights: ranks make different counts
            with trainer.gathered_for_generation():
                res[name]["logprobs"] = [sequence_logprobs(trainer.policy.model, PROMPT,
                                                           COMPLETION[:3 + k])
                                         for k in range(1 + rank)]
    # checkpoints: continue from a single-process checkpoint, then save under this world size
    for name in ("ddp", "fsdp"):
        trainer = make_trainer(config(distributed_strategy=name), seed=7)
        trainer.load(out / "single-ckpt")
        trainer.train_step(global_batch(3))
        trainer.save(out / f"{name}-ckpt-w{int(os.environ.get('WORLD_SIZE', '1'))}")
        res[f"{name}-resume"] = {"params": full(trainer, "param")}
    return res


def worker() -> None:
    out = Path(sys.argv[1])
    res = run_scenarios(out)
    torch.save(res, out / f"rank{os.environ['RANK']}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    first = make_trainer(config(distributed_strategy="no"), seed=7)
    first.train_step(global_batch(4))
    first.save(out / "single-ckpt")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc_per_node", str(WORLD), "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), __file__, str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    single = run_scenarios(out)
    return {"out": out, "ranks": ranks, "single": single}


def max_abs(a: dict) -> float:
    return max(float(v.abs().max()) for v in a.values())


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("name", ["ddp", "lora", "uneven", "starved", "fsdp", "ddp-kl",
                                  "fsdp-kl"])
def test_gradients_and_update_equal_one_process(runs, name):
    one = runs["single"][name]
    assert one["strategy"] == "no"
    assert [r[name]["local_steps"] for r in runs["ranks"]] != [one["local_steps"]] * WORLD
    for rank in runs["ranks"]:
        got = rank[name]
        assert got["strategy"] == ("fsdp" if name.startswith("fsdp") else "ddp")
        dg, dp = max_diff(got["grads"], one["grads"]), max_diff(got["params"], one["params"])
        print(f"{name}: max |grad diff| {dg:.2e}, max |param diff| {dp:.2e}")
        # elementwise sums over the batch's tokens: the error scales with the values summed
        assert dg < TOL * max(1.0, max_abs(one["grads"])) and dp < TOL
        for key in ("num_samples", "num_samples_trained", "num_tokens", "skipped_zero_advantage",
                    "num_importance_weighted", "optimizer_steps", "step"):
            assert got["step"][key] == one["step"][key], key
        for key in ("loss", "pg_loss", "grad_norm", "clip_frac", "tis_mean", "tis_capped_frac",
                    "ratio_mean") + (("kl",) if "kl" in name else ()):
            assert got["step"][key] == pytest.approx(one["step"][key], rel=REL, abs=TOL), key
    assert one["step"]["grad_clipped"] == 1.0  # the global norm was clipped
    if name == "lora":
        assert all("lora_" in k for k in one["grads"])
    if not name.startswith("fsdp"):  # DDP: the ranks hold the same full weights
        assert max_diff(runs["ranks"][0][name]["params"], runs["ranks"][1][name]["params"]) == 0


def test_fsdp_generation_with_gathered_weights(runs):
    want = runs["single"]["fsdp"]["logprobs"][0]
    for r, rank in enumerate(runs["ranks"]):
        got = rank["fsdp"]["logprobs"]
        assert len(got) == 1 + r
        assert got[0] == pytest.approx(want, rel=REL, abs=1e-5)


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_checkpoints_move_between_world_sizes(runs, name):
    """1 -> 2: both ranks resume from a single-process checkpoint and train like one process;
    2 -> 1: what the 2 ranks saved loads in one process, equal to its own state."""
    one = runs["single"][f"{name}-resume"]["params"]
    for rank in runs["ranks"]:
        assert max_diff(rank[f"{name}-resume"]["params"], one) < TOL
    a = make_trainer(config(distributed_strategy="no"), seed=11)
    a.load(runs["out"] / f"{name}-ckpt-w{WORLD}")
    b = make_trainer(config(distributed_strategy="no"), seed=11)
    b.load(runs["out"] / f"{name}-ckpt-w1")
    assert max_diff(full(a, "param"), full(b, "param")) < TOL
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for key in ("exp_avg", "exp_avg_sq"):
            assert float((sa[k][key] - sb[k][key]).abs().max()) < TOL
    batch = global_batch(6)
    a.train_step(batch)
    b.train_step(batch)
    assert max_diff(full(a, "param"), full(b, "param")) < TOL


def test_shard_indices_partition_deterministically():
    loads = [5, 40, 7, 7, 30, 2, 19]
    parts = [shard_indices(loads, 3, r) for r in range(3)]
    assert sorted(i for p in parts for i in p) == list(range(7))
    assert parts == [shard_indices(loads, 3, r) for r in range(3)]
    assert shard_indices([3], 2, 1) == []  # fewer samples than ranks: a rank may get none
    assert shard_indices(loads, 1, 0) == list(range(7))


def test_strategy_resolution():
    assert resolve_strategy("auto", 1, {}) == "no"
    assert resolve_strategy("fsdp", 1, {}) == "no"
    assert resolve_strategy("auto", 2, {}) == "ddp"
    assert resolve_strategy("auto", 2, {"ACCELERATE_USE_FSDP": "true"}) == "fsdp"
    assert resolve_strategy("auto", 2, {"ACCELERATE_USE_DEEPSPEED": "true"}) == "deepspeed"
    assert resolve_strategy("ddp", 2, {"ACCELERATE_USE_FSDP": "true"}) == "ddp"
    with pytest.raises(ValueError):
        TrainConfig(distributed_strategy="zero3")


if __name__ == "__main__":
    worker()
