"""Experiment tracking (``spadekit.runs.tracking``, docs/tracking.md) on real runs of the tiny
model, offline: W&B in offline mode (its ``run-<id>.wandb`` files in the run directory) and
trackio's local SQLite store (conftest points ``TRACKIO_DIR`` into a temp dir), each read back
from the backend's own files and compared with the run database.

- both backends get every round's scalars (the values the run database holds), the config and
  each round's environments table; a resume continues the same tracked run, no step twice;
- a backend killed mid-run (W&B's service process, SIGKILL), one whose package is missing and
  one that fails to start are each disabled with one warning and a counted event, and the run
  finishes every round;
- ``--log`` on the command line, and a bad backend name there or in the config.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from knob_observers import RecordingPolicy, base_config, designer_script, hybrid
from spadekit.common.errors import ConfigError
from spadekit.runs.tracking import BACKENDS, LoggingConfig, round_environments
from spadekit.runs.tracking_base import ENV_COLUMNS


def _run(cfg, run_dir: Path, *, rounds: int | None = None, resume: bool = False,
         between=None):
    """A real self-play run (tiny model, scripted designer) in ``run_dir``; returns the
    console's text, the tracking state, the tracking events and the database's metrics by
    step. ``between(sp)`` runs after the first round."""
    from spadekit.policy.registry import load_policy
    from spadekit.selfplay.loop import SelfPlay

    out = io.StringIO()
    with SelfPlay(cfg, run_dir, policy=load_policy("tiny", seed=0), resume=resume,
                  designer_policy=RecordingPolicy(hybrid(), designer_script(), []),
                  console=Console(file=out, width=200)) as sp:
        n = rounds if rounds is not None else cfg.rounds
        for i in range(n):
            sp.round(sp.next_step)
            sp.next_step += 1
            if i == 0 and between is not None:
                between(sp)
        state = sp.store.get_state("tracking")
        events = [e["data"] for e in sp.store.events() if e["kind"].startswith("tracking_")]
        metrics: dict[int, dict[str, float]] = {}
        for row in sp.store.query("SELECT name, step, value FROM metrics"):
            metrics.setdefault(row[1], {})[row[0]] = row[2]
        envs = {s: round_environments(sp.store, s) for s in sp.store.completed_rounds()}
        rounds_done = sp.store.completed_rounds()
    return {"console": out.getvalue(), "state": state, "events": events, "metrics": metrics,
            "envs": envs, "rounds": rounds_done}


def _config(backends, rounds=2, project=None):
    extra = {"logging.project": project} if project else {}
    return base_config(rounds=rounds, **{"logging.backends": json.dumps(backends), **extra})


# -- reading the backends' own files ---------------------------------------------------------


def _wandb_records(run_dir: Path, run_id: str) -> list:
    """Every record of every offline session of W&B run ``run_id`` (a resume is a new
    session with the same id), oldest first: the ``.wandb`` file is W&B's LevelDB-style log
    of protobuf records (7-byte header, 32 KiB blocks, records split FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2 as pb

    files = sorted(glob.glob(str(run_dir / "wandb" / f"offline-run-*-{run_id}" /
                                 f"run-{run_id}.wandb")))
    records = []
    for file in files:
        raw, pos, part = Path(file).read_bytes(), 7, b""
        assert raw[:4] == b":W&B"
        while pos + 7 <= len(raw):
            left = 32768 - pos % 32768
            if left < 7:
                pos += left
                continue
            _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
            pos += 7
            if kind == 0 and length == 0:  # the zero padding at a block's end
                pos += left - 7
                continue
            part += raw[pos:pos + length]
            pos += length
            if kind in (1, 4):
                record = pb.Record()
                record.ParseFromString(part)
                records.append(record)
                part = b""
    return records, files


def _wandb_history(records) -> dict[int, dict]:
    steps: dict[int, dict] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in r.history.item}
            assert r.history.step.num not in steps, f"step {r.history.step.num} twice"
            steps[r.history.step.num] = items
    return steps


def _trackio_logs(project: str, run_id: str) -> list[dict]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, run=run_id)


