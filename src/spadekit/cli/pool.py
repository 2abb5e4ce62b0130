"""``spadekit pool``: a run's environments as a product.

``pool export SOURCE OUT`` writes the SPADE reference's released layout (``games/*.py``,
``manifest.jsonl``, ``validation_manifest.jsonl``, ``validation_summary.json``,
``checksums.sha256``) and, by default, a Hugging Face dataset (``data/*.parquet`` and a dataset
card) into one new directory (``spadekit.runs.pool_export``). ``pool register SOURCE`` lists
the Gymnasium ids a pool's programs get (``spadekit.integrations.gym_pool``) and checks each with
Gymnasium's ``check_env``. Errors are typed and leave nothing half written. Registered on the
main ``app`` by ``spadekit.cli.app``. Details: docs/pools.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from spadekit.common.errors import SpadekitError
from spadekit.common.safe_text import terminal_text

console = Console(log_path=False)
err_console = Console(stderr=True, log_path=False)

pool_app = typer.Typer(no_args_is_help=True, help="Export a run's environments (the released "
                       "layout and a Hugging Face dataset); register them with Gymnasium.")

_FORMATS = ("all", "release")


def _fail(exc: SpadekitError) -> None:
    err_console.print(f"[red]error:[/red] {terminal_text(exc.message)}")
    raise typer.Exit(2)


@pool_app.command("export")
def export(
    source: Path = typer.Argument(..., help="A run directory (run.sqlite) or a pool directory "
                                  "(pool.jsonl)."),
    out: Path = typer.Argument(..., help="The directory to write (must not exist, unless "
                               "--force)."),
    include_removed: bool = typer.Option(False, "--include-removed", help="Also export the "
                                         "programs a run took out of its pool (blacklisted: "
                                         "hung, gamed, slow), each with its removed_reason."),
    license: str = typer.Option("unknown", "--license", help="The licence the dataset card "
                                "names (an SPDX id such as apache-2.0)."),
    name: Optional[str] = typer.Option(None, "--name", help="The pool's name (dataset card, "
                                       "Gymnasium ids); default: the source's directory name."),
    fmt: str = typer.Option("all", "--format", help="all: the released layout and the Hugging "
                            "Face dataset; release: the released layout only (no pyarrow)."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Export a run's (or a pool's) validated environments: the released layout and a dataset."""
    from spadekit.runs.pool_export import export_pool

    if fmt not in _FORMATS:
        err_console.print(f"[red]error:[/red] --format must be one of {', '.join(_FORMATS)}")
        raise typer.Exit(2)
    try:
        summary = export_pool(source, out, include_removed=include_removed, license=license,
                              name=name, parquet=fmt == "all", force=force)
    except SpadekitError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    skills = ", ".join(f"{k} {sum(v.values())}" for k, v in summary["by_skill"].items())
    console.print(f"{summary['total']} environment(s) exported to "
                  f"{terminal_text(str(out))} ({skills}; "
                  + ", ".join(f"{k} {v}" for k, v in summary["by_status"].items()) + ")")
    if summary.get("parquet"):
        console.print(f"  load it: datasets.load_dataset({str(out)!r}, split='train')")
    if license == "unknown":
        console.print("  the dataset card names no licence: pass --license")


@pool_app.command("register")
def register(
    source: Path = typer.Argument(..., help="A release (exported) directory, a pool directory "
                                  "or a run directory."),
    name: Optional[str] = typer.Option(None, "--name", help="The pool's name in the ids."),
    check: bool = typer.Option(True, "--check/--no-check", help="Run Gymnasium's check_env on "
                               "every environment (in the sandbox)."),
    as_json: bool = typer.Option(False, "--json", help="Print the ids (and checks) as JSON."),
) -> None:
    """Register a pool's environments with Gymnasium and check each; prints their ids."""
    from spadekit.integrations.gym_pool import check_registered, register_pool

    try:
        ids = register_pool(source, name=name)
        failures = check_registered(ids) if check else {}
    except SpadekitError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps({"ids": ids, "checked": check, "failures": failures}, indent=2))
    else:
        for env_id in ids:
            mark = "" if not check else (" check_env: " + failures[env_id] if env_id in failures
                                         else " check_env: passed")
            console.print(f"{env_id}{terminal_text(mark)}")
    raise typer.Exit(1 if failures else 0)
