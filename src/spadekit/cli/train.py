"""``spadekit selfplay`` and ``spadekit train-fixed``: the training commands and their round table.

Registered on the main ``app`` by ``spadekit.cli.app`` (this module only defines the functions).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from spadekit.common.errors import SpadekitError
from spadekit.common.safe_text import terminal_text

console = Console(log_path=False)
err_console = Console(stderr=True, log_path=False)
LOG_HELP = ("Also log every round (its metrics, the config, its environments as a table) to "
            "an experiment tracker: wandb or trackio (optional extras: pip install -e "
            "'.[wandb]'). Repeatable or comma-separated; sets logging.backends. On --resume "
            "it replaces the stored trackers; the tracked run continues (same id). A "
            "tracker that fails is turned off with one warning; the run goes on.")
UNSAFE_HELP = ("Allow running programs below the 'standard' isolation tier (see `spadekit "
               "doctor`). Only for trusted code.")


def selfplay(
    preset: str = typer.Option("cpu-kit", help="Preset: cpu-kit (default: bundled SmolLM2 on "
                               "CPU writing game-kit programs after a warm start of about 4 "
                               "minutes, cached), cpu-tiny (the same without kit or warm "
                               "start), cpu-warm (whole programs after a warm start), "
                               "games-4b, tooluse-4b, games-30b, games-8b-thinking, ablate-*."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file applied on top of "
                                          "the preset."),
    overrides: list[str] = typer.Option(None, "--set", help="Override one setting: "
                                        "key=value, dotted for sections (train.learning_rate=1e-5)."
                                        " Repeatable."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model (shortcut for "
                                        "--set model=...): tiny, smollm2-135m, hf:PATH, ..."),
    rounds: Optional[int] = typer.Option(None, help="Rounds to play now."),
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (default runs/DATE-TIME)."),
    resume: Optional[Path] = typer.Option(None, help="Continue the run in this directory from "
                                          "its last completed round."),
    curriculum: Optional[str] = typer.Option(
        None, help="spade (default): the model designs its environments; fixed: a static pool "
        "(`--set curriculum.pool=DIR`); rlve: RLVE's adaptive-difficulty environments. Same "
        "trainer and budget for all three."),
    log: list[str] = typer.Option(None, "--log", help=LOG_HELP),
    unsafe: bool = typer.Option(False, "--unsafe", help=UNSAFE_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved config and the "
                                 "budgets it implies (agent samples, plays per environment, "
                                 "hinted plays, designer weight, turn cap) and exit: no model "
                                 "is loaded and no run directory is created."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: one JSON object "
                                 "(the budgets, and the config under 'config')."),
) -> None:
    """The main job: SPADE self-play. One model designs environments (with hints) and learns to
    solve them; both roles are updated with GRPO every round.

    `--preset cpu-warm` first warm-starts the bundled model on a pool of procedural games
    (about 13 minutes on 2 cores, once; cached under ~/.cache/spadekit/warmstart); any preset
    takes `--set warmstart.pool=procedural|DIR` (docs/designer.md).

    Everything lives in the run directory (config.yaml, run.sqlite, checkpoints/,
    events.jsonl); `--resume DIR` continues after any crash, losing at most the round in flight.
    In-loop evaluation: `--set eval.every=N --set 'eval.suites=[rg-easy]'`.
    `--dry-run [--json]` shows what a preset resolves to without starting anything.
    `--log wandb --log trackio` also sends every round to those trackers (docs/tracking.md).
    """
    extra = ([f"curriculum.kind={curriculum}"] if curriculum else []) + _log_sets(log)
    if dry_run or as_json:
        if not dry_run:
            raise typer.BadParameter("--json needs --dry-run")
        _dry_run(preset, config, overrides, model, rounds, unsafe, extra, as_json)
        return
    _run_selfplay(preset, config, overrides, model, rounds, run_dir, resume, unsafe, extra)


def train_fixed(
    pool: str = typer.Option(..., "--pool", help="The fixed environments: library, a pool "
                             "directory from `spadekit generate`, or a run directory."),
    preset: str = typer.Option("cpu-tiny", help="Preset (as for selfplay)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file on top of the "
                                          "preset."),
    overrides: list[str] = typer.Option(None, "--set", help="Override one setting (key=value)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model, as for selfplay."),
    rounds: Optional[int] = typer.Option(None, help="Rounds to play now."),
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (default runs/DATE-TIME)."),
    resume: Optional[Path] = typer.Option(None, help="Continue this run."),
    log: list[str] = typer.Option(None, "--log", help=LOG_HELP),
    unsafe: bool = typer.Option(False, "--unsafe", help=UNSAFE_HELP),
) -> None:
    """The fixed-environment GRPO baseline: the agent role only, on a static pool, with the
    same loss, trainer and budget (envs_per_round x plays_per_env plays a round) as
    `selfplay`. Same run directory, resume and metrics."""
    _run_selfplay(preset, config, overrides, model, rounds, run_dir, resume, unsafe,
                  ["curriculum.kind=fixed", f"curriculum.pool={json.dumps(pool)}",
                   *_log_sets(log)])


def _log_sets(log: list[str] | None) -> list[str]:
    """``--log a --log b,c`` as the ``--set`` of ``logging.backends`` (none: no setting)."""
    names = [n.strip() for item in log or [] for n in item.split(",") if n.strip()]
    names = list(dict.fromkeys(names))  # --log wandb twice is once
    return [f"logging.backends={json.dumps(names)}"] if names else []


def _resolve(preset, config, overrides, model, rounds, unsafe, extra: list[str]):
    """The config of a ``selfplay``/``train-fixed`` command line (``typer.BadParameter`` if it
    does not load)."""
    from spadekit.selfplay.config import load_config

    sets = [*(overrides or []), *extra, *([f"model={json.dumps(model)}"] if model else []),
            *(["sandbox.allow_unsafe=true"] if unsafe else []),
            *([f"rounds={rounds}"] if rounds is not None else [])]
    try:
        cfg = load_config(preset, config, sets)
    except SpadekitError as exc:
        raise typer.BadParameter(exc.message) from None
    return cfg


def _dry_run(preset, config, overrides, model, rounds, unsafe, extra: list[str],
             as_json: bool) -> None:
    """``--dry-run``: the resolved config and its budgets; nothing is loaded or written."""
    import yaml

    from spadekit.selfplay.budgets import budgets
    from spadekit.selfplay.config import to_dict

    cfg = _resolve(preset, config, overrides, model, rounds, unsafe, extra)
    numbers = budgets(cfg)
    if as_json:
        typer.echo(json.dumps({**numbers, "config": to_dict(cfg)}, sort_keys=False))
        return
    console.print(f"[bold]spadekit selfplay --dry-run[/bold]: preset {preset}"
                  + (f" + {config}" if config else ""))
    console.print(yaml.safe_dump(to_dict(cfg), sort_keys=False), markup=False,
                  highlight=False)
    table = Table(title="budgets per round", show_header=True)
    table.add_column("quantity", no_wrap=True)
    table.add_column("value")
    for key, value in numbers.items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    console.print(table)


class Terminated(BaseException):
    """SIGTERM arrived: the round in flight rolls back (like Ctrl-C), the run exits 0."""


def _raise_terminated(signum, _frame) -> None:
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough; cleanup runs undisturbed
    raise Terminated(signum)


def resume_arg(target) -> str:
    """``--resume PATH``, quoted for a shell where the path needs it, as plain text: printed in
    a ``Text`` with ``soft_wrap=True`` it stays one piece however long the path (a log file
    keeps the command whole, ready to paste), and nothing in it is read as markup or as an
    emoji code. A path with characters a terminal would not show as themselves (tabs, control
    characters, bytes that are not UTF-8) is written in bash's ``$'...'`` form, byte by
    byte."""
    path = str(target)
    if path.isprintable():
        return "--resume " + shlex.quote(path)
    out = []
    for byte in os.fsencode(path):
        char = chr(byte)
        out.append("\\" + char if char in "'\\" else
                   char if 0x20 <= byte < 0x7F else f"\\x{byte:02x}")
    return "--resume $'" + "".join(out) + "'"


def _run_selfplay(preset, config, overrides, model, rounds, run_dir, resume, unsafe,
                  extra: list[str]) -> None:
    """``spadekit selfplay``; a SIGTERM (a scheduler's preemption, ``kill``) rolls the round in
    flight back and exits 0 with the resume command: nothing committed is lost."""
    import signal

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    target: list = []
    try:
        _selfplay_rounds(preset, config, overrides, model, rounds, run_dir, resume, unsafe,
                         extra, target)
    except Terminated:
        where = target[0] if target else (resume or run_dir)
        err_console.print(Text.assemble(
            ("stopped by SIGTERM", "yellow"), ": the round in flight was rolled back; every "
            "committed round is kept", *(("; continue with ", resume_arg(where)) if where else ())),
            soft_wrap=True)
        raise typer.Exit(0) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _selfplay_rounds(preset, config, overrides, model, rounds, run_dir, resume, unsafe,
                     extra: list[str], target_out: list) -> None:
    import time as _time

    from spadekit.selfplay.loop import SelfPlay

    cfg = _resolve(preset, config, overrides, model, rounds, unsafe, extra)
    import os

    # several processes (torchrun / accelerate launch): rank 0 owns the run directory and
    # prints; the others follow its rounds silently (see spadekit.selfplay.loop)
    main = int(os.environ.get("RANK", "0")) == 0
    rank = os.environ.get("RANK", "0")
    target = resume or run_dir or Path("runs") / _time.strftime("%Y%m%d-%H%M%S")
    target_out.append(target)
    if main:
        # one fact a line, each short enough for an 80-column terminal (no mid-phrase wraps)
        console.print(f"[bold]spadekit selfplay[/bold]: {cfg.model}, {cfg.setting}, "
                      f"{cfg.curriculum.kind} curriculum, {cfg.rounds} round(s)")
        console.print(Text.assemble("resuming " if resume else "run directory ",
                                    (terminal_text(target, markup=False), "cyan")),
                      overflow="fold")
    try:
        with err_console.status(f"loading {cfg.model}") if main else _nothing():
            sp = SelfPlay(cfg, target, resume=resume is not None,
                          console=err_console if main else None)
    except SpadekitError as exc:
        err_console.print(f"[red]{'' if main else f'rank {rank}: '}cannot start:[/red] "
                          f"{terminal_text(exc.message)}")
        raise typer.Exit(2) from None
    with sp:
        target = sp.run_dir  # rank 0's (the other ranks' default name may differ)
        if main:
            world = sp.trainer.dist.world_size
            from spadekit.selfplay.checkpoints import disk_use

            ck = sp.config.checkpoint
            console.print(f"starting at round {sp.next_step}; sandbox tier "
                          f"{sp.pool.report.tier}" + (f"; {world} processes "
                                                      f"({sp.trainer.dist.strategy})"
                                                      if world > 1 else ""))
            console.print(f"run directory {disk_use(sp.run_dir) / 2**20:.0f} MB; keeping the "
                          f"last {ck.keep_last} checkpoint(s)"
                          + (f" and every {ck.keep_every}th" if ck.keep_every else ""))
            for role, r in sp.roles.items():
                console.print(f"{role}: {terminal_text(str(r['policy']))} ({r['engine']}, "
                              f"{'trained' if r['trained'] else 'not trained'})",
                              overflow="fold")
            if sp.tracking is not None and sp.tracking.live:
                console.print(f"tracking: {', '.join(sp.tracking.live)} (project "
                              f"{sp.config.logging.project}, run {sp.tracking.run_id})",
                              overflow="fold", markup=False)
        history: list[dict] = []
        for _ in range(sp.config.rounds):
            try:
                metrics = sp.round(sp.next_step)
            except SpadekitError as exc:
                err_console.print(Text.assemble(
                    (f"{'' if main else f'rank {rank}: '}round {sp.next_step} failed:", "red"),
                    " ", terminal_text(exc.message, markup=False), "\nNothing of that round "
                    "was committed; fix the cause and continue with ", resume_arg(target)),
                    soft_wrap=True)
                raise typer.Exit(1) from None
            sp.next_step += 1
            history.append(metrics)
            if main:
                console.print(_round_table(metrics))
        from spadekit.selfplay.round_report import (designed_games, designed_games_line,
                                                    summary_line)

        games = designed_games(sp.store, history[0]["step"]) if main and history else []
    if main:
        console.print(summary_line(history), highlight=False)
        if history:
            console.print(designed_games_line(games), highlight=False, soft_wrap=True,
                          markup=False)
        console.print(Text(f"done: {terminal_text(target, markup=False)} "
                           f"(resume with {resume_arg(target)})"), soft_wrap=True)
    _leave_process_group()


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def _leave_process_group() -> None:
    """After a clean multi-process run: leave the process group (torch warns otherwise)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except ImportError:
        pass


def _round_table(m: dict) -> Table:
    times = "  ".join(f"{k} {v:.0f}s" for k, v in m["timings_s"].items())
    disk = (f"; run dir {m['run_dir_mb']:.0f} MB, {m.get('checkpoints_kept', 0)} "
            "checkpoint(s) kept" if isinstance(m.get("run_dir_mb"), (int, float)) else "")
    table = Table(title=f"round {m['step']} ({m['seconds']:.0f}s)", caption=times + disk,
                  show_header=True)
    for col in ("valid", "pool d+b", "win", "return", "adv!=0", "regret", "d.reward", "loss",
                "tok/s"):
        table.add_column(col, no_wrap=True)
    tps = m.get("sampled_tokens", 0) / max(m.get("timings_s", {}).get("play", 0) or 1e-9, 1e-9)

    def f(key, fmt="{:.3f}"):
        return fmt.format(m[key]) if isinstance(m.get(key), (int, float)) else "-"

    pool = f"{m.get('pool_designed', 0)}+{m.get('pool_bootstrap', 0)}"
    if "pool_baseline" in m:
        pool = f"{m['pool_baseline']} (baseline)"
    valid = f("valid_share", "{:.0%}")
    if isinstance(m.get("designed"), (int, float)) and isinstance(m.get("valid"), (int, float)):
        valid = f"{int(m['valid'])}/{int(m['designed'])} ({valid})"  # designed, then pooled
    table.add_row(valid, pool, f("agent_win_rate", "{:.0%}"),
                  f("agent_mean_return"), f("agent_nonzero_advantage_share", "{:.0%}"),
                  f("regret"), f("designer_reward"), f("train/loss"), f"{tps:.0f}")
    from spadekit.selfplay.round_report import empty_update_reason

    why = empty_update_reason(m)
    if why:  # an update that moved no weight says why, instead of a quiet loss of 0
        table.caption += f"\nempty update: {why}"
    cut = {k.split("/", 1)[1]: v for k, v in m.items()
           if k.startswith("thinking_cut/") and isinstance(v, (int, float)) and v}
    if cut:  # replies that ended inside <think>: a lost hint/program/move, not a quiet zero
        table.caption += ("\nthinking cut (reply ended inside <think>): "
                          + "  ".join(f"{role} {int(n)}" for role, n in sorted(cut.items()))
                          + " - raise that role's token budget or set "
                          "chat_template.<role>.enable_thinking=false")
    evals = [(k[5:-9], v) for k, v in m.items()
             if k.startswith("eval/") and k.endswith("/win_rate") and k.count("/") == 2]
    if evals:
        table.caption += "\neval win rate: " + "  ".join(f"{terminal_text(n)} {v:.3f}"
                                                         for n, v in evals)
    return table
