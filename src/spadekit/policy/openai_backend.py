"""The ``openai`` backend: any OpenAI-compatible server (vLLM, SGLang, llama.cpp, ollama), on the
``openai`` SDK. ``openai:MODEL`` or ``openai:MODEL@http://host:port/v1``.

Guarantees: ``prompt_ids`` (and, with a tokenizer, ``messages`` rendered here) go to
``/v1/completions`` as token ids with vLLM's extra fields (token ids and the stop string back, no
added specials); without a tokenizer messages go to ``/v1/chat/completions``. Text that reaches a
server's tokenizer never forges control tokens (``openai_safe``). One probe at construction
learns what the server takes and returns; ``capabilities`` has ``token_ids`` and ``logprobs``
only when they are exact (logprobs are the server's: start vLLM with ``--logprobs-mode
processed_logprobs``, as ``spadekit serve --model`` does). ``timeout`` (default 120 s or env
``SPADEKIT_OPENAI_TIMEOUT``) bounds every wait; connection failures, 408, 409, 429 and 5xx are
retried ``retries`` times by the SDK (``Retry-After`` honoured); a read timeout is never retried.
Failures are typed ``PolicyError``s (``openai_wire``). Weight pushes go to a vLLM server only
(``vllm_server``); once pushed to, a server that stops answering, or another server instance at
its address (a restart lost the pushed weights), makes this policy ``EngineLost``.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import openai

from spadekit.policy.base import (CapabilityError, Generation, GenerationRequest, PolicyError,
                                  SamplingParams, TemplatePolicy, cut_at_stop, encode_text)
from spadekit.policy.openai_safe import neutral_messages, neutral_value, text_of_ids
from spadekit.policy.openai_wire import (
    TIMEOUT_ENV, EngineLost, MalformedResponse, ServerFeatures, ServerHTTPError, ServerTimeout,
    ServerUnreachable, chat_tokens, completion_tokens, env_timeout, finish_reason, first_choice,
    int_list, normalize_base_url, parse_spec, sampling_fields)
from spadekit.policy.vllm_server import ServerWeights
from spadekit.policy.weight_items import WeightSyncError

__all__ = ["TIMEOUT_ENV", "EngineLost", "MalformedResponse", "OpenAIPolicy", "ServerFeatures",
           "ServerHTTPError", "ServerTimeout", "ServerUnreachable", "load_openai",
           "normalize_base_url", "parse_spec"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
"""When neither the spec, ``base_url=`` nor ``OPENAI_BASE_URL`` names a server (vLLM's port)."""

VLLM_EXTRAS = {"return_tokens_as_token_ids": True, "return_token_ids": True,
               "include_stop_str_in_output": True}
"""Extra request fields of vLLM; a server that rejects them gets plain OpenAI requests."""

NEEDS_VLLM = ("weight pushes need a vLLM server started with `spadekit serve --model M "
              "--allow-weight-updates`")
_EXCERPT = 500


class OpenAIPolicy(TemplatePolicy):
    """A model behind an OpenAI-compatible HTTP server, as a ``Policy``."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 tokenizer: Any = None, max_concurrency: int = 8, timeout: float | None = None,
                 retries: int = 3, probe: bool = True, name: str | None = None) -> None:
        if max_concurrency < 1:
            raise PolicyError(f"max_concurrency must be >= 1, got {max_concurrency}")
        timeout = env_timeout() if timeout is None else timeout
        if not 0 < timeout < float("inf"):
            raise PolicyError(f"timeout must be > 0, got {timeout}")
        if retries < 0:
            raise PolicyError(f"retries must be >= 0, got {retries}")
        self.base_url = normalize_base_url(base_url or os.environ.get("OPENAI_BASE_URL")
                                           or DEFAULT_BASE_URL)
        self.api_key = os.environ.get("OPENAI_API_KEY", "") if api_key is None else api_key
        self.timeout, self.retries = float(timeout), int(retries)
        self.max_concurrency = int(max_concurrency)
        self.lost: EngineLost | None = None
        """Why this engine, which follows a trainer, was lost; None if it is not."""
        self._follows = False  # a push succeeded: generations must come from the pushed weights
        self._instance: str | None = None  # the server instance pushed to (_server_instance)
        self.tokenizer = _load_tokenizer(tokenizer)
        self._client = _sdk_client(self.base_url, self.api_key, self.timeout, self.retries)
        self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="spadekit-openai")
        self._closed = False
        self.features = ServerFeatures()
        self.model = model or self._first_model()
        self.name = name or f"openai:{self.model}"
        self.weights = ServerWeights(self.base_url, api_key=self.api_key or None,
                                     timeout=self.timeout, name=self.name)
        self._is_vllm: bool | None = None
        if probe:
            self.features = self._probe()
        self.capabilities = self._capabilities()

    # -- Policy API --------------------------------------------------------------------------


    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        if self._closed:
            raise PolicyError(f"{self.name}: the policy is closed")
        from spadekit.policy.grammar import refuse_grammar

        refuse_grammar(self, requests)
        self._alive()
        try:
            if len(requests) <= 1:
                return [self._generate_one(r) for r in requests]
            futures = [self._pool.submit(self._generate_one, r) for r in requests]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        except (ServerUnreachable, ServerTimeout) as exc:
            if self._follows:
                raise self._lose(exc.message) from exc
            raise
        finally:
            if self._follows and self.lost is None:
                self._same_server()  # the answers came from the server that holds the weights

    # -- weight pushes: a vLLM server only (spadekit.policy.vllm_server) ---------------------

    def load_weights(self, weights: Any, *, final: bool = True,
                     version: int | None = None) -> int:
        """Push ``(name, tensor)`` pairs to the vLLM server (``final=False`` stages a chunk);
        returns how many it loaded. ``WeightSyncError`` when the server is not vLLM or refuses;
        ``EngineLost`` when the push broke off."""
        self._vllm()
        try:
            loaded = self.weights.push(weights, final=final, version=version)
        except WeightSyncError as exc:
            if not _broke_off(exc):
                raise  # refused: nothing was applied
            raise self._lose(f"a weight push broke off ({exc.message})") from exc
        if final and not self._follows:
            self._follows, self._instance = True, self._server_instance()
        return loaded

    @property
    def weights_version(self) -> int:
        return self.weights.version

    def cannot_restore_weights(self) -> str | None:
        """None: a vLLM server can undo a push; otherwise why not."""
        self._alive()
        why = None if self._is_vllm else self.weights.cannot_restore()
        return None if why is None else f"{self.name}: {why}; {NEEDS_VLLM}"

    def restore_weights(self) -> None:
        """Undo the last push not confirmed since (its check failed)."""
        self._vllm()
        self.weights.restore()

    def confirm_weights(self) -> None:
        """The last push was checked and stands."""
        self._vllm()
        self.weights.confirm()

    def _vllm(self) -> None:
        self._alive()
        if self._follows:
            self._same_server()  # a push to a restarted server would mix two weight histories
        if not self._is_vllm:  # asked until a vLLM server answers (a timeout is not remembered)
            why = self.weights.cannot_restore()
            if why is not None:
                raise WeightSyncError(f"{self.name} at {self.base_url} takes no weight push "
                                      f"({why}): {NEEDS_VLLM}")
            self._is_vllm = True

    # -- what the server allows ----------------------------------------------------------------

    def explain_capabilities(self) -> str:
        """What this server and tokenizer allow, in words."""
        f, caps = self.features, self.capabilities

        def yes(flag: Any) -> str:
            return "yes" if flag else "no"

        prompts = "untested (no tokenizer)" if f.completions and f.token_prompts is None \
            else yes(f.completions and f.token_prompts)
        lines = [f"{self.name} at {self.base_url}"
                 + ("" if f.probed else " (not probed: assuming a vLLM-like server)"),
                 f"- tokenizer given: {yes(self.tokenizer is not None)}",
                 f"- /v1/completions: {yes(f.completions)}; token-id prompts accepted: {prompts};"
                 f" vLLM extra fields accepted: {yes(f.extras)}",
                 f"- sampled token ids returned: {yes(f.token_ids)}; logprobs returned: "
                 f"{yes(f.logprobs)}"]
        if {"token_ids", "logprobs"} <= caps:
            lines.append("Training: possible (exact token ids in and out, logprobs of the sampled "
                         "tokens); the weights live in the server: " + NEEDS_VLLM + ".")
        else:
            missing = [why for bad, why in (
                (self.tokenizer is None, "no tokenizer (pass tokenizer=)"),
                (not (f.completions and f.token_prompts is not False),
                 "the server does not take token-id prompts"),
                (not f.token_ids, "the server returns no token ids (vLLM: it needs "
                                  "return_tokens_as_token_ids)"),
                (not f.logprobs, "the server returns no logprobs")) if bad]
            lines.append("Generation only: training needs token_ids and logprobs, and "
                         + "; ".join(missing) + ".")
        if f.logprobs:
            lines.append("Logprobs are the server's: for training they must be log_softmax(logits "
                         "/ temperature) (vLLM: --logprobs-mode processed_logprobs, top_p = 1).")
        lines.append(f"capabilities: {sorted(caps) or 'none'}")
        return "\n".join(lines)

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def __enter__(self) -> "OpenAIPolicy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenAIPolicy({self.model!r}, {self.base_url!r}, {sorted(self.capabilities)})"

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

    def _server_instance(self) -> str | None:
        """vLLM's ``process_start_time_seconds`` (``/metrics``), which a restart changes; None
        where the server has no such metric. ``EngineLost`` when it cannot be asked."""
        root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            resp = httpx2.get(f"{root}/metrics", headers=auth, timeout=self.timeout,
                              trust_env=False)
        except httpx2.HTTPError as exc:
            raise self._lose(f"it stopped answering ({type(exc).__name__}: {exc})") from exc
        for line in resp.text.splitlines() if resp.status_code == 200 else ():
            if line.startswith("process_start_time_seconds"):
                return line.split()[-1]
        return None

    def _same_server(self) -> None:
        """EngineLost unless the server instance pushed to still answers."""
        now = self._server_instance()
        if now != self._instance:
            raise self._lose(f"it restarted (started at {now}; the weights were pushed to the "
                             f"server started at {self._instance})")

    def _capabilities(self) -> frozenset[str]:
        f = self.features
        caps = set()
        if self.tokenizer is not None and f.completions and f.token_prompts and f.token_ids:
            caps.add("token_ids")
        if f.logprobs:
            caps.add("logprobs")
        return frozenset(caps)

    def _first_model(self) -> str:
        data = self._call("/models", None)
        try:
            return str(data["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise MalformedResponse(f"{self.base_url}/models lists no model; name one in the "
                                    "spec (openai:MODEL@URL)") from None

    def _probe(self) -> ServerFeatures:
        """One tiny request (a couple more only when the server rejects a variant)."""
        f = ServerFeatures(probed=True)
        ids = encode_text(self.tokenizer, "Hi") if self.tokenizer is not None else None
        chat = {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True}
        variants = [("/completions", {"prompt": p, "logprobs": 1}, x)
                    for p in ([ids] if ids else []) + ["Hi"] for x in (True, False)]
        variants += [("/chat/completions", chat, x) for x in (True, False)]
        last: ServerHTTPError | None = None
        for path, fields, extras in variants:
            if path == "/chat/completions" and f.completions:
                break  # /v1/completions exists and refused every variant
            if path == "/completions" and not f.completions:
                continue
            body = {"model": self.model, "max_tokens": 2, "temperature": 0, **fields,
                    **(VLLM_EXTRAS if extras else {})}
            try:
                data = self._call(path, body)
            except ServerHTTPError as exc:
                if path == "/completions" and exc.status in (404, 405, 501):
                    f.completions, f.token_prompts = False, False
                elif not 400 <= exc.status < 500 or exc.status in (401, 403, 404):
                    raise
                last = exc
                continue
            if path == "/completions":
                f.token_prompts = not isinstance(body["prompt"], str) or (False if ids else None)
            f.extras = extras
            tokens = completion_tokens if path == "/completions" else chat_tokens
            got_ids, lps, _ = tokens(first_choice(data))
            f.token_ids, f.logprobs = got_ids is not None, lps is not None
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
            body.update(VLLM_EXTRAS, add_special_tokens=False)  # the template has them
        choice = first_choice(self._call("/completions", body))
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
        data = self._call("/chat/completions", body)
        choice = first_choice(data)
        ids, lps, text = chat_tokens(choice)
        prompt_ids = choice.get("prompt_token_ids") or data.get("prompt_token_ids") or []
        return self._finish(prompt_ids if int_list(prompt_ids) else [], ids, lps, text, choice,
                            req.params)

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

    # -- HTTP, through the SDK -----------------------------------------------------------------

    def _call(self, path: str, body: dict | None) -> dict:
        """GET ``/models`` (body None) or POST a completion; the decoded JSON object."""
        url = f"{self.base_url}{path}"
        try:
            if body is None:
                raw = self._client.models.with_raw_response.list()
            else:
                api = self._client.completions if path == "/completions" \
                    else self._client.chat.completions
                known = _STANDARD[path]
                raw = api.with_raw_response.create(
                    **{k: v for k, v in body.items() if k in known},
                    extra_body={k: v for k, v in body.items() if k not in known} or None)
            content = raw.http_response.content
        except _ReadTimedOut as exc:
            raise ServerTimeout(f"{url}: no answer within {self.timeout:g} s", url=url,
                                seconds=self.timeout) from exc
        except openai.APIStatusError as exc:
            excerpt = exc.response.text[:_EXCERPT]
            raise ServerHTTPError(f"{url}: HTTP {exc.status_code}: {excerpt}{_tries(exc)}",
                                  status=exc.status_code, body=excerpt, url=url) from exc
        except openai.APIConnectionError as exc:
            why = "connection timed out" if isinstance(exc, openai.APITimeoutError) else \
                f"cannot connect ({type(exc.__cause__).__name__}: {exc.__cause__})"
            raise ServerUnreachable(f"{url}: {why}{_tries(exc)}", url=url) from exc
        try:
            data = json.loads(content)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedResponse(f"{url}: the answer is not JSON: "
                                    f"{content[:200].decode('utf-8', 'replace')!r}",
                                    url=url) from exc
        if not isinstance(data, dict):
            raise MalformedResponse(f"{url}: the answer is JSON but not an object", url=url)
        return data


_STANDARD = {"/completions": {"model", "prompt", "max_tokens", "temperature", "top_p", "stop",
                              "seed", "logprobs"},
             "/chat/completions": {"model", "messages", "max_tokens", "temperature", "top_p",
                                   "stop", "seed", "logprobs", "tools"}}
"""The fields the SDK's ``create`` takes by name; the others travel in ``extra_body``."""


def _tries(exc: Any) -> str:
    """`` (after N attempts)`` when the SDK retried the request that failed."""
    request = getattr(exc, "request", None)
    n = int(request.headers.get("x-stainless-retry-count", 0)) + 1 if request is not None else 1
    return f" (after {n} attempts)" if n > 1 else ""


class _ReadTimedOut(openai.OpenAIError):
    """A read timeout; an ``OpenAIError`` so that the SDK raises it without retrying."""


def _sdk_client(base_url: str, api_key: str, timeout: float, retries: int) -> Any:
    """The SDK client: no proxy from the environment, read timeouts not retried."""
    class Transport(httpx2.HTTPTransport):
        def handle_request(self, request: Any) -> Any:
            try:
                return super().handle_request(request)
            except httpx2.ReadTimeout as exc:
                raise _ReadTimedOut(str(exc)) from exc

    return openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout,
                         max_retries=retries,
                         http_client=httpx2.Client(transport=Transport(), trust_env=False))


def _broke_off(exc: BaseException | None) -> bool:
    """Whether ``exc`` comes of a connection failing (not of a refusal)."""
    for _ in range(8):
        if exc is None:
            return False
        if isinstance(exc, (OSError, httpx2.TransportError)):
            return True
        exc = exc.__cause__
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


def load_openai(spec: str, base_url: str | None = None, **options: Any) -> OpenAIPolicy:
    """The registry's ``openai`` backend. A URL in the spec wins over ``base_url=``, which wins
    over ``OPENAI_BASE_URL``; the key: ``api_key=`` or ``OPENAI_API_KEY``. An empty MODEL takes
    the first model the server lists. Options other backends take are ignored: a server owns its
    model, and sampling seeds travel with each request."""
    model, spec_url = parse_spec(spec)
    for local_only in ("seed", "device", "dtype", "max_batch_size"):
        options.pop(local_only, None)
    return OpenAIPolicy(model, base_url=spec_url or base_url, **options)
