"""Weight sync: a generation engine whose weights follow the trainer after every step.

The trainer owns one model; generation may run on a SEPARATE engine (another ``hf`` copy, vLLM in
this process, or a server). After each optimizer step the trainer's weights are pushed into that
engine, in memory, without writing a checkpoint or reloading from disk:

    from spadekit.policy.weight_sync import push_weights, trainer_weights
    stats = trainer.train_step(samples)
    push_weights(gen_policy, trainer_weights(trainer))      # {"tensors", "bytes", "seconds", ...}

``trainer_weights(trainer_or_model)`` yields ``(name, tensor)`` for the full model under the names
``AutoModelForCausalLM.state_dict()`` uses (``model.layers.0.self_attn.q_proj.weight``): peft's
``base_model.model.`` and ``.base_layer`` are stripped, adapter tensors are left out, and every
LoRA-adapted weight is MERGED, ``W + scale * B @ A`` for the active, unmerged adapters (peft's
``get_delta_weight``, computed in float32 and rounded once to ``W``'s dtype). The trained model is
never modified. Memory: merged weights are computed one at a time, lazily, as the iterator is
consumed, so at most one merged matrix plus one push chunk (``chunk_mb``) is alive at once; the
other tensors are the live parameters themselves (detached views, no copy: do not modify them).
Tied weights (``lm_head.weight`` = ``model.embed_tokens.weight``) are yielded once, under the
first name. DoRA adapters are refused. Under FSDP, iterate inside
``trainer.gathered_for_generation()`` on every rank; under DDP any rank's weights are the same.

``push_weights(policy, weights, chunk_mb=512)`` feeds those pairs to ``policy.load_weights`` in
chunks of about ``chunk_mb`` (``None``: one call); every backend that can follow training has
``load_weights``: ``HFPolicy`` (copies in place, checks all names and shapes of a call before
copying anything), ``VLLMPolicy`` and ``OpenAIPolicy`` (a push to ``spadekit serve``, below). A
policy without it, unknown names or wrong shapes raise ``WeightSyncError``.

How selfplay uses it: the lead wires ``--set generation_model=NAME`` into the loop; the trainer
keeps its own ``hf`` policy, rollouts use ``gen_policy = load_policy(NAME)``, and after each
``train_step`` the loop calls ``push_weights(gen_policy, trainer_weights(trainer),
version=trainer.step)``. On CPU ``generation_model=tiny`` (an ``hf`` copy) exercises the path.

vLLM in-process (colocated): ``generation_model=vllm:PATH``; ``VLLMPolicy.load_weights`` takes
the same Hugging Face names (``spadekit.policy.vllm_weights``: checked, then vLLM's in-place
``reload_weights``; tested on vLLM's CPU build, ``tests/policy/test_vllm_engine.py``).

Every push from a trainer or model is checked (``verify``, ``spadekit.policy.weight_probe``):
the engine's logprobs of a fixed probe must be measurably closer to the trainer's new ones than
to its old ones (or the update is reported ``indistinct``, counted, when it is under the
engine's noise), else the engine is restored to its previous weights and ``WeightSyncError`` is
raised. An engine that could not be restored is refused before the push (``verify=False``
pushes unchecked).

Servers: a real ``vllm serve`` in dev mode takes pushes through ``/collective_rpc``
(``spadekit.policy.vllm_server``: how to start it, and the route). ``spadekit serve --model
vllm:PATH --allow-weight-updates --weights-token-file FILE`` (our server wrapping any backend;
or env ``SPADEKIT_WEIGHTS_TOKEN`` / ``SPADEKIT_WEIGHTS_TOKEN_FILE``: a secret is never a
command-line argument, which ``ps`` shows every user; a token file must be ``chmod 600``) takes
them as below. The client is ``OpenAIPolicy`` (``openai:MODEL@URL``; ``weights_token=`` or the
same environment, ``weights_token``), whose ``load_weights`` recognises a vLLM server by its
``GET /version`` and otherwise posts safetensors payloads:

``POST /v1/spadekit/weights`` -- body: the bytes of ``safetensors.torch.save({name: tensor})``
(Content-Type ``application/octet-stream``, at most ``max_weights_request`` bytes, default
1 GiB). Headers: ``X-Spadekit-Weights-Token`` (required; compared in constant time);
optionally ``X-Spadekit-Weights-Upload: ID`` (1-64 of ``[A-Za-z0-9_-]``) with
``X-Spadekit-Weights-Final: 0`` to stage a chunk, the last chunk with ``Final: 1``: the staged
chunks are applied together, atomically, at the end (at most ``max_weights_total`` bytes staged;
a new upload ID discards an unfinished one); ``X-Spadekit-Weights-Version: N`` sets the version
(else it counts up); ``X-Spadekit-Weights-Action: restore`` (no body) undoes the last push
not confirmed since (hf: from a CPU copy taken before it; vLLM: its own undo) and
``...: confirm`` makes it stand (the client's check after the push sends one of them). The
policy's ``load_weights`` runs under the server's batching lock, so
never in the middle of a generation batch. Answers: 200 ``{"loaded", "version", "bytes",
"seconds"}`` (staged chunk: ``{"staged", "upload", "final": false}``); 403 when the server was
not started with ``--allow-weight-updates`` or the token is wrong or missing; 400 for a payload
that is not safetensors, a duplicate, unknown or wrongly shaped name (nothing applied: ``hf``
checks every name first; vLLM checks names itself as it loads); 411 chunked transfer encoding;
413 over a size cap. ``GET /v1/spadekit/weights`` (no token) gives ``{"weight_updates",
"version", "updates", "max_request_bytes", "last_update", "restore", "instance"}`` (``instance``:
a random id new at each start, also in a push's answer, by which the client tells a restarted
server, which lost the pushed weights: ``openai_backend``, ``EngineLost``); when pushes are
enabled,
``/health`` reports ``weight_updates: true`` and ``weights_version`` too. Plain HTTP: the token
travels in clear, so keep the server on loopback (its default) and reach it from another machine
through an SSH tunnel (``docs/scaling.md``).
"""

