"""Asynchronous rollouts with bounded staleness: ``rollout.max_staleness``.

Real parts throughout: the tiny model, really trained, generating through a separate ``hf``
copy (``generation_model=tiny``) whose weights follow by real pushes; a scripted designer; real
sandboxes; a real run database. Below the loop, the bound and the ledger as pure functions
under hypothesis.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spadekit.common.errors import ConfigError
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.selfplay.staleness import (Batch, LedgerError, StaleWork, TokenLedger, partition,
                                         staleness_parts)
from spadekit.train.sample import Sample

import prefork
from test_selfplay import WORDS, config, designer_responder

SRC = str(Path(__file__).resolve().parents[2] / "src")
TIMING = ("seconds", "timings_s", "tokens_per_second", "peak_rss_mb", "run_dir_mb", "mb_per_s",
          "probe_")


def _sample(tokens: int) -> Sample:
    return Sample(role="agent", group_id="g", token_ids=list(range(tokens + 1)),
                  loss_mask=[0] + [1] * tokens, behaviour_logprobs=None, advantage=1.0)


def _comparable(metrics: dict) -> dict:
    """A round's metrics without wall clocks (timings, rates, memory)."""
    return {k: v for k, v in metrics.items()
            if not any(t in k for t in TIMING) and not k.endswith("_s")}


def _run(tmp: Path, rounds: int, name: str = "run", **extra):
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny", seed=0)
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    cfg = config(tmp, rounds=rounds, generation_model="tiny", tensorboard="false", **extra)
    sp = SelfPlay(cfg, tmp / name, policy=policy, designer_policy=designer)
    return sp, policy


def _weights(policy) -> dict:
    return {k: v.clone() for k, v in policy.model.state_dict().items()}


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


# -- the bound and the ledger, pure ---------------------------------------------------------------


def test_staleness_parts_add_up_and_never_go_back():
    batch = Batch(step=3, version=1, samples=[_sample(4)], trainer_start=2, trainer_end=3)
    parts = staleness_parts(batch, 5)
    assert parts == {"lag": 1, "in_flight": 1, "waiting": 2, "staleness": 4}
    with pytest.raises(LedgerError, match="out of order"):
        staleness_parts(batch, 2)  # a trainer older than the batch's end


@st.composite
def _timelines(draw):
    """A run of rounds with random push failures and random update/generation timings: each
    round the trainer may or may not change the weights, the push may fail, and the update may
    finish before or after the round's generation ends."""
    rounds = draw(st.integers(1, 30))
    return (draw(st.integers(0, 4)),
            [(draw(st.booleans()), draw(st.booleans()), draw(st.booleans()),
              draw(st.integers(0, 9))) for _ in range(rounds)])


@settings(max_examples=300, deadline=None)
@given(_timelines())
def test_no_trained_batch_is_ever_staler_than_the_bound(timeline):
    """The pipeline's bookkeeping (``Pipeline.take``'s arithmetic) under random timings: every
    batch trained is at most k versions old, every other one is cancelled, and the ledger
    balances after every round."""
    k, rounds = timeline
    trainer = generator = 0
    queue: list[Batch] = []
    ledger = TokenLedger()
    trained_steps: list[int] = []
    for step, (changes, push_ok, update_first, tokens) in enumerate(rounds):
        fresh, stale = partition(queue, trainer, k)
        for b in fresh:
            assert trainer - b.version <= k
            ledger.add("trained", b.version, b.tokens)
            trained_steps.append(b.step)
        for b, why in stale:
            assert isinstance(why, StaleWork) and trainer - b.version > k
            assert why.details["staleness"] == trainer - b.version
            ledger.add("discarded", b.version, b.tokens)
        queue = []
        start, version = trainer, generator
        after = trainer + (1 if changes and fresh else 0)
        end = after if update_first else trainer  # the update finished before generation did
        batch = Batch(step, version, [_sample(tokens)] if tokens else [], start, end)
        trainer = after
        if push_ok:
            generator = trainer
        ledger.add("generated", batch.version, batch.tokens)
        queue.append(batch)
        rows = ledger.check(queue)
        assert sum(r["generated"] for r in rows) == sum(
            r["trained"] + r["discarded"] + r["in_flight"] for r in rows)
    assert len(trained_steps) == len(set(trained_steps))  # never a batch twice


