"""Edge cases of the designer warm start, the procedural pool and the designer benchmark, each
with real parts (the real sandbox and validator, real SQLite, the tiny model)."""

from __future__ import annotations

import json
import random

import pytest

from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.selfplay.config import load_config

PEEK = r'''
import random
import re


def last_box(text):
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1].strip().lower() if found else ""


class PeekEnv:
    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = int(max_turns)

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.secret = self.rng.randint(100, 999)
        self.turns = 0
        return ("The vault code is %d. Commands: \\boxed{look} looks around; "
                "\\boxed{answer N} opens the vault with code N." % self.secret), {}

    def step(self, action):
        self.turns += 1
        cmd = last_box(action).split()
        truncated = self.turns >= self.max_turns
        if cmd and cmd[0] == "look":
            return "You look around. Nothing new.", 0.0, False, truncated, {}
        if len(cmd) == 2 and cmd[0] == "answer" and cmd[1].isdigit():
            ok = int(cmd[1]) == self.secret
            return ("Open." if ok else "Wrong."), (1.0 if ok else 0.0), True, False, {}
        return "Unknown command. Use \\boxed{look} or \\boxed{answer N}.", 0.0, False, truncated, {}

    def solution(self):
        return ["\\boxed{look}", "\\boxed{answer %d}" % self.secret]
'''


def _cfg(*sets):
    return load_config("cpu-warm", overrides=["stream_key=tests", "model=tiny",
                                              "designer.max_new_tokens=4096",
                                              *sets])


def _designer(texts):
    """A designer that writes ``texts`` in turn (after the response prefix, if any)."""
    queue = list(texts)
    return ScriptedPolicy(load_policy("tiny").tokenizer, lambda _ids, _text: queue.pop(0))


def _sample(cfg, texts, known=()):
    from spadekit.sandbox import SandboxPool
    from spadekit.sandbox.validate import Validator
    from spadekit.selfplay.designer_eval import sample_designs

    prefix = cfg.designer.response_prefix
    outs = [t[len(prefix):] if prefix and t.startswith(prefix) else t for t in texts]
    with SandboxPool(cfg.sandbox, warm=1) as pool, \
            Validator(pool, cfg.validation.settings(cfg.turn_cap)) as validator:
        return sample_designs(_designer(outs), cfg, validator, n=len(texts), seed=0,
                              skills=["Mathematical_Reasoning"],
                              documents=[("d", "copper wires carry current")],
                              references=(), known=list(known))


def _block(code, hint="Look first, then answer."):
    return f"```python\n{code.strip()}\n```\nHINT: {hint}"


def _procedural(seed=0, combo="number+reveal+exact+open"):
    from spadekit.envs.procedural import Combo, compose, surface_words

    words = surface_words("copper wires carry current through the old station",
                          random.Random(1))
    return compose(Combo.parse(combo), words, seed, 3)


# -- 1. metric honesty ------------------------------------------------------------------------

def test_a_game_won_in_one_turn_is_not_counted_multiturn():
    """The observation states the code; ``solution()`` wastes one look before answering. The
    validator passes it (no baseline reads the observation) and designer_eval counts it
    multi-turn because the *solution* took two turns, although answering at once wins."""
    [sample] = _sample(_cfg(), [_block(PEEK)])
    assert sample.reason == "ok"
    # the one-turn play: the solution's last action alone wins on the first turn
    ns: dict = {}
    exec(PEEK, ns)
    env = ns["PeekEnv"]()
    env.reset(seed=5)
    answer = env.solution()[-1]
    env.reset(seed=5)
    _obs, reward, terminated, _tr, _i = env.step(answer)
    assert reward == 1.0 and terminated  # one turn suffices
    assert sample.multiturn is False, "a one-turn-winnable game counted as multi-turn"


DEAD = '''
    def _ledger(self, entries):
        total, seen, order = 0, {}, []
        for entry in entries:
            key = str(entry).strip().lower()
            if key in seen:
                seen[key] += 1
                continue
            seen[key] = 1
            order.append(key)
            total += len(key) * 3 + 7
        ranked = sorted(order, key=lambda k: (-seen[k], k))
        return {"total": total, "ranked": ranked[:5], "unique": len(order)}
'''


