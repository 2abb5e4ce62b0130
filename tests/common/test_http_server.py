"""``spadekit.common.http_server``: a client that resets its connection, while the server reads
its request or writes the answer, is counted and prints nothing; any other exception in a
request thread still prints its traceback; the server goes on serving. Real sockets on
loopback."""

from __future__ import annotations

import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from spadekit.common.http_server import QuietHTTPServer, client_went_away


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/bug":
            raise ValueError("a real bug in a handler")
        body = b"x" * (8 << 20) if self.path == "/big" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server():
    srv = QuietHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(10)


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset (linger 0), as a killed client or a proxy does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def get(srv, path: str) -> bytes:
    with socket.create_connection(srv.server_address[:2], timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def wait_for(check, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_a_client_that_resets_while_the_request_is_read_is_counted_not_printed(server, capfd):
    sock = socket.create_connection(server.server_address[:2])
    sock.sendall(b"GET / HTT")  # half a request line: the thread waits in readline
    time.sleep(0.2)
    reset(sock)
    wait_for(lambda: server.disconnects == 1)
    assert get(server, "/").endswith(b"ok")
    assert "Traceback" not in capfd.readouterr().err


def test_a_client_that_resets_while_the_answer_is_written_is_counted_not_printed(server, capfd):
    sock = socket.create_connection(server.server_address[:2])
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"GET /big HTTP/1.0\r\n\r\n")
    sock.recv(1024)  # the answer has begun; 8 MB cannot fit in the socket buffers
    reset(sock)
    wait_for(lambda: server.disconnects == 1)
    assert get(server, "/").endswith(b"ok")
    assert "Traceback" not in capfd.readouterr().err


def test_any_other_exception_still_prints_its_traceback(server, capfd):
    get(server, "/bug")  # the connection closes without an answer
    err: list[str] = []
    wait_for(lambda: err.append(capfd.readouterr().err) or "ValueError: a real bug" in "".join(err))
    assert server.disconnects == 0
    assert get(server, "/").endswith(b"ok")


def test_only_a_closed_or_reset_connection_counts_as_a_client_that_went_away():
    for gone in (ConnectionResetError(), BrokenPipeError(), ConnectionAbortedError()):
        assert client_went_away(gone)
    for other in (None, ValueError(), OSError(), TimeoutError(), ConnectionRefusedError()):
        assert not client_went_away(other)
