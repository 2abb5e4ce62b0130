"""Weight pushes to a real ``vllm serve``, for ``openai:MODEL@URL`` generation engines.

Start the server on the same machine (or with a filesystem both sides see, as the same user) in
vLLM's dev mode, on loopback, behind a key, with spadekit's worker extension and the logprobs the
trainer recomputes::

    export VLLM_API_KEY="$(cat ~/.config/spadekit/vllm.key)"   # a secret file (chmod 600)
    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model PATH \\
        --host 127.0.0.1 --port 8000 --middleware spadekit.policy.vllm_server.RequireKey \\
        --worker-extension-cls spadekit.policy.vllm_server.WorkerExtension \\
        --logprobs-mode processed_logprobs [--enforce-eager --dtype float32 on CPU]

and give the client the same key in env ``OPENAI_API_KEY`` (``OpenAIPolicy`` sends it on every
call, the push routes too). Why each part: without ``--host`` vLLM listens on every interface,
and dev mode adds ``/collective_rpc`` (any worker method, with any argument) and
``/reset_prefix_cache``, which vLLM's own ``--api-key`` does not guard (it guards ``/v1`` only);
``RequireKey`` refuses every route without ``Authorization: Bearer $VLLM_API_KEY`` (401), and a
server started without the variable does not start. The key stays out of the command line
(``--api-key`` is visible to every user in ``ps``). Another machine reaches the server through an
SSH tunnel (``ssh -N -L 8000:127.0.0.1:8000 gen-host``), never by binding 0.0.0.0. ``serve_command``
builds this command. (``python -m``: the ``vllm`` console script of the CPU build does not start.)

A push (``OpenAIPolicy.load_weights``, through ``push_weights``) is recognised by the server's
``GET /version``; chunks are staged here, and the final one writes one safetensors file in a
private folder (0700, the file 0600, never readable by other users: ``vllm_weights.save_private``)
under ``$SPADEKIT_VLLM_PUSH_DIR`` (default: the system temp directory) and asks every worker to
load it: ``POST /collective_rpc {"method": "spadekit_reload", "kwargs": {"path": FILE}}`` (the
extension, which loads only such private files of its own user: the in-place
``reload_weights``, then the tied output layer tied again, ``vllm_weights``), then
``POST /reset_prefix_cache``. A server without the extension gets vLLM's own
``reload_weights`` with ``weights_path`` (a directory holding the file); the check after the push
(``weight_probe``) then catches what that reload misses (a tied ``lm_head`` keeps the old
embeddings: it fails loudly). Before anything is sent the names and shapes are checked against
the server's checkpoint (its model directory, from ``GET /v1/models``, when it is local).

Undo: ``restore(policy)`` reloads the checkpoint and re-applies the confirmed pushes' files;
``confirm(policy)`` (after a passed check) makes the last push one of them and deletes files it
supersedes. Without ``VLLM_SERVER_DEV_MODE=1`` the server answers 404 and the push is refused
with ``WeightSyncError`` before anything changed.
"""

from __future__ import annotations

import http.client
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from spadekit.policy.weight_items import WeightSyncError, as_items

PUSH_DIR_ENV = "SPADEKIT_VLLM_PUSH_DIR"
KEY_ENV = "VLLM_API_KEY"
PUSH_PREFIX = "spadekit-vllm-push-"