@given(st.dictionaries(st.sampled_from(["generated", "trained", "discarded", "x"]),
                       st.dictionaries(st.text(max_size=4), st.integers(-3, 10), max_size=3),
                       max_size=4) | st.integers() | st.text() | st.none())
@example({"generated": {"\u00b9": 0}})  # a superscript one: isdigit() but not int()
def test_a_stored_ledger_decodes_or_fails_typed(state):
    try:
        ledger = TokenLedger.from_state(state)
    except LedgerError:
        return
    assert TokenLedger.from_state(ledger.state()) == ledger


def test_an_unbalanced_ledger_is_refused():
    ledger = TokenLedger()
    ledger.add("generated", 0, 10)
    ledger.add("trained", 0, 4)
    with pytest.raises(LedgerError, match="does not balance"):
        ledger.check([])
    assert ledger.check([Batch(0, 0, [_sample(6)], 0, 0)])[0]["in_flight"] == 6


# -- the config ------------------------------------------------------------------------------------


def test_the_knob_is_checked(tmp_path):
    with pytest.raises(ValueError, match="max_staleness"):
        config(tmp_path, **{"rollout.max_staleness": -1})
    with pytest.raises(ConfigError, match="generation_model"):
        config(tmp_path, **{"rollout.max_staleness": 1})
    with pytest.raises(ConfigError, match="checkpoint_every=1"):
        config(tmp_path, generation_model="tiny", checkpoint_every=2,
               **{"rollout.max_staleness": 1})
    with pytest.raises(ConfigError, match="cannot be scheduled"):
        config(tmp_path, generation_model="tiny",
               schedule='[{"from_round": 1, "set": {"rollout.max_staleness": 1}}]')


# -- the loop --------------------------------------------------------------------------------------


def test_k0_is_the_synchronous_loop_and_repeats_itself(tmp_path):
    """k = 0: two seeded runs give the same metrics and weights (so a difference below could
    be seen), everything generated in a round is trained in it, nothing waits in the queue."""
    runs = []
    for name in ("a", "b"):
        sp, policy = _run(tmp_path, 2, name)
        with sp:
            metrics = [_comparable(m) for m in sp.run()]
            ledger = sp.store.ledger()
            assert sp.store.queued() == []
        runs.append((metrics, _weights(policy), ledger))
    (ma, wa, la), (mb, wb, lb) = runs
    assert ma == mb and _same_weights(wa, wb) and la == lb
    assert all(r["generated"] == r["trained"] and r["in_flight"] == 0 for r in la)
    assert not any(k.startswith("async/staleness") for m in ma for k in m)
    assert ma[0]["train/optimizer_steps"] == 1  # round 0 trains its own plays


def test_k1_trains_each_round_on_the_previous_one_and_the_ledger_balances(tmp_path):
    sp, policy = _run(tmp_path, 3, **{"rollout.max_staleness": 1})
    with sp:
        m0, m1, m2 = sp.run()
        store = sp.store
        assert "train/optimizer_steps" not in m0  # nothing was queued before round 0
        assert m0["async/samples_trained"] == 0 and m0["async/tokens_in_flight"] > 0
        # round 1 trains round 0's batch (generated before any update: 0 versions old),
        # round 2 round 1's (generated while the trainer took its first update: 1 version)
        assert m1["async/trained_batches"] == 1 and m1["async/staleness_max"] == 0
        assert m2["async/staleness_max"] == 1 and m2["async/in_flight_max"] + \
            m2["async/waiting_max"] == 1
        assert m1["train/optimizer_steps"] == m2["train/optimizer_steps"] == 1
        assert m2["async/policy_version"] == 2 and m2["async/generator_version"] == 2
        for step in range(3):
            rows = store.ledger(step)
            assert rows and all(r["generated"] == r["trained"] + r["discarded"] + r["in_flight"]
                                for r in rows)
        # the hand computation: round 1's update trained exactly the tokens sampled in round
        # 0's no-hint plays (hinted plays measure regret only; no designer samples were due)
        tokens0 = store.query("SELECT SUM(n_sampled) FROM episodes WHERE step = 0 AND with_hint = 0")[0][0]
        assert m1["async/tokens_trained"] == tokens0 == store.ledger(0)[0]["in_flight"]
        assert store.queued_steps() == [2]  # the last round's batch waits for the next update
        assert all(json.loads(e["data"])["kind"] != "cancelled" for e in
                   [dict(r) for r in store.query("SELECT data FROM events")])
        # hinted and no-hint plays of a round come from one policy version: no push mid-round
        assert m1["weight_sync/tensors"] > 0
        # the engine holds the trained weights after the last push
        assert _same_weights(_weights(sp.gen_policy), _weights(policy))


