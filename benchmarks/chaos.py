"""Loses nothing, measured: SIGKILL at many moments, resume each time, and compare with the run
that was never killed; faults injected; a soak (issue 25).

Usage: python3 benchmarks/chaos.py [--rounds 4] [--kills 12] [--soak 200] [--out DIR]

1. **Resume equivalence.** A seeded self-play run on the tiny model (it really trains; a designer
   that answers every prompt with a real program drawn from the prompt's hash, 8 names x 2,925
   word triples, so a resumed designer answers as the first one would and rounds keep adding
   new environments; the library's bootstrap games; real
   sandboxes; a real run database) runs ``--rounds`` rounds twice uninterrupted: the two
   fingerprints (``spadekit.runs.fingerprint``) must be equal, or the comparison would prove
   nothing. Then the same run is killed with SIGKILL ``--kills`` times and resumed after each
   kill, until it has all its rounds: at named points (``spadekit.common.faults``: before
   design, validation, hints, play, reward, update, weight sync, retirement, checkpoint write,
   inside the checkpoint write, before and after the commit) and at random moments (a timer
   inside whatever phase is running). Its fingerprint must equal the uninterrupted one:
   weights bitwise, every metric per round (wall-clock ones out), environments, plays,
   episodes and their tokens, memory, delay buffer, blacklist, hint cache, the loop's random
   stream.
2. **Faults.** The database locked by another process, a full disk (ENOSPC) while the
   database is written, SIGTERM mid-round, a damaged latest checkpoint: each must end in a
   typed error or a clean resume with the previous round intact.
3. **Soak** (``--soak N`` rounds in one process): resident memory, open files, threads, sandbox
   workers, run-directory size per round, and their slopes.

The last line is one JSON object with ``kills``, ``resumed_equal``, ``max_weight_diff``,
``faults_injected``, ``faults_survived``, ``rss_slope_mb_per_round``, ``disk_bound_held`` and
more.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")
sys.path.insert(0, SRC)

GAME = r'''
import random
import re


class {name}Env:
    """Guess the hidden word; letters shared with it score partial credit."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.word = self.rng.choice({words!r})
        self.t = 0
        return "A word of five letters is hidden. Answer inside \\boxed{{}}.", {{}}

    def step(self, action):
        self.t += 1
        found = re.findall(r"\\boxed\{{([^{{}}]*)\}}", action)
        guess = found[-1].strip().lower() if found else ""
        if guess == self.word:
            return "Right.", 1.0, True, False, {{}}
        shared = len(set(guess) & set(self.word)) / 5 * 0.3 if guess.isalpha() else 0.0
        return "Shared letters score %.2f." % shared, round(shared, 4), True, False, {{}}

    def solution(self):
        return ["\\boxed{{%s}}" % self.word]
