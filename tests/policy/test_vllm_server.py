"""Weight pushes to a real ``vllm serve`` (vLLM's CPU build here), through ``openai:MODEL@URL``:
its logprobs equal the trainer's, a verified push changes what it serves and pushing the old
weights brings them back, refused pushes change nothing, and a killed server gives typed errors.

One server for the module (SmolLM2-135M, float32, eager, ``VLLM_SERVER_DEV_MODE=1`` and
spadekit's worker extension; about 30 s to start); the trainer's side is the session's bundled
model (``bundled_hf``, conftest.py), put back on its loaded weights after every push (checked
after the module). Skipped with
the reason when vLLM cannot be imported.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (bash install.sh train,vllm)", allow_module_level=True)

from spadekit.common.errors import SpadekitError  # noqa: E402
from spadekit.policy import load_policy  # noqa: E402
from spadekit.policy.base import PolicyError  # noqa: E402
from spadekit.policy.weight_sync import WeightSyncError, push_weights  # noqa: E402

from test_vllm_engine import TOL, fingerprint, max_diff, max_diffs, one_update  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hf(bundled_hf):
    """The trainer's side: the session's bundled model (conftest.py)."""
    return bundled_hf


@pytest.fixture(scope="module")
def server(hf, tmp_path_factory):
    from spadekit.policy import bundled

    port = free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
           "SPADEKIT_VLLM_PUSH_DIR": str(tmp_path_factory.mktemp("pushes"))}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(bundled.ensure_smollm2_cache()), "--served-model-name", "smollm2-135m",
           "--worker-extension-cls", "spadekit.policy.vllm_server.WorkerExtension",
           "--logprobs-mode", "processed_logprobs", "--enforce-eager", "--dtype", "float32",
           "--kv-cache-memory-bytes", str(1 << 30), "--max-model-len", "2048",
           "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as out:
        # its own process group: the server's engine process goes with it (killing only the
        # server left an orphaned EngineCore using CPU and 2.7 GB for the rest of the suite)
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(url + "/version", timeout=5):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                _kill_group(proc, signal.SIGKILL)
                pytest.fail("vllm serve did not start:\n" + log.read_text()[-3000:])
            time.sleep(1)
    yield proc, url + "/v1"
    _kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc, signal.SIGKILL)  # whatever of the group is left


def _kill_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def remote(server, hf):
    policy = load_policy(f"openai:smollm2-135m@{server[1]}", tokenizer=hf.tokenizer, retries=0)
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def original(bundled_original):
    """The weights as loaded; the module must leave ``hf`` on them (checked after it)."""
    return bundled_original


def test_server_logprobs_equal_the_trainers(remote, hf):
    assert {"token_ids", "logprobs"} <= remote.capabilities
    diffs = max_diffs(remote, hf.model, [(0.0, 1.0), (0.6, 1.0)])  # one batch of requests
    assert diffs[(0.0, 1.0)] <= TOL and diffs[(0.6, 1.0)] <= TOL


def test_a_server_push_changes_it_and_the_old_weights_bring_it_back(remote, hf, original):
    before = fingerprint(remote)
    trainer = one_update(hf)
    try:
        stats = push_weights(remote, trainer, version=3)  # verified against the trainer
        assert stats["probe_max_abs_diff"] <= TOL and remote.weights_version == 3
        assert max(abs(a - b) for a, b in zip(before, fingerprint(remote))) > 1e-3
        assert max_diff(remote, hf.model, 0.6) <= TOL
    finally:
        hf.model.load_state_dict(original)
    push_weights(remote, original, verify=hf.model)
    assert fingerprint(remote) == pytest.approx(before, abs=1e-5)


def test_refused_server_pushes_change_nothing(remote, hf, original):
    before, version = fingerprint(remote), remote.weights_version
    with pytest.raises(WeightSyncError, match="shape mismatches"):  # refused before sending
        remote.load_weights({"model.norm.weight": torch.ones(7)})
    wrong = {k: v * 1.02 if v.ndim == 2 else v for k, v in original.items()}
    with pytest.raises(WeightSyncError, match="does not serve the trainer's weights.*restored"):
        push_weights(remote, wrong, verify=hf.model)
    assert fingerprint(remote) == pytest.approx(before, abs=1e-5)
    assert remote.weights_version == version  # the undone push is not counted


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
