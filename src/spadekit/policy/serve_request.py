"""What ``spadekit serve`` accepts from a client: the request body, its fields, and who may ask.

Everything a client sends is checked here before any generation starts, and every way it can be
wrong is a :class:`RequestError` (the server answers it as an OpenAI-style error body,
``{"object": "error", "error": {"message", "type", "param", "code"}}``, never as a 500):

- the body (:func:`read_body`): ``Content-Length`` is required (411 without it, also for any
  ``Transfer-Encoding``), must be plain decimal digits (a negative, signed or repeated,
  disagreeing length is 400: the body is never read "until the end"), and at most the server's
  ``max_body`` (413); the body must be UTF-8 JSON (no ``NaN``/``Infinity``, nesting within
  Python's recursion limit) holding an object;
- the fields (:func:`decode_completion`, :func:`decode_chat`): each known field has its OpenAI
  type or is refused with 400 naming it (``param``); ``max_tokens`` (or
  ``max_completion_tokens``) is at most the server's ``max_tokens_limit``; ``n`` times the
  number of prompts at most ``MAX_CHOICES``; ``seed`` a signed 64-bit integer; unknown fields
  are ignored, as OpenAI-compatible servers do;
- the length (:func:`fit_context`, once the prompt is tokenized, before it is queued): a
  prompt is at most ``max_prompt_tokens`` tokens (the model's context length when the server
  knows it, else ``DEFAULT_MAX_PROMPT_TOKENS``), and the prompt plus ``max_tokens`` fit in the
  model's context (400 otherwise, as vLLM answers; a request that leaves ``max_tokens`` unset
  gets its default cut to the room left);
- who may ask (:func:`check_exposure`, :func:`authorized`): a server bound to anything but a
  loopback address needs an API key, and then every request but ``/health`` must carry
  ``Authorization: Bearer KEY`` (compared in constant time; 401 otherwise).
"""

from __future__ import annotations

import hmac
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from spadekit.common.loopback import is_loopback
from spadekit.common.errors import SpadekitError
from spadekit.policy.base import PolicyError, SamplingParams

__all__ = ["API_KEY_ENV", "DEFAULT_MAX_PROMPT_TOKENS", "DEFAULT_MAX_TOKENS_LIMIT", "Limits",
           "MAX_BODY", "MAX_CHOICES", "RequestError", "authorized", "check_exposure",
           "decode_chat", "decode_completion", "fit_context", "is_loopback", "parse_json",
           "read_body"]

MAX_BODY = 32 * 1024 * 1024
"""Largest request body accepted (bytes) unless the server is given another ``max_body``."""
DEFAULT_MAX_TOKENS_LIMIT = 16384
"""The largest ``max_tokens`` a request may ask unless the server is given another limit."""
MAX_CHOICES = 128
"""Most sequences one request may ask for (``n`` times the number of prompts)."""
DEFAULT_MAX_PROMPT_TOKENS = 32768
"""The longest prompt (tokens) a request may send when the model's context length is unknown."""
MAX_STOPS = 64
MAX_LOGPROBS = 20
API_KEY_ENV = "SPADEKIT_API_KEY"

_DIGITS = re.compile(r"[0-9]{1,18}")
_INT64 = (-(1 << 63), (1 << 63) - 1)


class RequestError(SpadekitError):
    """A client's request is wrong; ``status`` is the HTTP status to answer with and ``param``
    the field at fault (or None)."""

    reason = "bad_request"

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message, status=status, param=param)
        self.status, self.param, self.kind = status, param, kind

    def body(self) -> dict[str, Any]:
        return {"object": "error", "error": {"message": self.message, "type": self.kind,
                                             "param": self.param, "code": self.status}}


@dataclass(frozen=True)
class Limits:
    """The server's bounds on one request. ``context``: the model's context length (prompt
    plus generated tokens), None when unknown; ``max_prompt``: the longest prompt (tokens),
    by default the context, else ``DEFAULT_MAX_PROMPT_TOKENS``."""

    max_tokens: int = DEFAULT_MAX_TOKENS_LIMIT
    max_choices: int = MAX_CHOICES
    max_body: int = MAX_BODY
    context: int | None = None
    max_prompt: int | None = None

    def __post_init__(self) -> None:
        if min(self.max_tokens, self.max_choices, self.max_body) < 1:
            raise PolicyError("max_tokens_limit, max_choices and max_body must be >= 1")
        if self.context is not None and self.context < 2:
            raise PolicyError(f"the model's context length must be >= 2, got {self.context}")
        if self.max_prompt is None:
            object.__setattr__(self, "max_prompt", self.context or DEFAULT_MAX_PROMPT_TOKENS)
        if self.max_prompt < 1:
            raise PolicyError("max_prompt_tokens must be >= 1")