def test_a_warm_start_program_padded_with_dead_code_is_not_novel():
    """A warm-start program with one never-called helper added: still that program (every
    shingle of it is in the copy), but Jaccard drops below 0.9 and it counts as novel. The
    project's own blacklist check uses containment for exactly this reason."""
    from spadekit.selfplay.memory import containment, fingerprint

    known = _procedural()
    padded = known.code.replace("\n    def reset(", DEAD + "\n    def reset(", 1)
    [sample] = _sample(_cfg(), [_block(padded, known.hint)], known=[known])
    assert sample.reason == "ok", sample.reason
    held = containment(fingerprint(padded), fingerprint(known.code))
    assert held >= 0.95  # the whole warm-start program is inside the sample
    assert sample.novel is False, (f"padded copy counted novel (jaccard {sample.similarity}, "
                                   f"containment {held:.3f})")


def test_novelty_uses_the_runs_dedup_threshold():
    """designer_eval claims to count exactly what the loop's dedup gate lets in, but it uses the
    constant 0.9, not the run's ``dedup_threshold``: with dedup_threshold=0.5 the loop refuses a
    re-numbered copy of a warm-start program that designer_eval calls novel."""
    known = _procedural(seed=0)
    other = _procedural(seed=987654, combo="number+reveal+steep+open")  # another scoring
    cfg = _cfg("dedup_threshold=0.5")
    [sample] = _sample(cfg, [_block(other.code, other.hint)], known=[known])
    assert sample.reason == "ok"
    assert sample.similarity >= cfg.dedup_threshold  # the loop's gate would refuse it
    assert sample.novel is False, f"similarity {sample.similarity} >= {cfg.dedup_threshold}"


# -- 2. the warm cache ------------------------------------------------------------------------

def _ws_cfg(*sets):
    return load_config("cpu-warm", overrides=["stream_key=tests",
        "model=tiny", "warmstart.model=any", "rounds=1", "envs_per_round=1",
        "num_generations=2", "hint_generations=1", "bootstrap=null",
        "rollout.max_new_tokens=8", "designer.max_new_tokens=16", "tensorboard=false",
        "checkpoint_every=100", "generation_model=null", "warmstart.programs=2",
        "warmstart.epochs=1", *sets])


def _fake_warm_start(cfg):
    """A finished cache entry for ``cfg`` as warm_model_dir leaves it (the tiny model saved,
    its programs, the marker), without the minutes of a real build."""
    from spadekit.runs.pool import write_pool
    from spadekit.selfplay.warm_cache import MARKER, _cache_root, cache_key

    key = cache_key(cfg)
    folder = _cache_root() / key
    policy = load_policy("tiny")
    policy.model.save_pretrained(folder / "model")
    policy.tokenizer.save_pretrained(folder / "model")
    write_pool(folder / "programs", [(_procedural(), None)])
    (folder / MARKER).write_text(json.dumps({"key": key, "format": 1}) + "\n")
    return folder


def test_the_key_follows_the_validation_settings_that_pick_the_pool():
    """build_procedural_pool keeps only the programs ``config.validation`` passes, so the
    validation settings decide which programs the warm start learns from; the key ignores
    them (a stricter margin, more drawn seeds: the same cached warm start)."""
    from spadekit.selfplay.warm_cache import cache_key

    base = cache_key(_cfg())
    for setting in ("validation.random_margin=0.9", "validation.action_margin=0.9",
                    "validation.solution_drawn_seeds=6"):
        assert cache_key(_cfg(setting)) != base, setting


def test_the_key_follows_the_corpus_contents(tmp_path):
    """``corpus`` is keyed by its path only: editing the file (or the same relative path from
    another directory) gives other documents, other theme words, other examples, same key."""
    from spadekit.selfplay.warm_cache import cache_key

    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "copper wires carry current"}) + "\n")
    before = cache_key(_cfg(f"corpus={path}"))
    path.write_text(json.dumps({"id": "a", "text": "glaciers carve granite valleys"}) + "\n")
    assert cache_key(_cfg(f"corpus={path}")) != before


