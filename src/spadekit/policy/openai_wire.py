"""The wire format of OpenAI-compatible servers, for the ``openai`` backend: server URLs and specs,
the request's sampling fields and timeout, the features a probe found, the typed failures of a
request, and reading token ids, logprobs, text and the finish reason out of an answer in any of
the shapes servers send (vLLM's ``token_id:N`` tokens and ``token_ids`` fields, the completions
``logprobs`` arrays, the chat ``logprobs.content`` list, llama.cpp's ``id`` entries)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from spadekit.policy.base import PolicyError, SamplingParams, seconds_from_env
from spadekit.policy.weight_items import WeightSyncError

__all__ = ["TIMEOUT_ENV", "EngineLost", "MalformedResponse", "ServerFeatures", "ServerHTTPError",
           "ServerTimeout", "ServerUnreachable", "env_timeout", "normalize_base_url",
           "parse_spec", "sampling_fields",
           "chat_tokens", "completion_tokens", "finish_reason", "first_choice", "int_list"]

_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")
_STOP_REASONS = {"stop", "eos", "eos_token", "stop_sequence", "end_turn", "tool_calls",
                 "function_call", "content_filter", "stop_token"}
_LENGTH_REASONS = {"length", "max_tokens", "max_length", "model_length"}
TIMEOUT_ENV = "SPADEKIT_OPENAI_TIMEOUT"
DEFAULT_TIMEOUT = 120.0


# -- names ------------------------------------------------------------------------------------

def normalize_base_url(url: str) -> str:
    """``http://host:port`` gets ``/v1``; a trailing slash goes. Only http and https."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PolicyError(f"not an http(s) base URL: {url!r} (e.g. http://127.0.0.1:8000/v1)")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError as exc:
        raise PolicyError(f"bad port in {url!r}") from exc
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return f"{parts.scheme}://{host}{port}{path}"


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``openai:MODEL[@BASE_URL]`` -> (MODEL, BASE_URL or None)."""
    rest = spec.split(":", 1)[1] if spec.startswith("openai:") else spec
    m = re.search(r"@(https?://.*)$", rest)
    if m:
        return rest[:m.start()], m.group(1)
    return rest, None


# -- requests ---------------------------------------------------------------------------------

@dataclass
class ServerFeatures:
    """What the probe found the server to accept and return."""

    completions: bool = True
    """``/v1/completions`` exists (else only chat is used)."""
    token_prompts: bool | None = True
    """``prompt`` may be a list of token ids (None: not tested, for want of a tokenizer)."""
    extras: bool = True
    """The vLLM extra fields (``VLLM_EXTRAS``) are accepted."""
    token_ids: bool = True
    """Sampled token ids come back (``token_id:N`` tokens, ``token_ids`` field, or ``id``)."""
    logprobs: bool = True
    """Logprobs of the sampled tokens come back."""
    probed: bool = False


def sampling_fields(p: SamplingParams) -> dict[str, Any]:
    """The request fields of ``p``."""
    body: dict[str, Any] = {"temperature": p.temperature, "top_p": p.top_p,
                            "max_tokens": p.max_new_tokens}
    if p.stop:
        body["stop"] = list(p.stop)
    if p.seed is not None:
        body["seed"] = int(p.seed)
    return body


def env_timeout() -> float:
    """The timeout env ``SPADEKIT_OPENAI_TIMEOUT`` sets (seconds), else 120."""
    return seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT)


# -- typed failures ---------------------------------------------------------------------------

class ServerUnreachable(PolicyError):
    """No connection could be made (refused, DNS failure, reset before an answer)."""

    reason = "unreachable"


class ServerHTTPError(PolicyError):
    """The server answered with an HTTP error status; ``status`` and ``body`` (an excerpt)."""

    reason = "http_status"

    def __init__(self, message: str, status: int = 0, body: str = "", **details: Any) -> None:
        super().__init__(message, status=status, body=body, **details)
        self.status = status
        self.body = body


class ServerTimeout(PolicyError):
    """The server did not answer within the timeout."""

    reason = "timeout"


class MalformedResponse(PolicyError):
    """The server's answer is not the JSON an OpenAI-compatible server sends."""

    reason = "bad_response"