# -- the body ---------------------------------------------------------------------------------

def read_body(headers: Any, rfile: Any, max_body: int) -> bytes:
    """The body of a request with these ``headers`` from ``rfile``; RequestError (411, 400 or
    413) before reading anything when its framing is refused. The caller must close the
    connection after a RequestError (the body may be unread)."""
    if headers.get("Transfer-Encoding") is not None:
        raise RequestError("request bodies must be sent with Content-Length (no "
                           "Transfer-Encoding)", 411)
    values = headers.get_all("Content-Length") or []
    if not values:
        raise RequestError("Content-Length is required", 411)
    if len({v.strip() for v in values}) != 1 or not _DIGITS.fullmatch(values[0].strip()):
        raise RequestError("Content-Length must be one non-negative decimal integer")
    length = int(values[0].strip())
    if length > max_body:
        raise RequestError(f"request body over {max_body} bytes", 413)
    raw = rfile.read(length) if length else b""
    if len(raw) != length:
        raise RequestError(f"the body ended after {len(raw)} of {length} bytes")
    return raw


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The JSON object in ``raw`` (strict UTF-8 JSON); RequestError otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError("the request body is not UTF-8") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise RequestError("the request body is nested too deeply") from None
    except ValueError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}"[:300]) from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


# -- typed fields -----------------------------------------------------------------------------

def _type(key: str, what: str) -> RequestError:
    return RequestError(f"{key!r} must be {what}", param=key)


def _opt_bool(body: dict, key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise _type(key, "a boolean")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_int(body: dict, key: str, lo: int, hi: int, hint: str = "") -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)  # 16.0 is 16, as JSON does not tell them apart
    if not _is_int(value) or not lo <= value <= hi:
        raise _type(key, f"an integer in [{lo}, {hi}]{hint}")
    return value


def _opt_number(body: dict, key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise _type(key, "a finite number")
    return float(value)


def _opt_of(body: dict, key: str, kind: type, what: str) -> Any:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise _type(key, what)
    return value


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) \
            or len(stop) > MAX_STOPS:
        raise _type("stop", f"a string or a list of at most {MAX_STOPS} strings")
    return tuple(s for s in stop if s)


def _common(body: dict) -> None:
    """The fields both routes share that only need a type."""
    _opt_of(body, "model", str, "a string")
    for key in ("stream", "return_token_ids", "return_tokens_as_token_ids",
                "include_stop_str_in_output"):
        _opt_bool(body, key)
    options = _opt_of(body, "stream_options", dict, "an object")
    if options is not None:
        _opt_bool(options, "include_usage")


def _sampling(body: dict, default_max_tokens: int, limits: Limits, prompts: int
              ) -> tuple[SamplingParams, int]:
    hint = " (the server's max_tokens_limit)"
    max_tokens = _opt_int(body, "max_tokens", 1, limits.max_tokens, hint)
    temperature = _opt_number(body, "temperature")
    top_p = _opt_number(body, "top_p")
    if temperature is not None and temperature < 0:
        raise _type("temperature", "a number >= 0")
    if top_p is not None and not 0 < top_p <= 1:
        raise _type("top_p", "a number in (0, 1]")
    seed = _opt_int(body, "seed", *_INT64)
    n = _opt_int(body, "n", 1, limits.max_choices)
    n = 1 if n is None else n
    if n * prompts > limits.max_choices:
        raise RequestError(f"{n} choices for each of {prompts} prompts: at most "
                           f"{limits.max_choices} in all", param="n")
    try:
        params = SamplingParams(
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            max_new_tokens=min(default_max_tokens, limits.max_tokens) if max_tokens is None
            else max_tokens, stop=_stops(body), seed=seed)
    except PolicyError as exc:  # pragma: no cover (every bound is checked above)
        raise RequestError(f"bad sampling parameters: {exc.message}") from exc
    return params, n


# -- the routes -------------------------------------------------------------------------------

def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(_is_int(t) for t in x)


def _prompts(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if _is_ids(prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p)
                                                   for p in prompt):
        return list(prompt)
    raise _type("prompt", "a string, a list of token ids, or a list of either")


