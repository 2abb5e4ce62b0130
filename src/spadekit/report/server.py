"""``spadekit serve RUN``: a local, read-only web dashboard that follows a run while it trains.

Routes (GET and HEAD only, else 405): ``/`` (the page, polling ``/api/snapshot``),
``/api/snapshot``, ``/api/env/<sha>``, ``/api/episode/<id>``, ``/api/search?q=TEXT``,
``/favicon.ico``. Malformed parameters are 400, unknown routes and missing items 404, an
unexpected exception a 500 naming only its type; errors are JSON ``{"error": ...}`` and never
carry the run directory's path. Nothing outside the run's database can be reached. Every response
carries the page's Content-Security-Policy, ``nosniff`` and ``no-store``. On loopback (the
default) requests must name a loopback ``Host`` (DNS rebinding); on any other address an API key
is required (``ConfigError`` without one) as Bearer or Basic password, else 401.
:func:`serve_run` blocks; :func:`make_server` returns the server without serving.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hmac
import json
import os
import re
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from spadekit.common.loopback import is_loopback
from spadekit.common.errors import ConfigError
from spadekit.report import data
from spadekit.report.page import content_security_policy, live_page

__all__ = ["DashboardServer", "is_loopback", "make_server", "serve_run"]

_SHA = re.compile(r"[0-9a-fA-F]{8,64}")
_ID = re.compile(r"[0-9]{1,12}")
_NOT_FOUND = ("no environment", "no episode")  # ReportError messages of data.py
_BAD_ID = ("not an", "environment id")


_CLIENT_GONE = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)


def _peer_gone(sock: object) -> bool:
    """Whether the client of ``sock`` closed or reset it (a peek: nothing is read)."""
    if not isinstance(sock, socket.socket):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:  # open, with nothing to read
        return False
    except OSError as exc:
        return isinstance(exc, _CLIENT_GONE) or exc.errno in (errno.ENOTCONN, errno.EBADF)


class _QuietServer(ThreadingHTTPServer):
    """Daemon request threads; a client that resets or closes its connection mid-request (a
    closed tab) is counted in ``disconnects``, not printed; any other error still prints."""

    daemon_threads = True
    disconnects = 0
    _count = threading.Lock()

    def client_left(self, exc: BaseException | None, sock: object) -> bool:
        """Count and say True when ``exc`` is this request's own connection going away."""
        if isinstance(exc, _CLIENT_GONE) and _peer_gone(sock):
            with self._count:
                self.disconnects += 1
            return True
        return False

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not self.client_left(sys.exc_info()[1], request):
            super().handle_error(request, client_address)


