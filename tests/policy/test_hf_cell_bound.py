"""The generation memory bound inside ``HFPolicy.generate``: every caller, self-play's
rollouts included, gets calls of at most rows x longest prompt² ``max_batch_cells``, with the
same generations for seeded requests as one unbounded call.

Real parts: the tiny transformer, the rollout engine over in-process text environments, peak
resident memory of a fresh process (``VmHWM``).
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

pytest.importorskip("torch")
pytest.importorskip("transformers")

from spadekit.common.packing import within_cells  # noqa: E402
from spadekit.policy.base import GenerationRequest, PolicyError, SamplingParams  # noqa: E402
from spadekit.policy.registry import load_policy  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")


@settings(max_examples=200, deadline=None)
@given(widths=st.lists(st.integers(1, 3000), max_size=40), size=st.integers(1, 16),
       cells=st.sampled_from([0, None, 10_000, 10 ** 6, 2 ** 27]))
def test_calls_hold_every_request_once_and_the_bound(widths, size, cells):
    calls = within_cells(widths, size, cells)
    assert sorted(i for c in calls for i in c) == list(range(len(widths)))
    for c in calls:
        assert 1 <= len(c) <= size
        assert not cells or len(c) == 1 or len(c) * max(widths[i] for i in c) ** 2 <= cells
    chunks = [list(range(i, min(i + size, len(widths)))) for i in range(0, len(widths), size)]
    if not cells or all(len(c) == 1 or len(c) * max(widths[i] for i in c) ** 2 <= cells
                        for c in chunks):
        assert calls == chunks  # a batch within the bound is generated as it comes


def test_seeded_generations_are_the_same_bounded_or_not():
    policy = load_policy("tiny", seed=0)
    lengths = [30, 700, 8, 700, 250, 5, 30, 120]
    requests = [GenerationRequest(prompt_ids=[3 + (i * 7 + j) % 200 for j in range(n)],
                                  params=SamplingParams(temperature=1.0, max_new_tokens=6,
                                                        seed=100 + i))
                for i, n in enumerate(lengths)]
    calls = within_cells(lengths, policy.max_batch_size, 700 ** 2)
    assert len(calls) > 1  # the bound splits this batch
    whole = policy.generate(requests, max_batch_cells=0)
    split = policy.generate(requests, max_batch_cells=700 ** 2)
    assert [g.token_ids for g in split] == [g.token_ids for g in whole]
    assert [g.prompt_ids for g in split] == [r.prompt_ids for r in requests]
    with pytest.raises(PolicyError, match="max_batch_cells"):
        type(policy)(policy.model, policy.tokenizer, max_batch_cells=-1)


PEAK = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from spadekit.policy.registry import load_policy
    from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine

    class Text:
        def __init__(self, words):
            self.words = words
        def reset(self, *, seed=None, options=None):
            return "Read this and answer in \\\\boxed{}: " + " ".join(["word"] * self.words), {}
        def step(self, action):
            return "Thanks.", 0.0, True, False, {}

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    cells = None if sys.argv[2] == "none" else int(sys.argv[2])
    policy = load_policy("tiny", seed=0)
    policy.max_batch_cells = cells
    specs = [EpisodeSpec(program=None, seed=i, env_factory=(lambda n=n: Text(n)))
             for i, n in enumerate([10] * 22 + [900, 900])]
    engine = RolloutEngine(policy, None, RolloutConfig(max_turns=1, max_new_tokens=2,
                                                       max_context_tokens=65536))
    before = hwm()
    trajs = engine.run(specs)
    print(json.dumps({"growth": hwm() - before, "episodes": len(trajs),
                      "sampled": sum(t.num_sampled for t in trajs)}))
""")


def _peak(tmp_path: Path, cells: str) -> dict:
    script = tmp_path / "peak.py"
    script.write_text(PEAK)
    out = subprocess.run([sys.executable, str(script), SRC, cells], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_peak_memory_of_a_mixed_length_play_phase(tmp_path):
    """24 episodes in one rollout turn, 22 short and two of about 4,500 byte-level tokens:
    unbounded, one call pads all 24 rows to the long prompts; with the default bound the long
    ones go alone. Both play every episode; the bounded one grows far less."""
    bounded = _peak(tmp_path, str(2 ** 27))
    unbounded = _peak(tmp_path, "none")
    assert bounded["episodes"] == unbounded["episodes"] == 24
    assert bounded["sampled"] > 0 and unbounded["sampled"] > 0
    assert bounded["growth"] < 0.5 * unbounded["growth"], (bounded, unbounded)
