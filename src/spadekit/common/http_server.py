"""The threaded HTTP server both of the project's servers build on (``spadekit serve`` for a
model, and for a run's dashboard): a client that goes away mid-request is counted, not printed.

The standard library's server prints a full traceback to stderr for every exception a request
thread raises, and a client that resets its connection (a closed browser tab, a curl stopped
with Ctrl-C, a proxy's health probe) raises ``ConnectionResetError`` or ``BrokenPipeError`` in
the thread reading or writing it: a console full of tracebacks that are not errors.

``disconnects`` counts the connections a client reset or closed while the server read a
request, wrote an answer or streamed one, or waited on an idle keep-alive connection. The
request handlers count the cases they catch themselves (``count_disconnect``); one that reaches
the server's ``handle_error`` is counted only when its socket is really gone, so a handler bug
that raises ``BrokenPipeError`` on some other pipe still prints its traceback, as does any
other exception. Standard library only.
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
from http.server import ThreadingHTTPServer

__all__ = ["CLIENT_GONE", "QuietHTTPServer", "client_went_away", "peer_gone"]

CLIENT_GONE = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
"""What reading or writing a connection raises once its other end closed or reset it."""


def client_went_away(exc: BaseException | None) -> bool:
    """Whether ``exc`` says that a connection was closed or reset by its other end."""
    return isinstance(exc, CLIENT_GONE)


def peer_gone(sock: object) -> bool:
    """Whether the client of ``sock`` has closed or reset it (a look without reading: bytes
    the client sent stay unread)."""
    if not isinstance(sock, socket.socket):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:  # open, with nothing to read
        return False
    except OSError as exc:
        return isinstance(exc, CLIENT_GONE) or exc.errno in (errno.ENOTCONN, errno.EBADF)


class QuietHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with daemon request threads whose clients may leave quietly."""

    daemon_threads = True
    disconnects = 0
    """Connections a client reset or closed before the server was done with them (above)."""
    _count = threading.Lock()

    def count_disconnect(self) -> None:
        with self._count:
            self.disconnects += 1

    def client_left(self, exc: BaseException | None, sock: object) -> bool:
        """Count and say True when ``exc`` is a closed or reset connection and ``sock``, the
        request's own, is the one that is gone; False for anything else (a real error)."""
        if client_went_away(exc) and peer_gone(sock):
            self.count_disconnect()
            return True
        return False

    def handle_error(self, request, client_address) -> None:
        if not self.client_left(sys.exc_info()[1], request):
            super().handle_error(request, client_address)