def test_the_key_follows_the_code_that_writes_the_examples(tmp_path, monkeypatch):
    """The prompt text and the procedural generator are code, not settings: a new version of
    spadekit that changes them (a git pull) must not load the warm start trained on the old
    prompt. The key hashes the source files that write the examples (``KEY_SOURCES``): a copy
    of the package with one sentence of the compact prompt changed gives another key."""
    import shutil

    from spadekit.selfplay import warm_cache
    from spadekit.selfplay.warm_cache import KEY_SOURCES, SOURCE_ROOT, cache_key

    cfg = _cfg()
    key = cache_key(cfg)
    copy = tmp_path / "spadekit"
    for name in KEY_SOURCES:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOURCE_ROOT / name, copy / name)
    monkeypatch.setattr(warm_cache, "SOURCE_ROOT", copy)
    assert cache_key(cfg) == key  # the same sources, the same key
    prompts = copy / "selfplay" / "prompts.py"
    prompts.write_text(prompts.read_text().replace("Reply with one ```python block",
                                                   "Reply with exactly one ```python block"))
    assert cache_key(cfg) != key


def test_a_resumed_run_survives_a_cleared_warm_cache(tmp_path, monkeypatch):
    """The run's config.yaml replaces ``model`` by the cache path (hf:CACHE/KEY/model) and
    keeps nothing else: once the cache is cleared (``rm -rf ~/.cache/spadekit``, another
    machine, another SPADEKIT_CACHE) the run cannot be resumed, nor rebuilt (the original
    model spec is gone)."""
    import shutil

    from spadekit.selfplay.loop import SelfPlay

    monkeypatch.setenv("SPADEKIT_CACHE", str(tmp_path / "cache"))
    cfg = _ws_cfg()
    folder = _fake_warm_start(cfg)
    with SelfPlay(cfg, tmp_path / "run") as sp:
        assert sp.config.model == f"hf:{folder / 'model'}"
    shutil.rmtree(tmp_path / "cache")
    with SelfPlay(cfg, tmp_path / "run", resume=True) as sp:
        assert sp.config.warmstart.pool == "procedural"


def test_a_warm_start_without_weights_is_not_taken_as_complete(tmp_path, monkeypatch):
    """_complete checks the marker and model/config.json only: a cache entry whose weights
    are gone (a cleaned disk, an interrupted copy of the cache) is returned as finished, never
    rebuilt, and the run then fails to load it."""
    from spadekit.selfplay.warm_cache import warm_model_dir

    monkeypatch.setenv("SPADEKIT_CACHE", str(tmp_path / "cache"))
    cfg = _ws_cfg()
    folder = _fake_warm_start(cfg)
    for weights in (folder / "model").glob("*.safetensors"):
        weights.unlink()
    monkeypatch.setattr("spadekit.selfplay.warm_cache._build",
                        lambda *a, **k: pytest.fail("rebuilt"))  # what a fix would do
    path = None
    try:
        path = warm_model_dir(cfg)
    except BaseException:  # noqa: BLE001 - a rebuild was attempted: the defect is gone
        return
    load_policy(f"hf:{path}")  # the path it handed out must load


def test_spadekit_cache_is_read_like_the_bundled_models_cache(tmp_path, monkeypatch):
    """bundled.cache_dir() expands ``~`` in SPADEKIT_CACHE, warm_cache does not (a literal
    ``~`` folder under the working directory); and a relative SPADEKIT_CACHE puts a relative
    ``hf:`` path into the run's config.yaml, which breaks a resume from another directory."""
    from spadekit.policy.bundled import cache_dir
    from spadekit.selfplay.warm_cache import _cache_root

    monkeypatch.setenv("SPADEKIT_CACHE", "~/spadekit-r23")
    assert _cache_root().parent == cache_dir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPADEKIT_CACHE", "rel-cache")
    assert _cache_root().is_absolute()


# -- 3. config and knobs ----------------------------------------------------------------------

def test_a_warm_start_for_another_setting_is_refused_up_front():
    """``setting=tooluse`` with ``warmstart.pool: procedural`` (the cpu-tiny default) is
    accepted; the procedural pool is games only, so the build validates ~96 games in the
    sandbox and then fails in run_warmstart with a plain ValueError ("no tooluse programs")."""
    from spadekit.common.errors import ConfigError

    with pytest.raises(ConfigError):
        load_config("cpu-warm", overrides=["setting=tooluse"])


