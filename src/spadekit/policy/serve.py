"""A small OpenAI-compatible HTTP server in front of any spadekit ``Policy``.

``serve(policy)`` starts it in the background (``.url`` is the OpenAI base URL,
``http://127.0.0.1:PORT/v1``; ``.close()`` stops it); ``run_server(model, host, port)`` is the
blocking ``spadekit serve`` command. Standard library only (``http.server``).

Exposure: it binds 127.0.0.1 unless told otherwise; any other address needs ``api_key``
(``PolicyError`` at start without one; the command reads it from ``--api-key-file`` or
``SPADEKIT_API_KEY``, never from argv), and then every request but ``/health`` and the weight
route (guarded by its own token) must carry ``Authorization: Bearer KEY``, else 401. Plain
HTTP: keys travel in clear, so expose it on a trusted network only.

Client errors (``serve_request``): every malformed request is a 4xx with an OpenAI-style error
body (``{"object": "error", "error": {"message", "type", "param", "code"}}``), never a 500:
411 without ``Content-Length``, 400 for a negative or malformed one, 413 over ``max_body``
(32 MiB), 400 for a body that is not a UTF-8 JSON object or a field of the wrong type or range,
404 for a ``model`` other than the served one. ``max_tokens`` is at most ``max_tokens_limit``
(default 16384; 400 above it) and ``n`` times the prompts at most ``max_choices`` (128). A
prompt (token ids, or a string or messages once tokenized) is at most ``max_prompt_tokens``
(default: the model's context length, read from ``context_length``, else the model's config;
32768 when neither says), and with the context known, prompt plus ``max_tokens`` must fit in
it: 400 before anything is queued (an unset ``max_tokens`` is cut to the room left instead).

Endpoints:

- ``GET /health`` (``weight_updates``, ``weights_version`` if enabled), ``GET /v1/models``.
- ``POST /v1/spadekit/weights``: new weights (safetensors; needs ``allow_weight_updates`` and
  ``weights_token``), applied between batches; ``GET``: their version (``weight_sync`` docs).
- ``POST /v1/completions``: ``prompt`` a string, a list of token ids, or a list of either (one
  choice per prompt); ``max_tokens`` (default 16), ``temperature``, ``top_p``, ``stop``, ``seed``,
  ``n``; ``logprobs`` (any integer: the sampled token's logprob is returned, top-k alternatives
  are not computed, so ``top_logprobs`` holds the sampled token only); vLLM's extra fields
  ``return_tokens_as_token_ids`` (logprob tokens as ``token_id:N``), ``return_token_ids``
  (``token_ids`` and ``prompt_token_ids`` on each choice), ``include_stop_str_in_output`` and
  ``add_special_tokens`` (for string prompts; default true, as vLLM); ``stream``
  (``serve_stream``: server-sent events, sent as the tokens are produced). ``echo``, ``best_of``
  and ``suffix`` are refused with 400.
- ``POST /v1/chat/completions``: ``messages`` (and ``tools``) rendered through the policy's chat
  template; ``max_tokens``/``max_completion_tokens`` (default 256), ``logprobs: true`` gives
  ``logprobs.content`` (each entry's ``bytes`` are the token's own bytes, ``token_bytes``, also
  for byte-level pieces of a character); ``stream``; ``chat_template_kwargs`` (the chat
  template's extra variables, e.g. ``{"enable_thinking": false}``, as vLLM); the same extra
  fields.

Text follows the OpenAI convention: the stop string is left out unless
``include_stop_str_in_output``; ``finish_reason`` is ``stop`` or ``length``; ``stop_reason`` is
the stop string that ended the text, or null.

Batching (``serve_batch``): one collector thread gathers what arrives within ``batch_window``
seconds (default 5 ms) up to ``max_batch`` and calls ``policy.generate`` once for the batch
(a failed batch is retried one by one, so one bad request does not fail its neighbours). It is
fair between requests: batches are filled round-robin over requests, and a sequence generates at
most ``slice_tokens`` tokens (256; 0, whole sequences, for scripted policies, which cannot
continue a prompt) before it goes back in line, so a long request never holds the model for
the others (a new request waits at most for the slice that is running).
``server.stats()`` counts requests, batches, slices, and clients that left mid-request (their
connection reset: counted, never a traceback on the console).

Test switches: ``logprobs=False``, ``token_ids=False`` (tokens come back as text),
``token_prompts=False`` (refuse token-id prompts): to exercise a client's capability detection.
"""

