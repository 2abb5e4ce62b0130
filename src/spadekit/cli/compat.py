"""``spadekit import-reference``: a SPADE reference run's stored environments as a spadekit pool.

Reads the reference's environment memory file (``env_memory.json``) and/or its games directory
(``game_*.py``) with :func:`spadekit.envs.refimport.import_reference`, or a released pool
(``--release``: the reference's published layout, which ``spadekit pool export`` writes; every
checksum verified, hints, statistics and the release's validation kept), validates every program
in the sandbox (reference-contract compatibility on, ``SandboxConfig.compat``) and writes the
valid ones into a pool directory in ``spadekit generate``'s format (invalid ones go to
``rejected.jsonl``), each with ``meta.lineage`` naming where it came from. The pool then works
wherever an environment source is taken: ``train-fixed --pool``, ``eval --suite envs:POOL``,
``memory_seed``. Registered on the main ``app`` by ``spadekit.cli.app``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from spadekit.common.errors import ConfigError, SpadekitError
from spadekit.common.safe_text import terminal_text

console = Console(log_path=False)
err_console = Console(stderr=True, log_path=False)


def import_reference(
    out: Path = typer.Option(..., "--out", help="Pool directory to write (created; re-running "
                             "adds only programs not in it yet)."),
    memory: Optional[Path] = typer.Option(None, "--memory", help="The reference's environment "
                                          "memory file (env_memory.json)."),
    games: Optional[Path] = typer.Option(None, "--games", help="The reference's games directory "
                                         "(game_*.py files)."),
    release: Optional[Path] = typer.Option(None, "--release", help="A released pool directory "
                                           "(games/, manifest.jsonl, checksums.sha256), as "
                                           "`spadekit pool export` writes it."),
    include_removed: bool = typer.Option(False, "--include-removed", help="With --release: also "
                                         "import the programs its run took out (blacklisted; "
                                         "they keep that status and are never trained on)."),
    validate: bool = typer.Option(True, "--validate/--no-validate", help="Validate each program "
                                  "in the sandbox first (invalid ones are rejected); without, "
                                  "a release's own validation reports are kept."),
    workers: int = typer.Option(2, min=1, help="Programs validated in parallel."),
    unsafe: bool = typer.Option(False, "--unsafe", help="Allow running programs below the "
                                "'standard' isolation tier. Only for trusted code."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Import a SPADE reference run's memory file and/or games directory, or a released pool,
    as a spadekit pool."""
    from spadekit.envs.refimport import import_reference as read_reference
    from spadekit.runs.pool import write_pool

    try:
        if release is not None:
            if memory is not None or games is not None:
                raise ConfigError("give --release alone (it holds its games and manifest)")
            programs, reports, summary = _read_release(release, include_removed)
        else:
            from spadekit.runs.release import is_games_of_spadekit_release

            if games is not None and is_games_of_spadekit_release(games):
                raise ConfigError(f"{games} is the games/ folder of an exported pool: import it "
                                  f"with --release {games.resolve().parent}")
            programs, summary = read_reference(memory, games)
            reports = [None] * len(programs)
        if validate and programs:
            from spadekit.sandbox import SandboxConfig, SandboxPool
            from spadekit.sandbox.validate import Validator, ValidatorSettings

            # reference programs carry prose solutions: checked without one (the absolute
            # garbage criterion), as `spadekit validate --no-require-solution` does
            with Validator(SandboxPool(SandboxConfig(allow_unsafe=unsafe), warm=min(workers, 4)),
                           ValidatorSettings(require_solution=False)) as validator:
                reports = validator.validate_many(programs, workers=workers)
        if validate and release is not None:
            summary["validation_changed"] = _changed(reports, summary.pop("release_checks"))
        summary.update(write_pool(out, zip(programs, reports)))
    except SpadekitError as exc:
        err_console.print(f"[red]error:[/red] {terminal_text(exc.message)}")
        raise typer.Exit(2) from None
    summary["out"] = str(out)
    summary.pop("release_checks", None)
    summary.pop("snapshot", None)
    if as_json:
        print(json.dumps(summary, indent=2))
        raise typer.Exit(0)
    if release is not None:
        console.print(f"{summary['imported']} program(s) read ({summary['records']} manifest "
                      f"record(s)): {summary['written']} written to {terminal_text(str(out))}, "
                      f"{summary['rejected']} invalid, {summary['duplicate']} already there"
                      + (f", {summary['validation_changed']} validated otherwise than in the "
                         "release" if summary.get("validation_changed") else ""))
    else:
        console.print(f"{summary['imported']} program(s) read ({summary['memory_records']} "
                      f"memory record(s), {summary['game_files']} game file(s)): "
                      f"{summary['written']} written to {terminal_text(str(out))}, "
                      f"{summary['rejected']} invalid, {summary['duplicate']} already there")
    if summary.get("nonfinite"):
        console.print(f"  {summary['nonfinite']} NaN/Infinity number(s) in the memory file "
                      "read as unknown")
    for item in summary["skipped"]:
        console.print(f"  skipped {terminal_text(item['what'])}: {terminal_text(item['why'])}")
    raise typer.Exit(0)


_CHECK_KEYS = ("ok", "stage", "reason")
"""What a validation's verdict is: the same program validated twice agrees on these."""


def _read_release(path: Path, include_removed: bool) -> tuple[list, list, dict]:
    """A release's programs, its own validation reports (``ValidationReport``s, None where the
    release has none) and the read summary (with ``release_checks``: the reports' dicts)."""
    from spadekit.runs.release import read_release
    from spadekit.sandbox.validate import ValidationReport

    programs, checks, summary = read_release(path, include_removed)
    reports = []
    for program, check in zip(programs, checks):
        if isinstance(check, dict) and all(k in check for k in _CHECK_KEYS):
            details = check.get("details") if isinstance(check.get("details"), dict) else {}
            reports.append(ValidationReport(
                ok=bool(check["ok"]), stage=str(check["stage"]), reason=str(check["reason"]),
                message=str(check.get("message") or ""), details=details, program=program))
        else:
            reports.append(None)
    summary["release_checks"] = checks
    return programs, reports, summary


def _changed(reports: list, checks: list) -> int:
    """How many fresh reports disagree with the release's on :data:`_CHECK_KEYS`."""
    return sum(1 for report, check in zip(reports, checks)
               if isinstance(check, dict) and report is not None
               and any(getattr(report, k) != check.get(k) for k in _CHECK_KEYS))