'''
WORDS = ("solve", "train", "learn", "crane", "finch", "robin", "delta", "banks", "shore",
         "maple", "cedar", "birch", "amber", "coral", "ivory", "flint", "slate", "quartz",
         "tulip", "lilac", "poppy", "otter", "raven", "heron", "plume", "ridge", "grove")
NAMES = ("Letters", "Birds", "Rivers", "Trees", "Stones", "Flowers", "Beasts", "Hills")


def designer_text(prompt: str) -> str:
    """The scripted designer's answer to ``prompt``: a function of the prompt alone (a resumed
    designer answers as the first one did), a game drawn from its hash (one of 8 names x 2,925
    word triples, so rounds keep adding new environments)."""
    if "You write privileged hints" in prompt:
        return "HINT: the hidden word is one of three; try them in turn."
    rng = random.Random(int(hashlib.sha256(prompt.encode()).hexdigest(), 16))
    program = GAME.format(name=rng.choice(NAMES), words=rng.sample(WORDS, 3))
    return f"Here it is.\n```python\n{program}\n```\nHINT: common letters first."


BUNDLED = ["model=smollm2-135m", "train.use_peft=true", "train.lora_r=8",
           "train.learning_rate=1e-4"]
"""``--bundled``: the bundled SmolLM2-135M with LoRA instead of the tiny model."""


def _model(extra) -> str:
    return next((e.split("=", 1)[1] for e in extra if e.startswith("model=")), "tiny")


def run_config(rounds: int, extra: list[str] = ()):
    from spadekit.selfplay.config import load_config

    sets = [f"model={_model(extra)}", f"rounds={rounds}", "envs_per_round=2", "num_generations=4",
            "hint_generations=2", "regen_interval=2", "bootstrap=library",
            "bootstrap_per_round=1", "memory_seed_library=false", "rollout.max_turns=2",
            "rollout.max_new_tokens=10", "rollout.temperature=1.0", "designer.temperature=1.0",
            "designer.max_new_tokens=2048", "train.learning_rate=0.01", "tensorboard=false",
            "checkpoint.keep_last=2", "sandbox.step_timeout=5.0", "dedup_threshold=1.01",
            "stream_key=chaos"]  # fixed: the uninterrupted runs are compared with each other
    return load_config(preset=None, overrides=sets + list(extra))


def child(run_dir: str, rounds: int, extra: list[str]) -> None:
    """One process of the run: open (or resume) it and play its remaining rounds."""
    from spadekit.policy.registry import load_policy
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy(_model(extra), seed=0)
    designer = ScriptedPolicy(policy.tokenizer, lambda _ids, text: designer_text(text))
    resume = (Path(run_dir) / "run.sqlite").exists()
    with SelfPlay(run_config(rounds, extra), run_dir, policy=policy, designer_policy=designer,
                  resume=resume) as sp:
        while sp.next_step < rounds:
            sp.round(sp.next_step)
            print(json.dumps({"done": sp.next_step}), flush=True)
            sp.next_step += 1


POPEN = subprocess.Popen
"""How a process of the run is started: a fresh interpreter here; the tests put
``tests/prefork.popen`` (the same call, the child forked from an interpreter that has already
imported torch, transformers and spadekit) in its place."""


def start(run_dir: Path, rounds: int, fault: str | None = None, extra: list[str] = ()):
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("SPADEKIT_FAULT", None)
    if fault:
        env["SPADEKIT_FAULT"] = fault
    return POPEN([sys.executable, __file__, "--child", str(run_dir), "--rounds",
                             str(rounds), *sum((["--set", s] for s in extra), [])], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_through(run_dir: Path, rounds: int, fault: str | None = None,
                kill_after: float | None = None, extra: list[str] = ()) -> dict:
    """One process; returns how it ended (``rc``, rounds it finished, whether it was killed)."""
    proc = start(run_dir, rounds, fault, extra)
    try:
        out, err = proc.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
    done = [json.loads(x)["done"] for x in out.splitlines() if x.startswith("{")]
    return {"rc": proc.returncode, "done": done, "killed": proc.returncode == -signal.SIGKILL,
            "stderr": err[-2000:]}


def completed(run_dir: Path) -> int:
    from spadekit.runs.store import RunStore

    if not (run_dir / "run.sqlite").exists():
        return 0
    with RunStore.open(run_dir) as store:
        last = store.latest_complete_step()
    return 0 if last is None else last + 1


def killed_run(run_dir: Path, rounds: int, plan: list[tuple[str, object]],
               extra: list[str] = ()) -> list[dict]:
    """Run to ``rounds`` with the kills of ``plan`` (``("point", "2:update")`` or
    ``("timer", seconds)``), resuming after each; returns what each process did."""
    log = []
    for kind, what in plan:
        if completed(run_dir) >= rounds:
            break
        if kind == "point":
            result = run_through(run_dir, rounds, fault=str(what), extra=extra)
        else:
            result = run_through(run_dir, rounds, kill_after=float(what), extra=extra)
        result.update(kind=kind, what=what, committed=completed(run_dir))
        if result["rc"] not in (0, -signal.SIGKILL):
            raise RuntimeError(f"the run failed ({kind} {what}): {result['stderr']}")
        log.append(result)
    while completed(run_dir) < rounds:
        result = run_through(run_dir, rounds, extra=extra)
        if result["rc"] != 0:
            raise RuntimeError(f"the final resume failed: {result['stderr']}")
        log.append({**result, "kind": "finish", "committed": completed(run_dir)})
    return log


PRIORITY = ("play", "update", "save:weights", "commit", "design", "validate", "hint",
            "reward", "sync", "retire", "save", "committed")
"""The named points a plan uses first (the issue's list: design, play, update, checkpoint
write, commit)."""


def kill_plan(rounds: int, kills: int, timers: int = 0, seed: int = 0,
              regen_interval: int = 2) -> list[tuple[str, object]]:
    """``kills`` named points (:data:`PRIORITY` first) spread over rounds 1 to ``rounds - 1``
    in the order the run reaches them (a resumed process passes through the next one), then
    ``timers`` kills at random moments (seconds after a process starts: loading, resuming, or
    inside whatever phase is running)."""
    from spadekit.common.faults import ROUND_POINTS

    rng = random.Random(seed)
    left = list(PRIORITY[:kills])
    # named points over the first rounds; the last ``timers`` rounds are left for the timers
    steps = list(range(1, max(2, rounds - timers)))
    quota = -(-len(left) // max(1, len(steps)))
    plan: list[tuple[str, object]] = []
    for n, step in enumerate(steps):
        valid = [p for p in left if p not in ("design", "validate", "hint")
                 or step % regen_interval == 0]
        take = valid[:quota] if n < len(steps) - 1 else valid
        for point in sorted(take, key=ROUND_POINTS.index):
            plan.append(("point", f"{step}:{point}"))
            left.remove(point)
    plan += [("timer", round(rng.uniform(4.0, 14.0), 2)) for _ in range(timers)]
    return plan


def equivalence(out: Path, rounds: int, kills: int, timers: int = 3,
                extra: list[str] = ()) -> dict:
    from spadekit.runs.fingerprint import differences, fingerprint

    t = time.perf_counter()
    a, b, k = out / "reference-a", out / "reference-b", out / "killed"
    for d in (a, b):
        r = run_through(d, rounds, extra=extra)
        if r["rc"] != 0:
            raise RuntimeError(f"reference run failed: {r['stderr']}")
    fa, fb = fingerprint(a), fingerprint(b)
    same_twice = differences(fa, fb)
    log = killed_run(k, rounds, kill_plan(rounds, kills, timers), extra=extra)
    fk = fingerprint(k)
    diff = differences(fa, fk)
    weights_equal = fa["weights"] == fk["weights"]
    return {"rounds": rounds, "kills": sum(1 for x in log if x.get("killed")),
            "kill_points": [f"{x['kind']}:{x['what']}" for x in log if x.get("killed")],
            "references_equal": not same_twice, "reference_differences": same_twice,
            "resumed_equal": not diff and not same_twice, "differences": diff,
            "max_weight_diff": 0.0 if weights_equal else None,
            "weights_bitwise_equal": weights_equal,
            "minutes": round((time.perf_counter() - t) / 60, 2)}


def _descendants() -> int:
    """Processes below this one (sandbox workers and their bwrap parents)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier and p not in mine}
        mine |= frontier
    return len(mine)


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def soak_child(run_dir: str, rounds: int, extra: list[str]) -> None:
    """One process, ``rounds`` rounds; one JSON line of resource figures per round."""
    from spadekit.policy.registry import load_policy
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.checkpoints import disk_use
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny", seed=0)
    designer = ScriptedPolicy(policy.tokenizer, lambda _ids, text: designer_text(text))
    with SelfPlay(run_config(rounds, extra), run_dir, policy=policy,
                  designer_policy=designer) as sp:
        for step in range(rounds):
            sp.round(step)
            sp.next_step += 1
            run = Path(run_dir)
            print(json.dumps({
                "round": step, "rss_mb": _status("VmRSS") / 1024,
                "open_files": len(os.listdir("/proc/self/fd")), "threads": _status("Threads"),
                "child_processes": _descendants(),
                "db_mb": sum(f.stat().st_size for f in run.glob("run.sqlite*")) / 2**20,
                "checkpoints_mb": disk_use(run / "checkpoints") / 2**20,
                "run_dir_mb": disk_use(run) / 2**20}), flush=True)


def _slope(ys: list[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2
                                                                   for i in range(n))


def soak(out: Path, rounds: int) -> dict:
    """``rounds`` rounds in one process; slopes over the second half (after the warm-up)."""
    t = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run([sys.executable, __file__, "--soak-child", str(out / "soak"),
                           "--rounds", str(rounds)], env=env, capture_output=True, text=True)
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or len(rows) < rounds:
        raise RuntimeError(f"the soak failed after {len(rows)} rounds: {proc.stderr[-2000:]}")
    (out / "soak.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    half = rows[len(rows) // 2:]
    slopes = {f"{k}_slope_per_round": round(_slope([r[k] for r in half]), 5)
              for k in ("rss_mb", "open_files", "threads", "child_processes", "db_mb",
                        "checkpoints_mb", "run_dir_mb")}
    spans = {f"{k}_range_second_half": [min(r[k] for r in half), max(r[k] for r in half)]
             for k in ("open_files", "threads", "child_processes")}
    return {"soak_rounds": rounds, **slopes, **spans,
            "rss_mb_first_last": [round(rows[0]["rss_mb"], 1), round(rows[-1]["rss_mb"], 1)],
            "checkpoints_mb_max": round(max(r["checkpoints_mb"] for r in rows), 2),
            "soak_minutes": round((time.perf_counter() - t) / 60, 2)}


def faults(out: Path) -> dict:
    """The injected faults of ``chaos_faults`` (each in its own folder)."""
    import chaos_faults

    results = []
    for name, scenario in chaos_faults.SCENARIOS.items():
        folder = out / f"fault-{name}"
        folder.mkdir()
        try:
            results.append(scenario(folder))
        except Exception as exc:  # a scenario that broke is a fault not survived
            results.append({"fault": name, "survived": False, "error": repr(exc)[:500]})
    ran = [r for r in results if "skipped" not in r]
    return {"faults_injected": len(ran), "faults_survived": sum(bool(r["survived"])
                                                                for r in ran),
            "faults": [{k: v for k, v in r.items() if k in ("fault", "survived", "skipped",
                                                             "error")} for r in results]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--kills", type=int, default=12, help="kills at named points")
    ap.add_argument("--timers", type=int, default=3, help="kills at random moments")
    ap.add_argument("--bundled", action="store_true", help="the equivalence on the bundled "
                    "SmolLM2-135M with LoRA (then no faults and no soak)")
    ap.add_argument("--soak", type=int, default=200, help="rounds of the soak (0: none)")
    ap.add_argument("--no-faults", action="store_true", help="skip the injected faults")
    ap.add_argument("--soak-child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "chaos"))
    args = ap.parse_args()
    if args.child:
        child(args.child, args.rounds, args.set)
        return
    if args.soak_child:
        soak_child(args.soak_child, args.rounds, args.set)
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    start_clock = time.perf_counter()
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    if args.bundled:
        args.no_faults, args.soak = True, 0
    result = equivalence(out, args.rounds, args.kills, args.timers,
                         BUNDLED if args.bundled else [])
    print("equivalence:", json.dumps(result), flush=True)
    if not args.no_faults:
        result.update(faults(out))
        print("faults:", json.dumps(result["faults"]), flush=True)
    if args.soak:
        result.update(soak(out, args.soak))
        result["rss_slope_mb_per_round"] = result["rss_mb_slope_per_round"]
        # the checkpoints on disk never exceed keep_last (2) of them
        one = result["checkpoints_mb_max"] / 2
        result["disk_bound_held"] = bool(result["checkpoints_mb_slope_per_round"] <= 0.01 * one)
    result["minutes"] = round((time.perf_counter() - start_clock) / 60, 2)
    (out / "chaos.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
