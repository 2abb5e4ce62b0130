"""``stream: true`` for ``spadekit serve``: OpenAI's server-sent events for completions and chat.

Tokens go out as they are produced (:class:`LiveStream`): the route submits its sequences to the
batcher with a watcher (``serve_batch``: per token from the ``hf`` sampler and vLLM, per short
slice from other policies), and the handler writes each event as soon as it is made. Per choice:
the chat role event first (chat), then one event per batch of new tokens with the text those
tokens complete (``text``/``delta.content``), their logprob entries when logprobs were asked and
their ``token_ids`` when asked; then the rest of the text with the choice's ``finish_reason``.
Last a ``usage`` event when ``stream_options.include_usage`` is true, then ``data: [DONE]``.

The deltas of a choice concatenate to exactly the non-streamed text (:class:`StreamText`): the
text of the tokens so far is cut at a stop string the way the answer is, and the last characters
that could still be part of a stop string (as many as the longest stop has) are held back, as is
a character whose bytes have not all arrived (U+FFFD). The closing event carries the difference
to the finished answer, built by the same code as the non-streamed one.

A client that goes away mid-stream (the write fails) cancels its request: its sequences leave the
batcher's line, so the slot goes to the others (``stats()["cancelled"]``). An error after the
headers went out is an ``{"error": ...}`` event before ``[DONE]``; so is a cancel that the
stream did not make (the server closing while it streams).

The body goes out with ``Transfer-Encoding: chunked`` over HTTP/1.1, one chunk per event, and
the connection is closed at the end.
"""

from __future__ import annotations

import json
import queue
import time
from typing import Any, Callable, Iterable, Iterator

from spadekit.common.http_server import client_went_away

REPLACEMENT = "\ufffd"


