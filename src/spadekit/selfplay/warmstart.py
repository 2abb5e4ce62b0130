"""``spadekit warmstart``: supervised fine-tuning of both roles on a pool before self-play.

Each program of a pool gives a designer example (the loop's own designer prompt for its skill,
its grounding document and memory references, rendered with the chat template; the completion is
the program and its ``HINT:`` line as the loop's extractor reads them) and agent examples (its
``solution()`` played through the real sandbox and rollout engine on drawn seeds; loss on the
agent's replies only). Programs are split into training and held-out by a drawn share (both
kinds on one side); ``spadekit.train.sft`` trains and exports ``OUT/model``. ``OUT/warmstart.json``
records pool, split and losses; ``OUT/programs`` is the pool used.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from spadekit.common.errors import SandboxError
from spadekit.envs.program import EnvProgram
from spadekit.train.sft import SFTConfig, SFTExample, SFTRun

__all__ = ["WarmstartResult", "agent_examples", "designer_completion", "designer_examples",
           "run_warmstart"]


def designer_completion(program: EnvProgram) -> str:
    """What the designer writes for ``program``: the code block and the hint line (none for
    a program that holds its hint as a module-level ``HINT = ...``, as kit programs do)."""
    code = program.code.strip()
    text = f"```python\n{code}\n```"
    in_code = any(line.startswith(("HINT =", "HINT:")) for line in code.splitlines())
    return text + (f"\nHINT: {program.hint.strip()}" if program.hint and not in_code else "")


def _end_id(tokenizer: Any) -> int:
    vocab = tokenizer.get_vocab()
    for token in ("<|im_end|>", tokenizer.eos_token):
        if token in vocab:
            return vocab[token]
    raise ValueError("the tokenizer has no end-of-turn token")


def designer_examples(policy: Any, config: Any, programs: Sequence[EnvProgram],
                      documents: dict[str | None, str], rng: random.Random
                      ) -> list[tuple[int, SFTExample]]:
    """``(program index, example)``: per program the loop's designer prompt with the program
    and hint as completion, and with ``hint_mode: second_call`` also the hint call's."""
    from spadekit.policy.base import encode_text, render_text
    from spadekit.selfplay.prompts import build_designer_messages

    dcfg, tok = config.designer, policy.tokenizer
    by_skill: dict[str | None, list[EnvProgram]] = {}
    for p in programs:
        by_skill.setdefault(p.skill, []).append(p)
    from spadekit.selfplay.procedural_pool import split_documents

    # a program without its own document is themed on one of the corpus's training half: the
    # held-out half (what a designer benchmark prompts with) never appears in an example
    train_docs, _held = split_documents(list(documents.items()), config.warmstart.seed)
    texts = [t for _d, t in train_docs if t]
    out = []
    for index, program in enumerate(programs):
        doc_id = (program.meta.get("procedural") or {}).get("doc_id")
        doc = documents.get(doc_id) if doc_id in documents else None
        if doc is None and texts and config.grounding:
            doc = texts[rng.randrange(len(texts))]
        others = [p for p in by_skill.get(program.skill, []) if p.sha256 != program.sha256]
        k = min(dcfg.positive_seeds, len(others)) if config.use_memory else 0
        refs = _references(program, others, k, rng)
        messages = build_designer_messages(config.setting, program.skill or "", doc if
                                           config.grounding else None, refs, None,
                                           config.turn_cap, doc_words=dcfg.max_words,
                                        style=dcfg.prompt_style)
        prompt = encode_text(tok, render_text(tok, messages, True, None,
                                              config.chat_template.for_role("designer"))
                             + dcfg.response_prefix)
        text = designer_completion(program)
        if dcfg.response_prefix and text.startswith(dcfg.response_prefix):
            text = text[len(dcfg.response_prefix):]
        out.append((index, _example(tok, prompt, text, "designer")))
        if dcfg.hint_mode == "second_call" and program.hint:
            out.append((index, hint_example(policy, config, program)))
    return out


def _references(program: EnvProgram, others: Sequence[EnvProgram], k: int,
                rng: random.Random) -> list[EnvProgram]:
    """``k`` of ``others`` as the prompt's memory references; for a procedural kit program,
    preferring ones that share none of its information action, scoring rule and turn
    structure, so the examples teach "write what memory lacks" (a designer shown a reference
    learns to pick other parts, the means against collapse onto one composition)."""
    if not k:
        return []
    mine = (program.meta or {}).get("procedural") or {}
    if mine.get("style") != "kit":
        return rng.sample(list(others), k)
    slots = ("info", "scoring", "turns")

    def shared(other: EnvProgram) -> int:
        theirs = (other.meta or {}).get("procedural") or {}
        return sum(bool(mine.get(s)) and mine.get(s) == theirs.get(s) for s in slots)

    order = list(others)
    rng.shuffle(order)
    order.sort(key=shared)  # stable: the shuffle breaks ties
    return order[:k]


def _example(tok: Any, prompt: list[int], text: str, kind: str) -> SFTExample:
    from spadekit.policy.base import encode_text, escape_content

    # the completion's special-token strings are text, as in every prompt (policy.base)
    completion = encode_text(tok, escape_content(tok, text)) + [_end_id(tok)]
    return SFTExample(prompt + completion, [0] * len(prompt) + [1] * len(completion), kind=kind)


