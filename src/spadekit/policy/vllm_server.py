"""A real ``vllm serve`` as a generation engine that takes weight pushes (``openai:MODEL@URL``).

``serve_command`` builds the documented server: vLLM's dev mode (``VLLM_SERVER_DEV_MODE=1``) on
loopback, ``RequireKey`` (every route, dev-mode ones included, needs ``Authorization: Bearer
$VLLM_API_KEY``; without the variable the server does not start), spadekit's ``WorkerExtension``
and the logprobs the trainer recomputes. ``ServerWeights`` is the push side an ``OpenAIPolicy``
holds: names and shapes checked against the server's checkpoint before anything is sent, chunks
staged, then one private safetensors file (0700 folder, 0600 file) loaded by every worker through
``/collective_rpc`` (``spadekit_reload``, which loads only such files of its own user) and the
prefix cache reset; ``restore`` goes back to the checkpoint plus the confirmed pushes. Failures
are ``WeightSyncError``. Setup and the reasons: docs/scaling.md ("vLLM server").
"""

from __future__ import annotations

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
                  python: str = "python", extra: list[str] | None = None,
                  weight_updates: bool = True, key: bool = True) -> list[str]:
    """The documented ``vllm serve`` command as an argv list: with ``key``, every route behind
    ``RequireKey`` (``VLLM_API_KEY`` in the environment, never in argv); with
    ``weight_updates``, spadekit's worker extension (run it with ``VLLM_SERVER_DEV_MODE=1``)."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", host, "--port", str(int(port)),
            *(["--middleware", "spadekit.policy.vllm_server.RequireKey"] if key else []),
            *(["--worker-extension-cls", "spadekit.policy.vllm_server.WorkerExtension"]
              if weight_updates else []),
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


class ServerWeights:
    """The weights of one ``vllm serve`` started as ``serve_command`` does: ``push`` (staged
    chunks, applied at ``final``), ``confirm`` (the last push stands), ``restore`` (undo the
    unconfirmed push) and ``version`` (the last push's, or a count). ``timeout`` bounds the
    connection and every answer, a reload's answer by at least 600 s (a large model)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 120.0,
                 name: str | None = None) -> None:
        base = base_url.rstrip("/")
        self.root = base[:-3] if base.endswith("/v1") else base
        self.name = name or self.root
        self.api_key, self.timeout = api_key, float(timeout)
        self.version: int = 0
        self.last_push_s = 0.0
        self._staged: list[tuple[str, Any]] = []
        self._pending: tuple[Path, set[str], int] | None = None
        self._confirmed: list[tuple[Path, set[str]]] = []
        self._shapes: dict[str, tuple[int, ...]] | None = None

    def _call(self, method: str, path: str, body: dict | None = None,
              timeout: float | None = None) -> Any:
        import httpx2

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            resp = httpx2.request(method, self.root + path, json=body, headers=headers,
                                  timeout=httpx2.Timeout(timeout or self.timeout,
                                                         connect=self.timeout))
        except httpx2.HTTPError as exc:
            raise WeightSyncError(f"{self.root}{path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code == 404 and path == "/collective_rpc":
            raise WeightSyncError(f"{self.root} refuses weight pushes (no /collective_rpc: start "
                                  "vllm serve with VLLM_SERVER_DEV_MODE=1)", status=404)
        if resp.status_code >= 400:
            raise WeightSyncError(f"{self.root}{path}: HTTP {resp.status_code}: "
                                  f"{resp.text[:300]}", status=resp.status_code)
        try:
            return resp.json() if resp.content else None
        except ValueError:
            return resp.text[:300]

    def _rpc(self, method: str, **kwargs: str) -> None:
        self._call("POST", "/collective_rpc", {"method": method, "kwargs": kwargs},
                   timeout=max(self.timeout, 600.0))

    def _checkpoint(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the server's checkpoint, when its directory is local."""
        if self._shapes is None:
            from spadekit.policy.vllm_weights import checkpoint_shapes

            body = self._call("GET", "/v1/models")
            data = body.get("data") if isinstance(body, dict) else None
            roots = [m.get("root") for m in data if isinstance(m, dict)] \
                if isinstance(data, list) else []
            local = [r for r in roots if isinstance(r, str) and os.path.isdir(r)]
            self._shapes = checkpoint_shapes(local[0]) if local else {}
        return self._shapes

    def _apply(self, path: Path) -> None:
        self._rpc("spadekit_reload", path=str(path))
        self._call("POST", "/reset_prefix_cache")

    def push(self, weights: Any, *, final: bool = True, version: int | None = None) -> int:
        """Stage ``weights``; at ``final`` check everything staged, write it to a private file
        and load it on every worker. How many tensors were loaded (0 for a staged chunk)."""
        from spadekit.policy.vllm_weights import check_items, save_private, without_tied_head

        self._staged += as_items(weights)
        if not final:
            return 0
        items, self._staged = self._staged, []
        if not items:
            return 0
        shapes = self._checkpoint()
        items = without_tied_head(items, shapes)
        check_items(items, shapes, self.name)
        self.confirm()  # the previous push was not undone: it stands
        root = os.environ.get(PUSH_DIR_ENV) or tempfile.gettempdir()
        os.makedirs(root, mode=0o700, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=PUSH_PREFIX, dir=root)) / "model.safetensors"
        save_private({n: t.detach().to("cpu").contiguous() for n, t in items}, path)
        self._pending = (path, {n for n, _ in items}, self.version)
        t0 = time.perf_counter()
        try:
            self._apply(path)
        except WeightSyncError as exc:
            try:
                self.restore()
                note = "the previous weights were restored"
            except Exception as again:
                note = f"restoring the previous weights failed too ({type(again).__name__}: " \
                       f"{again})"
            raise WeightSyncError(f"{exc.message}; {note}", status=exc.status) from exc
        self.version = int(version) if version is not None else self.version + 1
        self.last_push_s = time.perf_counter() - t0
        return len(items)

    def confirm(self) -> None:
        """The last push stands: restores re-apply it; files it fully supersedes are deleted."""
        if self._pending is None:
            return
        path, names, _ = self._pending
        self._pending = None
        keep = []
        for old, old_names in self._confirmed:
            if old_names <= names:
                _remove(old)
            else:
                keep.append((old, old_names))
        self._confirmed = keep + [(path, names)]

    def restore(self) -> None:
        """Undo the unconfirmed push: the checkpoint, then every confirmed push again."""
        pending, self._pending = self._pending, None
        self._rpc("spadekit_restore")
        for path, _ in self._confirmed:
            self._apply(path)
        self._call("POST", "/reset_prefix_cache")
        if pending is not None:
            _remove(pending[0])
            self.version = pending[2]  # the undone push never happened

    def cannot_restore(self) -> str | None:
        """Why ``restore`` could not undo a push (None: it can, once the server answers)."""
        try:
            body = self._call("GET", "/version")
        except WeightSyncError as exc:
            return f"the server does not answer ({exc.message})"
        if not (isinstance(body, dict) and isinstance(body.get("version"), str)):
            return "its GET /version is not vLLM's ({\"version\": ...})"
        return None


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
        path.parent.rmdir()
    except OSError:
        pass