def _scalars(items: dict) -> dict:
    return {k: v for k, v in items.items() if not k.startswith(("_", "environments"))
            and k != "step" and k != "timestamp"}


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.extra("wandb", "trackio")
def test_rounds_config_and_environments_reach_both_backends_and_a_resume_continues(tmp_path):
    run = tmp_path / "run"
    cfg = _config(["wandb", "trackio"], project="spadekit-test-a")
    first = _run(cfg, run)
    run_id = first["state"]["run_id"]
    assert first["state"]["logged"] == {"wandb": 1, "trackio": 1}
    assert [e["kind"] for e in first["events"]] == ["tracking_started"] * 2
    assert "disabled" not in first["console"]

    # W&B: the run record, its config, each step's scalars and environments table
    records, files = _wandb_records(run, run_id)
    assert len(files) == 1
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert runs and runs[0].run_id == run_id and runs[0].project == "spadekit-test-a"
    assert runs[0].display_name == "run"
    config = {i.key: json.loads(i.value_json) for i in runs[0].config.update}
    assert config["model"] == "tiny"
    assert config["logging"]["backends"] == ["wandb", "trackio"]
    history = _wandb_history(records)
    assert sorted(history) == [0, 1]
    for step, items in history.items():
        assert _scalars(items) == pytest.approx(first["metrics"][step]), step
        assert items["environments/_type"] == "table-file"
        table = json.loads((Path(files[0]).parent / "files" / items["environments/path"])
                           .read_text())
        assert table["columns"] == list(ENV_COLUMNS)
        assert len(table["data"]) == len(first["envs"][step]) > 0
        assert [row[1] for row in table["data"]] == [e["sha"] for e in first["envs"][step]]

    # trackio: the same steps and values, its config, the table
    logs = _trackio_logs("spadekit-test-a", run_id)
    assert [log["step"] for log in logs] == [0, 1]
    for log in logs:
        assert _scalars(log) == pytest.approx(first["metrics"][log["step"]])
        rows = log["environments"]["_value"]
        assert [r["sha"] for r in rows] == [e["sha"] for e in first["envs"][log["step"]]]
        assert set(rows[0]) == set(ENV_COLUMNS)
    from trackio.sqlite_storage import SQLiteStorage

    assert SQLiteStorage.get_run_config("spadekit-test-a", run_id)["model"] == "tiny"

    # resume for two more rounds: the same tracked runs, steps 0..3 each exactly once
    second = _run(cfg, run, rounds=2, resume=True)
    assert second["state"]["run_id"] == run_id
    assert second["state"]["logged"] == {"wandb": 3, "trackio": 3}
    assert [e["resumed"] for e in second["events"] if e["kind"] == "tracking_started"] == \
        [False, False, True, True]
    records, files = _wandb_records(run, run_id)
    assert len(files) == 2  # two offline sessions of one W&B run (`wandb sync` joins them)
    assert {r.run.run_id for r in records if r.WhichOneof("record_type") == "run"} == {run_id}
    history = _wandb_history(records)
    assert sorted(history) == [0, 1, 2, 3]
    assert _scalars(history[3]) == pytest.approx(second["metrics"][3])
    logs = _trackio_logs("spadekit-test-a", run_id)
    assert [log["step"] for log in logs] == [0, 1, 2, 3]
    assert SQLiteStorage.get_runs("spadekit-test-a") == [run_id]

    # a resume that plays nothing logs nothing again
    third = _run(cfg, run, rounds=0, resume=True)
    assert third["state"]["logged"] == {"wandb": 3, "trackio": 3}
    assert sorted(_wandb_history(_wandb_records(run, run_id)[0])) == [0, 1, 2, 3]
    assert [log["step"] for log in _trackio_logs("spadekit-test-a", run_id)] == [0, 1, 2, 3]


@pytest.mark.extra("trackio")
def test_a_backend_added_on_resume_gets_the_earlier_rounds_from_the_database(tmp_path):
    run = tmp_path / "run"
    first = _run(_config([]), run)
    assert first["state"] is None
    # --log on --resume: the given trackers replace the stored (none); rounds 0 and 1 are sent
    # from the run database at start, round 2 after its commit
    second = _run(_config(["trackio"], project="spadekit-test-b"), run, rounds=1, resume=True)
    assert second["state"]["logged"] == {"trackio": 2}
    logs = _trackio_logs("spadekit-test-b", second["state"]["run_id"])
    assert [log["step"] for log in logs] == [0, 1, 2]
    for log in logs:
        assert _scalars(log) == pytest.approx(second["metrics"][log["step"]])
        assert [r["sha"] for r in log["environments"]["_value"]] == \
            [e["sha"] for e in second["envs"][log["step"]]]


