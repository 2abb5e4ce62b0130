"""``SelfPlay`` under ``torchrun --nproc_per_node 2`` (CPU, gloo) equals one process.

One launch of this file (``worker``) runs, in 2 processes: 2 self-play rounds with DDP, then
``resume=True`` for a third round, then 2 rounds with FSDP in a second run directory. Rank 1 is
given its own (different) run directory, and its ``RunStore`` and ``SandboxPool`` are replaced
by traps: it must open no store, start no sandbox, and follow rank 0's run. The same rounds run
here in one process (``worker`` in single mode, a plain subprocess at the same time); sampling
is seeded (``rollout.seed``), so rank 0 generates exactly what the single process generates and
the weights must agree. A second launch injects a failure into rank 0's design phase in round 1
(FSDP, inside ``gathered_for_generation``): both processes must exit with an error on their own,
and a third launch resumes that run (FSDP) from its committed round.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

WORLD = 2
TOL = 1e-5
HERE = Path(__file__).resolve().parents[1]
SRC = HERE.parent / "src"


def make_config(base: Path, rounds: int, strategy: str):
    """``test_selfplay``'s config with seeded sampling, and a learning rate small enough that
    Adam's amplification of float-rounding noise in near-zero gradients (its update is about
    ``lr * g / (|g| + eps)`` per element) stays far below the tolerance (lr 0.01 gives a few
    elements 1e-4 apart though the gradients agree to 1e-7 relative). Nothing may depend on the
    wall clock: the watch's step-time checks (``slow_in_play`` compares play step times with
    validation's) are off and the sandbox's step timeout is long, since three processes share
    two cores here, and under other load the two runs' rollouts once differed
    (test_watch.py and the sandbox tests cover those limits)."""
    from test_selfplay import config

    return config(base, rounds=rounds, **{"rollout.seed": 7, "train.learning_rate": 1e-4,
                                          "train.distributed_strategy": strategy,
                                          "watch.step_time_limit_s": 600.0,
                                          "watch.slow_step_factor": 1e9,
                                          "sandbox.step_timeout": 60.0})


def weights(sp) -> dict:
    from spadekit.train.distributed import full_state_dict

    if sp.trainer.dist.strategy == "fsdp":
        return full_state_dict(sp.trainer.inner)  # collective
    return {k: v.detach().cpu().clone() for k, v in sp.policy.model.state_dict().items()}


def selfplay(base: Path, run_dir: Path, rounds: int, strategy: str, resume: bool = False):
    from test_selfplay import WORDS, designer_responder

    from spadekit.policy.registry import load_policy
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")  # the same initial weights in every process
    # a resumed run's designer writes new games (the earlier ones are already in the store)
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS[::-1] if resume
                                                                   else WORDS))
    return SelfPlay(make_config(base, rounds, strategy), run_dir, policy=policy,
                    designer_policy=designer, resume=resume)


def trap_rank1() -> None:
    """On rank 1: opening a run store or starting a sandbox pool fails loudly."""
    import spadekit.selfplay.loop as selfplay_mod

    class Trap:
        def __init__(self, *a, **k):
            raise AssertionError("rank 1 must not open a store or start sandboxes")

        @classmethod
        def open(cls, *a, **k):
            raise AssertionError("rank 1 must not open a store")

    selfplay_mod.RunStore = Trap
    selfplay_mod.SandboxPool = Trap


def scenarios(out: Path, rank: int, world: int) -> None:
    res: dict = {}
    run = out / ("run" if rank == 0 else f"run-rank{rank}")
    with selfplay(out, run, 2, "ddp") as sp:
        res["ddp_metrics"] = sp.run()
        res["ddp"] = weights(sp)
        res["run_dir"] = str(sp.run_dir)
        res["has_store"] = sp.store is not None
        res["world_size"] = sp.trainer.dist.world_size
        res["strategy"] = sp.trainer.dist.strategy
    with selfplay(out, run, 1, "ddp", resume=True) as sp:
        res["resume_next"] = sp.next_step
        res["resume_metrics"] = sp.run()
        res["resume"] = weights(sp)
    if world > 1:  # the same 2 rounds under FSDP (one process: the same run as above)
        with selfplay(out, out / ("fsdp-run" if rank == 0 else f"fsdp-rank{rank}"), 2,
                      "fsdp") as sp:
            res["fsdp_metrics"] = sp.run()
            res["fsdp"] = weights(sp)
            res["fsdp_strategy"] = sp.trainer.dist.strategy
    torch.save(res, out / f"result-{'single' if world == 1 else rank}.pt")


def fail(out: Path, rank: int) -> None:
    """Round 1's design phase raises on rank 0; every rank records what it raised."""
    sp = selfplay(out, out / ("fail-run" if rank == 0 else "fail-rank1"), 3, "fsdp")
    if rank == 0:
        real = sp.design.design

        def design(step, *a, **k):
            if step == 1:
                raise RuntimeError("injected design failure")
            return real(step, *a, **k)

        sp.design.design = design
    try:
        sp.run()
    except BaseException as exc:
        (out / f"fail-{rank}.json").write_text(json.dumps(
            {"type": type(exc).__name__, "message": str(exc), "next_step": sp.next_step}))
        raise
    finally:
        sp.close()


