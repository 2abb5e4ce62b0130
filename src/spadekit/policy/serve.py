"""A small OpenAI-compatible HTTP server in front of any spadekit ``Policy``.

``serve(policy)`` starts it in the background (``.url`` is the OpenAI base URL,
``http://127.0.0.1:PORT/v1``; ``.close()`` stops it); ``run_server(model, host, port)`` is the
blocking ``spadekit serve`` command. Standard library only (``http.server``); binds to
127.0.0.1 unless told otherwise, with no authentication (but for weight pushes): do not expose it.

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
  (``serve_stream``: server-sent events, sent once generation is done). ``echo``, ``best_of``
  and ``suffix`` are refused with 400.
- ``POST /v1/chat/completions``: ``messages`` (and ``tools``) rendered through the policy's chat
  template; ``max_tokens``/``max_completion_tokens`` (default 256), ``logprobs: true`` gives
  ``logprobs.content`` (each entry's ``bytes`` are the token's own bytes, ``token_bytes``, also
  for byte-level pieces of a character); ``stream``; the same extra fields.

Text follows the OpenAI convention: the stop string is left out unless
``include_stop_str_in_output``; ``finish_reason`` is ``stop`` or ``length``; ``stop_reason`` is
the stop string that ended the text, or null.

Batching: request handlers put their generation requests on a queue; one collector thread takes
the first, keeps taking whatever arrives within ``batch_window`` seconds (default 5 ms) up to
``max_batch``, and calls ``policy.generate`` once for the whole batch (if that batch fails, its
requests are retried one by one, so one bad request does not fail its neighbours).
``server.stats()`` counts requests and batches.

Test switches: ``logprobs=False``, ``token_ids=False`` (tokens come back as text),
``token_prompts=False`` (refuse token-id prompts): to exercise a client's capability detection.
"""

from __future__ import annotations

import inspect
import json
import queue
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from spadekit.policy.base import (Generation, GenerationRequest, Policy, PolicyError,
                                  SamplingParams)
from spadekit.policy.serve_stream import EventStream, chat_events, completion_events, send_events
from spadekit.policy.token_bytes import TokenBytes
from spadekit.policy.weight_sync import MAX_REQUEST, MAX_TOTAL, WEIGHTS_PATH, WeightReceiver

MAX_BODY = 32 * 1024 * 1024
"""Largest request body accepted (bytes)."""

_STOP = object()


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# -- batching ---------------------------------------------------------------------------------

class _Batcher:
    """One collector thread: gathers requests arriving within ``window`` s, generates once."""

    def __init__(self, policy: Policy, window: float, max_batch: int, gen_lock: Any) -> None:
        self.policy = policy
        self.window = window
        self.max_batch = max_batch
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self.gen_lock = gen_lock
        self.batches = 0
        self.requests = 0
        self.largest = 0
        self.failed_batches = 0
        self._thread = threading.Thread(target=self._run, name="spadekit-serve-batcher",
                                        daemon=True)
        self._thread.start()

    def submit(self, requests: list[GenerationRequest]) -> list[Future]:
        futures = []
        for r in requests:
            fut: Future = Future()
            futures.append(fut)
            self._queue.put((r, fut))
        return futures

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "batches": self.batches,
                    "largest_batch": self.largest, "failed_batches": self.failed_batches,
                    "queued": self._queue.qsize()}

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=30)
        while True:  # anything still queued gets an error, not a hang
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item[1].set_exception(PolicyError("the server is shutting down"))

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            deadline = time.monotonic() + self.window
            stop = False
            while len(batch) < self.max_batch:
                remaining = deadline - time.monotonic()
                try:
                    item = self._queue.get(timeout=remaining) if remaining > 0 \
                        else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            with self.gen_lock:  # weight updates take it: they never land mid-batch
                self._generate(batch)
            if stop:
                return

    def _generate(self, batch: list[tuple[GenerationRequest, Future]]) -> None:
        batch = [(r, f) for r, f in batch if f.set_running_or_notify_cancel()]
        if not batch:
            return
        with self._lock:
            self.batches += 1
            self.requests += len(batch)
            self.largest = max(self.largest, len(batch))
        try:
            out = self.policy.generate([r for r, _ in batch])
            if len(out) != len(batch):
                raise PolicyError(f"the policy returned {len(out)} generations for "
                                  f"{len(batch)} requests")
        except Exception as exc:  # isolate the failing request(s)
            with self._lock:
                self.failed_batches += 1
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
                return
            for r, f in batch:
                try:
                    f.set_result(self.policy.generate([r])[0])
                except Exception as one_exc:
                    f.set_exception(one_exc)
            return
        for (_, f), g in zip(batch, out):
            f.set_result(g)