def _chunks(events: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    try:
        for event in events:
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
    except Exception as exc:  # the headers are out: the error is the stream's last event
        event = _error_event(f"internal error: {type(exc).__name__}: {exc}")
        yield b"data: " + json.dumps(event).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def send_events(handler: Any, stream: "LiveStream") -> None:
    """Write ``stream`` as ``text/event-stream`` on a ``BaseHTTPRequestHandler``, each event as
    soon as it is made; a client gone mid-stream cancels the request."""
    handler.close_connection = True
    try:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Connection", "close")
        handler.end_headers()
        for data in _chunks(stream):
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()
    except OSError as exc:  # broken pipe, reset, timeout: the client is gone
        if client_went_away(exc):
            handler.server.count_disconnect()
        stream.cancel()


class StreamText:
    """The text deltas of one streamed choice (module docstring): :meth:`partial` with the
    visible text of the tokens so far, :meth:`final` with the finished answer's text."""

    def __init__(self, stops: Iterable[str]) -> None:
        self.hold = max((len(x) for x in stops), default=0)
        self.sent = ""

    def partial(self, text: str) -> str:
        bad = text.find(REPLACEMENT)
        end = (len(text) if bad < 0 else bad) - self.hold
        if end <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta = text[len(self.sent):end]
        self.sent += delta
        return delta

    def final(self, text: str) -> str:
        """The rest of ``text``; ``ValueError`` if what was sent is not its beginning (a
        tokenizer whose decoding of a prefix is not a prefix of the decoding)."""
        if not text.startswith(self.sent):
            raise ValueError(f"streamed text {self.sent[-40:]!r} is not a prefix of the answer")
        delta = text[len(self.sent):]
        self.sent = text
        return delta


class LiveStream:
    """The events of a streamed answer, made as the tokens come (module docstring).

    ``submit(watch)`` queues the sequences and returns the batcher's ticket; ``answer(gens)``
    builds the whole (non-streamed) answer from the finished generations; ``part(i, k0, k1,
    tokens, logprobs)`` is the logprob/token-id fields of tokens ``k0:k1`` of choice ``i``;
    ``visible(tokens)`` the text of the tokens so far."""

    def __init__(self, kind: str, head: dict[str, Any], n: int, stops: Iterable[str],
                 submit: Callable[[Callable], Any], answer: Callable[[list], dict],
                 part: Callable[[int, int, int, list[int], list[float] | None], dict],
                 visible: Callable[[list[int]], str], body: dict, timeout: float) -> None:
        self.kind, self.head, self.n, self.body = kind, head, n, body
        self.answer, self.part, self.visible = answer, part, visible
        self.texts = [StreamText(stops) for _ in range(n)]
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float] | None] = [[] for _ in range(n)]
        self.sent_tokens = [0] * n
        self.deadline = time.monotonic() + timeout
        self._q: queue.Queue = queue.Queue()
        self.ticket = submit(lambda i, toks, lps: self._q.put(("part", i, toks, lps)))
        for i, fut in enumerate(self.ticket.futures):
            fut.add_done_callback(lambda f, i=i: self._q.put(("done", i, f)))
        self.first_token_at: float | None = None
        self.cancelled_by_us = False

    def cancel(self) -> None:
        self.cancelled_by_us = True
        self.ticket.cancel()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        chat = self.kind == "chat"
        if chat:
            for i in range(self.n):
                yield self._event(i, {"delta": {"role": "assistant", "content": ""}})
        gens: list[Any] = [None] * self.n
        left = self.n
        while left:
            try:
                item = self._q.get(timeout=max(0.0, self.deadline - time.monotonic()))
            except queue.Empty:
                self.cancel()
                yield _error_event("generation took longer than the request timeout")
                return
            if item[0] == "part":
                _, i, toks, lps = item
                self.tokens[i] += toks
                if self.logprobs[i] is not None and lps is not None:
                    self.logprobs[i] += lps
                else:
                    self.logprobs[i] = None
                event = self._partial(i)
                if event is not None:
                    yield event
                continue
            _, i, fut = item
            if fut.cancelled():
                if self.cancelled_by_us:
                    return  # our own cancel: the client is gone
                # cancelled by someone else (the server closing, the batcher stopping): the
                # client is still there and must not read a stream that just ends
                yield _error_event("generation was cancelled: the server is shutting down")
                return
            exc = fut.exception()
            if exc is not None:
                self.cancel()
                yield _error_event(f"generation failed: {exc}")
                return
            gens[i] = fut.result()
            left -= 1
        out = self.answer(gens)
        for choice, g in zip(out["choices"], gens):
            i = choice["index"]
            text = choice["message"]["content"] if chat else choice["text"]
            try:
                rest = self.texts[i].final(text)
            except ValueError as exc:
                yield _error_event(str(exc))
                return
            fields = self.part(i, self.sent_tokens[i], len(g.token_ids), list(g.token_ids),
                               g.logprobs)
            if rest or fields:
                yield self._event(i, self._delta(rest), **fields)
            yield self._event(i, {"delta": {}} if chat else {"text": ""},
                              finish_reason=choice["finish_reason"],
                              stop_reason=choice["stop_reason"])
        options = self.body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            yield {**self.head, "choices": [], "usage": out["usage"]}

    def _partial(self, i: int) -> dict[str, Any] | None:
        delta = self.texts[i].partial(self.visible(self.tokens[i]))
        k0, k1 = self.sent_tokens[i], len(self.tokens[i])
        fields = self.part(i, k0, k1, self.tokens[i], self.logprobs[i])
        self.sent_tokens[i] = k1
        if not delta and not fields:
            return None
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        return self._event(i, self._delta(delta), **fields)

    def _delta(self, text: str) -> dict[str, Any]:
        return {"delta": {"content": text}} if self.kind == "chat" else {"text": text}

    def _event(self, index: int, content: dict[str, Any], finish_reason: str | None = None,
               stop_reason: str | None = None, **fields: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, **content, "logprobs": None,
                                  "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        choice.update(fields)
        return {**self.head, "choices": [choice]}


def _error_event(message: str) -> dict[str, Any]:
    return {"object": "error", "error": {"message": message, "type": "server_error",
                                         "param": None, "code": 500}}