def resume_after_failure(out: Path, rank: int) -> None:
    """Continue the failed FSDP run: every rank loads round 0's checkpoint, round 1 again."""
    with selfplay(out, out / ("fail-run" if rank == 0 else "fail-rank1"), 1, "fsdp",
                  resume=True) as sp:
        res = {"next_step": sp.next_step, "metrics": sp.run(), "weights": weights(sp)}
    torch.save(res, out / f"resumed-{rank}.pt")


def worker() -> None:
    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    mode, out = sys.argv[1], Path(sys.argv[2])
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if rank:
        trap_rank1()
    if mode == "fail":
        fail(out, rank)
    elif mode == "resume":
        resume_after_failure(out, rank)
    else:
        scenarios(out, rank, world)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def _torchrun(mode: str, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc_per_node", str(WORLD), "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), __file__, mode, str(out)]
    return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    dist_out = tmp_path_factory.mktemp("two")
    single_out = tmp_path_factory.mktemp("one")
    t0 = time.monotonic()
    procs = {"two": _torchrun("run", dist_out),
             "one": subprocess.Popen([sys.executable, __file__, "run", str(single_out)],
                                     env=_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=single_out)}
    logs = {}
    for name, proc in procs.items():
        try:
            logs[name] = proc.communicate(timeout=400)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"{name}: timed out\n{proc.communicate()[0][-4000:]}")
        assert proc.returncode == 0, f"{name}:\n{logs[name][-6000:]}"
    print(f"2-process and 1-process runs: {time.monotonic() - t0:.1f}s")
    ranks = [torch.load(dist_out / f"result-{r}.pt", weights_only=False) for r in range(WORLD)]
    single = torch.load(single_out / "result-single.pt", weights_only=False)
    return {"out": dist_out, "ranks": ranks, "single": single}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_only_rank0_owns_the_run_directory(runs):
    out, ranks = runs["out"], runs["ranks"]
    assert [r["world_size"] for r in ranks] == [WORLD, WORLD]
    assert [r["strategy"] for r in ranks] == ["ddp", "ddp"]
    assert [r["has_store"] for r in ranks] == [True, False]
    assert ranks[1]["run_dir"] == ranks[0]["run_dir"] == str(out / "run")  # rank 0's
    for never in ("run-rank1", "fsdp-rank1"):  # rank 1's own --run-dir was never made
        assert not (out / never).exists()
    assert sorted(p.name for p in out.rglob("run.sqlite")) == ["run.sqlite", "run.sqlite"]
    from spadekit.runs.store import RunStore

    with RunStore.open(out / "run") as store:
        assert store.completed_rounds() == [0, 1, 2]
        assert store.latest_checkpoint()["step"] == 2
        world = store.query("SELECT COUNT(*) FROM metrics WHERE name = 'world_size' "
                            "AND value = 2")[0][0]
        assert world == 3
    with RunStore.open(out / "fsdp-run") as store:
        assert store.completed_rounds() == [0, 1]
    events = [json.loads(x) for x in (out / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e.get("kind") == "round"] == [0, 1, 2]
    ckpts = sorted(p.name for p in (out / "run" / "checkpoints").iterdir())
    assert ckpts == ["step-1", "step-2"]  # checkpoint.keep_last 2; no temp dirs of other ranks


def test_ddp_rounds_equal_one_process(runs):
    (r0, r1), one = runs["ranks"], runs["single"]
    assert max_diff(r0["ddp"], r1["ddp"]) == 0  # DDP: the ranks hold the same weights
    diff = max_diff(r0["ddp"], one["ddp"])
    print(f"ddp vs one process: max |weight diff| {diff:.2e}")
    assert diff < TOL
    for m0, m1, m in zip(r0["ddp_metrics"], r1["ddp_metrics"], one["ddp_metrics"]):
        assert m1 == m0  # every rank returns rank 0's metrics
        assert m0["world_size"] == 2 and m["world_size"] == 1
        for key in ("agent_episodes", "agent_mean_return", "sampled_tokens", "valid",
                    "designer_samples", "train/num_samples", "train/num_tokens"):
            assert m0.get(key) == m.get(key), key  # the same rollouts
        assert m0["train/loss"] == pytest.approx(m["train/loss"], rel=1e-5, abs=1e-5)


def test_resume_under_two_processes_continues_from_the_committed_round(runs):
    (r0, r1), one = runs["ranks"], runs["single"]
    assert r0["resume_next"] == r1["resume_next"] == one["resume_next"] == 2
    assert [m["step"] for m in r0["resume_metrics"]] == [2]
    assert r0["resume_metrics"][0]["agent_episodes"] == 8
    assert r0["resume_metrics"][0]["train/optimizer_steps"] == 1
    assert max_diff(r0["ddp"], r0["resume"]) > 0  # the resumed round trained
    for key in ("agent_mean_return", "sampled_tokens", "designer_samples"):
        assert r0["resume_metrics"][0][key] == one["resume_metrics"][0][key], key
    assert max_diff(r0["resume"], r1["resume"]) == 0
    diff = max_diff(r0["resume"], one["resume"])
    print(f"ddp resume vs one process: max |weight diff| {diff:.2e}")
    assert diff < TOL


def test_fsdp_rounds_equal_one_process(runs):
    (r0, r1), one = runs["ranks"], runs["single"]
    assert r0["fsdp_strategy"] == r1["fsdp_strategy"] == "fsdp"
    assert max_diff(r0["fsdp"], r1["fsdp"]) == 0
    diff = max_diff(r0["fsdp"], one["ddp"])  # one process: the same two rounds
    print(f"fsdp vs one process: max |weight diff| {diff:.2e}")
    assert diff < TOL
    for m0, m in zip(r0["fsdp_metrics"], one["ddp_metrics"]):
        assert m0["agent_mean_return"] == m["agent_mean_return"]


def test_a_failure_on_rank0_stops_every_rank_and_the_run_resumes(tmp_path):
    t0 = time.monotonic()
    proc = _torchrun("fail", tmp_path)
    try:
        log = proc.communicate(timeout=240)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("a failure on rank 0 left the launch hanging")
    assert proc.returncode != 0, log[-4000:]
    print(f"failure launch: {time.monotonic() - t0:.1f}s")
    got = [json.loads((tmp_path / f"fail-{r}.json").read_text()) for r in range(WORLD)]
    assert got[0]["type"] == "RuntimeError" and "injected" in got[0]["message"]
    assert got[1]["type"] == "PeerFailed"  # rank 1 stopped by itself, not killed
    assert "rank 0 failed to design environments in round 1" in got[1]["message"]
    assert "injected design failure" in got[1]["message"]
    from spadekit.runs.store import RunStore

    with RunStore.open(tmp_path / "fail-run") as store:
        assert store.completed_rounds() == [0]  # round 1 was not committed
    assert not (tmp_path / "fail-rank1").exists()

    proc = _torchrun("resume", tmp_path)  # FSDP: every rank loads the checkpoint of round 0
    log = proc.communicate(timeout=240)[0]
    assert proc.returncode == 0, log[-6000:]
    print(f"failure and resume launches: {time.monotonic() - t0:.1f}s")
    r0, r1 = [torch.load(tmp_path / f"resumed-{r}.pt", weights_only=False)
              for r in range(WORLD)]
    assert r0["next_step"] == r1["next_step"] == 1
    assert [m["step"] for m in r0["metrics"]] == [1] and r1["metrics"] == r0["metrics"]
    assert r0["metrics"][0]["train/optimizer_steps"] == 1
    assert max_diff(r0["weights"], r1["weights"]) == 0
    with RunStore.open(tmp_path / "fail-run") as store:
        assert store.completed_rounds() == [0, 1]
        assert store.latest_checkpoint()["step"] == 1
    assert not (tmp_path / "fail-rank1").exists()


if __name__ == "__main__":
    worker()