from __future__ import annotations

import hmac
import inspect
import os
import re
import threading
import time
import uuid
from typing import Any, Iterable, Mapping

from spadekit.common.errors import ConfigError
from spadekit.policy.base import PolicyError  # noqa: F401
from spadekit.policy.weight_items import (WeightSyncError, as_items,  # noqa: F401 (re-exported)
                                          trainer_weights)

WEIGHTS_PATH = "/v1/spadekit/weights"
TOKEN_HEADER = "X-Spadekit-Weights-Token"
UPLOAD_HEADER = "X-Spadekit-Weights-Upload"
FINAL_HEADER = "X-Spadekit-Weights-Final"
VERSION_HEADER = "X-Spadekit-Weights-Version"
ACTION_HEADER = "X-Spadekit-Weights-Action"
TOKEN_ENV = "SPADEKIT_WEIGHTS_TOKEN"
TOKEN_FILE_ENV = "SPADEKIT_WEIGHTS_TOKEN_FILE"
MAX_REQUEST = 1 << 30
MAX_TOTAL = 64 << 30
_UPLOAD_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def read_token_file(path: str | os.PathLike) -> str:
    """The secret in ``path`` (surrounding whitespace stripped). ``ConfigError`` when it is
    missing, empty, or readable by other users (``chmod 600``: a shared secret is private)."""
    import stat

    try:
        info = os.stat(path)
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the weights token file {str(path)!r}: "
                          f"{type(exc).__name__}: {exc}") from None
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise ConfigError(f"the weights token file {str(path)!r} is readable by other users "
                          f"(mode {stat.S_IMODE(info.st_mode):o}): chmod 600 it")
    if not token:
        raise ConfigError(f"the weights token file {str(path)!r} is empty")
    return token


