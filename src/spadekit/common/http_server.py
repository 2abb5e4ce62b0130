"""The threaded HTTP server both of the project's servers build on (``spadekit serve`` for a
model, and for a run's dashboard): a client that goes away mid-request is counted, not printed.

The standard library's server prints a full traceback to stderr for every exception a request
thread raises, and a client that resets its connection (a closed browser tab, a curl stopped
with Ctrl-C, a proxy's health probe) raises ``ConnectionResetError`` or ``BrokenPipeError`` in
the thread reading or writing it: a console full of tracebacks that are not errors. Those are
counted in ``disconnects``; any other exception still prints its traceback, as before.
Standard library only.
"""

from __future__ import annotations

import sys
import threading
from http.server import ThreadingHTTPServer

__all__ = ["QuietHTTPServer", "client_went_away"]


def client_went_away(exc: BaseException | None) -> bool:
    """Whether ``exc`` only says the other end closed or reset the connection."""
    return isinstance(exc, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError))


class QuietHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with daemon request threads whose clients may leave quietly."""

    daemon_threads = True
    disconnects = 0
    """Requests whose client reset or closed the connection while it was served."""
    _count = threading.Lock()

    def handle_error(self, request, client_address) -> None:
        if client_went_away(sys.exc_info()[1]):
            with self._count:
                self.disconnects += 1
            return
        super().handle_error(request, client_address)
