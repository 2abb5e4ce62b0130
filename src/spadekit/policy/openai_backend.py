"""The ``openai`` backend: any OpenAI-compatible server (vLLM, SGLang, llama.cpp server, ollama).

``openai:MODEL`` or ``openai:MODEL@http://host:port/v1``. Standard library HTTP only.

How requests travel:

- ``prompt_ids`` requests go to ``POST /v1/completions`` with ``prompt`` as a list of token ids
  (when the server accepts that; otherwise the ids are decoded to text with the tokenizer).
- ``messages`` requests are rendered locally through the tokenizer's chat template when a
  tokenizer is given (so the prompt ids are known exactly) and then sent as above; without a
  tokenizer they go to ``POST /v1/chat/completions`` and the server renders them.
- Every request asks for the sampled tokens' logprobs (``logprobs: 1`` for completions,
  ``logprobs: true`` for chat) and, when the server takes vLLM's extra fields, for token ids
  (``return_tokens_as_token_ids`` makes logprob tokens come back as ``token_id:N``;
  ``return_token_ids`` adds ``token_ids``/``prompt_token_ids`` fields), for the stop string to be
  kept in the text (``include_stop_str_in_output``) and for no extra special tokens
  (``add_special_tokens: false``: the chat template already has them).

Capabilities are learnt at construction (``probe=True``): one tiny completion tells whether the
server accepts token-id prompts, whether it returns token ids and whether it returns logprobs.
``token_ids`` needs a tokenizer (``render``), token-id prompts and token ids back; ``logprobs``
needs logprobs back. Training needs both; otherwise the policy is for generation only
(``explain_capabilities()`` says so in words). When the server returns no logprobs,
``Generation.logprobs`` is None; when it returns no token ids, ``Generation.token_ids`` is the
tokenizer's re-encoding of the text (or empty without a tokenizer): fine for counting, not for
training.

Logprob semantics are the server's: vLLM's default (``raw_logprobs``) is ``log_softmax(logits)``
before temperature; start it with ``--logprobs-mode processed_logprobs`` (vLLM >= 0.10.2) to get
``log_softmax(logits / temperature)``, which is what the trainer computes (equal for top_p = 1).

Transport: one HTTP request per generation request, at most ``max_concurrency`` in flight (a
thread pool); the server batches them. ``timeout`` bounds connecting and every wait for data
(default 120 s, or env ``SPADEKIT_OPENAI_TIMEOUT``, which also reaches a run's
``generation_model=openai:...``).
Connection failures, 408, 429 and 5xx answers are retried ``retries`` times with exponential
backoff (``Retry-After`` is honoured, capped); other 4xx answers and read timeouts are not (a
generation that timed out is likely to time out again, and would be paid for twice). Failures
are typed: ``ServerUnreachable``, ``ServerHTTPError`` (status and body excerpt),
``ServerTimeout``, ``MalformedResponse``, all ``PolicyError``. Connections go straight to the
server (no HTTP proxy).

A generation engine that follows a trainer (after a successful weight push) is watched: when a
request to it stays unreachable after the retries or times out, a push to it breaks off, or the
server instance answering is not the one pushed to (``spadekit serve`` names its instance; a
restarted server lost the pushed weights: checked after every ``generate`` and before every
push), the policy is lost: that call and every later one raise ``EngineLost`` (a
``WeightSyncError`` naming the URL) at once, so the round whose generations were lost cannot
push, and so cannot commit; a resumed run opens a new policy and pushes its weights again.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from spadekit.policy.base import (CapabilityError, Generation, GenerationRequest, PolicyError,
                                  SamplingParams, cut_at_stop, encode_text, render_text)
from spadekit.policy.openai_safe import neutral_messages, neutral_value, text_of_ids
from spadekit.policy.openai_wire import (  # noqa: F401 (some are re-exported)
    TIMEOUT_ENV,
    EngineLost,
    MalformedResponse,
    ServerFeatures,
    ServerHTTPError,
    ServerTimeout,
    ServerUnreachable,
    chat_tokens,
    completion_tokens,
    env_timeout,
    finish_reason,
    first_choice,
    int_list,
    normalize_base_url,
    parse_spec,
    retry_after,
    sampling_fields,
)
from spadekit.policy.weight_items import WeightSyncError

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
"""Used when neither the spec, ``base_url=`` nor ``OPENAI_BASE_URL`` names a server (vLLM's
default port)."""

VLLM_EXTRAS = {"return_tokens_as_token_ids": True, "return_token_ids": True,
               "include_stop_str_in_output": True}
"""Extra request fields understood by vLLM (and by ``spadekit serve``); servers that reject
unknown fields are detected by the probe and get plain OpenAI requests."""

_RETRY_STATUS = {408, 429}
_BODY_EXCERPT = 500
_MAX_BACKOFF = 30.0


# -- the policy -------------------------------------------------------------------------------

class OpenAIPolicy:
    """A model behind an OpenAI-compatible HTTP server, as a ``Policy``."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 tokenizer: Any = None, max_concurrency: int = 8, timeout: float | None = None,
                 retries: int = 3, probe: bool = True, backoff: float = 0.5,
                 name: str | None = None, weights_token: str | None = None) -> None:
        if max_concurrency < 1:
            raise PolicyError(f"max_concurrency must be >= 1, got {max_concurrency}")
        timeout = env_timeout() if timeout is None else timeout
        if not 0 < timeout < float("inf"):
            raise PolicyError(f"timeout must be > 0, got {timeout}")
        if retries < 0:
            raise PolicyError(f"retries must be >= 0, got {retries}")
        self.base_url = normalize_base_url(base_url or os.environ.get("OPENAI_BASE_URL")
                                           or DEFAULT_BASE_URL)
        parts = urlsplit(self.base_url)
        self._scheme, self._host = parts.scheme, parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._path = parts.path.rstrip("/")
        self.api_key = os.environ.get("OPENAI_API_KEY", "") if api_key is None else api_key
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.max_concurrency = int(max_concurrency)
        self.weights_token = weights_token
        """For ``load_weights``; else env ``SPADEKIT_WEIGHTS_TOKEN`` or the file named by
        ``SPADEKIT_WEIGHTS_TOKEN_FILE`` (``weight_sync.weights_token``)."""
        self.lost: EngineLost | None = None
        """Why this engine, which follows a trainer, was lost (module docstring); None if not."""
        self._follows = False  # a push succeeded: generations must come from the pushed weights
        self._instance: str | None = None  # the server instance pushed to (spadekit serve)
        self.tokenizer = _load_tokenizer(tokenizer)
        self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency,
                                        thread_name_prefix="spadekit-openai")
        self._closed = False
        self.features = ServerFeatures()
        self.model = model or self._first_model()
        self.name = name or f"openai:{self.model}"
        if probe:
            self.features = self._probe()
        self.capabilities = self._capabilities()

    # -- Policy API --------------------------------------------------------------------------

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               tools: list[dict] | None = None,
               chat_template_kwargs: dict | None = None) -> list[int]:
        if self.tokenizer is None:
            raise CapabilityError(f"{self.name}: render() needs a tokenizer (pass tokenizer= "
                                  "a Hugging Face tokenizer or a local path)")
        return encode_text(self.tokenizer, render_text(self.tokenizer, messages,
                                                       add_generation_prompt, tools,
                                                       chat_template_kwargs))

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        if self._closed:
            raise PolicyError(f"{self.name}: the policy is closed")
        from spadekit.policy.grammar import refuse_grammar

        refuse_grammar(self, requests)
        self._alive()
        if not requests:
            return []
        try:
            out = self._generate_all(requests)
        except (ServerUnreachable, ServerTimeout) as exc:
            if self._follows:
                raise self._lose(exc.message) from exc
            raise
        if self._follows:
            self._same_server()  # the answers came from the server that holds the pushed weights
        return out

    def _generate_all(self, requests: list[GenerationRequest]) -> list[Generation]:
        if len(requests) == 1:
            return [self._generate_one(requests[0])]
        futures = [self._pool.submit(self._generate_one, r) for r in requests]
        out: list[Generation] = []
        try:
            for f in futures:
                out.append(f.result())
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        return out

    def load_weights(self, weights: Any, *, final: bool = True,
                     version: int | None = None) -> int:
        """Push ``(name, tensor)`` pairs to a ``spadekit serve --allow-weight-updates`` server
        (``POST /v1/spadekit/weights``, safetensors; ``final=False`` stages a chunk of one atomic
        upload); returns how many the server loaded (0 for a staged chunk). ``WeightSyncError``
        (with the server's message) when it does not advertise ``weight_updates`` or refuses.
        See ``spadekit.policy.weight_sync``."""
        from spadekit.policy.weight_sync import push_to_server

        self._alive()
        if self._follows:
            self._same_server()
        try:
            loaded = push_to_server(self, weights, final=final, version=version)
        except WeightSyncError as exc:
            if not _broke_off(exc):
                raise  # refused (by us or the server): nothing was applied
            raise self._lose(f"a weight push broke off ({exc.message})") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise self._lose(f"a weight push broke off ({type(exc).__name__}: {exc})") from exc
        if final:
            self._follows = True
        return loaded

    def cannot_restore_weights(self) -> str | None:
        """Why this server could not undo a push whose check failed (None: it can): a
        ``vllm serve`` always can (``vllm_server.restore``), a ``spadekit serve`` when it
        advertises ``restore``. ``push_weights`` refuses a checked push up front otherwise."""
        from spadekit.policy import vllm_server
        from spadekit.policy.weight_sync import server_cannot_restore

        self._alive()
        if self._follows:
            self._same_server()  # a lost server is EngineLost, not "cannot restore"
        return None if vllm_server.is_vllm(self) else server_cannot_restore(self)

    def restore_weights(self) -> None:
        """Undo the last push not confirmed since (its check failed)."""
        from spadekit.policy import vllm_server
        from spadekit.policy.weight_sync import server_action

        self._alive()
        if vllm_server.is_vllm(self):
            vllm_server.restore(self)
        else:
            server_action(self, "restore")

    def confirm_weights(self) -> None:
        """The last push was checked and stands."""
        from spadekit.policy import vllm_server
        from spadekit.policy.weight_sync import server_action

        self._alive()
        if vllm_server.is_vllm(self):
            vllm_server.confirm(self)
        elif getattr(self, "weights_version", None) is not None:  # something was pushed
            server_action(self, "confirm")

    def explain_capabilities(self) -> str:
        """What this server and tokenizer allow, in words."""
        f = self.features
        lines = [f"{self.name} at {self.base_url}"
                 + ("" if f.probed else " (not probed: assuming a vLLM-like server)")]

        def yes(flag: bool) -> str:
            return "yes" if flag else "no"

        lines.append(f"- tokenizer given: {yes(self.tokenizer is not None)}")
        prompts = "untested (no tokenizer)" if f.completions and f.token_prompts is None \
            else yes(bool(f.completions and f.token_prompts))
        lines.append(f"- /v1/completions: {yes(f.completions)}; token-id prompts accepted: "
                     f"{prompts}; vLLM extra fields accepted: {yes(f.extras)}")
        lines.append(f"- sampled token ids returned: {yes(f.token_ids)}; logprobs returned: "
                     f"{yes(f.logprobs)}")
        caps = self.capabilities
        if {"token_ids", "logprobs"} <= caps:
            lines.append("Training: possible (exact token ids in and out, logprobs of the sampled "
                         "tokens); the weights live in the server, so updates must be pushed to "
                         "it separately.")
        else:
            missing = []
            if self.tokenizer is None:
                missing.append("no tokenizer (pass tokenizer=)")
            if not (f.completions and f.token_prompts is not False):
                missing.append("the server does not take token-id prompts")
            if not f.token_ids:
                missing.append("the server returns no token ids (vLLM: it needs "
                               "return_tokens_as_token_ids)")
            if not f.logprobs:
                missing.append("the server returns no logprobs")
            lines.append("Generation only: training needs token_ids and logprobs, and "
                         + "; ".join(missing) + ".")
        if f.logprobs:
            lines.append("Logprobs are the server's: for training they must be log_softmax(logits "
                         "/ temperature) (vLLM: start it with --logprobs-mode processed_logprobs "
                         "and sample with top_p = 1).")
        lines.append(f"capabilities: {sorted(caps) or 'none'}")
        return "\n".join(lines)

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "OpenAIPolicy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenAIPolicy({self.model!r}, {self.base_url!r}, {sorted(self.capabilities)})"

    # -- a lost engine (module docstring) ----------------------------------------------------

    def _alive(self) -> None:
        if self.lost is not None:
            raise EngineLost(self.lost.message, **self.lost.details)

    def _lose(self, why: str) -> EngineLost:
        """Mark this engine lost (the first reason stays) and return the error to raise."""
        if self.lost is None:
            self.lost = EngineLost(
                f"{self.name}: the generation server at {self.base_url} was lost: {why}; what it "
                "generated since the last weight push is missing or came from other weights, "
                "so nothing of it may be trained on: once a server answers there again, resume "
                "the run (it pushes its weights anew)", url=self.base_url)
        return EngineLost(self.lost.message, **self.lost.details)

    def _same_server(self) -> None:
        """EngineLost unless the server instance pushed to still answers (``spadekit serve``
        names its instance; others are not checked)."""
        if self._instance is None:
            return
        from spadekit.policy.weight_sync import server_instance

        try:
            now = server_instance(self)
        except WeightSyncError as exc:
            raise self._lose(f"its weights route stopped answering ({exc.message})") from exc
        if now != self._instance:
            raise self._lose(f"it restarted (server instance {now!r}; the weights were pushed "
                             f"to {self._instance!r})")

    # -- capabilities ------------------------------------------------------------------------

    def _capabilities(self) -> frozenset[str]:
        f = self.features
        caps = set()
        if self.tokenizer is not None and f.completions and f.token_prompts and f.token_ids:
            caps.add("token_ids")
        if f.logprobs:
            caps.add("logprobs")
        return frozenset(caps)

    def _first_model(self) -> str:
        data = self._request("GET", "/models", None)
        try:
            return str(data["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise MalformedResponse(f"{self.base_url}/models lists no model; name one in the "
                                    "spec (openai:MODEL@URL)") from None

    def _probe(self) -> ServerFeatures:
        """One tiny request (a couple more only if the server rejects a variant)."""
        f = ServerFeatures(probed=True)
        token_prompt = encode_text(self.tokenizer, "Hi") if self.tokenizer is not None else None
        attempts: list[tuple[Any, bool]] = []
        if token_prompt:
            attempts += [(token_prompt, True), (token_prompt, False)]
        attempts += [("Hi", True), ("Hi", False)]
        last: ServerHTTPError | None = None
        for prompt, extras in attempts:
            body = {"model": self.model, "prompt": prompt, "max_tokens": 2, "temperature": 0,
                    "logprobs": 1}
            if extras:
                body.update(VLLM_EXTRAS)
            try:
                data = self._request("POST", "/completions", body)
            except ServerHTTPError as exc:
                if exc.status in (404, 405, 501):
                    return self._probe_chat(f)
                if 400 <= exc.status < 500 and exc.status not in (401, 403):
                    last = exc
                    continue
                raise
            if not isinstance(prompt, str):
                f.token_prompts = True
            else:
                f.token_prompts = False if token_prompt else None
            f.extras = extras
            choice = first_choice(data)
            ids, lps, _ = completion_tokens(choice)
            f.token_ids = ids is not None
            f.logprobs = lps is not None
            return f
        assert last is not None
        raise last

    def _probe_chat(self, f: ServerFeatures) -> ServerFeatures:
        f.completions = False
        f.token_prompts = False
        last: ServerHTTPError | None = None
        for extras in (True, False):
            body = {"model": self.model, "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 2, "temperature": 0, "logprobs": True}
            if extras:
                body.update(VLLM_EXTRAS)
            try:
                data = self._request("POST", "/chat/completions", body)
            except ServerHTTPError as exc:
                if 400 <= exc.status < 500 and exc.status not in (401, 403, 404):
                    last = exc
                    continue
                raise
            f.extras = extras
            ids, lps, _ = chat_tokens(first_choice(data))
            f.token_ids = ids is not None
            f.logprobs = lps is not None
            return f
        assert last is not None
        raise last

    # -- one request -------------------------------------------------------------------------

    def _generate_one(self, req: GenerationRequest) -> Generation:
        f = self.features
        if req.messages is not None and (self.tokenizer is None or not f.completions):
            return self._chat(req)
        if req.prompt_ids is not None:
            prompt_ids = [int(t) for t in req.prompt_ids]
        else:
            prompt_ids = self.render(req.messages, True, req.tools, req.chat_template_kwargs)
        if not prompt_ids:
            raise PolicyError("empty prompt")
        if not f.completions:
            raise CapabilityError(f"{self.name}: the server has no /v1/completions, so token-id "
                                  "prompts cannot be sent; send messages instead")
        if f.token_prompts is not False:
            prompt: Any = prompt_ids
        elif self.tokenizer is not None:
            prompt = text_of_ids(self.tokenizer, prompt_ids)  # content specials stay text
        else:
            raise CapabilityError(f"{self.name}: the server takes no token-id prompts and there "
                                  "is no tokenizer to decode them (pass tokenizer=)")
        body = {"model": self.model, "prompt": prompt, **sampling_fields(req.params),
                "logprobs": 1}
        if f.extras:
            body.update(VLLM_EXTRAS)
            body["add_special_tokens"] = False
        choice = first_choice(self._request("POST", "/completions", body))
        ids, lps, text = completion_tokens(choice)
        return self._finish(prompt_ids, ids, lps, text, choice, req.params)

    def _chat(self, req: GenerationRequest) -> Generation:
        body: dict[str, Any] = {"model": self.model,  # the server renders: break specials
                                "messages": neutral_messages(self.tokenizer, req.messages),
                                **sampling_fields(req.params), "logprobs": True}
        if req.tools:
            body["tools"] = neutral_value(self.tokenizer, req.tools)
        if req.chat_template_kwargs:  # vLLM's / SGLang's name for template options
            body["chat_template_kwargs"] = dict(req.chat_template_kwargs)
        if self.features.extras:
            body.update(VLLM_EXTRAS)
        data = self._request("POST", "/chat/completions", body)
        choice = first_choice(data)
        ids, lps, text = chat_tokens(choice)
        prompt_ids = choice.get("prompt_token_ids") or data.get("prompt_token_ids") or []
        if not int_list(prompt_ids):
            prompt_ids = []
        return self._finish(list(prompt_ids), ids, lps, text, choice, req.params)

    def _finish(self, prompt_ids: list[int], ids: list[int] | None, lps: list[float] | None,
                text: str, choice: dict, params: SamplingParams) -> Generation:
        if ids is None and "token_ids" in self.capabilities:
            raise CapabilityError(f"{self.name}: the server returned no token ids although the "
                                  "probe said it would")
        if ids is not None and self.tokenizer is not None:
            # the same text rule as every other backend: decode, cut after the first stop string
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        else:
            stop_reason = choice.get("stop_reason")
            if isinstance(stop_reason, str) and stop_reason in params.stop \
                    and not text.endswith(stop_reason):
                text += stop_reason  # the server cut the stop string off; put it back
        text, _ = cut_at_stop(text, params.stop)
        if ids is not None and lps is not None and len(lps) != len(ids):
            raise MalformedResponse(f"{self.name}: {len(lps)} logprobs for {len(ids)} tokens")
        if ids is None:  # best effort, for counting only (capabilities lack token_ids)
            ids = encode_text(self.tokenizer, text) if self.tokenizer is not None else []
        finish = finish_reason(choice.get("finish_reason"), len(ids), params.max_new_tokens)
        return Generation(prompt_ids=list(prompt_ids), token_ids=list(ids), logprobs=lps,
                          text=text, finish_reason=finish)

    # -- HTTP --------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict | None) -> dict:
        """One call with retries; the decoded JSON object."""
        attempt = 0
        while True:
            if self._follows:
                self._alive()  # another request found the engine lost: stop retrying
            try:
                return self._request_once(method, path, body)
            except (ServerUnreachable, ServerHTTPError) as exc:
                retriable = isinstance(exc, ServerUnreachable) or exc.status in _RETRY_STATUS \
                    or exc.status >= 500
                if not retriable or attempt >= self.retries:
                    if attempt:
                        exc.details["attempts"] = attempt + 1
                        exc.message = f"{exc.message} (after {attempt + 1} attempts)"
                        exc.args = (exc.message,)
                    raise
                delay = min(_MAX_BACKOFF, self.backoff * (2 ** attempt))
                delay *= 0.75 + 0.5 * random.random()
                wait = exc.details.get("retry_after")
                if isinstance(wait, (int, float)):
                    delay = max(delay, min(float(wait), _MAX_BACKOFF))
                time.sleep(delay)
                attempt += 1

    def _request_once(self, method: str, path: str, body: dict | None) -> dict:
        url = f"{self.base_url}{path}"
        headers = {"Accept": "application/json", "Connection": "close",
                   "User-Agent": "spadekit"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if self._scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self._host, self._port, timeout=self.timeout,
                context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            try:
                conn.connect()
            except TimeoutError as exc:
                raise ServerUnreachable(f"{url}: connection timed out after {self.timeout:g} s",
                                        url=url) from exc
            except OSError as exc:
                raise ServerUnreachable(f"{url}: cannot connect ({exc})", url=url) from exc
            try:
                conn.request(method, self._path + path, body=payload, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except TimeoutError as exc:
                raise ServerTimeout(f"{url}: no answer within {self.timeout:g} s", url=url,
                                    seconds=self.timeout) from exc
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                raise ServerUnreachable(f"{url}: connection lost ({type(exc).__name__}: {exc})",
                                        url=url) from exc
        finally:
            conn.close()
        if resp.status >= 400:
            excerpt = raw[:_BODY_EXCERPT].decode("utf-8", "replace")
            wait = retry_after(resp.getheader("Retry-After"))
            raise ServerHTTPError(f"{url}: HTTP {resp.status} {resp.reason}: {excerpt}",
                                  status=resp.status, body=excerpt, url=url,
                                  retry_after=wait)
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedResponse(f"{url}: the answer is not JSON: "
                                    f"{raw[:200].decode('utf-8', 'replace')!r}", url=url) from exc
        if not isinstance(data, dict):
            raise MalformedResponse(f"{url}: the answer is JSON but not an object", url=url)
        return data


def _broke_off(exc: BaseException) -> bool:
    """Whether ``exc`` comes of a connection failing (not of a refusal)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (OSError, http.client.HTTPException)):
            return True
        exc, seen = exc.__cause__, seen + 1
    return False


def _load_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None or not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise PolicyError("loading a tokenizer from a path needs transformers "
                          "(pip install 'spadekit[train]')") from exc
    try:
        return AutoTokenizer.from_pretrained(str(tokenizer))
    except Exception as exc:  # transformers raises many kinds
        raise PolicyError(f"cannot load the tokenizer {str(tokenizer)!r}: {exc}") from exc


def load_openai(spec: str, base_url: str | None = None, api_key: str | None = None,
                tokenizer: Any = None, max_concurrency: int = 8, timeout: float | None = None,
                retries: int = 3, probe: bool = True, **options: Any) -> OpenAIPolicy:
    """The registry's ``openai`` backend. A URL in the spec wins over ``base_url=``, which wins
    over ``OPENAI_BASE_URL``; the key comes from ``api_key=`` or ``OPENAI_API_KEY`` (may be
    empty); ``timeout`` None: env ``SPADEKIT_OPENAI_TIMEOUT``, else 120 s. An empty MODEL takes
    the first model the server lists."""
    model, spec_url = parse_spec(spec)
    for local_only in ("seed", "device", "dtype", "max_batch_size"):
        # options other backends take; a server owns its model, and sampling seeds travel
        # with each request (SamplingParams.seed)
        options.pop(local_only, None)
    return OpenAIPolicy(model, base_url=spec_url or base_url, api_key=api_key,
                        tokenizer=tokenizer, max_concurrency=max_concurrency, timeout=timeout,
                        retries=retries, probe=probe, **options)