def test_a_failed_push_leaves_the_engine_on_its_version_and_stale_work_is_cancelled(
        tmp_path, monkeypatch):
    """The push after round 1 fails (the engine restores its weights): round 2 generates at
    version 0 while the trainer reaches 2, so round 3 finds that batch 2 versions old and
    cancels it (k = 1), counted in the ledger's ``discarded``; the run goes on."""
    from spadekit.train import weight_sync
    from spadekit.train.weight_sync import WeightSyncError

    real = weight_sync.WeightSync.push
    calls = {"n": 0}

    def flaky(self, weights, **kw):
        calls["n"] += 1
        if calls["n"] == 3:  # 1: the start; 2: round 0 (nothing trained); 3: after round 1
            raise WeightSyncError("push refused (test)")
        return real(self, weights, **kw)

    monkeypatch.setattr(weight_sync.WeightSync, "push", flaky)
    sp, _policy = _run(tmp_path, 4, **{"rollout.max_staleness": 1})
    with sp:
        ms = sp.run()
        store = sp.store
        assert ms[1]["async/push_failed"] == 1 and ms[1]["async/generator_version"] == 0
        assert ms[2]["async/lag_max"] == 0  # batch 1 was generated before the failure
        assert ms[3]["async/cancelled_batches"] == 1 and ms[3]["async/cancelled_tokens"] > 0
        assert all(m.get("async/staleness_max", 0) <= 1 for m in ms)
        events = [json.loads(r[0]) for r in store.query("SELECT data FROM events")]
        cancelled = [e for e in events if e.get("kind") == "cancelled"]
        assert len(cancelled) == 1 and cancelled[0]["error"] == "StaleWork"
        assert cancelled[0]["staleness"] == 2 and cancelled[0]["lag"] == 1
        assert any(e.get("kind") == "push_failed" for e in events)
        last = store.ledger(3)
        assert sum(r["discarded"] for r in last) == ms[3]["async/cancelled_tokens"]
        assert all(r["generated"] == r["trained"] + r["discarded"] + r["in_flight"]
                   for r in last)


def test_the_end_of_a_run_never_waits(tmp_path, monkeypatch):
    """No livelock at k = 1 at the end: even with every push failing, the rounds end, the
    stale batches are cancelled, and the last batch stays queued (in flight) for a resume."""
    from spadekit.train import weight_sync
    from spadekit.train.weight_sync import WeightSyncError

    real = weight_sync.WeightSync.push
    calls = {"n": 0}

    def failing(self, weights, **kw):
        calls["n"] += 1
        if calls["n"] > 1:
            raise WeightSyncError("push refused (test)")
        return real(self, weights, **kw)

    monkeypatch.setattr(weight_sync.WeightSync, "push", failing)
    t = time.perf_counter()
    sp, _policy = _run(tmp_path, 4, **{"rollout.max_staleness": 1})
    with sp:
        ms = sp.run()
        assert len(ms) == 4 and sp.store.queued_steps() == [3]
        assert sum(m["async/cancelled_batches"] for m in ms) >= 1
    assert time.perf_counter() - t < 600