class EngineLost(WeightSyncError):
    """A generation server that follows a trainer (weights were pushed to it) was lost: it
    stopped answering (unreachable after the retries, or silent past the timeout), a push to it
    broke off, or another server instance now answers at its address (restarted, without the
    pushed weights). Its generations since the last push are missing or came from other
    weights; every later call of that policy raises this at once (``url`` names the server)."""

    reason = "engine_lost"


# -- parsing an answer ------------------------------------------------------------------------

def first_choice(data: dict) -> dict:
    """The first choice of an answer (MalformedResponse when there is none)."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponse(f"the answer has no choices: {json.dumps(data)[:200]}")
    return choices[0]


def int_list(x: Any) -> bool:
    """Whether ``x`` is a list of ints (bools excluded)."""
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def _num(x: Any) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    return None


def _token_id(token: Any) -> int | None:
    if isinstance(token, str):
        m = _TOKEN_ID.match(token)
        if m:
            return int(m.group(1))
    return None


def _entries_tokens(entries: list) -> tuple[list[int] | None, list[float] | None]:
    """Token ids and logprobs from a ``logprobs.content`` list (chat format, llama.cpp); each is
    None unless every entry has it."""
    if not entries:
        return None, None
    ids: list[int | None] = []
    lps: list[float | None] = []
    for e in entries:
        if not isinstance(e, dict):
            raise MalformedResponse(f"bad logprobs entry: {e!r}"[:200])
        tid = _token_id(e.get("token"))
        if tid is None and isinstance(e.get("id"), int) and not isinstance(e.get("id"), bool):
            tid = e["id"]
        ids.append(tid)
        lps.append(_num(e.get("logprob")))
    known_ids = None if None in ids else [int(t) for t in ids if t is not None]
    known_lps = None if None in lps else [float(v) for v in lps if v is not None]
    return known_ids, known_lps


def completion_tokens(choice: dict) -> tuple[list[int] | None, list[float] | None, str]:
    """(token ids or None, logprobs or None, text) of a ``/v1/completions`` choice."""
    text = choice.get("text")
    if not isinstance(text, str):
        raise MalformedResponse(f"a completion choice without text: {json.dumps(choice)[:200]}")
    ids = choice.get("token_ids") if int_list(choice.get("token_ids")) else None
    lps = None
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        if isinstance(lp.get("token_logprobs"), list):
            raw = lp["token_logprobs"]
            vals = [_num(v) for v in raw]
            lps = vals if raw and all(v is not None for v in vals) else None
            if ids is None and isinstance(lp.get("tokens"), list) and lp["tokens"]:
                parsed = [_token_id(t) for t in lp["tokens"]]
                ids = parsed if all(t is not None for t in parsed) else None
        elif isinstance(lp.get("content"), list):
            cids, lps = _entries_tokens(lp["content"])
            ids = ids if ids is not None else cids
    return (list(ids) if ids is not None else None), lps, text


def chat_tokens(choice: dict) -> tuple[list[int] | None, list[float] | None, str]:
    """(token ids or None, logprobs or None, text) of a ``/v1/chat/completions`` choice."""
    msg = choice.get("message")
    if not isinstance(msg, dict):
        raise MalformedResponse(f"a chat choice without a message: {json.dumps(choice)[:200]}")
    text = msg.get("content")
    if text is None and msg.get("tool_calls"):
        text = json.dumps(msg["tool_calls"])
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    ids = choice.get("token_ids") if int_list(choice.get("token_ids")) else None
    lps = None
    lp = choice.get("logprobs")
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        cids, lps = _entries_tokens(lp["content"])
        ids = ids if ids is not None else cids
    return (list(ids) if ids is not None else None), lps, text


def finish_reason(reason: Any, n_tokens: int, max_tokens: int) -> str:
    """``"stop"`` or ``"length"`` from a server's finish reason (servers name them differently);
    an unknown reason is ``"length"`` exactly when the token budget was used up."""
    if isinstance(reason, str):
        r = reason.lower()
        if r in _LENGTH_REASONS:
            return "length"
        if r in _STOP_REASONS:
            return "stop"
    return "length" if n_tokens >= max_tokens else "stop"