def weights_token(given: str | None = None) -> str:
    """The shared secret of weight pushes: ``given``, else env ``SPADEKIT_WEIGHTS_TOKEN``, else
    the file named by env ``SPADEKIT_WEIGHTS_TOKEN_FILE`` (``read_token_file``), else ``""``.
    Never a command-line argument: every user of the machine sees those (``ps``)."""
    if given:
        return given
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    path = os.environ.get(TOKEN_FILE_ENV)
    return read_token_file(path) if path else ""


def generation_policy(spec: str, trained: Any, *, seed: int = 0) -> Any:
    """The generation engine named by ``spec`` for a run that trains ``trained``: loaded, and
    checked to return logprobs (``ConfigError`` naming the engine otherwise: importance weights
    need them), to accept weight pushes (``load_weights``) and to share the trained model's
    vocabulary (token ids pass between them unchanged); ``WeightSyncError`` otherwise."""
    from spadekit.policy.registry import load_policy

    options: dict[str, Any] = {"seed": seed}
    if spec.startswith("openai:"):  # a server sends token ids: decode them with ours
        options["tokenizer"] = trained.tokenizer
    policy = load_policy(spec, **options)
    if "logprobs" not in getattr(policy, "capabilities", ()):
        raise ConfigError(
            f"generation_model {spec!r} ({getattr(policy, 'name', type(policy).__name__)}) "
            "returns no logprobs of its sampled tokens: training needs them for the importance "
            "weights of its samples; use an engine that returns logprobs (vllm:, hf:, tiny, or "
            "a server that gives logprobs)")
    if not callable(getattr(policy, "load_weights", None)):
        raise WeightSyncError(f"generation_model {spec!r} ({type(policy).__name__}) cannot take "
                              "weight updates (no load_weights): use vllm:, hf:, tiny, or an "
                              "openai: server started with --allow-weight-updates")
    if policy.tokenizer is None or policy.tokenizer.get_vocab() != trained.tokenizer.get_vocab():
        raise WeightSyncError(f"generation_model {spec!r} has another vocabulary than the "
                              "trained model: token ids would not mean the same")
    return policy


def push_weights(policy: Any, weights: Any, *, chunk_mb: float | None = 512,
                 version: int | None = None, verify: Any = None) -> dict[str, Any]:
    """Feed ``weights`` (``(name, tensor)`` pairs, a mapping, or a trainer/model, which goes
    through ``trainer_weights``) to ``policy.load_weights`` in chunks of about ``chunk_mb``
    (``None``: all in one call). ``version`` (e.g. the trainer's step) is passed on to backends
    that record one. ``verify``: the model to check the engine against after the push
    (``weight_probe.probe_push``: a failed check restores the engine's previous weights and
    raises ``WeightSyncError``; an engine that could not be restored, or FSDP-sharded weights
    outside ``gathered_for_generation()``, are refused before anything is sent); None checks
    against ``weights`` itself when it is a trainer or model, False never checks. Returns
    ``{"tensors", "loaded", "bytes", "chunks", "seconds", "mb_per_s"}`` (plus the probe's
    ``probe_*`` fields, ``probe_verdict`` "pass" or "indistinct" among them, and ``verify_s``
    when checked)."""
    from spadekit.policy import weight_probe

    load = getattr(policy, "load_weights", None)
    name = getattr(policy, "name", type(policy).__name__)
    if not callable(load):
        raise WeightSyncError(f"{name} cannot load weights ({type(policy).__name__} has no "
                              "load_weights): use an hf, tiny or vllm policy, or a spadekit "
                              "serve --allow-weight-updates server through openai:")
    if isinstance(weights, Mapping):
        weights = weights.items()
    elif any(hasattr(weights, a) for a in ("parameters", "train_step", "model")):
        if verify is None:
            verify = weights
        weights = trainer_weights(weights)
    weight_probe.valid_record(policy)  # an unchecked change since the last check voids it
    model = weight_probe.check_before_push(policy, verify)  # refusals come before any send
    accepts = inspect.signature(load).parameters
    t0 = time.perf_counter()
    stats = {"tensors": 0, "loaded": 0, "bytes": 0, "chunks": 0}
    limit = None if chunk_mb is None else max(1, int(chunk_mb * 2**20))
    try:
        for chunk, final in _chunks(weights, limit):
            kwargs: dict[str, Any] = {}
            if "final" in accepts:  # staged backends apply everything at the final chunk
                kwargs["final"] = final
            if "version" in accepts and final:
                kwargs["version"] = version
            n = load(chunk, **kwargs)
            stats["loaded"] += int(n) if isinstance(n, int) else len(chunk)
            stats["tensors"] += len(chunk)
            stats["bytes"] += sum(_nbytes(t) for _, t in chunk)
            stats["chunks"] += 1
    except Exception as exc:
        if getattr(policy, "_weights_undo", None) is None:
            raise  # nothing was applied, or the backend restored itself (vLLM)
        note = weight_probe.restore_previous(policy)  # chunks already copied in: undone
        raise WeightSyncError(f"{name}: the push failed after {stats['chunks']} chunks "
                              f"({type(exc).__name__}: {getattr(exc, 'message', exc)}); "
                              f"{note}") from exc
    stats["seconds"] = time.perf_counter() - t0
    stats["mb_per_s"] = stats["bytes"] / 2**20 / max(stats["seconds"], 1e-9)
    if model is None:
        weight_probe.forget(policy)  # changed unchecked: the next check has no old reading
        return stats
    t1 = time.perf_counter()
    stats.update(weight_probe.probe_push(policy, model))
    stats["verify_s"] = time.perf_counter() - t1
    return stats


