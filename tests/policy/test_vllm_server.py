"""Weight pushes to a real ``vllm serve`` (vLLM's CPU build here), through ``openai:MODEL@URL``:
its logprobs equal the trainer's, a verified push changes what it serves and pushing the old
weights brings them back, refused pushes change nothing, and a killed server gives typed errors.
The server is the documented command (``vllm_server.serve_command``: loopback, ``RequireKey``,
the key in ``VLLM_API_KEY``): it answers 401 on every route without the key, dev-mode routes
included, and cannot be reached on this machine's other addresses.

One server for the module (SmolLM2-135M, float32, eager, ``VLLM_SERVER_DEV_MODE=1`` and
spadekit's worker extension; about 30 s to start), under a watchdog that takes it down if
pytest dies. In a one-process session it starts in the background as soon as collection ends
(``start_early``, called by conftest.py) so that its start overlaps the tests that run before
this module; under the suite's default pytest-xdist workers the module's fixture starts it. The trainer's
side is the session's bundled model (``bundled_hf``, conftest.py), put back on its loaded weights
after every push (checked after the module). Marked ``extra("vllm")``: skipped, naming the
extra and its install command, where vLLM is not installed (and then not started early).
"""

from __future__ import annotations

import os
import shutil
import socket
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.extra("vllm")

from spadekit.common.errors import SpadekitError  # noqa: E402
from spadekit.policy import load_policy  # noqa: E402
from spadekit.policy.base import PolicyError  # noqa: E402
from spadekit.train.weight_sync import WeightSync, WeightSyncError  # noqa: E402

from test_vllm_engine import (TOL, diffs_of, fingerprint, fingerprint_of,  # noqa: E402
                               generations, max_diffs, one_update)

SRC = str(Path(__file__).resolve().parents[2] / "src")
KEY = "test-vllm-key-" + os.urandom(8).hex()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hf(bundled_hf):
    """The trainer's side: the session's bundled model (conftest.py)."""
    return bundled_hf


WATCHDOG = """
import os, signal, subprocess, sys, time
server = subprocess.Popen(sys.argv[2:])
signal.signal(signal.SIGTERM, lambda *_: server.terminate())  # a clean stop: the server's own
while server.poll() is None:
    if os.getppid() != int(sys.argv[1]):  # pytest is gone, without its teardown
        os.killpg(0, signal.SIGKILL)
    time.sleep(1)
sys.exit(server.returncode)
"""
"""Runs the server (argv[2:]) as the leader of its process group and kills the whole group
(server and engine process) when pytest dies without tearing the module down (a SIGKILL, a
``timeout``): the server starts when collection ends (``start_early``), so it lives longer
than the module that uses it."""

_EARLY: dict = {}


def launch() -> dict:
    """``vllm serve`` of the bundled model in the background (not waited for)."""
    from spadekit.policy import bundled, vllm_server

    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="spadekit-vllm-server-"))
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
           "SPADEKIT_VLLM_PUSH_DIR": str(work / "pushes"), vllm_server.KEY_ENV: KEY}
    (work / "pushes").mkdir()
    cmd = vllm_server.serve_command(  # the documented command, with the CPU settings
        bundled.ensure_smollm2_cache(), port=port, python=sys.executable, extra=[
            "--served-model-name", "smollm2-135m", "--enforce-eager", "--dtype", "float32",
            "--kv-cache-memory-bytes", str(1 << 30), "--max-model-len", "2048"])
    log = work / "server.log"
    with open(log, "wb") as out:
        # its own process group: the server's engine process goes with it (killing only the
        # server left an orphaned EngineCore using CPU and 2.7 GB for the rest of the suite)
        proc = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), *cmd],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    return {"proc": proc, "url": f"http://127.0.0.1:{port}", "log": log, "work": work}


def start_early() -> None:
    """Called by conftest.py when collection ends and this module's tests are selected: the
    server starts (about 30 s of imports and loading) while the tests before this module run."""
    if not _EARLY:
        _EARLY.update(launch())


def stop_early() -> None:
    """Called by conftest.py when the session ends: a server the module never took is stopped."""
    if _EARLY:
        _stop(_EARLY.pop("proc"))
        shutil.rmtree(_EARLY.pop("work"), ignore_errors=True)
        _EARLY.clear()


def _stop(proc) -> None:
    _kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc, signal.SIGKILL)  # whatever of the group is left