def test_the_warmstart_command_reads_the_warmstart_section(tmp_path, monkeypatch):
    """``spadekit warmstart --set warmstart.epochs=1 --set warmstart.lora_r=4`` is accepted and
    changes nothing: the command's SFT settings come from its own options (other defaults than
    the section: lr 2e-4 vs 5e-4, no lora_layers, 2 agent seeds), so the command does not
    reproduce the warm start a run builds and caches."""
    from typer.testing import CliRunner

    from spadekit.cli.app import app

    seen = {}

    def fake(cfg, source, out, sft, **kw):
        seen.update(sft=sft, **kw)
        raise ValueError("stop here")

    monkeypatch.setattr("spadekit.selfplay.warmstart.run_warmstart", fake)
    res = CliRunner().invoke(app, ["warmstart", "--pool", "library", "--out",
                                   str(tmp_path / "w"), "--model", "tiny",
                                   "--set", "warmstart.epochs=1", "--set", "warmstart.lora_r=4",
                                   "--set", "warmstart.agent_seeds=0"])
    assert "sft" in seen, res.output
    assert (seen["sft"].epochs, seen["sft"].lora_r, seen["seeds_per_program"]) == (1, 4, 0)


def test_lora_layers_works_on_a_model_that_is_not_llama_shaped():
    """``warmstart.lora_layers`` (15 by default, used with ``warmstart.model: any``) replaces
    ``all-linear`` by Llama's module names: a GPT-2-style model (c_attn, c_fc, ...) gets a
    peft NoMatchingPeftModuleError instead of LoRA on its last layers."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from spadekit.train.model_prep import add_lora
    from spadekit.train.sft import SFTConfig

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128,
                                       bos_token_id=0, eos_token_id=0))
    wrapped = add_lora(model, SFTConfig(lora_layers=1, lora_r=4, lora_alpha=8))
    trained = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trained and all(".h.1." in n for n in trained)


def test_rerunning_warmstart_on_another_pool_does_not_reuse_the_old_one(tmp_path):
    """run_warmstart into an existing OUT with the same SFT settings but another pool resumes
    the old SFT state (already finished: no step on the new pool), keeps OUT/programs of the
    old pool, and writes warmstart.json naming the new pool: a model trained on pool A
    labelled as trained on pool B."""
    from spadekit.runs.pool import load_pool, write_pool
    from spadekit.selfplay.warmstart import run_warmstart
    from spadekit.train.sft import SFTConfig

    cfg = _cfg()
    a, b = tmp_path / "a", tmp_path / "b"
    write_pool(a, [(_procedural(1, "number+reveal+exact+open"), None),
                   (_procedural(2, "code+clue+steep+budget"), None)])
    write_pool(b, [(_procedural(3, "cell+probe+banded+open"), None),
                   (_procedural(4, "cause+reveal+thrifty+budget"), None)])
    sft = SFTConfig(epochs=1, lora_r=4, lora_alpha=8, max_tokens_per_microbatch=8192)
    out = tmp_path / "w"
    run_warmstart(cfg, str(a), out, sft, policy=load_policy("tiny"), seeds_per_program=0,
                  held_out_share=0.0)
    second = run_warmstart(cfg, str(b), out, sft, policy=load_policy("tiny"),
                           seeds_per_program=0, held_out_share=0.0)
    learnt = {p.sha256 for p in load_pool(out / "programs")}
    assert learnt == {p.sha256 for p in load_pool(b)}, "OUT/programs is still pool A"
    assert second.history[-1]["step"] > second.history[-2]["step"] or \
        len(second.history) > 2, "no training step on pool B"


# -- 4. prompts -------------------------------------------------------------------------------

def test_the_compact_prompt_bounds_a_reference_like_the_full_one():
    """The full style cuts a reference at MAX_REFERENCE_CHARS; the compact style's
    reference_summary takes the first 30 *words* of the longest string constant (or of the
    code when it does not parse), and a word has no length limit: one valid program in memory
    with a long table string (or code the parser gives up on) makes every later compact
    designer prompt of its skill as long as that string."""
    from spadekit.selfplay.prompts import MAX_REFERENCE_CHARS, build_designer_messages

    table = "class TableEnv:\n    TABLE = \"" + "0123456789abcdef" * 4000 + "\"\n"
    unparsable = "x = " + "1+" * 200_000 + "1\n"
    for code in (table, unparsable):
        compact = build_designer_messages("games", "Optimization", "copper wires", [code],
                                          None, 3, style="compact")
        full = build_designer_messages("games", "Optimization", "copper wires", [code],
                                       None, 3, style="full")
        size = sum(len(m["content"]) for m in compact)
        assert size <= sum(len(m["content"]) for m in full), size
        assert size < MAX_REFERENCE_CHARS + 4000, size


def test_theme_words_are_whole_words_of_a_non_english_document():
    """theme_words splits on non-ASCII letters: "Der Müller füttert die Hühner" gives the
    fragments 'ller', 'ttert', 'hner' as theme words (and as a procedural game's items)."""
    from spadekit.envs.procedural.compose import theme_words

    words = theme_words("Der Müller füttert die Hühner am Fluss")
    assert not {"ller", "ttert", "hner"} & set(words), words


# -- 6. held-out documents --------------------------------------------------------------------

def test_a_library_warm_start_never_shows_the_benchmarks_held_out_documents():
    """benchmarks/designer.py prompts with the held-out half of split_documents, "the warm
    start never saw them"; but designer_examples themes every program without a procedural
    doc_id (warmstart.pool: library or a pool directory) on a document drawn from the WHOLE
    corpus, held-out half included."""
    from spadekit.envs import library
    from spadekit.selfplay.procedural_pool import split_documents
    from spadekit.selfplay.warmstart import designer_examples

    cfg = _cfg("designer.prompt_style=full", "warmstart.pool=library")
    docs = [(f"doc{i}", f"marker{i:03d} " + "river stone " * 5) for i in range(40)]
    _train, held = split_documents(docs, cfg.warmstart.seed)
    assert held
    programs = [library.program(e) for e in library.list_library() if e.setting == "games"]
    policy = load_policy("tiny")
    examples = designer_examples(policy, cfg, programs, dict(docs), random.Random(0))
    text = " ".join(policy.tokenizer.decode(e.token_ids) for _i, e in examples)
    shown = [doc_id for doc_id, body in held if body.split()[0] in text]
    assert not shown, f"held-out documents in the warm start's prompts: {shown[:5]}"


# -- 1b. the benchmark ------------------------------------------------------------------------

def _benchmark():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "designer.py"
    spec = importlib.util.spec_from_file_location("designer_benchmark_r23", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rl_phase_counts_a_copy_of_the_runs_own_memory_as_novel(tmp_path, monkeypatch):
    """The spec: novel = "not a near-duplicate of any warm-start program or memory entry".
    After self-play the benchmark measures the trained checkpoint against the warm-start
    programs only (``--programs``), not the run's memory: re-writing a program the run already
    pooled counts as novel in ``novel_share`` (the headline after RL)."""
    import argparse

    from spadekit.runs.pool import write_pool
    from spadekit.runs.store import RunStore
    from spadekit.selfplay.memory import EnvironmentMemory

    bench = _benchmark()
    warm = tmp_path / "programs"
    write_pool(warm, [(_procedural(1, "code+clue+steep+budget"), None)])
    pooled = _procedural(7, "number+reveal+exact+open")  # designed during the run
    run = tmp_path / "run"
    store = RunStore(run, create=True)
    try:
        store.add_environment(pooled, step=0)
        EnvironmentMemory(store).add(pooled, step=0)
    finally:
        store.close()
    text = _block(pooled.code, pooled.hint)
    cfg = _cfg()
    prefix = cfg.designer.response_prefix
    monkeypatch.setattr(bench, "_policy", lambda spec, engine, seed: _designer(
        [text[len(prefix):] if text.startswith(prefix) else text]))
    out = tmp_path / "sample.json"
    args = argparse.Namespace(preset="cpu-tiny", set=["model=tiny",
                                                      "designer.max_new_tokens=4096"],
                              programs=str(warm), spec=str(run), samples=1, seed=0,
                              engine="transformers", json=str(out))
    bench.phase_sample(args)
    [sample] = json.loads(out.read_text())["samples_detail"]
    assert sample["reason"] == "ok"
    assert sample["novel"] is False, "a copy of the run's own pooled program counted novel"


def test_the_per_round_table_has_a_novel_share(tmp_path):
    """The benchmark's docstring promises per round "valid share, novel share (valid designs
    that passed the loop's dedup gate)", and the novel share is meant to rise over the
    rounds; but ``_rounds`` reads only numeric metrics, and the loop's ``valid``/``valid_share``
    already exclude near-duplicates (reason ``near_duplicate``, counted only in the
    ``invalid_reasons`` dict of the round event). So a round of 4 designs, 3 sandbox-valid of
    which 2 were near-duplicates, reads valid_share 0.25: neither the valid share
    designer_eval reports for the other phases (0.75) nor a novel share (1/3)."""
    from spadekit.runs.store import RunStore

    bench = _benchmark()
    run = tmp_path / "run"
    store = RunStore(run, create=True)
    try:  # what SelfPlay.commit writes for such a round
        metrics = {"designed": 4, "valid": 1, "valid_share": 0.25, "pooled": 1,
                   "pool_designed": 1, "designer_reward": 0.1, "regret": 0.0,
                   "invalid_reasons": {"near_duplicate": 2, "solution_fails": 1}}
        store.log_metrics(0, {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        store.append_event({"kind": "round", "step": 0, **metrics})
    finally:
        store.close()
    rows, _regrets = bench._rounds(run)
    [row] = rows
    assert any("novel" in k or "near_duplicate" in k for k in row), row


def test_the_key_follows_the_rollout_settings_the_agent_examples_are_played_with():
    """With ``warmstart.agent_seeds`` > 0 the agent examples are the solutions played by the
    rollout engine under ``config.rollout``; a reply longer than ``rollout.max_new_tokens`` is
    cut, the episode lost and the example dropped. The key holds only the rollout's prefix,
    demonstrations and system prompt: other examples, same cached warm start."""
    from spadekit.sandbox import SandboxPool
    from spadekit.selfplay.warm_cache import cache_key
    from spadekit.selfplay.warmstart import agent_examples

    policy = load_policy("tiny")
    program = _procedural(3, "code+reveal+exact+open")  # answers are several words long
    counts = {}
    for tokens in (48, 4):
        cfg = _cfg("warmstart.agent_seeds=2", f"rollout.max_new_tokens={tokens}")
        with SandboxPool(cfg.sandbox, warm=0) as pool:
            counts[tokens] = len(agent_examples(policy, cfg, pool, [program], 2,
                                                random.Random(0)))
    assert counts[48] != counts[4], counts  # the setting changes the examples ...
    assert cache_key(_cfg("warmstart.agent_seeds=2", "rollout.max_new_tokens=48")) != \
        cache_key(_cfg("warmstart.agent_seeds=2", "rollout.max_new_tokens=4"))  # ... not the key


def test_settings_that_do_not_change_the_examples_keep_the_cached_warm_start():
    """The reverse: ``designer.max_new_tokens`` and ``designer.hint_max_new_tokens`` are
    sampling budgets (no example is cut by them) but are hashed, so raising the budget throws
    away a 20-minute warm start."""
    from spadekit.selfplay.warm_cache import cache_key

    base = cache_key(_cfg())
    assert cache_key(_cfg("designer.max_new_tokens=2048")) == base
    assert cache_key(_cfg("designer.hint_max_new_tokens=96")) == base


def test_sft_resumes_with_another_thread_count(tmp_path):
    """``threads`` does not change a single number, but it is part of the saved SFT config,
    so resuming a killed warm start with another thread count is refused."""
    from spadekit.train.sft import SFTConfig, SFTExample, SFTRun

    rows = [SFTExample(list(range(5, 25)), [0] * 10 + [1] * 10)]
    run = SFTRun(load_policy("tiny"), SFTConfig(epochs=1, lora_r=4, lora_alpha=8), tmp_path)
    run.fit(rows)
    again = SFTRun(load_policy("tiny"), SFTConfig(epochs=1, lora_r=4, lora_alpha=8, threads=1),
                   tmp_path)
    assert again.resumed