class DashboardServer(_QuietServer):
    """The HTTP server; ``url`` is where the dashboard is, ``run_dir`` what it shows."""

    allow_reuse_address = True

    def __init__(self, run_dir: Path, host: str, port: int, poll_ms: int = 3000,
                 quiet: bool = True, api_key: str | None = None) -> None:
        if api_key is not None and not api_key.strip():
            raise ConfigError("the API key is empty")
        if not is_loopback(host) and not api_key:
            raise ConfigError(f"the dashboard would listen on {host or 'every address'}, "
                              "reachable from other machines, without an API key: give one "
                              "with --api-key-file PATH or the SPADEKIT_API_KEY environment "
                              "variable, or bind 127.0.0.1")
        self.api_key = api_key
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host.strip("[]"), port), _Handler)
        self.run_dir = run_dir
        self.loopback = is_loopback(host)
        self.quiet = quiet
        self.page = live_page(poll_ms).encode("utf-8")
        self.csp = content_security_policy(header=True)
        self._lock = threading.Lock()
        self._snapshot: tuple[Any, bytes] | None = None
        self._texts: dict[str, str] = {}
        shown = f"[{host.strip('[]')}]" if ":" in host else host
        self.url = f"http://{shown}:{self.server_address[1]}/"

    def db_state(self) -> tuple:
        """Changes whenever the run commits (the database or its WAL file is written)."""
        out = []
        for name in ("run.sqlite", "run.sqlite-wal"):
            try:
                st = os.stat(self.run_dir / name)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def snapshot_json(self) -> bytes:
        state = self.db_state()
        with self._lock:
            if self._snapshot and self._snapshot[0] == state:
                return self._snapshot[1]
        body = _dumps(data.snapshot(self.run_dir))
        with self._lock:
            self._snapshot = (state, body)
        return body

    def search(self, query: str, limit: int = 2000) -> list[str]:
        """Shas of environments whose code or hint contains ``query`` (case-insensitive);
        code and hint are cached per sha (an environment's text never changes)."""
        query = query.lower()
        envs = json.loads(self.snapshot_json()).get("environments", [])
        hits = []
        with data.RunReader(self.run_dir) as reader:
            for env in envs[:limit]:
                sha = env["sha"]
                text = self._texts.get(sha)
                if text is None:
                    detail = reader.env_detail(sha, 0)["env"]
                    text = ((detail.get("code") or "") + "\n" + (detail.get("hint") or "")).lower()
                    self._texts[sha] = text
                if query in text:
                    hits.append(sha)
        return hits

    def scrub(self, message: str) -> str:
        """``message`` without the run directory's absolute path."""
        for form in {str(self.run_dir), str(self.run_dir.resolve())}:
            message = message.replace(form, self.run_dir.name)
        return message


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "spadekit-dashboard"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._dispatch(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch(head=True)

    def _method_not_allowed(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, _dumps({"error": "read-only: GET or HEAD"}),
                   "application/json", extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = \
        _method_not_allowed

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if not self.server.quiet:
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, ctype: str, head: bool = False,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", self.server.csp)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, status: int, value: Any, head: bool) -> None:
        body = value if isinstance(value, bytes) else _dumps(value)
        self._send(status, body, "application/json; charset=utf-8", head)

    def _host_ok(self) -> bool:
        if not self.server.loopback:
            return True
        host = (self.headers.get("Host") or "").strip()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if host.startswith("[") and "]" in host:
            name = host[:host.index("]") + 1]
        return bool(name) and is_loopback(name)

    def _key_ok(self) -> bool:
        """Whether the request carries the API key (always true without one)."""
        key = self.server.api_key
        if not key:
            return True
        scheme, _, value = (self.headers.get("Authorization") or "").strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "basic":
            try:
                value = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[2]
            except (binascii.Error, UnicodeDecodeError):
                return False
        elif scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(value.encode("utf-8"), key.encode("utf-8"))

    def _dispatch(self, head: bool) -> None:
        if not self._host_ok():
            return self._json(HTTPStatus.BAD_REQUEST, {"error": "unexpected Host header"}, head)
        if not self._key_ok():
            return self._send(HTTPStatus.UNAUTHORIZED, _dumps({"error": "the API key is "
                                                               "required"}),
                              "application/json; charset=utf-8", head,
                              {"WWW-Authenticate": 'Basic realm="spadekit dashboard", '
                                                   'charset="UTF-8"'})
        parts = urlsplit(self.path)
        path = parts.path
        try:
            if path in ("/", "/index.html"):
                return self._send(HTTPStatus.OK, self.server.page, "text/html; charset=utf-8",
                                  head)
            if path == "/favicon.ico":
                return self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon", head)
            if path == "/api/snapshot":
                return self._json(HTTPStatus.OK, self.server.snapshot_json(), head)
            if path.startswith("/api/env/"):
                sha = path[len("/api/env/"):]
                if not _SHA.fullmatch(sha):
                    return self._json(HTTPStatus.BAD_REQUEST, {
                        "error": "environment id must be 8 to 64 hex characters"}, head)
                return self._json(HTTPStatus.OK, data.env_detail(self.server.run_dir,
                                                                 sha.lower()), head)
            if path.startswith("/api/episode/"):
                key = path[len("/api/episode/"):]
                if not _ID.fullmatch(key):
                    return self._json(HTTPStatus.BAD_REQUEST,
                                      {"error": "episode id must be a decimal integer"}, head)
                return self._json(HTTPStatus.OK, data.episode(self.server.run_dir, int(key)),
                                  head)
            if path == "/api/search":
                query = (parse_qs(parts.query).get("q") or [""])[0].strip()
                if not 1 <= len(query) <= 200:
                    return self._json(HTTPStatus.BAD_REQUEST,
                                      {"error": "q must have 1 to 200 characters"}, head)
                return self._json(HTTPStatus.OK, {"q": query,
                                                  "shas": self.server.search(query)}, head)
            return self._json(HTTPStatus.NOT_FOUND, {"error": "no such route"}, head)
        except data.ReportError as exc:
            message = self.server.scrub(exc.message)
            status = (HTTPStatus.NOT_FOUND if message.startswith(_NOT_FOUND)
                      else HTTPStatus.BAD_REQUEST if message.startswith(_BAD_ID)
                      else HTTPStatus.SERVICE_UNAVAILABLE)  # the run itself is unreadable
            return self._json(status, {"error": message}, head)
        except Exception as exc:  # noqa: BLE001 (a request must never kill the server)
            if self.server.client_left(exc, self.connection):  # counted; nobody to answer
                return None
            print(f"spadekit serve: error in {path}:\n{traceback.format_exc()}", file=sys.stderr)
            return self._json(HTTPStatus.INTERNAL_SERVER_ERROR,
                              {"error": f"internal error ({type(exc).__name__})"}, head)


def make_server(run_dir: str | Path, host: str = "127.0.0.1", port: int = 8765,
                poll_ms: int = 3000, quiet: bool = True,
                api_key: str | None = None) -> DashboardServer:
    """A listening (not yet serving) dashboard server; checks the run directory first
    (:class:`~spadekit.report.data.ReportError` when it is not a readable run) and that a
    non-loopback ``host`` comes with an ``api_key`` (``ConfigError``)."""
    run_dir = Path(run_dir)
    with data.RunReader(run_dir):
        pass
    return DashboardServer(run_dir, host, int(port), poll_ms=poll_ms, quiet=quiet,
                           api_key=api_key)


def serve_run(run_dir: str | Path, host: str = "127.0.0.1", port: int = 8765, *,
              ready: Callable[[DashboardServer], Any] | None = None, poll_ms: int = 3000,
              quiet: bool = True, api_key: str | None = None) -> None:
    """Serve the dashboard of ``run_dir`` until ``server.shutdown()`` or Ctrl-C.

    ``ready(server)`` runs once the socket listens (default: print the URL); a non-loopback
    ``host`` needs ``api_key`` (module docstring).
    """
    server = make_server(run_dir, host, port, poll_ms=poll_ms, quiet=quiet, api_key=api_key)
    try:
        if ready is None:
            print(f"spadekit dashboard of {run_dir}: {server.url}", flush=True)
        else:
            ready(server)
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