def hint_example(policy: Any, config: Any, program: EnvProgram) -> SFTExample:
    """The hint call of ``hint_mode: second_call`` (the loop's ``build_hint_messages``), with
    ``HINT: <the program's hint>`` as the completion."""
    from spadekit.policy.base import encode_text, render_text
    from spadekit.selfplay.prompts import build_hint_messages

    tok = policy.tokenizer
    prompt = encode_text(tok, render_text(tok, build_hint_messages(program.code, config.setting),
                                          True, None, config.chat_template.for_role("hint")))
    return _example(tok, prompt, f"HINT: {program.hint.strip()}", "hint")


def _solutions(pool: Any, program: EnvProgram, seeds: Sequence[int], cap: int
               ) -> dict[int, list[str]]:
    """``solution()`` after ``reset(seed)`` for each seed, in one sandbox (seeds whose call
    fails are left out)."""
    out: dict[int, list[str]] = {}
    try:
        sb = pool.acquire(program.code)
    except SandboxError:
        return out
    try:
        env = sb.new_env(max_turns=cap)
        for seed in seeds:
            try:
                env.reset(seed=seed)
                actions = env.solution()
            except SandboxError:
                continue
            if isinstance(actions, list) and all(isinstance(a, str) for a in actions):
                out[seed] = actions
    finally:
        pool.release(sb)
    return out


def agent_examples(policy: Any, config: Any, pool: Any, programs: Sequence[EnvProgram],
                   seeds_per_program: int, rng: random.Random) -> list[tuple[int, SFTExample]]:
    """``(program index, example)`` for every solution episode that won (return 1.0), played
    by the rollout engine with the solution's actions as the agent's replies."""
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.rollout.engine import EpisodeSpec, RolloutEngine

    prefixes = config.rollout.response_prefix
    out = []
    for index, program in enumerate(programs):
        seeds = [rng.randrange(2 ** 31) for _ in range(seeds_per_program)]
        prefix = prefixes.get(program.domain or config.setting, "")
        for seed, actions in _solutions(pool, program, seeds, config.turn_cap).items():
            queue = list(actions)

            def reply(_ids: list[int], _text: str, queue: list[str] = queue) -> str:
                action = queue.pop(0) if queue else ""
                return action[len(prefix):] if prefix and action.startswith(prefix) else action

            engine = RolloutEngine(ScriptedPolicy(policy.tokenizer, reply), pool,
                                   dataclasses.replace(config.rollout, action_grammar=()),
                                   chat_template_kwargs=config.chat_template.for_role("agent"))
            [tr] = engine.run([EpisodeSpec(program, seed=seed, max_turns=config.turn_cap)])
            if tr.failure or tr.episode_return < 1.0 or not any(tr.loss_mask):
                continue
            out.append((index, SFTExample(list(tr.token_ids), list(tr.loss_mask),
                                          kind="agent")))
    return out


@dataclass
class WarmstartResult:
    model_dir: Path
    history: list[dict[str, Any]]
    counts: dict[str, int] = field(default_factory=dict)


def run_warmstart(config: Any, source: str, out: str | Path, sft: SFTConfig, *,
                  policy: Any = None, pool: Any = None, seeds_per_program: int = 2,
                  held_out_share: float = 0.1, max_programs: int | None = None,
                  progress: Callable[[str, int, int, float | None], None] | None = None
                  ) -> WarmstartResult:
    """Build the examples of ``source`` for ``config``'s loop, train, export ``out/model``."""
    from spadekit.policy.registry import load_policy
    from spadekit.runs.pool import write_pool
    from spadekit.runs.sources import load_programs
    from spadekit.sandbox import SandboxPool
    from spadekit.selfplay.corpus import load_corpus

    out = Path(out)
    programs = load_programs(source, config.setting)  # ConfigError when none
    rng = random.Random(sft.seed)
    if max_programs is not None and len(programs) > max_programs:
        programs = rng.sample(programs, max_programs)
    order = list(range(len(programs)))
    rng.shuffle(order)
    n_held = round(len(programs) * held_out_share) if len(programs) > 1 else 0
    held = set(order[:n_held])
    policy = policy or load_policy(config.model)
    corpus = load_corpus(config.corpus)
    documents = {d.id: d.text for d in corpus}
    own = pool is None
    pool = pool or SandboxPool(config.sandbox, warm=1)
    try:
        if progress:
            progress("examples", 0, len(programs), None)
        designer = designer_examples(policy, config, programs, documents, rng)
        agent = agent_examples(policy, config, pool, programs, seeds_per_program, rng)
        if progress:
            progress("examples", len(programs), len(programs), None)
    finally:
        if own:
            pool.close()
    train = [e for i, e in designer + agent if i not in held]
    held_out = [e for i, e in designer + agent if i in held]
    counts = {"programs": len(programs), "held_out_programs": len(held),
              "designer_examples": sum(e.kind == "designer" for _i, e in designer),
              "hint_examples": sum(e.kind == "hint" for _i, e in designer),
              "agent_examples": len(agent),
              "train_examples": len(train), "held_out_examples": len(held_out),
              "completion_tokens": sum(sum(e.loss_mask) for e in train)}
    shutil.rmtree(out / "programs", ignore_errors=True)  # what it learns from (a pool)
    write_pool(out / "programs", [(p, None) for p in programs])
    run = SFTRun(policy, sft, out)
    history = run.fit(train, held_out, None if progress is None else
                      (lambda done, total, loss: progress("train", done, total, loss)))
    model_dir = run.export()
    (out / "warmstart.json").write_text(json.dumps({
        "source": source, "counts": counts, "history": history,
        "held_out": sorted(programs[i].sha256 for i in held),
        "model": str(model_dir)}, indent=1) + "\n")
    return WarmstartResult(model_dir, history, counts)