def _kill_wandb_service(sp) -> None:
    """SIGKILL this process's wandb-core service: every later W&B call fails."""
    kids = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True,
                          text=True).stdout.split()
    killed = [k for k in kids if Path(f"/proc/{k}/comm").read_text().strip() == "wandb-core"]
    assert killed, "no wandb-core process to kill"
    for pid in killed:
        os.kill(int(pid), signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(int(pid), 0)


@pytest.mark.extra("wandb")
def test_a_backend_killed_mid_run_is_disabled_once_and_the_run_finishes(tmp_path):
    import wandb

    run = tmp_path / "run"
    try:
        out = _run(_config(["wandb"], rounds=3), run, between=_kill_wandb_service)
    finally:
        with contextlib.suppress(Exception):
            wandb.teardown()  # the next W&B run in this process starts a fresh service
    assert out["rounds"] == [0, 1, 2]  # the run database is complete
    assert sorted(out["metrics"]) == [0, 1, 2]
    assert out["console"].count("logging backend wandb disabled") == 1
    disabled = [e for e in out["events"] if e["kind"] == "tracking_disabled"]
    assert len(disabled) == 1 and disabled[0]["backend"] == "wandb"
    assert disabled[0]["stage"] == "log" and not disabled[0]["missing"]
    assert out["state"]["failures"] == {"wandb": 1}
    assert out["state"]["logged"] == {"wandb": 0}
    records, files = _wandb_records(run, out["state"]["run_id"])
    assert len(files) == 1  # it had started; what its killed service had not written yet
    assert set(_wandb_history(records)) <= {0}  # is lost, and nothing after the kill came


def test_a_missing_package_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    out = _run(_config(["wandb"]), tmp_path / "run")
    assert out["rounds"] == [0, 1]
    assert out["console"].count("logging backend wandb disabled") == 1
    assert "pip install -e \".[wandb]\"" in out["console"]
    disabled = [e for e in out["events"] if e["kind"] == "tracking_disabled"]
    assert len(disabled) == 1 and disabled[0]["stage"] == "start"
    assert disabled[0]["missing"] and disabled[0]["error"] == "TrackerMissing"
    assert out["state"]["failures"] == {"wandb": 1} and "logged" not in out["state"]


@pytest.mark.extra("wandb", "trackio")
def test_a_backend_failing_to_start_is_one_warning_and_the_others_go_on(tmp_path):
    # trackio refuses a project named registry-* (reserved): its init raises, a real failure;
    # W&B takes the same project and logs every round
    out = _run(_config(["trackio", "wandb"], project="registry-x"), tmp_path / "run")
    assert out["rounds"] == [0, 1]
    assert out["console"].count("logging backend trackio disabled") == 1
    assert "wandb disabled" not in out["console"]
    disabled = [e for e in out["events"] if e["kind"] == "tracking_disabled"]
    assert [(e["backend"], e["stage"], e["missing"]) for e in disabled] == \
        [("trackio", "start", False)]
    assert out["state"]["failures"] == {"trackio": 1}
    assert out["state"]["logged"] == {"wandb": 1}
    records, _ = _wandb_records(tmp_path / "run", out["state"]["run_id"])
    assert sorted(_wandb_history(records)) == [0, 1]


def test_no_backend_no_tracking(tmp_path):
    out = _run(_config([], rounds=1), tmp_path / "run")
    assert out["state"] is None and out["events"] == []


def test_backend_names_are_checked_at_load():
    assert sorted(BACKENDS) == ["trackio", "wandb"]
    with pytest.raises(ConfigError, match="unknown backend 'mlflow'; valid: trackio, wandb"):
        LoggingConfig(backends=["mlflow"])
    with pytest.raises(ConfigError, match="unknown backend"):
        base_config(**{"logging.backends": "[wandb, nope]"})
    with pytest.raises(ConfigError, match="twice"):
        LoggingConfig(backends=["wandb", "wandb"])
    with pytest.raises(ConfigError, match="logging.project"):
        LoggingConfig(project="a/b")


def test_the_log_option():
    from spadekit.cli.app import app

    runner = CliRunner()
    ok = runner.invoke(app, ["selfplay", "--log", "wandb,trackio", "--log", "wandb",
                             "--dry-run", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["config"]["logging"]["backends"] == ["wandb", "trackio"]
    bad = runner.invoke(app, ["selfplay", "--log", "mlflow", "--dry-run"],
                        env={"COLUMNS": "200"})
    assert bad.exit_code == 2
    assert "unknown backend 'mlflow'; valid: trackio, wandb" in bad.output
    helptext = runner.invoke(app, ["selfplay", "--help"], env={"COLUMNS": "200"}).output
    assert "--log" in helptext and "wandb or trackio" in helptext