def test_a_generation_error_waits_for_the_update_and_commits_nothing(tmp_path, monkeypatch):
    """A round whose generation fails ends with that error after the trainer thread has
    finished; nothing of the round commits and a resume continues with the queue intact."""
    from spadekit.selfplay.loop import SelfPlay

    sp, _policy = _run(tmp_path, 2, **{"rollout.max_staleness": 1})
    with sp:
        sp.run(1)
        queued = sp.store.queued()
        assert queued

        def broken(r):
            raise RuntimeError("generator died (test)")

        monkeypatch.setattr(sp, "play", broken)
        with pytest.raises(RuntimeError, match="generator died"):
            sp.round(1)
        assert sp.store.latest_complete_step() == 0
        assert [q["step"] for q in sp.store.queued()] == [q["step"] for q in queued]
    monkeypatch.undo()
    policy = load_policy("tiny", seed=0)
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    cfg = config(tmp_path, rounds=2, generation_model="tiny", tensorboard="false",
                 **{"rollout.max_staleness": 1})
    with SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=designer,
                  resume=True) as again:
        (m1,) = again.run(1)
        assert m1["async/trained_batches"] == 1 and again.store.queued_steps() == [1]


# -- a killed process ------------------------------------------------------------------------------

CHILD = r"""
import hashlib, json, sys
sys.path[:0] = [{tests!r}]
from pathlib import Path
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.selfplay.loop import SelfPlay
from test_selfplay import WORDS, config
run, rounds, resume, k = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
policy = load_policy("tiny", seed=0)


def respond(_ids, text):  # a function of the prompt alone: a resumed designer answers alike
    if "You write privileged hints" in text:
        return "HINT: Answer with one short lowercase word that names the goal."
    program = WORDS[int(hashlib.sha256(text.encode()).hexdigest(), 16) % len(WORDS)]
    return f"Here is the environment.\n```python\n{{program}}\n```\nHINT: use letters."


designer = ScriptedPolicy(policy.tokenizer, respond)
cfg = config(run.parent, rounds=rounds, generation_model="tiny", tensorboard="false",
             **{{"rollout.max_staleness": k, "rollout.seed": 7}})
with SelfPlay(cfg, run, policy=policy, designer_policy=designer, resume=resume) as sp:
    sp.run(rounds - sp.next_step)
    digest = hashlib.sha256()
    for name, value in sorted(policy.model.state_dict().items()):
        digest.update(name.encode()); digest.update(value.numpy().tobytes())
    steps = [m[1] for m in sp.store.metrics("train/optimizer_steps")]
    print("RESULT", json.dumps({{"ledger": sp.store.ledger(), "weights": digest.hexdigest(),
                                 "queued": sp.store.queued_steps(), "steps": steps}}))
"""


def _child(tmp: Path, run: Path, rounds: int, resume: bool, fault: str | None = None,
           k: int = 1):
    script = tmp / "child.py"
    script.write_text(CHILD.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("SPADEKIT_FAULT", None)
    if fault:
        env["SPADEKIT_FAULT"] = fault
    proc = prefork.run([sys.executable, str(script), str(run), str(rounds),
                           "1" if resume else "0", str(k)], env=env, capture_output=True, text=True,
                          timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return proc.returncode, json.loads(line[7:])
    return proc.returncode, proc.stderr[-2000:]


def test_sigkill_with_work_in_flight_resumes_to_the_same_ledger_and_weights(tmp_path):
    """SIGKILL in round 2 while its generation runs beside the update of round 1's batch (the
    ``play`` fault point), and again in round 3 just before the commit: the resumed run ends
    with the ledger and the weights of a run never killed, which trains no batch twice (an
    update that trained a batch again would unbalance the ledger: LedgerError)."""
    rc, clean = _child(tmp_path, tmp_path / "clean" / "run", 4, False)
    assert rc == 0, clean
    assert sum(clean["steps"]) >= 2  # the weights really move (else "same weights" is empty)
    rc, again = _child(tmp_path, tmp_path / "again" / "run", 4, False)
    assert rc == 0 and again == clean  # two runs of the same input compare equal
    killed = tmp_path / "killed" / "run"
    rc, _ = _child(tmp_path, killed, 4, False, fault="2:play")
    assert rc == -9
    rc, _ = _child(tmp_path, killed, 4, True, fault="3:commit")
    assert rc == -9
    rc, resumed = _child(tmp_path, killed, 4, True)
    assert rc == 0, resumed
    assert resumed == clean
    assert resumed["queued"] == [3]
