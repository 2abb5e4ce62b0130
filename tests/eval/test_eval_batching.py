"""Generation calls of an in-process model split by prompt length (``spadekit.eval.batching``).

The memory blow-up this guards: ``spadekit eval --model tiny --suite rg-hard --limit 2`` sent
its 200 items to the engine 64 at a time in item order. The in-process model pads a call to its
longest prompt and, when rows differ in length, attends over every padded pair of positions, so
one 7,000-token prompt among 63 short ones cost about 16 GB. Now episodes are sorted by prompt
length, each call within ``rows x longest prompt² <= max_batch_cells``, on every turn.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spadekit.eval import EvalError
from spadekit.common.packing import plan_batches
from spadekit.eval.batching import CellBoundedPolicy, bounded
from spadekit.eval.runner import EvalSettings, run_suite
from spadekit.policy.base import GenerationRequest, SamplingParams
from spadekit.policy.registry import load_policy

SRC = Path(__file__).resolve().parents[2] / "src"
# Reasoning Gym datasets with short hard prompts (under 100 tiny tokens) and one with long ones
# (mahjong_puzzle: about 3,400): the mix that made one padded call cost gigabytes
SHORT = ["number_sequence", "simple_equations", "spell_backward", "basic_arithmetic",
         "complex_arithmetic", "calendar_arithmetic", "lcm", "count_primes", "count_bits",
         "time_intervals", "aiw"]
LONG = "mahjong_puzzle"


@settings(max_examples=300, deadline=None)
@given(widths=st.lists(st.integers(0, 5000), max_size=80), batch_size=st.integers(1, 70),
       max_cells=st.one_of(st.none(), st.integers(0, 10 ** 8)))
def test_a_plan_holds_every_episode_once_within_its_bounds(widths, batch_size, max_cells):
    calls = plan_batches(widths, batch_size, max_cells)
    assert sorted(i for call in calls for i in call) == list(range(len(widths)))
    assert all(call for call in calls)
    flat = [widths[i] for call in calls for i in call]
    assert flat == sorted(flat)  # shortest first, so each call's rows are alike
    for call in calls:
        assert len(call) <= batch_size
        if max_cells and len(call) > 1:
            assert len(call) * max(widths[i] for i in call) ** 2 <= max_cells
        assert call == sorted(call, key=lambda i: (widths[i], i))  # ties keep their order
    # cut only when needed: the next call's first episode would not have fitted
    for a, b in zip(calls, calls[1:]):
        cells = (len(a) + 1) * widths[b[0]] ** 2
        assert len(a) == batch_size or (max_cells and cells > max_cells)


def test_no_bound_batches_by_count_only():
    assert plan_batches([5, 1, 3, 1], 3, None) == [[1, 3, 2], [0]]
    assert plan_batches([5, 1, 3, 1], 3, 0) == [[1, 3, 2], [0]]
    assert plan_batches([100, 100, 100], 64, 10_000) == [[0], [1], [2]]  # one always fits
    assert plan_batches([], 64, 10) == []


def test_a_negative_cell_bound_is_refused():
    from spadekit.eval.rg import ReasoningGymSuite

    with pytest.raises(EvalError, match="max_batch_cells"):
        EvalSettings(max_batch_cells=-1).resolve(ReasoningGymSuite("hard", datasets=["lcm"]))


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny", seed=0)


def spy(monkeypatch, policy):
    """Note ``(rows, longest prompt)`` of every call that reaches the real policy."""
    calls, real = [], policy.generate

    def generate(requests, **kw):
        calls.append((len(requests), max(len(r.prompt_ids) for r in requests)))
        return real(requests, **kw)

    monkeypatch.setattr(policy, "generate", generate)
    return calls


def test_long_prompts_never_share_a_call_beyond_the_bound(tiny, monkeypatch):
    pytest.importorskip("reasoning_gym")
    from spadekit.eval.rg import ReasoningGymSuite

    suite = ReasoningGymSuite("hard", datasets=SHORT + [LONG])
    items = suite.load_items(limit=2)
    calls = spy(monkeypatch, tiny)
    cells = 2 ** 25
    result = run_suite(tiny, suite, EvalSettings(limit=2, max_new_tokens=2, max_turns=2,
                                                 max_batch_cells=cells), items=items)
    assert [r["id"] for r in result["items"]] == [i.id for i in items]  # order and ids kept
    assert all(len(r["scores"]) == 1 for r in result["items"])
    assert max(width for _, width in calls) > 3000  # the long prompts were played
    for rows, width in calls:
        assert rows == 1 or rows * width ** 2 <= cells, calls
    # the short items still share a call (the bound does not serialise everything)
    assert max(rows for rows, _ in calls) >= 2 * len(SHORT)
    calls.clear()
    run_suite(tiny, suite, EvalSettings(limit=2, max_new_tokens=2, max_turns=1,
                                        max_batch_cells=None), items=items)
    assert calls[0][0] == len(items)  # no bound: one call of everything


def test_a_split_call_returns_each_generation_in_request_order(tiny):
    lengths = [40, 900, 12, 900, 300, 5, 40]
    requests = [GenerationRequest(prompt_ids=[3 + (i + j) % 200 for j in range(n)],
                                  params=SamplingParams(temperature=1.0, max_new_tokens=3,
                                                        seed=i))
                for i, n in enumerate(lengths)]
    wrapped = CellBoundedPolicy(tiny, 900 ** 2)
    gens = wrapped.generate(requests)
    assert [g.prompt_ids for g in gens] == [r.prompt_ids for r in requests]
    assert all(1 <= len(g.token_ids) <= 3 for g in gens)
    assert wrapped.calls == [(5, 300), (1, 900), (1, 900)]
    assert wrapped.tokenizer is tiny.tokenizer and wrapped.name == tiny.name


def test_only_in_process_models_are_wrapped(tiny):
    from spadekit.policy.scripted import ScriptedPolicy

    assert isinstance(bounded(tiny, 10), CellBoundedPolicy)
    # no bound: still wrapped, so that the policy's own bound is switched off as asked
    assert bounded(tiny, None).max_cells == bounded(tiny, 0).max_cells == 0
    scripted = ScriptedPolicy(tiny.tokenizer, lambda request: "<answer>1</answer>")
    assert bounded(scripted, 10) is scripted


PEAK_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from spadekit.eval.rg import ReasoningGymSuite
    from spadekit.eval.runner import EvalSettings, run_suite
    from spadekit.policy.registry import load_policy

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    suite = ReasoningGymSuite("hard", datasets=json.loads(sys.argv[2]))
    items = suite.load_items(limit=2)
    policy = load_policy("tiny", seed=0)
    before = hwm()
    result = run_suite(policy, suite, EvalSettings(limit=2, max_new_tokens=2, max_turns=1),
                       items=items)
    print(json.dumps({"growth": hwm() - before, "items": len(result["items"])}))
""")


