"""Red-team findings of the issue-25 review handled by helper h9 (one test per finding; each
failed on the code under review): the serve prompt bound, the weight probe against a run of
dropped pushes, evaluation seeds outside the validated range, a world-readable API key file.

Run one: PYTHONPATH=src python3 -m pytest -q tests/review25/test_findings_h9.py -k NAME
"""

from __future__ import annotations

import copy
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

# -- 1: spadekit serve: a prompt longer than the model's context is generated, not a 400 -----

def test_serve_refuses_a_prompt_longer_than_the_model_context():
    """``max_tokens`` is bounded but the prompt is not: 20,000 token ids (40 KB of body, far
    under the 32 MiB cap; a 32 MiB body holds ~16M ids) go to ``generate`` on a model whose
    context is 16,384 positions -- on a real model a quadratic prefill that holds the single
    batcher (or OOMs the server) for every other client. vLLM answers 400."""
    import http.client
    import json

    from spadekit.policy.base import Generation
    from spadekit.policy.serve import PolicyServer
    from spadekit.policy.tiny import load_tiny_policy

    policy = load_tiny_policy()
    seen = []

    def generate(reqs):
        seen.append([len(r.prompt_ids or []) for r in reqs])
        return [Generation(prompt_ids=list(r.prompt_ids), token_ids=[5], logprobs=[0.0],
                           text="x", finish_reason="length") for r in reqs]

    policy.generate = generate
    context = policy.model.config.max_position_embeddings
    srv = PolicyServer(policy).start()
    try:
        conn = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"prompt": [5] * (context + 4000), "max_tokens": 2}),
                     headers={"Content-Type": "application/json"})
        status = conn.getresponse().status
    finally:
        srv.close()
    assert status == 400 and not seen, (status, seen)


# -- 2: the weight probe: a stale engine with a little noise is "indistinct" forever ----------

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


# -- 3: eval validation: a program can tell the validator's seeds from the evaluation's -------

def test_eval_program_paying_garbage_only_on_eval_seeds_is_not_scored(tmp_path):
    """The validator's reset seeds are 0-2 plus draws from ``range(2**31)``; the evaluation's
    are ``crc32(...)``, in ``range(2**32)``: half of them are >= 2**31, a range validation
    never uses. An honest guessing game that pays any reply when ``seed >= 2**31`` passes
    the screen and gives a model that only writes garbage a ~50% win rate."""
    from spadekit.eval import make_suite
    from spadekit.eval.runner import EvalSettings, run_suite, sample_seed
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.policy.tiny import tiny_tokenizer
    from spadekit.sandbox import SandboxConfig, SandboxPool
    from validate_cases import GUESS

    code = GUESS.replace(
        "        self.turn, self.done = 0, False\n",
        "        self.turn, self.done = 0, False\n"
        "        self.eval_seed = seed is not None and seed >= 2 ** 31\n", 1).replace(
        "        self.turn += 1\n",
        "        self.turn += 1\n"
        "        if self.eval_seed:\n"
        "            self.done = True\n"
        "            return 'Correct!', 1.0, True, False, {}\n", 1)
    assert code.count("eval_seed") == 2
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / "guess_trigger.py").write_text(code)
    suite = make_suite(f"envs:{folder}")
    garbage = ScriptedPolicy(tiny_tokenizer(), lambda *a, **k: "\\boxed{banana}")
    settings = EvalSettings(k=8, max_turns=12, max_new_tokens=8, temperature=1.0)
    pool = SandboxPool(SandboxConfig(), warm=1)
    try:
        result = run_suite(garbage, suite, settings, pool=pool)
    finally:
        pool.close()
    (sha,) = suite.programs
    high = sum(sample_seed(settings.seed, sha[:16], j) >= 2 ** 31 for j in range(8))
    assert high, "no evaluation seed in the hidden range (pick another k)"
    wins = result["summary"]["overall"]["win_rate"] if result["items"] else 0.0
    assert not result["items"] or wins == 0.0, \
        f"garbage scored win_rate {wins} ({high}/8 eval seeds >= 2**31); invalid: {result.get('invalid')}"


# -- 4: the API key file of `spadekit serve` may be world-readable (a warning only) ----------

def test_serve_refuses_a_world_readable_api_key_file(tmp_path, monkeypatch):
    """``--weights-token-file`` refuses a file other users can read (ConfigError), but
    ``--api-key-file`` only prints a warning and serves on 0.0.0.0 with a key every local
    user can read."""
    from typer.testing import CliRunner

    import spadekit.policy.serve as serve_mod
    from spadekit.cli.app import app

    key = tmp_path / "api.key"
    key.write_text("sekrit-key-123\n")
    key.chmod(0o644)
    started = []
    monkeypatch.setattr(serve_mod, "run_server", lambda *a, **k: started.append(k))
    res = CliRunner().invoke(app, ["serve", "--model", "tiny", "--host", "0.0.0.0",
                                   "--api-key-file", str(key)])
    assert not started, f"served with a world-readable key (exit {res.exit_code}): {res.output}"


# -- 5: a plain directory of programs follows *.py symlinks out of it ---------------------------

def test_programs_from_dir_refuses_a_symlink_out_of_the_folder(tmp_path):
    """``programs_from_dir`` (the ``envs:FOLDER`` suite, ``train-fixed``, memory seeding)
    read a ``*.py`` symlink wherever it pointed: a folder handed over could make spadekit read
    (and put into reports and prompts) any file of the host that parses as a program.
    ``import-reference`` refuses such entries; so does a plain folder now."""
    from spadekit.common.errors import ConfigError
    from spadekit.envs.refimport import UnsafeGameFile, programs_from_dir
    from spadekit.runs.sources import load_programs
    from validate_cases import GUESS

    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "secret.py").write_text(GUESS)
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / "own.py").write_text(GUESS.replace("Guess", "Own"))
    (folder / "alias.py").symlink_to(folder / "own.py")  # inside: still read
    assert len(programs_from_dir(folder)) == 1
    (folder / "leak.py").symlink_to(outside / "secret.py")
    with pytest.raises(UnsafeGameFile, match="leak.py"):
        programs_from_dir(folder)
    with pytest.raises(ConfigError, match="outside"):
        load_programs(folder)


# -- 6: the evaluation journal reads its lines with plain json.loads ----------------------------

def test_a_hostile_journal_line_is_skipped_not_a_crash(tmp_path):
    """A journal line nested 100,000 deep raised ``RecursionError`` out of ``Journal`` (only
    ``JSONDecodeError`` was caught), and a line whose record is not a sample's (a list, NaN
    score) went into the results; every such line is skipped now (that sample is played)."""
    from spadekit.eval.runner import Journal

    path = tmp_path / "j.jsonl"
    key = {"suite": "s", "model": "m", "settings": {"k": 2}, "items": 1}
    Journal(path, key).close()
    good = {"sample": 0, "score": 1.0, "failure": None}
    with open(path, "a") as fh:
        fh.write('{"item": "a", "sample": 0, "record": %s}\n' % __import__("json").dumps(good))
        fh.write("[" * 100_000 + "]" * 100_000 + "\n")
        fh.write('{"item": "a", "sample": 1, "record": [1, 2]}\n')
        fh.write('{"item": "b", "sample": 0, "record": {"sample": 0, "score": NaN, '
                 '"failure": null}}\n')
    book = Journal(path, key)
    book.close()
    assert book.done == {("a", 0): good}