# -- the server -------------------------------------------------------------------------------

class PolicyServer:
    """An OpenAI-compatible server for ``policy``; see the module docstring."""

    def __init__(self, policy: Policy, host: str = "127.0.0.1", port: int = 0,
                 batch_window: float = 0.005, max_batch: int = 64,
                 model_name: str | None = None, logprobs: bool = True, token_ids: bool = True,
                 token_prompts: bool = True, request_timeout: float = 600.0,
                 verbose: bool = False, allow_weight_updates: bool = False,
                 weights_token: str | None = None, max_weights_request: int = MAX_REQUEST,
                 max_weights_total: int = MAX_TOTAL) -> None:
        if getattr(policy, "tokenizer", None) is None:
            raise PolicyError("serving a policy needs its tokenizer (policy.tokenizer is None)")
        if batch_window < 0 or max_batch < 1:
            raise PolicyError("batch_window must be >= 0 and max_batch >= 1")
        self.policy = policy
        self.model_name = model_name or getattr(policy, "name", "spadekit")
        self.logprobs = logprobs
        self.token_ids, self.token_prompts = token_ids, token_prompts
        self.request_timeout, self.verbose = request_timeout, verbose
        self.created = int(time.time())
        self._vocab = _vocab_size(policy)
        self._bytes = TokenBytes(policy.tokenizer)
        self.weights = WeightReceiver(policy, threading.Lock(), allow_weight_updates,
                                      weights_token, max_weights_request, max_weights_total)
        self._batcher = _Batcher(policy, batch_window, max_batch, self.weights.lock)
        handler = type("Handler", (_Handler,), {"server_ref": self})
        try:
            self._httpd = _HTTPServer((host, port), handler)
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

    def stats(self) -> dict[str, Any]:  # requests served, batches run, the largest batch
        return self._batcher.stats()

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
        futures = self._batcher.submit(requests)
        try:
            return [f.result(timeout=self.request_timeout) for f in futures]
        except TimeoutError as exc:
            for f in futures:
                f.cancel()
            raise PolicyError(f"generation took longer than {self.request_timeout:g} s") from exc

    def completions(self, body: dict) -> dict | EventStream:
        for unsupported in ("echo", "suffix"):
            if body.get(unsupported):
                raise _BadRequest(f"{unsupported!r} is not supported by this server")
        if body.get("best_of") not in (None, 1):
            raise _BadRequest("'best_of' is not supported by this server")
        tok = self.policy.tokenizer
        prompts = _prompts(body.get("prompt"))
        add_special = bool(body.get("add_special_tokens", True))
        prompt_ids = []
        for p in prompts:
            if isinstance(p, str):
                ids = list(tok(p, add_special_tokens=add_special)["input_ids"])
            else:
                if not self.token_prompts:
                    raise _BadRequest("this server does not accept token-id prompts")
                ids = p
            if not ids:
                raise _BadRequest("empty prompt")
            bad = [t for t in ids if not 0 <= t < self._vocab]
            if bad:
                raise _BadRequest(f"token ids out of range [0, {self._vocab}): {bad[:5]}")
            prompt_ids.append(ids)
        params, n = self._params(body, default_max_tokens=16)
        reqs = [GenerationRequest(prompt_ids=ids, params=_nth(params, k))
                for ids in prompt_ids for k in range(n)]
        gens = self.generate(reqs)
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
        return completion_events(out, gens, self, body) if body.get("stream") else out

    def chat(self, body: dict) -> dict | EventStream:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages \
                or not all(isinstance(m, dict) for m in messages):
            raise _BadRequest("'messages' must be a non-empty list of objects")
        messages = [_plain_message(m) for m in messages]
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise _BadRequest("'tools' must be a list")
        if body.get("max_completion_tokens") is not None and body.get("max_tokens") is None:
            body = {**body, "max_tokens": body["max_completion_tokens"]}
        params, n = self._params(body, default_max_tokens=SamplingParams().max_new_tokens)
        try:  # render here so that a template error is the client's 400, not a failed batch
            prompt = self.policy.render(messages, True, tools)
        except Exception as exc:
            raise _BadRequest(f"cannot render the messages with the chat template: {exc}") \
                from exc
        reqs = [GenerationRequest(prompt_ids=prompt, params=_nth(params, k)) for k in range(n)]
        gens = self.generate(reqs)
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
        return chat_events(out, gens, self, body) if body.get("stream") else out

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                            "created": self.created, "owned_by": "spadekit"}]}

    # -- helpers -----------------------------------------------------------------------------

    def _params(self, body: dict, default_max_tokens: int) -> tuple[SamplingParams, int]:
        stop = body.get("stop")
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            stop = tuple(s for s in stop if s)
        else:
            raise _BadRequest("'stop' must be a string or a list of strings")
        n = body.get("n", 1)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128:
            raise _BadRequest("'n' must be an integer in [1, 128]")
        try:
            max_tokens = body.get("max_tokens")
            temperature = body.get("temperature")
            top_p = body.get("top_p")
            seed = body.get("seed")
            params = SamplingParams(
                temperature=1.0 if temperature is None else float(temperature),
                top_p=1.0 if top_p is None else float(top_p),
                max_new_tokens=default_max_tokens if max_tokens is None else _int(max_tokens),
                stop=stop, seed=None if seed is None else _int(seed))
        except (TypeError, ValueError, PolicyError) as exc:
            raise _BadRequest(f"bad sampling parameters: {exc}") from exc
        return params, n

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


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients connecting at once must not be dropped
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    server_ref: PolicyServer
    protocol_version = "HTTP/1.1"
    timeout = 60  # idle keep-alive connections end after this
    server_version = "spadekit-serve"

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/health", "/v1/health"):
            self._send(200, {"status": "ok", **self.server_ref.weights.health()})
        elif path in ("/v1/models", "/models"):
            self._send(200, self.server_ref.models())
        elif path in ("/v1/stats",):
            self._send(200, self.server_ref.stats())
        elif path == WEIGHTS_PATH:
            self._send(200, self.server_ref.weights.info())
        else:
            self._error(404, f"no route GET {path}")

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == WEIGHTS_PATH:
            return self.server_ref.weights.post(self)
        routes = {"/v1/completions": self.server_ref.completions,
                  "/v1/chat/completions": self.server_ref.chat}
        route = routes.get(path)
        try:
            body = self._read_json()
            if route is None:
                raise _BadRequest(f"no route POST {path}", 404)
            answer = route(body)
            send_events(self, answer) if isinstance(answer, EventStream) else \
                self._send(200, answer)
        except _BadRequest as exc:
            self._error(exc.status, str(exc))
        except PolicyError as exc:
            self._error(500, f"generation failed: {exc}", "server_error")
        except Exception as exc:  # a bug must not kill the handler thread silently
            self._error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    def _read_json(self) -> dict:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True  # the unread body must not be taken for a request
            raise _BadRequest("chunked request bodies are not supported", 411)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise _BadRequest("bad Content-Length") from None
        if length > MAX_BODY:
            self.close_connection = True
            raise _BadRequest(f"request body over {MAX_BODY} bytes", 413)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise _BadRequest("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise _BadRequest("the request body must be a JSON object")
        return body

    def _send(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._send(status, {"object": "error", "error": {"message": message, "type": kind,
                                                         "code": status}})

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server_ref.verbose:
            super().log_message(format, *args)


# -- small helpers ----------------------------------------------------------------------------

def _int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or int(x) != x:
        raise ValueError(f"not an integer: {x!r}")
    return int(x)


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in x)


def _prompts(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if _is_ids(prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p)
                                                   for p in prompt):
        return list(prompt)
    raise _BadRequest("'prompt' must be a string, a list of token ids, or a list of either")


def _nth(params: SamplingParams, k: int) -> SamplingParams:
    """The k-th of n samples: a distinct seed when one is given."""
    if k == 0 or params.seed is None:
        return params
    return SamplingParams(temperature=params.temperature, top_p=params.top_p,
                          max_new_tokens=params.max_new_tokens, stop=params.stop,
                          seed=params.seed + k)


def _plain_message(m: dict) -> dict:
    """Content parts joined into one string (the chat templates here expect strings)."""
    content = m.get("content")
    if isinstance(content, list):
        parts = [p.get("text", "") if isinstance(p, dict) else str(p) for p in content]
        m = {**m, "content": "".join(parts)}
    elif content is None:
        m = {**m, "content": ""}
    if not isinstance(m.get("role"), str):
        raise _BadRequest("every message needs a string 'role'")
    return m


def _usage(gens: list[Generation]) -> dict[str, int]:
    prompt = sum(len(g.prompt_ids) for g in gens)
    completion = sum(len(g.token_ids) for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


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
    policy = load_policy(model, **options)
    server = PolicyServer(policy, host=host, port=port, **server_opts)
    try:
        print(f"spadekit: serving {model} at {server.url} (OpenAI-compatible; Ctrl-C to stop)",
              file=sys.stderr, flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        print("spadekit: stopped", file=sys.stderr)
    finally:
        server.close()