def decode_completion(body: dict, limits: Limits, default_max_tokens: int = 16
                      ) -> tuple[list[str | list[int]], SamplingParams, int]:
    """The prompts (strings or token ids, not yet checked against a vocabulary), sampling
    parameters and ``n`` of a ``/v1/completions`` body; RequestError for anything refused."""
    for unsupported in ("echo", "suffix"):
        if body.get(unsupported):
            raise RequestError(f"{unsupported!r} is not supported by this server",
                               param=unsupported)
    if body.get("best_of") not in (None, 1):
        raise RequestError("'best_of' is not supported by this server", param="best_of")
    _common(body)
    _opt_bool(body, "add_special_tokens")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        _opt_int(body, "logprobs", 0, MAX_LOGPROBS)
    prompts = _prompts(body.get("prompt"))
    params, n = _sampling(body, default_max_tokens, limits, len(prompts))
    return prompts, params, n


def _content(m: dict) -> dict:
    """A message with its content as one string (the chat templates here expect strings)."""
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str) \
                    and p.get("type", "text") == "text":
                parts.append(p["text"])
            else:
                raise _type("messages", "a list of messages whose content parts are strings "
                            "or text parts ({\"type\": \"text\", \"text\": STRING})")
        return {**m, "content": "".join(parts)}
    if content is None:
        return {**m, "content": ""}
    if not isinstance(content, str):
        raise _type("messages", "a list of messages whose content is a string, null or a list "
                    "of text parts")
    return m


def decode_chat(body: dict, limits: Limits, default_max_tokens: int = 256
                ) -> tuple[list[dict], list[dict] | None, SamplingParams, int]:
    """The messages (content joined into strings), tools, sampling parameters and ``n`` of a
    ``/v1/chat/completions`` body; RequestError for anything refused."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages \
            or not all(isinstance(m, dict) for m in messages):
        raise _type("messages", "a non-empty list of objects")
    if not all(isinstance(m.get("role"), str) for m in messages):
        raise RequestError("every message needs a string 'role'", param="messages")
    messages = [_content(m) for m in messages]
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list)
                              or not all(isinstance(t, dict) for t in tools)):
        raise _type("tools", "a list of objects")
    tools = tools or None
    _common(body)
    _opt_bool(body, "logprobs")
    _opt_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    _opt_of(body, "chat_template_kwargs", dict, "an object")
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    params, n = _sampling(body, default_max_tokens, limits, 1)
    return messages, tools, params, n


# -- the length ------------------------------------------------------------------------------

def fit_context(prompt_tokens: int, params: SamplingParams, body: dict, limits: Limits
                ) -> SamplingParams:
    """``params`` for a prompt of ``prompt_tokens`` tokens (the longest of the request's):
    RequestError (400, ``param`` "prompt" or "max_tokens") when the prompt is over
    ``limits.max_prompt`` or, with the model's context known, leaves no room to generate or
    less room than an explicit ``max_tokens``; a default ``max_tokens`` (the client sent none)
    is cut to the room left. Checked before generation, so an over-long prompt never reaches
    the model (a quadratic prefill holding the one batcher, or an out-of-memory)."""
    if prompt_tokens > limits.max_prompt:
        raise RequestError(f"the prompt has {prompt_tokens} tokens, over this server's limit "
                           f"of {limits.max_prompt} (max_prompt_tokens)", param="prompt")
    if limits.context is None:
        return params
    room = limits.context - prompt_tokens
    if room < 1:
        raise RequestError(f"this model's maximum context length is {limits.context} tokens, "
                           f"and the prompt has {prompt_tokens}: no room to generate",
                           param="prompt")
    if params.max_new_tokens <= room:
        return params
    if body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None:
        raise RequestError(f"this model's maximum context length is {limits.context} tokens, "
                           f"but {prompt_tokens + params.max_new_tokens} were requested "
                           f"({prompt_tokens} in the prompt, {params.max_new_tokens} in the "
                           "completion)", param="max_tokens")
    return replace(params, max_new_tokens=room)


# -- who may ask ------------------------------------------------------------------------------

def check_exposure(host: str, api_key: str | None, what: str = "the server") -> None:
    """PolicyError unless ``host`` is loopback or an API key is set."""
    if api_key is not None and not api_key.strip():
        raise PolicyError("the API key is empty")
    if not is_loopback(host) and not api_key:
        raise PolicyError(
            f"{what} would listen on {host or 'every address'}, reachable from other machines, "
            f"without an API key: give one with --api-key-file PATH or the {API_KEY_ENV} "
            "environment variable (clients send it as 'Authorization: Bearer KEY'), or bind "
            "127.0.0.1")


def authorized(headers: Any, api_key: str | None) -> bool:
    """Whether a request with these ``headers`` may be served (always, without a key)."""
    if not api_key:
        return True
    given = (headers.get("Authorization") or "").strip()
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode("utf-8", "replace"),
                               api_key.encode("utf-8"))