def test_peak_memory_of_a_mixed_length_evaluation(tmp_path):
    """VmHWM growth of a real evaluation in a fresh process: 22 short Reasoning Gym items and
    two of ~3,400 tokens. Measured three times each: the old code grew by 1.8 GiB (one call of
    24 rows padded to the long prompts); split calls by 0.16 to 0.2 GiB."""
    pytest.importorskip("reasoning_gym")
    script = tmp_path / "peak.py"
    script.write_text(PEAK_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(SRC), json.dumps(SHORT + [LONG])],
                         capture_output=True, text=True, timeout=600, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["items"] == 2 * (len(SHORT) + 1)
    assert report["growth"] < 600 * 2 ** 20, report


def test_the_command_takes_the_bound(tmp_path):
    from typer.testing import CliRunner

    from spadekit.cli.app import app

    qa = Path(__file__).resolve().parents[1] / "data" / "qa_math.jsonl"
    base = ["eval", "--model", "tiny", "--suite", f"qa:{qa}", "--limit", "1", "-k", "1",
            "--max-new-tokens", "2"]
    refused = CliRunner().invoke(app, base + ["--max-batch-cells", "-1"])
    assert refused.exit_code == 2 and "max_batch_cells must be >= 0" in refused.output
    out = tmp_path / "r.json"
    ran = CliRunner().invoke(app, base + ["--max-batch-cells", "0", "--out", str(out)])
    assert ran.exit_code == 0, ran.output
    [suite] = json.loads(out.read_text())["suites"].values()
    assert suite["summary"]["overall"]["items"] >= 1
