"""``spadekit procedural`` and ``spadekit warmstart``: a pool of procedural games, and supervised
fine-tuning of both roles on a pool before self-play.

Registered on the main ``app`` by ``spadekit.cli.app`` (this module only defines the functions).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn)

from spadekit.common.errors import SpadekitError

console = Console(log_path=False)


def _bar() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console)


def procedural(
    out: Path = typer.Option(..., "--out", help="Pool directory to write (spadekit's pool "
                             "format; appended to when it exists)."),
    split: str = typer.Option("train", help="Which combinations: train (what a warm start may "
                              "see) or held_out (every combination of the held-out part, plus "
                              "a drawn share of the rest)."),
    per_combo: int = typer.Option(1, help="Candidates per combination (near-duplicates of a "
                                  "kept program are dropped)."),
    seed: int = typer.Option(0, help="Fixes the split's draw, the documents, the numbers and "
                             "the validation seeds."),
    held_out_part: str = typer.Option("turns=gated", help="The part (kind=name) whose every "
                                      "combination is held out."),
    held_out_share: float = typer.Option(0.2, help="Share of the other combinations held out."),
    corpus: Optional[str] = typer.Option(None, help="Grounding corpus for the surface words "
                                         "(default: the offline default corpus)."),
    limit: Optional[int] = typer.Option(None, help="At most this many candidates."),
    max_turns: Optional[int] = typer.Option(None, help="Every program's turn limit (use the "
                                            "run's turn cap, e.g. 3 for cpu-tiny); default: "
                                            "drawn from 6-10 (whole) or 8 (kit)."),
    style: str = typer.Option("whole", help="whole: complete programs of about 900 tokens; "
                              "kit: game-kit programs of about 150 tokens (a class naming the "
                              "parts and their parameters, spadekit.envs.gamekit)."),
) -> None:
    """Write a pool of procedural games: each combines a hidden state, an information action,
    a scoring rule and a turn structure, themed on words of a grounding document; every one is
    validated in the sandbox and near-duplicates are dropped. `split.json` beside the pool
    names the held-out combinations (for measuring a designer's novelty). `--style kit` writes
    the same combinations as game-kit programs."""
    from spadekit.runs.pool import write_pool
    from spadekit.sandbox.validate import Validator, ValidatorSettings
    from spadekit.selfplay.corpus import load_corpus
    from spadekit.selfplay.procedural_pool import (build_pool, candidates, split_combos,
                                                   write_split)

    try:
        parts = split_combos(seed, held_out_share, held_out_part)
        combos = parts.of(split)
        texts = [(d.id, d.text) for d in load_corpus(corpus)]
        programs = candidates(combos, texts, seed, per_combo, max_turns, style)[:limit]
    except (ValueError, SpadekitError) as exc:
        raise typer.BadParameter(str(exc)) from None
    with _bar() as bar, Validator(settings=ValidatorSettings()) as validator:
        task = bar.add_task("validate", total=len(programs), note="")
        built = build_pool(programs, validator, seed=seed,
                           progress=lambda done, _n: bar.update(task, completed=done))
    counts = write_pool(out, built.kept)
    write_split(parts, out)
    summary = {**built.summary(), **counts, "split": split, "style": style, "out": str(out)}
    (Path(out) / "procedural.json").write_text(json.dumps(summary, indent=1) + "\n")
    console.print(f"{summary['kept']} programs ({summary['combos']} combinations, "
                  f"{len(summary['skills'])} skills) in {out}; {summary['invalid']} invalid, "
                  f"{summary['near_duplicates']} near-duplicates dropped")
    print(json.dumps(summary))


def warmstart(
    pool: str = typer.Option(..., "--pool", help="Where the examples come from: a pool "
                             "directory (spadekit procedural / generate / import-reference) "
                             "or library."),
    out: Path = typer.Option(..., "--out", help="Output folder: the resumable state, then "
                             "OUT/model (what selfplay starts from)."),
    preset: str = typer.Option("cpu-tiny", help="The self-play preset whose prompts, turn cap, "
                               "format aids and model the examples use."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML on top of the preset."),
    overrides: list[str] = typer.Option(None, "--set", help="Override one self-play setting "
                                        "(key=value). Repeatable."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to fine-tune "
                                        "(default: the preset's)."),
    epochs: Optional[int] = typer.Option(None, help="Passes over the training examples "
                                         "(default: warmstart.epochs)."),
    learning_rate: Optional[float] = typer.Option(None, help="AdamW learning rate (default: "
                                                  "warmstart.learning_rate)."),
    full: bool = typer.Option(False, "--full", help="Train all weights instead of LoRA."),
    lora_r: Optional[int] = typer.Option(None, help="LoRA rank (default: warmstart.lora_r; "
                                         "ignored with --full)."),
    max_tokens: int = typer.Option(2600, help="Padded tokens per micro-batch."),
    seeds_per_program: Optional[int] = typer.Option(None, help="Solution episodes per program "
                                                    "as agent examples (default: "
                                                    "warmstart.agent_seeds)."),
    held_out_share: Optional[float] = typer.Option(None, help="Share of programs held out for "
                                                   "the held-out loss (default: "
                                                   "warmstart.held_out_share)."),
    seed: Optional[int] = typer.Option(None, help="Fixes the split, the order and the LoRA "
                                       "init (default: warmstart.seed)."),
    max_programs: Optional[int] = typer.Option(None, help="Use at most this many programs of "
                                               "the pool, a seeded draw (default: "
                                               "warmstart.programs)."),
    bf16: bool = typer.Option(True, help="bfloat16 autocast while training (float32 weights)."),
) -> None:
    """Supervised fine-tuning of both roles before self-play: the designer learns to write the
    pool's programs (from the exact prompt the loop builds), the agent to play their solutions
    (through the real sandbox). Completion-only loss; a held-out loss every epoch; rerun the
    same command to resume after a crash. Then: `spadekit selfplay --model hf:OUT/model`."""
    from spadekit.cli.train import _resolve
    from spadekit.selfplay.warmstart import run_warmstart

    cfg = _resolve(preset, config, overrides, model, None, False, [])
    ws = cfg.warmstart  # the same recipe a run's cached warm start uses, unless overridden
    try:
        sft = dataclasses.replace(
            ws.sft(), epochs=ws.epochs if epochs is None else epochs,
            learning_rate=ws.learning_rate if learning_rate is None else learning_rate,
            use_peft=not full, lora_r=ws.lora_r if lora_r is None else lora_r,
            lora_alpha=2 * (ws.lora_r if lora_r is None else lora_r),
            max_tokens_per_microbatch=max_tokens, seed=ws.seed if seed is None else seed,
            bf16=bf16)
    except SpadekitError as exc:
        raise typer.BadParameter(exc.message) from None
    seeds_per_program = ws.agent_seeds if seeds_per_program is None else seeds_per_program
    held_out_share = ws.held_out_share if held_out_share is None else held_out_share
    max_programs = ws.programs if max_programs is None else max_programs
    with _bar() as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int, loss: float | None) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total, note="")
            bar.update(tasks[phase], completed=done, total=total,
                       note="" if loss is None else f"loss {loss:.3f}")

        try:
            result = run_warmstart(cfg, pool, out, sft, seeds_per_program=seeds_per_program,
                                   held_out_share=held_out_share, progress=progress,
                                   max_programs=max_programs)
        except (ValueError, SpadekitError) as exc:
            raise typer.BadParameter(str(exc)) from None
    first, last = result.history[0]["held_out_loss"], result.history[-1]["held_out_loss"]
    losses = ("no held-out programs" if first is None else
              f"held-out loss {first:.3f} -> {last:.3f}")
    console.print(f"{losses}; {result.counts['train_examples']} training examples "
                  f"({result.counts['completion_tokens']} completion tokens)")
    console.print(f"start self-play from it: spadekit selfplay --model hf:{result.model_dir}",
                  soft_wrap=True)