def _chunks(items: Iterable[tuple[str, Any]], limit: int | None):
    """``(chunk, is_last)`` groups of about ``limit`` bytes (one group at least)."""
    chunk: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in items:
        n = _nbytes(tensor)
        if chunk and limit is not None and size + n > limit:
            yield chunk, False
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += n
    yield chunk, True


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if hasattr(t, "element_size") else 0


# -- client: push to ``spadekit serve`` --------------------------------------------------------

def serialize(items: list[tuple[str, Any]]) -> bytes:
    """A safetensors payload of ``items`` (copied to the CPU, contiguous)."""
    from safetensors.torch import save

    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise WeightSyncError("duplicate tensor names in one push")
    return save({n: t.detach().to("cpu", copy=True).contiguous() for n, t in items})


def push_to_server(policy: Any, weights: Any, *, final: bool = True,
                   version: int | None = None) -> int:
    """``OpenAIPolicy.load_weights``: post ``weights`` to the server behind ``policy``. Several
    calls with ``final=False`` and a last one with ``final=True`` form one atomic upload."""
    from spadekit.policy import vllm_server

    if vllm_server.is_vllm(policy):  # a real vllm serve: its own route (vllm_server)
        return vllm_server.push(policy, weights, final=final, version=version)
    items = as_items(weights)
    if not items and final and getattr(policy, "_weights_upload", None) is None:
        return 0
    token = weights_token(getattr(policy, "weights_token", None))
    info = _call(policy, "GET", b"", {})
    if not info.get("weight_updates"):
        raise WeightSyncError(f"{policy.base_url} does not accept weight pushes (start it with "
                              "spadekit serve --allow-weight-updates and a token: "
                              "--weights-token-file FILE or env SPADEKIT_WEIGHTS_TOKEN)")
    cap = _int(info.get("max_request_bytes"), MAX_REQUEST) - (1 << 20)
    upload = getattr(policy, "_weights_upload", None) or uuid.uuid4().hex
    policy._weights_upload = upload
    groups = [g for g, _ in _chunks(items, max(cap, 1))]
    loaded = 0
    try:
        for k, group in enumerate(groups):
            last = final and k == len(groups) - 1
            headers = {TOKEN_HEADER: token, UPLOAD_HEADER: upload, FINAL_HEADER: str(int(last))}
            if last and version is not None:
                headers[VERSION_HEADER] = str(int(version))
            answer = _call(policy, "POST", serialize(group), headers)
            loaded = _int(answer.get("loaded"), 0) if last else loaded
    except BaseException:
        policy._weights_upload = None
        raise
    if final:
        policy._weights_upload = None
        policy.weights_version = answer.get("version")
        instance = answer.get("instance")  # which server now holds these weights
        policy._instance = instance if isinstance(instance, str) else None
    return loaded if final else 0  # a staged chunk loads nothing yet