def serve_command(model: str, *, port: int = 8000, host: str = "127.0.0.1",
                  python: str = "python", extra: list[str] | None = None) -> list[str]:
    """The documented ``vllm serve`` command (module docstring) as an argv list; run it with
    ``VLLM_SERVER_DEV_MODE=1`` and ``VLLM_API_KEY`` in the environment (never in argv)."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", host, "--port", str(int(port)),
            "--middleware", "spadekit.policy.vllm_server.RequireKey",
            "--worker-extension-cls", "spadekit.policy.vllm_server.WorkerExtension",
            "--logprobs-mode", "processed_logprobs", *(extra or [])]


class RequireKey:
    """ASGI middleware for ``vllm serve --middleware``: every HTTP request (every route, dev-mode
    ones included) needs ``Authorization: Bearer $VLLM_API_KEY``, else 401; WebSockets without
    it are closed. Refuses to build (the server does not start) without the variable."""

    def __init__(self, app: Any) -> None:
        import hashlib

        key = os.environ.get(KEY_ENV, "")
        if not key.strip():
            raise RuntimeError(f"spadekit RequireKey: set {KEY_ENV} (a secret; read it from a "
                               "private file) before starting the server")
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    def _allowed(self, scope: dict) -> bool:
        import hashlib
        import hmac

        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, given = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    hashlib.sha256(given.strip().encode()).digest(), self._digest)
        return False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            body = json.dumps({"error": {"message": "missing or wrong API key (Authorization: "
                                                    "Bearer ...)", "code": 401}}).encode()
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": body})


class WorkerExtension:
    """Methods added to vLLM's workers by ``--worker-extension-cls`` (called by name through
    ``/collective_rpc``; arguments are strings)."""

    def spadekit_reload(self, path: str) -> int:
        from safetensors.torch import load_file

        from spadekit.policy.vllm_weights import _reload, check_private

        check_private(path)  # a push file of this user, nothing else on the server's disk
        items = list(load_file(path).items())
        _reload(self, items)
        return len(items)

    def spadekit_restore(self) -> str:
        from spadekit.policy.vllm_weights import _reload

        _reload(self, None)
        return "ok"


def _root(policy: Any) -> str:
    base = policy.base_url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def _call(policy: Any, method: str, path: str, body: dict | None = None,
          timeout: float = 600.0) -> tuple[int, Any]:
    parts = policy._scheme, policy._host, policy._port
    conn = (http.client.HTTPSConnection if parts[0] == "https" else
            http.client.HTTPConnection)(parts[1], parts[2], timeout=timeout)
    prefix = policy._path[:-3] if policy._path.endswith("/v1") else policy._path
    try:
        key = getattr(policy, "api_key", None)
        conn.request(method, prefix + path, body=json.dumps(body).encode() if body else None,
                     headers={"Content-Type": "application/json", "Connection": "close",
                              **({"Authorization": f"Bearer {key}"} if key else {})})
        resp = conn.getresponse()
        raw = resp.read()
    except OSError as exc:
        raise WeightSyncError(f"{_root(policy)}{path}: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw) if raw else None
    except ValueError:
        return resp.status, raw[:300].decode("utf-8", "replace")


def is_vllm(policy: Any) -> bool:
    """Whether the server behind ``policy`` is vLLM (its ``GET /version``); cached."""
    known = getattr(policy, "_vllm_server", None)
    if known is None:
        try:
            status, body = _call(policy, "GET", "/version", timeout=30)
            known = status == 200 and isinstance(body, dict) and "version" in body
        except WeightSyncError:
            known = False
        policy._vllm_server = known
    return known


def _state(policy: Any) -> dict[str, Any]:
    state = getattr(policy, "_vllm_push", None)
    if state is None:
        state = policy._vllm_push = {"staged": [], "pending": None, "confirmed": [],
                                     "method": None, "shapes": None, "model_dir": None}
    return state


def _server_checkpoint(policy: Any, state: dict) -> None:
    if state["shapes"] is not None:
        return
    from spadekit.policy.vllm_weights import checkpoint_shapes

    status, body = _call(policy, "GET", "/v1/models", timeout=30)
    roots = [m.get("root") for m in (body or {}).get("data", []) if isinstance(m, dict)] \
        if status == 200 and isinstance(body, dict) else []
    local = [r for r in roots if isinstance(r, str) and os.path.isdir(r)]
    state["model_dir"] = local[0] if local else None
    state["shapes"] = checkpoint_shapes(local[0]) if local else {}


def _rpc(policy: Any, method: str, kwargs: dict[str, str]) -> Any:
    status, body = _call(policy, "POST", "/collective_rpc", {"method": method,
                                                             "kwargs": kwargs})
    if status == 404:
        raise WeightSyncError(f"{_root(policy)} refuses weight pushes (no /collective_rpc: "
                              "start vllm serve with VLLM_SERVER_DEV_MODE=1)", status=404)
    if status >= 400:
        raise WeightSyncError(f"{_root(policy)}: {method} failed: HTTP {status}: "
                              f"{str(body)[:300]}", status=status)
    return body


def _apply(policy: Any, state: dict, path: Path) -> None:
    if state["method"] in (None, "spadekit_reload"):
        try:
            _rpc(policy, "spadekit_reload", {"path": str(path)})
            state["method"] = "spadekit_reload"
        except WeightSyncError as exc:
            if state["method"] is not None or exc.status in (0, 404):
                raise
            state["method"] = "reload_weights"  # no worker extension on this server
    if state["method"] == "reload_weights":
        _rpc(policy, "reload_weights", {"weights_path": str(path.parent)})
    _call(policy, "POST", "/reset_prefix_cache", timeout=60)


def push(policy: Any, weights: Any, *, final: bool = True, version: int | None = None) -> int:
    """``OpenAIPolicy.load_weights`` for a vLLM server (module docstring); returns how many
    tensors were loaded (0 for a staged chunk)."""
    from spadekit.policy.vllm_weights import check_items, save_private

    state = _state(policy)
    state["staged"] += as_items(weights)
    if not final:
        return 0
    items, state["staged"] = state["staged"], []
    if not items:
        return 0
    _server_checkpoint(policy, state)
    names = {n for n, _ in items}
    if state["shapes"] and "lm_head.weight" not in state["shapes"] \
            and {"lm_head.weight", "model.embed_tokens.weight"} <= names:
        items = [(n, t) for n, t in items if n != "lm_head.weight"]  # tied: follows the embed
    check_items(items, state["shapes"] or {}, policy.name)
    confirm(policy)  # the previous push was not undone: it stands
    root = os.environ.get(PUSH_DIR_ENV) or tempfile.gettempdir()
    os.makedirs(root, mode=0o700, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=PUSH_PREFIX, dir=root))  # 0700 from the start
    path = folder / "model.safetensors"
    save_private({n: t.detach().to("cpu").contiguous() for n, t in items}, path)
    state["pending"] = (path, set(n for n, _ in items), getattr(policy, "weights_version", 0))
    t0 = time.perf_counter()
    try:
        _apply(policy, state, path)
    except WeightSyncError as exc:
        note = _restore_note(policy)
        raise WeightSyncError(f"{exc.message}; {note}", status=exc.status) from exc
    policy.weights_version = int(version) if version is not None else \
        int(getattr(policy, "weights_version", 0) or 0) + 1
    policy.last_push_s = time.perf_counter() - t0
    return len(items)


def confirm(policy: Any) -> None:
    """The last push stands: restores re-apply it; files it fully supersedes are deleted."""
    state = _state(policy)
    if state["pending"] is None:
        return
    path, names, _ = state["pending"]
    state["pending"] = None
    keep = []
    for old, old_names in state["confirmed"]:
        if old_names <= names:
            _remove(old)
        else:
            keep.append((old, old_names))
    state["confirmed"] = keep + [(path, names)]


def restore(policy: Any) -> None:
    """Undo the unconfirmed push: the checkpoint, then every confirmed push again."""
    state = _state(policy)
    pending, state["pending"] = state["pending"], None
    if state["method"] == "reload_weights":
        if not state["model_dir"]:
            raise WeightSyncError(f"{_root(policy)}: cannot restore: the server's checkpoint "
                                  "directory is not known here")
        _rpc(policy, "reload_weights", {"weights_path": state["model_dir"]})
    else:
        _rpc(policy, "spadekit_restore", {})
    for path, _ in state["confirmed"]:
        _apply(policy, state, path)
    _call(policy, "POST", "/reset_prefix_cache", timeout=60)
    if pending is not None:
        _remove(pending[0])
        policy.weights_version = pending[2]  # the undone push never happened


def _restore_note(policy: Any) -> str:
    try:
        restore(policy)
        return "the previous weights were restored"
    except Exception as exc:
        return f"restoring the previous weights failed too ({type(exc).__name__}: {exc})"


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
        path.parent.rmdir()
    except OSError:
        pass
