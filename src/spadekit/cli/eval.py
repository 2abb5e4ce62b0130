"""``spadekit eval``: benchmark a model or a self-play checkpoint, and compare two result files.

    spadekit eval --model M --suite rg-hard [--suite bfcl-mt ...] [--limit N] [--out F.json]
    spadekit eval --model M --suite envs:DIR [--trusted]   (validated first unless --trusted)
    spadekit eval compare A.json B.json [--datasets]   (notes runs grounded on other corpora)
    spadekit eval suites
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table

from spadekit.common.errors import SpadekitError
from spadekit.common.safe_text import strict_json, terminal_text

console = Console(log_path=False)
err_console = Console(stderr=True, log_path=False)
eval_app = typer.Typer(invoke_without_command=True, no_args_is_help=False,
                       rich_markup_mode="markdown")


@eval_app.callback()
def evaluate(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(
        None, "--model", "-m", help="A model (tiny, smollm2-135m, hf:PATH, openai:NAME@URL), a "
        "run directory (its newest checkpoint) or a checkpoint directory."),
    suites: list[str] = typer.Option(
        None, "--suite", "-s", help="rg-hard, rg-easy, bfcl-mt, qa:FILE, envs:SOURCE "
        "(`spadekit eval suites` lists them). Repeatable."),
    limit: Optional[int] = typer.Option(None, help="At most N items per dataset (quick runs)."),
    k: Optional[int] = typer.Option(None, "-k", "--k", help="Samples per item (Avg@k); default "
                                    "the suite's."),
    temperature: Optional[float] = typer.Option(None, help="Default: the suite's."),
    top_p: Optional[float] = typer.Option(None, help="Default: the suite's."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Per turn; default the suite's."),
    max_turns: Optional[int] = typer.Option(None, help="Turns per item; default the suite's."),
    batch_size: int = typer.Option(64, help="Episodes per batched generation call."),
    max_batch_cells: int = typer.Option(
        2 ** 27, help="At most episodes x (longest prompt in tokens)^2 per generation call "
        "(bounds the padded attention of an in-process model; 0: no bound)."),
    seed: int = typer.Option(0, help="Seeds every item's environment and sampling."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write all results (per-item "
                                       "scores included) to this JSON file. Scored samples are "
                                       "journaled beside it, so rerunning an interrupted "
                                       "command resumes."),
    transcripts: bool = typer.Option(False, help="Keep whole conversations in --out."),
    unsafe: bool = typer.Option(False, "--unsafe", help="Allow a weak sandbox (envs: suites)."),
    trusted: bool = typer.Option(
        False, "--trusted", help="envs: suites: play every program without validating it "
        "first (only for folders you wrote or checked yourself). By default each program "
        "goes through self-play's validator and those that fail it are listed as invalid, "
        "with their reasons, and never scored."),
) -> None:
    """Evaluate a model on benchmark suites: per-item scores, a table per suite, JSON output.
    Wins count at score >= 1.0; `spadekit eval compare A.json B.json` shows deltas.
    Environment programs (`envs:`) are validated before they are played (see `--trusted`).
    Their defaults are sized for a CPU (k 4, 8 turns of 256 tokens); the paper plays an
    environment 8 times, up to 25 turns of up to 8,192 tokens: `--k 8 --max-turns 25
    --max-new-tokens 8192`. The progress bar moves as each episode
    ends."""
    if ctx.invoked_subcommand is not None:
        return
    if not model or not suites:
        err_console.print("spadekit eval needs --model and at least one --suite "
                          "(see `spadekit eval --help`, `spadekit eval suites`)")
        raise typer.Exit(2)
    from spadekit.eval import make_suite
    from spadekit.eval.compare import results_file
    from spadekit.eval.models import load_eval_policy
    from spadekit.eval.runner import EvalSettings

    settings = EvalSettings(k=k, temperature=temperature, top_p=top_p,
                            max_new_tokens=max_new_tokens, max_turns=max_turns, limit=limit,
                            seed=seed, batch_size=batch_size, transcripts=transcripts,
                            max_batch_cells=max_batch_cells or None)
    from spadekit.policy.loading import quiet_transformers

    quiet_transformers()  # the command shows its own progress
    try:
        built = [make_suite(s) for s in suites]
        for suite in built:
            settings.resolve(suite)
            if trusted and hasattr(suite, "trusted"):
                suite.trusted = True
        with err_console.status(f"loading {model}"):
            policy, label = load_eval_policy(model, seed=seed)
    except SpadekitError as exc:
        err_console.print(f"[red]cannot evaluate:[/red] {terminal_text(exc.message)}")
        raise typer.Exit(2) from None
    pool = None
    if any(getattr(s, "sandboxed", False) for s in built):
        from spadekit.sandbox import SandboxConfig, SandboxPool

        try:
            pool = SandboxPool(SandboxConfig(allow_unsafe=unsafe), warm=2)
        except SpadekitError as exc:
            err_console.print(f"[red]sandbox unavailable:[/red] {terminal_text(exc.message)}")
            raise typer.Exit(2) from None
    results, journals = [], []
    try:
        for i, suite in enumerate(built):
            journal = None
            if out is not None:  # scored samples survive a crash; a rerun resumes from them
                journal = out.with_name(f"{out.name}.{i}.partial.jsonl")
                journals.append(journal)
            results.append(_run_one(policy, suite, settings, pool, label, journal))
            console.print(suite_table(results[-1]))
            if results[-1].get("invalid"):
                console.print(invalid_table(results[-1]))
    finally:
        if pool is not None:
            pool.close()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(strict_json(results_file(label, results, source=model), indent=1))
        tmp.replace(out)
        for journal in journals:
            journal.unlink(missing_ok=True)
        console.print(f"results: [cyan]{terminal_text(out)}[/cyan]")


def _run_one(policy: Any, suite: Any, settings: Any, pool: Any, label: str,
             journal: Path | None) -> dict:
    from spadekit.eval.runner import run_suite

    if callable(getattr(suite, "screen", None)) and not suite.ready:
        n = len(suite.programs)
        with err_console.status(f"{suite.name}: validating {n} program(s)"):
            cfg = settings.resolve(suite)  # validated on the seeds it will play
            suite.screen(pool, cfg["max_turns"], seed=settings.seed, limit=settings.limit,
                         samples=cfg["k"])
    with err_console.status(f"{suite.name}: loading items"):
        items = suite.load_items(settings.limit)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err_console, transient=True) as progress:
        task = progress.add_task(suite.name, total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        result = run_suite(policy, suite, settings, pool=pool, items=items,
                           on_progress=advance, model_label=label, journal=journal)
    if result.get("resumed_samples"):
        err_console.print(f"{suite.name}: {result['resumed_samples']} sample(s) taken from "
                          f"{journal} (an earlier run was interrupted)")
    return result


def suite_table(result: dict) -> Table:
    """A table of one suite's result: overall, then each group."""
    s = result["settings"]
    table = Table(title=terminal_text(f"{result['suite']}  ({result['model']}, k={s['k']}, "
                                      f"T={s['temperature']}, {s['max_turns']} turn(s))"))
    for col in ("group", "items", "win rate", "mean score", "pass@k", "failures"):
        table.add_column(col, justify="left" if col == "group" else "right")
    rows = [("overall", result["summary"]["overall"])] + list(
        result["summary"]["groups"].items())
    for name, m in rows:
        table.add_row(terminal_text(name), str(m["items"]), f"{m['win_rate']:.3f}",
                      f"{m['mean_score']:.3f}",
                      f"{m['pass_rate']:.3f}", str(m["failures"]),
                      style="bold" if name == "overall" else None)
    captions = []
    if result.get("skipped"):
        captions.append(f"{len(result['skipped'])} item(s) skipped (could not be generated)")
    if result.get("invalid"):
        captions.append(f"{len(result['invalid'])} program(s) failed validation: not scored")
    elif (result.get("validation") or {}).get("trusted"):
        captions.append("programs trusted (--trusted): not validated")
    if captions:
        table.caption = "; ".join(captions)
    return table