@pytest.fixture(scope="module")
def server(hf):
    """The server started when collection ended (or now, when this module runs alone), once it
    answers; stopped, with its pushed files removed, after the module."""
    started = dict(_EARLY) if _EARLY else launch()
    _EARLY.clear()
    proc, url, log = started["proc"], started["url"], started["log"]
    deadline = time.monotonic() + 300
    try:
        while True:
            try:
                with urllib.request.urlopen(urllib.request.Request(
                        url + "/version", headers={"Authorization": f"Bearer {KEY}"}), timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    _kill_group(proc, signal.SIGKILL)
                    pytest.fail("vllm serve did not start:\n" + log.read_text()[-3000:])
                time.sleep(1)
        yield proc, url + "/v1"
    finally:
        _stop(proc)
        shutil.rmtree(started["work"], ignore_errors=True)


def _kill_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def remote(server, hf):
    policy = load_policy(f"openai:smollm2-135m@{server[1]}", tokenizer=hf.tokenizer, retries=0,
                         api_key=KEY)
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def sync(remote):
    """The module's pushes into the server, each checked against the readings of the last."""
    return WeightSync(remote)


@pytest.fixture(scope="module")
def original(bundled_original):
    """The weights as loaded; the module must leave ``hf`` on them (checked after it)."""
    return bundled_original


def _status(url: str, method: str, path: str, key: str | None) -> int:
    body = b'{"method": "spadekit_restore", "kwargs": {}}' if method == "POST" else None
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + path, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_every_route_needs_the_key(server):
    root = server[1][:-3]
    for method, path in [("POST", "/collective_rpc"), ("POST", "/reset_prefix_cache"),
                         ("GET", "/v1/models"), ("GET", "/version"), ("GET", "/health"),
                         ("POST", "/v1/completions")]:
        assert _status(root, method, path, None) == 401, path
        assert _status(root, method, path, "wrong") == 401, path
    assert _status(root, "GET", "/v1/models", KEY) == 200


def non_loopback_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (``hostname -I``, then a UDP socket's
    source address towards a documentation-range peer: nothing is sent)."""
    found = set()
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10)
        found.update(a for a in out.stdout.split() if a.count(".") == 3)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("198.51.100.1", 9))
            found.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(a for a in found if not a.startswith("127.") and a != "0.0.0.0")


def test_the_server_is_not_reachable_off_loopback(server):
    addresses = non_loopback_addresses()
    if not addresses:
        pytest.skip("this machine has no non-loopback IPv4 address to try")
    port = int(server[1].rsplit(":", 1)[1].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        pass  # the server is up on loopback
    for addr in addresses:
        with pytest.raises(OSError):
            socket.create_connection((addr, port), timeout=5).close()


def test_server_logprobs_equal_the_trainers(remote, hf):
    assert {"token_ids", "logprobs"} <= remote.capabilities
    diffs = max_diffs(remote, hf.model, [(0.0, 1.0), (0.6, 1.0)])  # one batch of requests
    assert diffs[(0.0, 1.0)] <= TOL and diffs[(0.6, 1.0)] <= TOL


def test_a_server_push_changes_it_and_the_old_weights_bring_it_back(remote, sync, hf,
                                                                    original):
    before = fingerprint(remote)
    trainer = one_update(hf)
    try:
        stats = sync.push(trainer, version=3)  # verified against the trainer
        assert stats["probe_max_abs_diff"] <= TOL and remote.weights_version == 3
        gens = generations(remote, [(0.0, 1.0), (0.6, 1.0)])  # one batch of requests
        assert max(abs(a - b) for a, b in zip(before, fingerprint_of(gens))) > 1e-3
        assert max(diffs_of(gens, hf.model).values()) <= TOL  # greedy and sampled
    finally:
        hf.model.load_state_dict(original)
    sync.push(original, verify=hf.model)
    assert fingerprint(remote) == pytest.approx(before, abs=1e-5)


def test_refused_server_pushes_change_nothing(remote, sync, hf, original):
    before, version = fingerprint(remote), remote.weights_version
    with pytest.raises(WeightSyncError, match="shape mismatches"):  # refused before sending
        remote.load_weights({"model.norm.weight": torch.ones(7)})
    wrong = {k: v * 1.02 if v.ndim == 2 else v for k, v in original.items()}
    with pytest.raises(WeightSyncError, match="does not serve the trainer's weights.*restored"):
        sync.push(wrong, verify=hf.model)
    assert fingerprint(remote) == pytest.approx(before, abs=1e-5)
    assert remote.weights_version == version  # the undone push is not counted


def test_an_async_selfplay_run_generates_through_vllm_serve(remote, sync, hf, original,
                                                            tmp_path, monkeypatch):
    """``rollout.max_staleness=1`` through a real ``vllm serve`` (issue 24): round 1 trains
    round 0's batch while the server generates round 1, the push after it goes through the
    server's route and is verified, and the ledger balances."""
    import spadekit.policy.registry as registry
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.loop import SelfPlay
    from test_selfplay import WORDS, config, designer_responder

    spec = "openai:smollm2-135m@http://served"
    real = registry.load_policy
    monkeypatch.setattr(registry, "load_policy", lambda s, **kw: remote
                        if s == spec else real(s, **kw))
    designer = ScriptedPolicy(hf.tokenizer, designer_responder(WORDS))
    cfg = config(tmp_path, rounds=2, model="smollm2-135m", envs_per_round=1,
                 generation_model=spec, tensorboard="false",
                 **{"train.learning_rate": 1e-4, "rollout.max_context_tokens": 2048,
                    "rollout.max_staleness": 1})
    try:
        with SelfPlay(cfg, tmp_path / "run", policy=hf, designer_policy=designer) as sp:
            m0, m1 = sp.run()
            ledger = sp.store.ledger(1)
        assert m0["agent_failures"] == m1["agent_failures"] == 0
        assert m1["async/samples_trained"] == 4 and m1["train/optimizer_steps"] == 1
        assert m1["train/mismatch_kl"] < 1e-6
        assert m1["weight_sync/probe_max_abs_diff"] <= TOL
        assert all(r["generated"] == r["trained"] + r["discarded"] + r["in_flight"]
                   for r in ledger)
    finally:
        hf.model.load_state_dict(original)
        sync.push(original, verify=hf.model)


def test_a_killed_server_gives_typed_errors(server, remote, original):
    proc, _ = server
    version = remote.weights_version
    _kill_group(proc, signal.SIGKILL)  # the server and its engine die
    proc.wait(timeout=30)
    with pytest.raises(WeightSyncError) as err:
        remote.load_weights(original)
    assert isinstance(err.value, SpadekitError)
    with pytest.raises(PolicyError):
        fingerprint(remote)
    assert remote.weights_version == version
