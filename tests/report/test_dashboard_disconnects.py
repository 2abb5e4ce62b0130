"""The dashboard's threaded server (``spadekit.report.server``): a client that resets its
connection, while the server reads its request or writes the answer, is counted and prints nothing; a connection error that is
not its client's (a handler's own broken pipe) and any other exception in a request thread
still print their traceback; the server goes on serving. Real sockets on loopback."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from spadekit.report.server import _peer_gone as peer_gone
from spadekit.report.server import _QuietServer as QuietHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/bug":
            raise ValueError("a real bug in a handler")
        if self.path == "/own-pipe":  # a handler's own pipe breaks; its client is still there
            r, w = os.pipe()
            os.close(r)
            try:
                os.write(w, b"x")
            finally:
                os.close(w)
        self.send_response(200)
        if self.path == "/endless":  # writes until the client is gone (HTTP/1.0: no length)
            self.end_headers()
            for _ in range(1024):
                self.wfile.write(b"x" * (1 << 20))
            return
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


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


def stderr_until(capfd, text: str) -> str:
    err: list[str] = []
    wait_for(lambda: err.append(capfd.readouterr().err) or text in "".join(err))
    return "".join(err)


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
    sock.sendall(b"GET /endless HTTP/1.0\r\n\r\n")
    sock.recv(1024)  # the answer has begun, and goes on until a write fails
    reset(sock)
    wait_for(lambda: server.disconnects == 1)
    assert get(server, "/").endswith(b"ok")
    assert "Traceback" not in capfd.readouterr().err


def test_a_broken_pipe_that_is_not_the_client_still_prints(server, capfd):
    get(server, "/own-pipe")
    assert "BrokenPipeError" in stderr_until(capfd, "BrokenPipeError")
    assert server.disconnects == 0
    assert get(server, "/").endswith(b"ok")


def test_any_other_exception_still_prints_its_traceback(server, capfd):
    get(server, "/bug")  # the connection closes without an answer
    stderr_until(capfd, "ValueError: a real bug")
    assert server.disconnects == 0
    assert get(server, "/").endswith(b"ok")


def test_only_a_closed_or_reset_connection_counts_as_a_client_that_went_away(server):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server_side = listener.accept()[0]
        client.close()
        wait_for(lambda: peer_gone(server_side))
        for other in (None, ValueError(), OSError(), TimeoutError(), ConnectionRefusedError()):
            assert not server.client_left(other, server_side)
        assert server.disconnects == 0
        for gone in (ConnectionResetError(), BrokenPipeError(), ConnectionAbortedError()):
            assert server.client_left(gone, server_side)
        assert server.disconnects == 3
        server_side.close()


def test_peer_gone_tells_an_open_connection_from_a_closed_or_reset_one():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def pair():
            client = socket.create_connection(listener.getsockname())
            return client, listener.accept()[0]

        client, server_side = pair()
        assert not peer_gone(server_side)  # open, nothing sent
        client.sendall(b"x")
        time.sleep(0.05)
        assert not peer_gone(server_side) and server_side.recv(1) == b"x"  # peeked, not taken
        client.close()
        wait_for(lambda: peer_gone(server_side))  # closed: end of stream
        server_side.close()
        client, server_side = pair()
        reset(client)
        wait_for(lambda: peer_gone(server_side))  # reset
        server_side.close()
    assert not peer_gone(None) and not peer_gone("not a socket")
