"""``stream: true`` for ``spadekit serve``: OpenAI's server-sent events for completions and chat.

A ``Policy`` generates whole sequences (``generate`` returns finished generations), so the
server generates first and then sends the answer as the stream a client expects: one event per
sampled token (``text``/``delta.content`` holding the characters that token completes, with its
logprob entry when logprobs were asked), a last event per choice with ``finish_reason``, a
``usage`` event when ``stream_options.include_usage`` is true, then ``data: [DONE]``. The deltas
of a choice concatenate to exactly the non-streamed text (stop strings cut the same way); a
token that ends inside a multi-byte character sends an empty delta, and the character comes
with the token that completes it. Tokens therefore arrive after the whole generation finished,
not while it runs.

The body goes out with ``Transfer-Encoding: chunked`` over HTTP/1.1, one chunk per event, and
the connection is closed at the end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

REPLACEMENT = "\ufffd"


@dataclass
class EventStream:
    """What a route returns for ``stream: true``: the events to send, in order."""

    events: list[dict[str, Any]] = field(default_factory=list)


def text_deltas(tokenizer: Any, token_ids: list[int], text: str) -> list[str]:
    """One delta per token; their concatenation is ``text`` (module docstring)."""
    deltas, cursor = [], 0
    for k in range(len(token_ids)):
        prefix = tokenizer.decode(token_ids[:k + 1], skip_special_tokens=True)
        if prefix.endswith(REPLACEMENT):  # an incomplete character: wait for the rest
            deltas.append("")
            continue
        end = max(cursor, min(len(prefix), len(text)))
        deltas.append(text[cursor:end])
        cursor = end
    if deltas:
        deltas[-1] += text[cursor:]
    elif text:
        deltas.append(text)
    return deltas


def completion_events(resp: dict, gens: list, server: Any, body: dict) -> EventStream:
    """The events of a streamed ``/v1/completions`` answer ``resp`` (built as if not streamed)."""
    head = {"id": resp["id"], "object": "text_completion", "created": resp["created"],
            "model": resp["model"]}
    out = EventStream()
    for choice, g in zip(resp["choices"], gens):
        lp = choice.get("logprobs")
        deltas = text_deltas(server.policy.tokenizer, list(g.token_ids), choice["text"])
        for k, delta in enumerate(deltas):
            part: dict[str, Any] = {"index": choice["index"], "text": delta, "logprobs": None,
                                    "finish_reason": None}
            if lp is not None and k < len(lp["tokens"]):
                part["logprobs"] = {key: lp[key][k:k + 1] for key in
                                    ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
            if "token_ids" in choice and k < len(choice["token_ids"]):
                part["token_ids"] = choice["token_ids"][k:k + 1]
            out.events.append({**head, "choices": [part]})
        out.events.append({**head, "choices": [{
            "index": choice["index"], "text": "", "logprobs": None,
            "finish_reason": choice["finish_reason"], "stop_reason": choice["stop_reason"]}]})
    _usage(out, head, resp, body)
    return out


def chat_events(resp: dict, gens: list, server: Any, body: dict) -> EventStream:
    """The events of a streamed ``/v1/chat/completions`` answer ``resp``."""
    head = {"id": resp["id"], "object": "chat.completion.chunk", "created": resp["created"],
            "model": resp["model"]}
    out = EventStream()
    for choice, g in zip(resp["choices"], gens):
        index = choice["index"]
        out.events.append({**head, "choices": [{"index": index, "delta": {
            "role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
        entries = (choice.get("logprobs") or {}).get("content")
        deltas = text_deltas(server.policy.tokenizer, list(g.token_ids),
                             choice["message"]["content"])
        for k, delta in enumerate(deltas):
            part: dict[str, Any] = {"index": index, "delta": {"content": delta},
                                    "logprobs": None, "finish_reason": None}
            if entries is not None and k < len(entries):
                part["logprobs"] = {"content": entries[k:k + 1]}
            if "token_ids" in choice and k < len(choice["token_ids"]):
                part["token_ids"] = choice["token_ids"][k:k + 1]
            out.events.append({**head, "choices": [part]})
        out.events.append({**head, "choices": [{
            "index": index, "delta": {}, "logprobs": None,
            "finish_reason": choice["finish_reason"], "stop_reason": choice["stop_reason"]}]})
    _usage(out, head, resp, body)
    return out


def _usage(out: EventStream, head: dict, resp: dict, body: dict) -> None:
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        out.events.append({**head, "choices": [], "usage": resp["usage"]})


def _chunks(stream: EventStream) -> Iterator[bytes]:
    for event in stream.events:
        yield b"data: " + json.dumps(event).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def send_events(handler: Any, stream: EventStream) -> None:
    """Write ``stream`` as ``text/event-stream`` on a ``BaseHTTPRequestHandler``."""
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
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass
