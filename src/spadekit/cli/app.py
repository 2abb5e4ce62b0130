"""The ``spadekit`` command.

Subcommands:
  validate  check programs (files or raw model output) in the sandbox, stage by stage
  play      play a program in the terminal, from a script of actions, or its own solution
  library   validate every reference environment and replay its solutions (the default job)
  doctor    what this machine offers: isolation tier and layers, dependencies, models
  eval      benchmark a model or checkpoint (rg-hard, bfcl-mt, qa:FILE, envs:SOURCE); compare
  report    write a run's dashboard as one self-contained HTML file (RUN/report.html)
  serve     RUN: a local read-only web dashboard that follows a run while it trains;
            --model NAME: serve a model with vLLM's OpenAI-compatible server

Exit codes: 0 success, 1 a program is invalid or an episode failed, 2 usage errors.
Everything a program or a model wrote is printed through ``spadekit.common.safe_text`` (no terminal
escape sequences, no rich markup) and JSON output is strict (never NaN or Infinity).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from spadekit import __version__
from spadekit.common.errors import SpadekitError
from spadekit.common.safe_text import strict_json, terminal_text

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                  help="spadekit: self-play RL of language models in environments the model "
                       "writes itself (SPADE). Every program runs in an isolated sandbox.")
console = Console(log_path=False)
err_console = Console(stderr=True, log_path=False)

UNSAFE_HELP = ("Allow running programs below the 'standard' isolation tier (see `spadekit "
               "doctor`). Only for trusted code.")


def _version(value: bool) -> None:
    if value:
        console.print(f"spadekit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """spadekit command line."""


from spadekit.cli.train import selfplay, train_fixed  # noqa: E402  (the main job first in --help)

app.command()(selfplay)
app.command("train-fixed")(train_fixed)

from spadekit.cli.warmstart import procedural, warmstart  # noqa: E402

app.command()(warmstart)
app.command()(procedural)

from spadekit.cli.compat import import_reference  # noqa: E402

app.command("import-reference")(import_reference)


def _sandbox_config(unsafe: bool, step_timeout: float | None = None):
    from spadekit.sandbox import SandboxConfig

    kw = {"allow_unsafe": unsafe}
    if step_timeout:
        kw.update(step_timeout=step_timeout, reset_timeout=step_timeout)
    return SandboxConfig(**kw)


def _pool(unsafe: bool, warm: int = 2, step_timeout: float | None = None):
    from spadekit.sandbox import SandboxPool

    try:
        return SandboxPool(_sandbox_config(unsafe, step_timeout), warm=warm)
    except SpadekitError as exc:
        err_console.print(f"[red]sandbox unavailable:[/red] {terminal_text(exc.message)}")
        raise typer.Exit(2) from None


def _read_program(ref: str):
    """A path, or ``library:NAME``; returns (label, text, hint from the library or None)."""
    if ref.startswith("library:"):
        from spadekit.envs import library

        try:
            entry = library.get(ref.split(":", 1)[1])
        except KeyError as exc:
            raise typer.BadParameter(str(exc.args[0]) if exc.args else str(exc)) from None
        return ref, library.source(entry.name), entry.hint
    path = Path(ref)
    if not path.is_file():
        raise typer.BadParameter(f"no such file: {ref}")
    try:
        return str(path), path.read_text(encoding="utf-8", errors="replace"), None
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {ref}: {exc}") from None


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err_console, transient=True)


# ---------------------------------------------------------------------------------------------


@app.command()
def validate(
    paths: list[str] = typer.Argument(None, help="Program files (.py) or raw model-output text "
                                      "files; `library:NAME` for a reference environment."),
    library: bool = typer.Option(False, "--library", help="Validate every reference "
                                 "environment too."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of reports."),
    max_turns: int = typer.Option(12, help="max_turns passed to the constructor; also the "
                                  "runner's cap."),
    workers: int = typer.Option(2, min=1, help="Programs validated in parallel."),
    step_timeout: float = typer.Option(5.0, help="Seconds allowed per reset/step call."),
    unsafe: bool = typer.Option(False, "--unsafe", help=UNSAFE_HELP),
    require_solution: bool = typer.Option(
        True, "--require-solution/--no-require-solution", help="Refuse programs without a "
        "replayable solution() (off: programs of the reference's contract, prose solutions)."),
) -> None:
    """Check programs against the environment contract, in the sandbox, stage by stage.

    Stages: extract, syntax, load, interface, tools (tool use), determinism, solution,
    lockstep, action_dependent, ends. Exit 0 when all are valid, 1 when any is invalid, 2 on
    usage errors.
    """
    from spadekit.sandbox.validate import Validator, ValidatorSettings

    refs = list(paths or [])
    if library:
        from spadekit.envs import library as lib

        refs += [f"library:{e.name}" for e in lib.list_library()]
    if not refs:
        raise typer.BadParameter("give at least one PATH, or --library")
    items = [_read_program(r) for r in refs]
    pool = _pool(unsafe, warm=min(workers + 1, 4), step_timeout=step_timeout)
    validator = Validator(pool, ValidatorSettings(max_turns=max_turns,
                                                  require_solution=require_solution))
    reports = []
    try:
        with _progress() as bar:
            task = bar.add_task("validating", total=len(items))
            from concurrent.futures import ThreadPoolExecutor

            def one(item):
                rep = validator.validate(item[1])
                bar.advance(task)
                return rep

            with ThreadPoolExecutor(workers) as ex:
                reports = list(ex.map(one, items))
    finally:
        pool.close()
    if as_json:
        out = []
        for (label, _text, _h), rep in zip(items, reports):
            d = rep.to_dict()
            out.append({"path": label, **{k: d[k] for k in ("ok", "stage", "reason", "message")},
                        "details": d["details"], "program": d["program"]})
        print(strict_json(out, indent=2))
    else:
        table = Table(title=f"validation ({pool.report.tier} isolation)")
        for col in ("program", "ok", "stage", "reason", "message", "ms"):
            table.add_column(col, overflow="fold")
        for (label, _t, _h), rep in zip(items, reports):
            table.add_row(terminal_text(label), "[green]yes[/green]" if rep.ok else
                          "[red]no[/red]", terminal_text(rep.stage), terminal_text(rep.reason),
                          terminal_text(rep.message, limit=160),
                          f"{rep.details.get('timings_ms', {}).get('total', 0):.0f}")
        console.print(table)
        n_ok = sum(r.ok for r in reports)
        console.print(f"{n_ok}/{len(reports)} valid")
    raise typer.Exit(0 if all(r.ok for r in reports) else 1)


# ---------------------------------------------------------------------------------------------


@app.command()
def play(
    path: str = typer.Argument(..., help="Program file, raw model output, or `library:NAME`."),
    seed: Optional[int] = typer.Option(None, help="Seed for reset()."),
    hint: Optional[str] = typer.Option(None, help="Append this hint to the first observation "
                                       "(SPADE's `HINT:` convention)."),
    use_library_hint: bool = typer.Option(False, "--library-hint", help="Use the reference "
                                          "environment's own hint."),
    actions: list[str] = typer.Option(None, "--actions", "-a", help="Play this action "
                                      "(repeatable, in order) instead of asking."),
    solution: bool = typer.Option(False, "--solution", help="Play the program's own solution()."),
    max_turns: Optional[int] = typer.Option(None, help="Turn cap (the program's own "
                                            "max_turns applies too); default 12, with --model "
                                            "6."),
    raw: bool = typer.Option(False, "--raw", help="Interactive: send input exactly as typed "
                             "(otherwise games get \\boxed{...} and tool calls get shorthand)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Let a model play: tiny, "
                                        "smollm2-135m, hf:PATH, openai:NAME@URL, vllm:PATH."),
    episodes: int = typer.Option(1, min=1, help="With --model: episodes to play (seeds "
                                 "seed, seed+1, ...)."),
    temperature: float = typer.Option(0.7, help="With --model: sampling temperature."),
    max_new_tokens: Optional[int] = typer.Option(None, help="With --model: tokens per turn "
                                                 "(default 48)."),
    preset: str = typer.Option("cpu-tiny", help="With --model: the preset whose format aids "
                               "(rollout.response_prefix, demonstrations) the model gets."),
    as_json: bool = typer.Option(False, "--json", help="Print the transcript as JSON."),
    unsafe: bool = typer.Option(False, "--unsafe", help=UNSAFE_HELP),
) -> None:
    """Play a program: interactively, from --actions, its own --solution, or with a --model.

    Interactive shorthand: in games, input without \\boxed{} is wrapped in it; in tool use,
    `NAME {json args}` becomes a tool call and `done` the final answer. `:q` quits.
    With --model, the model plays N episodes through the rollout engine; each transcript and
    the mean return are shown. Exit 0 when the episodes ran (whatever their return), 1 when the
    program failed.
    """
    from spadekit.sandbox.play import Episode, interactive_source, scripted_source
    from spadekit.sandbox.validate import to_program

    label, text, lib_hint = _read_program(path)
    try:
        program = to_program(text)
    except (SpadekitError, ValueError) as exc:  # not a program: it is invalid, exit 1
        error = {"type": type(exc).__name__, "reason": getattr(exc, "reason", "extract"),
                 "message": getattr(exc, "message", str(exc))}
        if as_json:
            print(strict_json({"path": label, "error": error, "turns": [], "return": 0.0},
                              indent=2))
        else:
            err_console.print(f"[red]{terminal_text(label)} is not a program:[/red] "
                              f"{terminal_text(error['message'])}")
        raise typer.Exit(1) from None
    if use_library_hint:
        hint = hint or lib_hint or program.hint
    if model:
        from spadekit.cli.play_live import play_with_model

        raise typer.Exit(play_with_model(label, program, model, episodes, seed or 0, hint,
                                         max_turns, temperature, max_new_tokens, as_json,
                                         _pool(unsafe, warm=1), console, err_console, preset))
    pool = _pool(unsafe, warm=0)
    try:
        episode = Episode(pool, program, seed=seed, hint=hint,
                          max_turns=12 if max_turns is None else max_turns)
        if solution:
            source = "solution"
        elif actions:
            source = scripted_source(actions)
        else:
            if as_json or not sys.stdin.isatty():
                source = scripted_source([line.rstrip("\n") for line in sys.stdin])
            else:
                source = interactive_source(console, raw)
        transcript = episode.run(source, show=None if as_json else console)
    finally:
        pool.close()
    transcript["path"] = label
    if as_json:
        print(strict_json(transcript, indent=2))
    else:
        status = terminal_text(transcript["error"]["message"]) if transcript["error"] else (
            "terminated" if transcript["terminated"] else
            "truncated" if transcript["truncated"] else "stopped")
        console.print(Panel(f"return {transcript['return']:.3f}  ({status}, "
                            f"{len(transcript['turns'])} turns)", title="episode"))
    raise typer.Exit(1 if transcript["error"] else 0)


# ---------------------------------------------------------------------------------------------


@app.command("library")
def library_cmd(
    seeds: int = typer.Option(3, min=1, help="Seeds per environment for the solution replay."),
    as_json: bool = typer.Option(False, "--json", help="Print results as JSON."),
    unsafe: bool = typer.Option(False, "--unsafe", help=UNSAFE_HELP),
) -> None:
    """Validate every reference environment in the sandbox and replay its solution and a
    garbage-playing baseline on several seeds: a health check of the sandbox, the validator and
    the library. Exit 1 if any environment fails."""
    from spadekit.envs import library as lib
    from spadekit.sandbox.play import Episode, garbage_source
    from spadekit.sandbox.validate import Validator, ValidatorSettings

    entries = lib.list_library()
    pool = _pool(unsafe, warm=3)
    rows = []
    try:
        validator = Validator(pool, ValidatorSettings(seeds=tuple(range(seeds))))
        with _progress() as bar:
            task = bar.add_task("library", total=len(entries))
            for entry in entries:
                program = lib.program(entry)
                rep = validator.validate(program)
                sol, junk = [], []
                if rep.ok:
                    for s in range(seeds):
                        sol.append(Episode(pool, program, seed=s).run("solution")["return"])
                        junk.append(Episode(pool, program, seed=s).run(
                            garbage_source(entry.setting, s))["return"])
                rows.append({"name": entry.name, "skill": entry.skill, "setting": entry.setting,
                             "ok": rep.ok, "reason": rep.reason, "message": rep.message,
                             "solution_return": sum(sol) / len(sol) if sol else None,
                             "garbage_return": sum(junk) / len(junk) if junk else None,
                             "ms": rep.details.get("timings_ms", {}).get("total")})
                bar.advance(task)
    finally:
        pool.close()
    if as_json:
        print(strict_json({"tier": pool.report.tier, "environments": rows}, indent=2))
    else:
        table = Table(title=f"reference library ({pool.report.tier} isolation)")
        for col in ("environment", "skill", "valid", "solution return", "garbage return",
                    "validate ms"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["name"], r["skill"], "[green]yes[/green]" if r["ok"] else
                          f"[red]{terminal_text(r['reason'])}[/red]",
                          "-" if r["solution_return"] is None else f"{r['solution_return']:.2f}",
                          "-" if r["garbage_return"] is None else f"{r['garbage_return']:.2f}",
                          f"{r['ms'] or 0:.0f}")
        console.print(table)
    raise typer.Exit(0 if all(r["ok"] for r in rows) else 1)


# ---------------------------------------------------------------------------------------------


@app.command()
def generate(
    model: str = typer.Option(..., "--model", "-m", help="The (frozen) designer: tiny, "
                              "smollm2-135m, hf:PATH, openai:NAME@URL, vllm:PATH."),
    out: Path = typer.Option(..., "--out", "-o", help="Pool directory to write (appended to, "
                             "never duplicated)."),
    n: int = typer.Option(8, "--n", min=1, help="Programs to design."),
    setting: str = typer.Option("games", help="games or tooluse."),
    skill: Optional[str] = typer.Option(None, help="One skill, or several comma-separated; "
                                        "default: all skills of the setting, round robin."),
    corpus: Optional[str] = typer.Option(None, help="Grounding corpus (JSONL, Parquet, folder); "
                                         "default: the offline documentation corpus."),
    seed: int = typer.Option(0, help="Seed of prompts, documents and sampling."),
    temperature: float = typer.Option(0.6, help="Designer sampling temperature."),
    max_new_tokens: int = typer.Option(4096, help="Designer output budget."),
    hint_mode: str = typer.Option("second_call", help="second_call (the policy reads the code "
                                  "and writes the hint) or designer (hint from the designer's "
                                  "own output)."),
    batch_size: int = typer.Option(8, min=1, help="Designer prompts per generate call."),
    workers: int = typer.Option(2, min=1, help="Programs validated in parallel."),
    doc_words: Optional[int] = typer.Option(None, help="Truncate grounding documents to this "
                                            "many words (default 6000 games, 4000 tool use)."),
    max_turns: int = typer.Option(12, help="Episode cap stated in the contract."),
    unsafe: bool = typer.Option(False, "--unsafe", help=UNSAFE_HELP),
) -> None:
    """The designer role with a frozen model: write N programs, validate them in the sandbox,
    write hints for the valid ones, and store them as a pool directory (pool.jsonl,
    programs/, rejected.jsonl, summary.json): a fixed environment pool built by any model.
    Exit 1 when no program was valid."""
    from spadekit.selfplay.generate import run_generate
    from spadekit.sandbox import SandboxConfig

    if setting not in ("games", "tooluse"):
        raise typer.BadParameter("setting must be games or tooluse")
    if hint_mode not in ("second_call", "designer"):
        raise typer.BadParameter("hint-mode must be second_call or designer")
    try:
        summary = run_generate(model, setting=setting, skill=skill, n=n, out=out, corpus=corpus,
                               seed=seed, temperature=temperature,
                               max_new_tokens=max_new_tokens, hint_mode=hint_mode,
                               workers=workers, batch_size=batch_size, doc_words=doc_words,
                               max_turns=max_turns,
                               sandbox_config=SandboxConfig(allow_unsafe=unsafe),
                               console=err_console)
    except SpadekitError as exc:
        err_console.print(f"[red]generate failed:[/red] {terminal_text(exc.message)}")
        raise typer.Exit(2) from None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    data = summary.to_dict() if hasattr(summary, "to_dict") else dict(vars(summary))
    console.print_json(strict_json(data))
    valid = data.get("valid", 0)
    raise typer.Exit(0 if valid or not data.get("attempted") else 1)


_ARGV_SECRET = ("{flag} is no longer accepted: a secret on the command line is visible to every user of this machine (ps, "
                "/proc); put it in a file ({file}) or the {env} environment variable")


def _secret(path: Optional[Path], env: str, what: str) -> Optional[str]:
    """A secret from ``path`` (its text, stripped) or else the environment variable ``env``.
    A file other users can read (group or other permission bits) is refused, exit 2: a key
    every local user can read guards nothing."""
    if path is None:
        import os

        return os.environ.get(env) or None
    import stat

    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        err_console.print(f"cannot read the {what} file {path}: {exc}", markup=False, style="red")
        raise typer.Exit(2) from None
    if mode & 0o077:
        err_console.print(f"refused: the {what} file {path} is readable by other users "
                          f"(mode {mode:o}): chmod 600 it", markup=False, style="red")
        raise typer.Exit(2)
    if not text:
        err_console.print(f"the {what} file {path} is empty", markup=False, style="red")
        raise typer.Exit(2)
    return text


SERVE_OWNS = ("--host", "--port", "--api-key", "--middleware", "--worker-extension-cls",
              "--uds")
"""vLLM options ``spadekit serve --model`` sets itself and ``--vllm-args`` may not override."""

VLLM_INSTALL = ('vLLM is not installed: `bash install.sh train,eval,rlve,dev,trl,vllm` (its CPU build '
                'where there is no NVIDIA GPU) or `pip install -e ".[vllm]"`')


def vllm_extra_args(vllm_args: str) -> list[str]:
    """``--vllm-args`` as a list; ``ValueError`` when one sets what ``SERVE_OWNS`` (an
    abbreviation too: vLLM's parser takes those)."""
    import shlex

    more = shlex.split(vllm_args)
    owned = [a for a in more if a.startswith("--") and len(a.split("=", 1)[0]) > 2
             and any(o.startswith(a.split("=", 1)[0]) for o in SERVE_OWNS)]
    if owned:
        raise ValueError(f"--vllm-args may not set {', '.join(owned)}: spadekit serve sets the "
                         "address, the key and the extensions itself (--host, --port, "
                         "--api-key-file, --allow-weight-updates)")
    return more


def vllm_command(model: str, *, host: str, port: int, key: Optional[str],
                 weight_updates: bool, dtype: Optional[str] = None,
                 vllm_args: str = "") -> tuple[list[str], dict[str, str]]:
    """The argv and the extra environment that start vLLM's OpenAI-compatible server for
    ``spadekit serve --model``: the bundled model's name resolved to its local directory, the
    name served as given, the logprobs the trainer recomputes, float32 and eager mode on a
    machine without CUDA, the key in ``VLLM_API_KEY`` (never in argv), and with
    ``weight_updates`` the command of ``vllm_server.serve_command`` in vLLM's dev mode."""
    import os

    from spadekit.policy import bundled, vllm_server

    path = model.split(":", 1)[1] if model.startswith(("vllm:", "hf:")) else model
    if path == bundled.NAME:
        path = str(bundled.ensure_smollm2_cache())
    extra, cuda = ["--served-model-name", model], _has_cuda()
    if dtype or not cuda:
        extra += ["--dtype", dtype or "float32"] + ([] if cuda else ["--enforce-eager"])
    more = vllm_extra_args(vllm_args)
    argv = vllm_server.serve_command(path, port=port, host=host, python=sys.executable,
                                     extra=extra + more, weight_updates=weight_updates,
                                     key=bool(key))
    env = {k: v for k, v in os.environ.items()  # dev mode and the key only as said here
           if k not in ("VLLM_SERVER_DEV_MODE", "VLLM_API_KEY")}
    env.update({"VLLM_API_KEY": key} if key else {})
    env.update({"VLLM_SERVER_DEV_MODE": "1"} if weight_updates else {})
    return argv, env


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _run_forwarding(argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv`` until it exits; Ctrl-C (which the child gets too) and SIGTERM stop it."""
    import signal
    import subprocess

    proc = subprocess.Popen(argv, env=env)
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)


@app.command()
def serve(
    run: Optional[Path] = typer.Argument(None, help="A run directory: serve its dashboard."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Instead of a run: serve "
                                        "this model (smollm2-135m, a local Hugging Face "
                                        "directory or id) with vLLM's OpenAI-compatible server."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default; any "
                             "other address needs an API key)."),
    port: Optional[int] = typer.Option(None, help="Port (default 8765 for a dashboard, 8000 "
                                       "for a model; 0 picks a free one for a dashboard)."),
    api_key_file: Optional[Path] = typer.Option(
        None, help="A file (chmod 600) holding the API key every request must carry "
        "(Authorization: Bearer KEY; the dashboard also takes it as a Basic password); else env "
        "SPADEKIT_API_KEY. Required to bind a non-loopback address."),
    api_key: Optional[str] = typer.Option(None, hidden=True),
    allow_weight_updates: bool = typer.Option(
        False, help="Model server: accept trained weights pushed by a run (--set "
        "generation_model=openai:NAME@URL): vLLM's dev mode with spadekit's worker extension, "
        "every route behind the API key (required)."),
    dtype: Optional[str] = typer.Option(None, help="Model server: vLLM's --dtype (default "
                                        "float32 without CUDA, else vLLM's choice)."),
    vllm_args: str = typer.Option("", "--vllm-args", help="Model server: more arguments for "
                                  "vLLM, one string (e.g. \"--max-model-len 4096\")."),
) -> None:
    """Serve a run's dashboard (`spadekit serve RUN`) or a model (`spadekit serve --model NAME`).

    Dashboard: a read-only web UI of the run directory that follows it while it trains
    (curves, environments with code, hints and episodes, rejected programs, curriculum); it
    prints its URL. Model: vLLM's OpenAI-compatible server (needs the vllm extra), with the
    logprobs training needs (--logprobs-mode processed_logprobs). Both bind 127.0.0.1 unless
    --host says otherwise, and then refuse to start without an API key (--api-key-file or
    SPADEKIT_API_KEY; never on the command line). Ctrl-C stops."""
    if api_key is not None:
        err_console.print("refused: " + _ARGV_SECRET.format(
            flag="--api-key", file="--api-key-file", env="SPADEKIT_API_KEY"),
            markup=False, style="red")
        raise typer.Exit(2)
    if (run is None) == (model is None):
        err_console.print("[red]usage:[/red] spadekit serve RUN (a run's dashboard) or "
                          "spadekit serve --model NAME (a model server), not "
                          + ("both" if run is not None else "neither"), soft_wrap=True)
        raise typer.Exit(2)
    key = _secret(api_key_file, "SPADEKIT_API_KEY", "API key")
    if run is not None:
        from spadekit.report.server import serve_run

        def ready(server) -> None:
            console.print(f"dashboard of {run}: {server.url} (read-only; Ctrl-C stops)",
                          markup=False)

        try:
            serve_run(run, host=host, port=8765 if port is None else port, ready=ready,
                      api_key=key)
        except (SpadekitError, OSError) as exc:
            err_console.print(f"cannot serve {run}: {getattr(exc, 'message', exc)}",
                              markup=False, style="red")
            raise typer.Exit(2) from None
        return
    import importlib.util

    from spadekit.common.loopback import is_loopback

    refusal = (f"binding {host} needs an API key (--api-key-file or SPADEKIT_API_KEY)"
               if not key and not is_loopback(host)
               else "--allow-weight-updates needs an API key (--api-key-file or "
               "SPADEKIT_API_KEY): every route of the server, the weight routes too, needs it"
               if not key and allow_weight_updates
               else ("--allow-weight-updates serves on loopback only (its dev-mode routes run any "
                     "worker method, over plain HTTP): reach it from another machine through an "
                     "SSH tunnel") if allow_weight_updates and not is_loopback(host)
               else None)
    try:
        vllm_extra_args(vllm_args)
    except ValueError as exc:
        refusal = refusal or str(exc)
    if not refusal and importlib.util.find_spec("vllm") is None:
        refusal = VLLM_INSTALL
    if refusal:
        err_console.print(f"cannot serve {model}: {refusal}", markup=False, style="red")
        raise typer.Exit(2)
    try:
        argv, env = vllm_command(model, host=host, port=8000 if port is None else port, key=key,
                                 weight_updates=allow_weight_updates, dtype=dtype,
                                 vllm_args=vllm_args)
    except (SpadekitError, ValueError) as exc:
        err_console.print(f"cannot serve {model}: {getattr(exc, 'message', exc)}",
                          markup=False, style="red")
        raise typer.Exit(2) from None
    console.print(f"serving {model} with vLLM on http://{host}:{argv[argv.index('--port') + 1]}"
                  "/v1 (Ctrl-C stops)", markup=False)
    raise typer.Exit(_run_forwarding(argv, env))


@app.command()
def report(
    run: Path = typer.Argument(..., help="The run directory."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="HTML file to write (default "
                                       "RUN/report.html)."),
    max_episodes: int = typer.Option(2, "--max-episodes", min=0, help="Sample episodes kept "
                                     "per environment."),
    max_envs: int = typer.Option(500, "--max-envs", min=0, help="Environments whose code, "
                                 "hint and episodes are included (designed ones first)."),
) -> None:
    """Write the run's dashboard as one self-contained HTML file: curves, environments (code,
    hint, validation, lineage, episodes), rejected programs, curriculum. Opens without a
    network or a server; everything the model wrote is shown as inert text."""
    from spadekit.report.page import write_report

    try:
        path = write_report(run, out, max_episodes=max_episodes, max_envs=max_envs)
    except SpadekitError as exc:
        err_console.print(terminal_text(f"cannot report {run}: {exc.message}", markup=False),
                          markup=False, style="red")
        raise typer.Exit(2) from None
    size = path.stat().st_size
    console.print(f"wrote {path} ({size / 1024:.0f} KiB)" if size >= 1024
                  else f"wrote {path} ({size} bytes)", markup=False)


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")
           ) -> None:
    """What this machine offers: the sandbox's isolation tier and each layer, dependencies,
    and which models are available offline. Exit 1 when no safe sandbox tier works."""
    from spadekit.cli.doctor import collect, render

    report = collect()
    if as_json:
        print(json.dumps(report, indent=2, default=str))
    else:
        render(report, console)
    raise typer.Exit(0 if report["sandbox"].get("safe_for_untrusted_code") else 1)


from spadekit.cli.eval import eval_app  # noqa: E402
from spadekit.cli.pool import pool_app  # noqa: E402

app.add_typer(eval_app, name="eval", help="Evaluate a model or checkpoint on benchmark suites; "
              "compare two result files.")
app.add_typer(pool_app, name="pool", help="Export a run's environments (the SPADE reference's "
              "released layout and a Hugging Face dataset); register them with Gymnasium.")


def main() -> None:
    _stack_dump_on_sigusr1()
    app()


def _stack_dump_on_sigusr1() -> None:
    """``kill -USR1 PID`` prints every thread's Python stack to stderr and the command goes on:
    a run that seems stuck tells where it waits (no debugger needed)."""
    import faulthandler
    import signal
    import sys

    if hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True,
                                  chain=False)
        except (ValueError, OSError, RuntimeError, AttributeError):
            pass  # stderr without a file descriptor (an embedding host): no dump, no failure


if __name__ == "__main__":
    main()