def invalid_table(result: dict) -> Table:
    """The programs of a suite that failed validation, with the validator's verdict; they
    are not in the scores."""
    table = Table(title=terminal_text(f"{result['suite']}: invalid programs (not scored)"))
    for col in ("program", "skill", "stage", "reason"):
        table.add_column(col, no_wrap=True)
    table.add_column("message", overflow="fold")
    for row in result.get("invalid", []):
        program = str(row.get("program", ""))
        if "/" in program:  # a file of the suite's folder (in the title): its name, unwrapped
            program = program.rsplit("/", 1)[1]
        table.add_row(terminal_text(program[:300]), *(terminal_text(str(row.get(k, ""))[:300])
                                                      for k in ("skill", "stage", "reason",
                                                                "message")))
    return table


@eval_app.command("compare")
def compare_cmd(a: Path = typer.Argument(..., help="Baseline results (A)."),
                b: Path = typer.Argument(..., help="Results to compare (B)."),
                datasets: bool = typer.Option(False, help="Also one row per dataset."),
                as_json: bool = typer.Option(False, "--json", help="Print rows as JSON.")
                ) -> None:
    """Side by side: win rate and mean score of A and B per suite and group, B - A, and the
    head-to-head win rate of B over the items both scored. A note (on stderr) says when the two
    runs were grounded on different default corpora."""
    from spadekit.eval.compare import compare, corpus_note, missing_suites, read_results

    try:
        ra, rb = read_results(a), read_results(b)
    except SpadekitError as exc:
        err_console.print(f"[red]cannot compare:[/red] {terminal_text(exc.message)}")
        raise typer.Exit(2) from None
    rows = compare(ra, rb, datasets=datasets)
    note = corpus_note(ra, rb)
    if note is not None:  # designers grounded on other documents: say so, beside the numbers
        err_console.print(terminal_text(note), style="yellow", markup=False)
    if as_json:
        console.print_json(strict_json(rows))
        return
    table = Table(title=terminal_text(f"A = {ra['model']}   B = {rb['model']}"))
    for col in ("suite", "name", "A win", "B win", "delta", "A score", "B score", "delta",
                "B h2h"):
        table.add_column(col, justify="left" if col in ("suite", "name") else "right")
    for r in rows:
        h2h = r["head_to_head"]["b_win_rate"]
        table.add_row(terminal_text(r["suite"]), terminal_text(r["name"]),
                      f"{r['a_win_rate']:.3f}", f"{r['b_win_rate']:.3f}",
                      _delta(r["delta_win_rate"]), f"{r['a_mean_score']:.3f}",
                      f"{r['b_mean_score']:.3f}", _delta(r["delta_mean_score"]),
                      "-" if h2h is None else f"{h2h:.3f}",
                      style="bold" if r["level"] == "overall" else None)
    console.print(table)
    for name in missing_suites(ra, rb):
        err_console.print(f"[yellow]suite {terminal_text(name)} is in only one of the "
                          "files[/yellow]")


def _delta(value: float) -> str:
    color = "green" if value > 1e-9 else "red" if value < -1e-9 else "dim"
    return f"[{color}]{value:+.3f}[/{color}]"


@eval_app.command("suites")
def suites_cmd() -> None:
    """List the evaluation suites and what their argument means."""
    from spadekit.eval import SUITES

    table = Table(title="evaluation suites")
    for col in ("suite", "argument", "what"):
        table.add_column(col)
    for entry in SUITES.values():
        table.add_row(entry.name, entry.argument or "-", entry.summary)
    console.print(table)