from __future__ import annotations

import inspect
import json
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any

from spadekit.common.http_server import CLIENT_GONE, QuietHTTPServer
from spadekit.policy.base import Generation, GenerationRequest, Policy, PolicyError, \
    SamplingParams, cut_at_stop
from spadekit.policy.serve_batch import DEFAULT_SLICE, FairBatcher, UpdateGate, wrap64
from spadekit.policy.serve_request import (DEFAULT_MAX_TOKENS_LIMIT, MAX_BODY, MAX_CHOICES,
                                           Limits, RequestError, authorized, check_exposure,
                                           decode_chat, decode_completion, fit_context,
                                           parse_json, read_body)
from spadekit.policy.serve_stream import LiveStream, send_events
from spadekit.policy.token_bytes import TokenBytes
from spadekit.policy.weight_sync import MAX_REQUEST, MAX_TOTAL, WEIGHTS_PATH, WeightReceiver

__all__ = ["MAX_BODY", "PolicyServer", "run_server", "serve"]


# -- the server -------------------------------------------------------------------------------

class PolicyServer:
    """An OpenAI-compatible server for ``policy``; see the module docstring."""

    def __init__(self, policy: Policy, host: str = "127.0.0.1", port: int = 0,
                 batch_window: float = 0.005, max_batch: int = 64,
                 model_name: str | None = None, logprobs: bool = True, token_ids: bool = True,
                 token_prompts: bool = True, request_timeout: float = 600.0,
                 verbose: bool = False, allow_weight_updates: bool = False,
                 weights_token: str | None = None, max_weights_request: int = MAX_REQUEST,
                 max_weights_total: int = MAX_TOTAL, api_key: str | None = None,
                 max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT,
                 max_choices: int = MAX_CHOICES, max_body: int = MAX_BODY,
                 slice_tokens: int | None = None, max_prompt_tokens: int | None = None,
                 context_length: int | None = None) -> None:
        if getattr(policy, "tokenizer", None) is None:
            raise PolicyError("serving a policy needs its tokenizer (policy.tokenizer is None)")
        slice_tokens = _default_slice(policy) if slice_tokens is None else int(slice_tokens)
        if batch_window < 0 or max_batch < 1 or slice_tokens < 0:
            raise PolicyError("batch_window must be >= 0, max_batch >= 1, slice_tokens >= 0")
        check_exposure(host, api_key)
        self.api_key = api_key
        context = _context_length(policy) if context_length is None else int(context_length)
        self.limits = Limits(int(max_tokens_limit), int(max_choices), int(max_body), context,
                             None if max_prompt_tokens is None else int(max_prompt_tokens))
        self.policy = policy
        self.model_name = model_name or getattr(policy, "name", "spadekit")
        self.logprobs = logprobs
        self.token_ids, self.token_prompts = token_ids, token_prompts
        self.request_timeout, self.verbose = request_timeout, verbose
        self.created = int(time.time())
        self._vocab = _vocab_size(policy)
        self._bytes = TokenBytes(policy.tokenizer)
        gate = UpdateGate()  # weight updates land between sequences, never inside one
        self.weights = WeightReceiver(policy, gate, allow_weight_updates,
                                      weights_token, max_weights_request, max_weights_total)
        self._batcher = FairBatcher(policy, batch_window, max_batch, gate, slice_tokens)
        handler = type("Handler", (_Handler,), {"server_ref": self})
        try:
            self._httpd = _server_class(host)((host.strip("[]"), port), handler)
        except OSError as exc:
            self._batcher.close()
            raise PolicyError(f"cannot listen on {host}:{port}: {exc}") from exc
        self.host, self.port = self._httpd.server_address[:2]
        shown = f"[{self.host}]" if ":" in str(self.host) else self.host
        self.url = f"http://{shown}:{self.port}/v1"
        self._thread: threading.Thread | None = None
        self._serving_in: threading.Thread | None = None
        self._closed = False

    def start(self) -> "PolicyServer":
        """Serve in a background thread."""
        if self._thread is None and self._serving_in is None:
            self._thread = threading.Thread(target=self._serve, name="spadekit-serve",
                                            daemon=True)
            self._serving_in = self._thread
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until ``close()`` (from another thread) or Ctrl-C."""
        self._serving_in = threading.current_thread()
        try:
            self._serve()
        finally:
            self._serving_in = None
            self.close()

    def _serve(self) -> None:
        self._httpd.serve_forever(poll_interval=0.1)

    def stats(self) -> dict[str, Any]:
        """Requests served, batches run, the largest batch, slices, requests cancelled, and
        connections whose client reset or closed them mid-request (``disconnects``)."""
        return {**self._batcher.stats(), "disconnects": self._httpd.disconnects}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        serving = self._serving_in
        if serving is not None and serving is not threading.current_thread():
            self._httpd.shutdown()  # returns once serve_forever has stopped
            if serving is self._thread:
                serving.join(timeout=10)
        self._httpd.server_close()
        self._batcher.close()

    def __enter__(self) -> "PolicyServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- request handling (called from handler threads) ---------------------------------------

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        ticket = self._batcher.submit(requests)
        deadline = time.monotonic() + self.request_timeout
        try:
            return [f.result(timeout=max(0.0, deadline - time.monotonic()))
                    for f in ticket.futures]
        except TimeoutError as exc:
            ticket.cancel()
            raise PolicyError(f"generation took longer than {self.request_timeout:g} s") from exc

    def _check_model(self, body: dict) -> None:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise RequestError(f"the model {model!r} does not exist here (this server serves "
                               f"{self.model_name!r})", 404, "model", "not_found_error")

    def completions(self, body: dict) -> dict | LiveStream:
        prompts, params, n = decode_completion(body, self.limits)
        self._check_model(body)
        tok = self.policy.tokenizer
        add_special = body.get("add_special_tokens") is not False
        prompt_ids = []
        for p in prompts:
            if isinstance(p, str):
                ids = list(tok(p, add_special_tokens=add_special)["input_ids"])
            else:
                if not self.token_prompts:
                    raise RequestError("this server does not accept token-id prompts",
                                       param="prompt")
                ids = p
            if not ids:
                raise RequestError("empty prompt", param="prompt")
            bad = [t for t in ids if not 0 <= t < self._vocab]
            if bad:
                raise RequestError(f"token ids out of range [0, {self._vocab}): {bad[:5]}",
                                   param="prompt")
            prompt_ids.append(ids)
        params = fit_context(max(map(len, prompt_ids)), params, body, self.limits)
        reqs = [GenerationRequest(prompt_ids=ids, params=_nth(params, k))
                for ids in prompt_ids for k in range(n)]
        if body.get("stream"):
            return self._live("completion", reqs, params, body,
                              lambda gens: self._completion_answer(gens, params, body))
        return self._completion_answer(self.generate(reqs), params, body)

    def _completion_answer(self, gens: list[Generation], params: SamplingParams,
                           body: dict) -> dict:
        want_lp = body.get("logprobs") is not None and body.get("logprobs") is not False
        choices = []
        for i, g in enumerate(gens):
            text, stop_reason = self._visible_text(g, params, body)
            choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": g.finish_reason,
                                      "stop_reason": stop_reason, "logprobs": None}
            if want_lp and self.logprobs and g.logprobs is not None:
                choice["logprobs"] = self._completion_logprobs(g, body)
            if body.get("return_token_ids") and self.token_ids:
                choice["token_ids"] = list(g.token_ids)
                choice["prompt_token_ids"] = list(g.prompt_ids)
            choices.append(choice)
        out = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
               "created": int(time.time()), "model": self.model_name, "choices": choices,
               "usage": _usage(gens)}
        return out

    def chat(self, body: dict) -> dict | LiveStream:
        messages, tools, params, n = decode_chat(body, self.limits,
                                                 SamplingParams().max_new_tokens)
        self._check_model(body)
        try:  # render here so that a template error is the client's 400, not a failed batch
            prompt = self.policy.render(messages, True, tools,
                                        body.get("chat_template_kwargs") or None)
        except Exception as exc:
            raise RequestError(f"cannot render the messages with the chat template: {exc}",
                               param="messages") from exc
        params = fit_context(len(prompt), params, body, self.limits)
        reqs = [GenerationRequest(prompt_ids=prompt, params=_nth(params, k)) for k in range(n)]
        if body.get("stream"):
            return self._live("chat", reqs, params, body,
                              lambda gens: self._chat_answer(gens, params, body, prompt))
        return self._chat_answer(self.generate(reqs), params, body, prompt)

    def _chat_answer(self, gens: list[Generation], params: SamplingParams, body: dict,
                     prompt: list[int]) -> dict:
        choices = []
        for i, g in enumerate(gens):
            text, stop_reason = self._visible_text(g, params, body)
            choice: dict[str, Any] = {"index": i,
                                      "message": {"role": "assistant", "content": text},
                                      "finish_reason": g.finish_reason,
                                      "stop_reason": stop_reason, "logprobs": None}
            if body.get("logprobs") and self.logprobs and g.logprobs is not None:
                choice["logprobs"] = {"content": self._chat_logprobs(g, body)}
            if body.get("return_token_ids") and self.token_ids:
                choice["token_ids"] = list(g.token_ids)
            choices.append(choice)
        out = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
               "created": int(time.time()), "model": self.model_name, "choices": choices,
               "usage": _usage(gens)}
        if body.get("return_token_ids") and self.token_ids:
            out["prompt_token_ids"] = list(prompt)
        return out

    def _live(self, kind: str, reqs: list[GenerationRequest], params: SamplingParams,
              body: dict, answer: Any) -> LiveStream:
        """A streamed answer: the sequences go to the batcher with a watcher, and the events
        are made as their tokens come (``serve_stream``)."""
        chat = kind == "chat"
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name}
        want_lp = bool(body.get("logprobs")) if chat else (
            body.get("logprobs") is not None and body.get("logprobs") is not False)
        want_lp = want_lp and self.logprobs
        want_ids = bool(body.get("return_token_ids")) and self.token_ids
        tok = self.policy.tokenizer

        def part(i: int, k0: int, k1: int, tokens: list[int], lps: list[float] | None) -> dict:
            if k1 <= k0:
                return {}
            fields: dict[str, Any] = {}
            if want_lp and lps is not None:
                g = Generation(prompt_ids=[], token_ids=tokens[k0:k1], logprobs=lps[k0:k1],
                               text="", finish_reason="")
                fields["logprobs"] = {"content": self._chat_logprobs(g, body)} if chat \
                    else self._completion_logprobs(g, body)
            if want_ids:
                fields["token_ids"] = tokens[k0:k1]
            return fields

        def visible(tokens: list[int]) -> str:
            return cut_at_stop(tok.decode(tokens, skip_special_tokens=True), params.stop)[0]

        return LiveStream(kind, head, len(reqs), params.stop,
                          lambda watch: self._batcher.submit(reqs, watch), answer, part,
                          visible, body, self.request_timeout)

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                            "created": self.created, "owned_by": "spadekit"}]}

    # -- helpers -----------------------------------------------------------------------------

    def _visible_text(self, g: Generation, params: SamplingParams,
                      body: dict) -> tuple[str, str | None]:
        """The text as OpenAI servers show it, and the stop string that ended it."""
        text = g.text
        for s in params.stop:
            if text.endswith(s):
                if not body.get("include_stop_str_in_output"):
                    text = text[:-len(s)]
                return text, s
        return text, None

    def _token_str(self, tid: int, as_ids: bool) -> str:
        if as_ids and self.token_ids:
            return f"token_id:{tid}"
        return self.policy.tokenizer.decode([tid], skip_special_tokens=False)

    def _completion_logprobs(self, g: Generation, body: dict) -> dict:
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        tokens = [self._token_str(t, as_ids) for t in g.token_ids]
        offsets, pos = [], 0
        for t in g.token_ids:
            offsets.append(pos)
            pos += len(self.policy.tokenizer.decode([t], skip_special_tokens=True))
        lps = list(g.logprobs or [])
        return {"tokens": tokens, "token_logprobs": lps,
                "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, lps)],
                "text_offset": offsets}

    def _chat_logprobs(self, g: Generation, body: dict) -> list[dict]:
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        out = []
        for t, lp in zip(g.token_ids, g.logprobs or []):
            tok = self._token_str(t, as_ids)
            raw = list(self._bytes(t))
            entry = {"token": tok, "logprob": lp, "bytes": raw, "top_logprobs": []}
            if body.get("top_logprobs"):
                entry["top_logprobs"] = [{"token": tok, "logprob": lp, "bytes": raw}]
            out.append(entry)
        return out


class _HTTPServer(QuietHTTPServer):
    request_queue_size = 256  # many clients connecting at once must not be dropped
    allow_reuse_address = True


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


def _server_class(host: str) -> type[_HTTPServer]:
    return _HTTPServer6 if ":" in host else _HTTPServer


_LINGER_BYTES = 1 << 20
_OPEN_PATHS = ("/health", "/v1/health", WEIGHTS_PATH)
"""Answered without the API key: liveness, and the weight route (its own token guards it)."""


class _Handler(BaseHTTPRequestHandler):
    server_ref: PolicyServer
    protocol_version = "HTTP/1.1"
    timeout = 60  # idle keep-alive connections (and a stalled body) end after this
    server_version = "spadekit-serve"

    def _route(self) -> str | None:
        """The request's path, or None once a 401 was sent (an API key is set and missing)."""
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in _OPEN_PATHS or authorized(self.headers, self.server_ref.api_key):
            return path
        self._unread = True  # the body is not read
        self._send(401, RequestError("a valid API key is required: send 'Authorization: "
                                     "Bearer KEY'", 401).body(),
                   {"WWW-Authenticate": 'Bearer realm="spadekit"'})
        return None

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        path = self._route()
        if path is None:
            return
        if path in ("/health", "/v1/health"):
            self._send(200, {"status": "ok", **self.server_ref.weights.health()})
        elif path in ("/v1/models", "/models"):
            self._send(200, self.server_ref.models())
        elif path in ("/v1/stats",):
            self._send(200, self.server_ref.stats())
        elif path == WEIGHTS_PATH:
            self._send(200, self.server_ref.weights.info())
        else:
            self._send(404, RequestError(f"no route GET {path}", 404).body())

    def do_POST(self) -> None:  # noqa: N802
        path = self._route()
        if path is None:
            return
        if path == WEIGHTS_PATH:
            return self.server_ref.weights.post(self)
        routes = {"/v1/completions": self.server_ref.completions,
                  "/v1/chat/completions": self.server_ref.chat}
        route = routes.get(path)
        try:
            try:
                raw = read_body(self.headers, self.rfile, self.server_ref.limits.max_body)
            except RequestError:
                self._unread = True  # the unread body must not be taken for a request
                raise
            except CLIENT_GONE:
                self.close_connection = True  # the client left while its body was read
                self.server.count_disconnect()
                return
            if route is None:
                raise RequestError(f"no route POST {path}", 404)
            answer = route(parse_json(raw))
            send_events(self, answer) if isinstance(answer, LiveStream) else \
                self._send(200, answer)
        except RequestError as exc:
            self._send(exc.status, exc.body())
        except PolicyError as exc:
            self._error(500, f"generation failed: {exc}")
        except Exception as exc:  # a bug must not kill the handler thread silently
            self._error(500, f"internal error: {type(exc).__name__}: {exc}")

    _unread = False

    def _send(self, status: int, obj: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        if self._unread:
            self.close_connection = True
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            if self._unread:
                self._linger()
        except CLIENT_GONE:  # the answer is written to the client's own socket
            self.close_connection = True
            self.server.count_disconnect()

    def _linger(self) -> None:
        """After an answer sent without reading the body: end our side and discard what the
        client still sends (at most ``_LINGER_BYTES``, for at most a second), so that closing
        does not reset the connection before the client has read the answer."""
        sock = self.connection
        left = _LINGER_BYTES
        try:
            self.wfile.flush()
            sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + 1.0
            while left > 0 and time.monotonic() < deadline:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(min(65536, left))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def _error(self, status: int, message: str, kind: str = "server_error") -> None:
        self._send(status, {"object": "error", "error": {"message": message, "type": kind,
                                                         "param": None, "code": status}})

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server_ref.verbose:
            super().log_message(format, *args)


# -- small helpers ----------------------------------------------------------------------------

def _nth(params: SamplingParams, k: int) -> SamplingParams:
    """The k-th of n samples: a distinct seed when one is given."""
    if k == 0 or params.seed is None:
        return params
    return SamplingParams(temperature=params.temperature, top_p=params.top_p,
                          max_new_tokens=params.max_new_tokens, stop=params.stop,
                          seed=wrap64(params.seed + k))


def _usage(gens: list[Generation]) -> dict[str, int]:
    prompt = sum(len(g.prompt_ids) for g in gens)
    completion = sum(len(g.token_ids) for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _default_slice(policy: Policy) -> int:
    """``DEFAULT_SLICE``, or 0 (no slicing) for a policy that does not continue a prompt: a
    scripted one, or one with ``continues_prompts = False``."""
    from spadekit.policy.scripted import ScriptedPolicy

    if isinstance(policy, ScriptedPolicy) or not getattr(policy, "continues_prompts", True):
        return 0
    return DEFAULT_SLICE


def _context_length(policy: Policy) -> int | None:
    """The model's context length (positions, prompt plus generated), None when unknown: the
    policy's ``context_length`` or ``max_model_len``, its vLLM engine's ``max_model_len``, or
    its model config's ``max_position_embeddings`` (``n_positions``)."""
    engine = getattr(getattr(policy, "llm", None), "llm_engine", None)
    config = getattr(getattr(policy, "model", None), "config", None)
    for n in (getattr(policy, "context_length", None), getattr(policy, "max_model_len", None),
              getattr(getattr(engine, "model_config", None), "max_model_len", None),
              getattr(config, "max_position_embeddings", None),
              getattr(config, "n_positions", None)):
        if isinstance(n, int) and not isinstance(n, bool) and n > 1:
            return n
    return None


def _vocab_size(policy: Policy) -> int:
    sizes = [len(policy.tokenizer)]
    config = getattr(getattr(policy, "model", None), "config", None)
    if isinstance(getattr(config, "vocab_size", None), int):
        sizes.append(config.vocab_size)
    return max(sizes)


# -- entry points -----------------------------------------------------------------------------

def serve(policy: Policy, host: str = "127.0.0.1", port: int = 0,
          **options: Any) -> PolicyServer:
    """Start serving ``policy`` in the background; returns the running server (``.url``,
    ``.stats()``, ``.close()``). ``port=0`` picks a free port. Options: ``PolicyServer``'s
    (``batch_window``, ``max_batch``, ``model_name``, ..., ``allow_weight_updates``,
    ``weights_token``)."""
    return PolicyServer(policy, host=host, port=port, **options).start()


_SERVER_OPTIONS = tuple(inspect.signature(PolicyServer).parameters)[3:]  # after policy, host, port


def run_server(model: str, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> None:
    """``spadekit serve --model NAME --port N``: load the policy named ``model`` and serve it
    until Ctrl-C. Server options (see ``serve``) are taken out of ``options``; the rest go to
    ``load_policy``."""
    from spadekit.policy.registry import load_policy

    server_opts = {k: options.pop(k) for k in _SERVER_OPTIONS if k in options}
    server_opts.setdefault("model_name", model)
    check_exposure(host, server_opts.get("api_key"))  # before the (slow) load
    policy = load_policy(model, **options)
    server = PolicyServer(policy, host=host, port=port, **server_opts)
    try:
        key = "API key required" if server.api_key else "no API key: loopback only"
        print(f"spadekit: serving {model} at {server.url} (OpenAI-compatible; {key}; Ctrl-C "
              "to stop)", file=sys.stderr, flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        print("spadekit: stopped", file=sys.stderr)
    finally:
        server.close()
