"""The weight probe (``spadekit.policy.weight_probe``) catches a run of dropped pushes: a stale
engine with a little numeric noise must not stay "indistinct" while the trainer drifts away."""

from __future__ import annotations

import copy
import random

import pytest

pytest.importorskip("torch")


def test_probe_catches_a_run_of_dropped_pushes():
    """The noise used for the verdict is twice the previous check's distance from the new
    weights. A stale engine's distance grows with every dropped push, so its "noise" grows
    with it: after one small indistinct push, every later dropped push is indistinct too,
    while the engine drifts 30x its real noise (1e-5) away from the trainer. Twelve dropped
    pushes at paper-sized steps pass without a failure."""
    import torch

    from spadekit.policy import weight_probe as wp
    from spadekit.policy.base import Generation
    from spadekit.policy.tiny import tiny_model, tiny_tokenizer
    from spadekit.policy.weight_items import WeightSyncError

    tok = tiny_tokenizer()
    trainer = tiny_model(0)

    class StaleEngine:  # serves frozen weights, logprobs with 1e-5 of numeric noise
        name, capabilities = "stale", frozenset({"logprobs", "token_ids"})

        def __init__(self):
            self.model, self.tokenizer, self.weights_version = None, tok, 0
            self.rng = random.Random(0)

        def generate(self, reqs):
            out = []
            for r in reqs:
                with torch.inference_mode():
                    lp = torch.log_softmax(self.model(input_ids=torch.tensor(
                        [r.prompt_ids])).logits[0, -1].float(), -1)
                t = int(lp.argmax())
                out.append(Generation(prompt_ids=list(r.prompt_ids), token_ids=[t],
                                      logprobs=[float(lp[t]) + self.rng.uniform(-1e-5, 1e-5)],
                                      text="", finish_reason="length"))
            return out

        def restore_weights(self):
            pass

        def confirm_weights(self):
            pass

    g = torch.Generator().manual_seed(1)
    direction = {n: torch.randn(p.shape, generator=g) for n, p in trainer.named_parameters()}

    def step(scale):
        with torch.no_grad():
            for n, p in trainer.named_parameters():
                p.add_(direction[n] * scale)

    eng = StaleEngine()
    eng.model = copy.deepcopy(trainer)
    wp.probe_push(eng, trainer)  # first push lands
    step(1e-4)
    eng.model = copy.deepcopy(trainer)
    eng.weights_version += 1
    assert wp.probe_push(eng, trainer)["probe_verdict"] == "pass"  # second push lands
    failed = False
    for _ in range(12):  # twelve pushes, acknowledged, never applied
        step(5e-6)
        eng.weights_version += 1
        try:
            wp.probe_push(eng, trainer)
        except WeightSyncError:
            failed = True
            break
    assert failed, "12 dropped pushes in a row were never caught"