def server_instance(policy: Any) -> str | None:
    """The instance id the ``spadekit serve`` behind ``policy`` reports (new at each start;
    None from a server too old to report one)."""
    instance = _call(policy, "GET", b"", {}).get("instance")
    return instance if isinstance(instance, str) else None


def _int(value: Any, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        raise WeightSyncError(f"a weights answer holds {value!r} where a number "
                              "belongs") from None


def server_cannot_restore(policy: Any) -> str | None:
    """Why the ``spadekit serve`` behind ``policy`` could not undo a push (None: it can)."""
    try:
        info = _call(policy, "GET", b"", {})
    except WeightSyncError as exc:
        return f"its weights route does not answer ({exc.message})"
    if not info.get("weight_updates"):
        return f"{policy.base_url} does not accept weight pushes"
    if not info.get("restore"):
        return f"{policy.base_url} cannot undo a push (a spadekit serve older than the restore " \
               "action)"
    return None


def server_action(policy: Any, action: str) -> dict:
    """``restore`` (undo the last unconfirmed push) or ``confirm`` (it stands) on the
    ``spadekit serve`` behind ``policy``; its answer (``version`` after the action)."""
    token = weights_token(getattr(policy, "weights_token", None))
    answer = _call(policy, "POST", b"", {TOKEN_HEADER: token, ACTION_HEADER: action})
    if "version" in answer:
        policy.weights_version = answer["version"]
    return answer


def _call(policy: Any, method: str, body: bytes, headers: dict[str, str]) -> dict:
    """One call to the weights route. Connecting, and every wait for the answer, are bounded by
    ``policy.timeout``; the answer to a payload by at least 600 s (the server may be applying a
    large upload). Any failure to get an answer is a ``WeightSyncError`` naming the URL."""
    import http.client
    import json
    import ssl

    conn_cls = http.client.HTTPSConnection if policy._scheme == "https" \
        else http.client.HTTPConnection
    kwargs = {"context": ssl.create_default_context()} if policy._scheme == "https" else {}
    conn = conn_cls(policy._host, policy._port, timeout=policy.timeout, **kwargs)
    url = policy.base_url + WEIGHTS_PATH[3:]
    wait = max(policy.timeout, 600.0) if body else policy.timeout
    try:
        conn.connect()
        conn.sock.settimeout(wait)
        conn.request(method, policy._path + WEIGHTS_PATH[3:], body=body or None,
                     headers={"Content-Type": "application/octet-stream", "Connection": "close",
                              **_auth(policy), **headers})
        resp = conn.getresponse()
        raw = resp.read()
    except TimeoutError as exc:
        raise WeightSyncError(f"{url}: no answer within {wait:g} s") from exc
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, a broken-off answer
        raise WeightSyncError(f"{url}: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if resp.status >= 400 or not isinstance(data, dict):
        msg = data.get("error", {}).get("message") if isinstance(data, dict) and \
            isinstance(data.get("error"), dict) else raw[:300].decode("utf-8", "replace")
        hint = " (not a spadekit serve server?)" if resp.status == 404 else ""
        raise WeightSyncError(f"{url}: HTTP {resp.status}: {msg}{hint}", status=resp.status)
    return data


def _auth(policy: Any) -> dict[str, str]:
    key = getattr(policy, "api_key", None)
    return {"Authorization": f"Bearer {key}"} if key else {}


# -- server: receive pushes in ``spadekit serve`` ---------------------------------------------

class WeightReceiver:
    """The ``/v1/spadekit/weights`` endpoint of ``PolicyServer`` (module docstring)."""

    def __init__(self, policy: Any, lock: Any, enabled: bool = False, token: str | None = None,
                 max_request: int = MAX_REQUEST, max_total: int = MAX_TOTAL) -> None:
        if token is None and enabled:
            try:
                token = weights_token()
            except ConfigError as exc:
                raise PolicyError(exc.message) from None
        if enabled and not token:
            raise PolicyError("--allow-weight-updates needs a shared secret: "
                              f"--weights-token-file FILE, or env {TOKEN_ENV} or "
                              f"{TOKEN_FILE_ENV}")
        if enabled and not callable(getattr(policy, "load_weights", None)):
            raise PolicyError(f"{type(policy).__name__} cannot load weights: weight updates "
                              "need an hf, tiny or vllm model")
        self.policy, self.lock, self.enabled = policy, lock, bool(enabled)
        self._token = (token or "").encode()
        self.max_request, self.max_total = int(max_request), int(max_total)
        self.version, self.updates = 0, 0
        self.last_update: dict[str, Any] | None = None
        self._state = threading.Lock()
        self._upload: str | None = None
        self._staged: dict[str, Any] = {}
        self._staged_bytes = 0
        self._undo_version: int | None = None  # the version an undo goes back to
        self.instance = uuid.uuid4().hex
        """This server's identity: a client that pushed to it sees a restart as a new one."""

    def health(self) -> dict[str, Any]:
        """Fields ``/health`` adds when pushes are enabled (none otherwise)."""
        return {"weight_updates": True, "weights_version": self.version} if self.enabled else {}

    def info(self) -> dict[str, Any]:
        return {"object": "spadekit.weights", "weight_updates": self.enabled,
                "version": self.version, "updates": self.updates,
                "max_request_bytes": self.max_request, "last_update": self.last_update,
                "restore": self.enabled, "instance": self.instance}

    def post(self, handler: Any) -> None:
        """Answer one POST on ``handler`` (a ``BaseHTTPRequestHandler`` with ``_send``)."""
        try:
            status, obj = self._post(handler)
        except Exception as exc:  # a bug must not kill the handler thread silently
            status, obj = 500, {"message": f"internal error: {type(exc).__name__}: {exc}"}
        if status >= 400:
            kind = "server_error" if status >= 500 else "invalid_request_error"
            obj = {"object": "error", "error": {**obj, "type": kind, "code": status}}
        handler._send(status, obj)

    def _post(self, h: Any) -> tuple[int, dict]:
        def refuse(status: int, message: str) -> tuple[int, dict]:
            h.close_connection = True  # the body may be unread
            return status, {"message": message}

        if not self.enabled:
            return refuse(403, "weight updates are disabled (start the server with "
                               "--allow-weight-updates and --weights-token-file)")
        given = (h.headers.get(TOKEN_HEADER) or "").encode()
        if not hmac.compare_digest(given, self._token):
            return refuse(403, f"missing or wrong {TOKEN_HEADER}")
        action = h.headers.get(ACTION_HEADER)
        if action is not None:
            h.close_connection = True  # an action has no body to read
            return self._action(action.strip().lower())
        if "chunked" in (h.headers.get("Transfer-Encoding") or "").lower():
            return refuse(411, "chunked request bodies are not supported; send Content-Length")
        try:
            length = int(h.headers.get("Content-Length") or 0)
        except ValueError:
            return refuse(400, "bad Content-Length")
        if length > self.max_request:
            return refuse(413, f"payload over {self.max_request} bytes; split it into chunks "
                               f"with {UPLOAD_HEADER} and {FINAL_HEADER}")
        data = h.rfile.read(length) if length > 0 else b""
        upload = h.headers.get(UPLOAD_HEADER)
        final = (h.headers.get(FINAL_HEADER) or "1").strip().lower() not in ("0", "false", "no")
        version = h.headers.get(VERSION_HEADER)
        if upload is not None and not _UPLOAD_ID.match(upload):
            return 400, {"message": f"bad {UPLOAD_HEADER} (1-64 of A-Z a-z 0-9 _ -)"}
        if version is not None and not re.fullmatch(r"-?\d{1,18}", version.strip()):
            return 400, {"message": f"{VERSION_HEADER} must be an integer"}
        if not final and upload is None:
            return 400, {"message": f"a non-final chunk needs {UPLOAD_HEADER}"}
        try:
            from safetensors.torch import load

            tensors = load(data) if data else {}
        except Exception as exc:
            with self._state:
                self._discard(upload)
            return 400, {"message": f"the payload is not a safetensors file: {exc}"}
        with self._state:
            if upload is not None and upload != self._upload:
                self._discard(None)
                self._upload = upload
            dup = sorted(set(tensors) & set(self._staged))
            if dup:
                self._discard(None)
                return 400, {"message": f"tensor names sent twice in one upload: {dup[:5]}"}
            self._staged.update(tensors)
            self._staged_bytes += len(data)
            if self._staged_bytes > self.max_total:
                self._discard(None)
                return 413, {"message": f"upload over {self.max_total} bytes in all"}
            if not final:
                return 200, {"staged": len(self._staged), "upload": upload, "final": False,
                             "version": self.version}
            items, nbytes = list(self._staged.items()), self._staged_bytes
            self._discard(None)
        if not items:
            return 400, {"message": "the payload holds no tensors"}
        t0 = time.perf_counter()
        from spadekit.policy import weight_probe

        try:
            with self.lock:  # the batching lock: between generation batches, never mid-batch
                weight_probe.confirm(self.policy)  # a push not undone by now stands
                weight_probe.keep_undo(self.policy)  # hf: a CPU copy; vLLM keeps its own
                self._undo_version = self.version
                loaded = self.policy.load_weights(items)
                self.version = int(version) if version is not None else self.version + 1
                self.updates += 1
        except (WeightSyncError, KeyError, ValueError) as exc:
            self._undo_version = None  # nothing was applied (hf checks first; vLLM undoes)
            if getattr(self.policy, "_weights_undo", None) is not None:
                self.policy._weights_undo = None
            return 400, {"message": f"weights not loaded: {getattr(exc, 'message', exc)}"}
        seconds = time.perf_counter() - t0
        loaded = int(loaded) if isinstance(loaded, int) else len(items)
        self.last_update = {"loaded": loaded, "bytes": nbytes, "seconds": seconds,
                            "time": time.time()}
        return 200, {"loaded": loaded, "version": self.version, "bytes": nbytes,
                     "seconds": seconds, "instance": self.instance}

    def _action(self, action: str) -> tuple[int, dict]:
        """``restore``: undo the last push not confirmed since (the client's check of it
        failed); ``confirm``: it stands. Both under the batching lock."""
        from spadekit.policy import weight_probe

        if action not in ("restore", "confirm"):
            return 400, {"message": f"unknown {ACTION_HEADER} {action!r} (restore, confirm)"}
        with self.lock:
            if action == "confirm":
                weight_probe.confirm(self.policy)
                self._undo_version = None
                return 200, {"confirmed": True, "version": self.version}
            if self._undo_version is None:
                return 409, {"message": "no unconfirmed push to undo"}
            note = weight_probe.restore_previous(self.policy)
            if not note.startswith("the previous weights were restored"):
                return 500, {"message": note}
            self.version, self._undo_version = self._undo_version, None
        return 200, {"restored": True, "version": self.version}

    def _discard(self, upload: str | None) -> None:
        """Drop staged chunks (of ``upload``, or whatever is staged when None)."""
        if upload is None or upload == self._upload:
            self._upload, self._staged, self._staged_bytes = None, {}, 0
