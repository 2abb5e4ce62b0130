"""Secrets and files of weight pushes: files pushed to a ``vllm serve`` are private from the
moment they exist, whatever the umask, and the worker extension loads nothing else; every
documented ``vllm serve`` command binds loopback behind ``RequireKey``, which refuses every route
without the key. The live server's side (a real ``vllm serve``: unreachable off loopback, 401
without the key) is in ``test_vllm_server.py``. CPU, seconds."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import stat
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from spadekit.policy import vllm_server, vllm_weights  # noqa: E402
from spadekit.policy.weight_items import WeightSyncError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- pushed files --------------------------------------------------------------------------------

class FakeVLLM(http.server.BaseHTTPRequestHandler):
    """Enough of a dev-mode ``vllm serve`` for a push: records each reload's file modes (at the
    moment the worker would read it) and the Authorization header."""

    seen: list = []

    def log_message(self, *args):
        pass

    def _answer(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        return self._answer({"data": [{"id": "m", "root": "/nonexistent"}]})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/collective_rpc":
            path = Path(json.loads(body)["kwargs"]["path"])
            FakeVLLM.seen.append({"file": mode(path), "folder": mode(path.parent),
                                  "auth": self.headers.get("Authorization")})
        return self._answer({"results": [1]})


def test_files_pushed_to_a_vllm_server_are_private_from_the_start(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm_server.PUSH_DIR_ENV, str(tmp_path / "pushes"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    FakeVLLM.seen = []
    old_umask = os.umask(0)  # the most permissive umask: the modes must not depend on it
    try:
        weights = vllm_server.ServerWeights(f"http://127.0.0.1:{httpd.server_port}/v1",
                                            api_key="the-key")
        assert weights.push({"w": torch.ones(3)}) == 1 and weights.version == 1
    finally:
        os.umask(old_umask)
        httpd.shutdown()
    assert FakeVLLM.seen == [{"file": 0o600, "folder": 0o700, "auth": "Bearer the-key"}]


def test_the_worker_extension_loads_only_private_push_files(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    loaded = []
    monkeypatch.setattr(vllm_weights, "_reload", lambda worker, items: loaded.append(items))
    worker = vllm_server.WorkerExtension()
    public = tmp_path / "public"
    public.mkdir(mode=0o755)
    public.chmod(0o755)
    save_file({"w": torch.ones(2)}, str(public / "model.safetensors"))
    (public / "model.safetensors").chmod(0o644)
    with pytest.raises(WeightSyncError, match="not a private push file"):
        worker.spadekit_reload(str(public / "model.safetensors"))
    (public / "model.safetensors").chmod(0o600)  # a private file in a shared folder: still not
    with pytest.raises(WeightSyncError, match="not a private push file"):
        worker.spadekit_reload(str(public / "model.safetensors"))
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    vllm_weights.save_private({"w": torch.ones(2)}, private / "model.safetensors")
    assert worker.spadekit_reload(str(private / "model.safetensors")) == 1
    assert len(loaded) == 1 and mode(private / "model.safetensors") == 0o600


# -- the documented server -----------------------------------------------------------------------

def documented_vllm_commands() -> dict[str, str]:
    """Each documented ``vllm serve`` command, joined across its continuation lines."""
    found = {}
    sources = {"README.md": (ROOT / "README.md").read_text(),
               "scaling.md": (ROOT / "docs" / "scaling.md").read_text()}
    for name, text in sources.items():
        text = text.replace("\\\n", " ")
        for k, line in enumerate(text.splitlines()):
            if "vllm.entrypoints.openai.api_server" in line or re.search(r"\bvllm serve\b.*--",
                                                                        line):
                found[f"{name}:{k}"] = line
    return found


def test_every_documented_vllm_command_binds_loopback_behind_a_key():
    commands = documented_vllm_commands()
    assert commands, commands  # docs/scaling.md (the README shows `spadekit serve --model`)
    for where, line in commands.items():
        assert "--host 127.0.0.1" in line, where
        assert "--middleware spadekit.policy.vllm_server.RequireKey" in line, where
        assert "--api-key" not in line and "0.0.0.0" not in line, where
    built = " ".join(vllm_server.serve_command("PATH"))
    assert "--host 127.0.0.1" in built and "RequireKey" in built and "--api-key" not in built
    for doc in ("README.md", "docs/scaling.md"):
        assert "0.0.0.0" not in (ROOT / doc).read_text(), doc


def _asgi(middleware, headers):
    """One HTTP request through ``middleware`` around an app that answers 200."""
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "POST", "path": "/collective_rpc", "headers": headers}
    asyncio.run(middleware(app)(scope, receive, send))
    return sent[0]["status"]


def test_require_key_refuses_every_route_without_the_key(monkeypatch):
    monkeypatch.delenv(vllm_server.KEY_ENV, raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY"):
        vllm_server.RequireKey(lambda *a: None)
    monkeypatch.setenv(vllm_server.KEY_ENV, "k3y")
    assert _asgi(vllm_server.RequireKey, []) == 401
    assert _asgi(vllm_server.RequireKey, [(b"authorization", b"Bearer wrong")]) == 401
    assert _asgi(vllm_server.RequireKey, [(b"authorization", b"Basic k3y")]) == 401
    assert _asgi(vllm_server.RequireKey, [(b"authorization", b"Bearer k3y")]) == 200
