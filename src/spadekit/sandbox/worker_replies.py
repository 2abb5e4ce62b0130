"""What a sandbox worker sends: program results checked, replies encoded, requests decoded.

Standard library only (copied into the workers' runtime library); the parent re-runs
``check_reset``/``check_step`` on every reply and shares ``valid_text`` with ``replies``.

- ``check_reset``/``check_step``: the Gymnasium result contract (types, finite reward in [0, 1],
  observation size, valid Unicode), as ``(value, None)`` or ``(None, error)``;
- ``plain``/``sanitize``: ``info`` and method results kept inside the parent's schema;
- ``encode_reply``: one reply object -> one JSON line (the hot path uses C encoders only);
- ``decode_request``: one request line from the parent -> its object.
"""

import json
import json.encoder
import math

# Limits of the parent's reply schema (spadekit.sandbox.replies, which refuses replies nested
# deeper than 32 levels): info and method results nest at most RESULT_DEPTH levels as they are.
RESULT_DEPTH = 16
ERROR_FIELD_CHARS = {"message": 4000, "traceback": 8000, "exc_type": 200, "reason": 64,
                     "kind": 32, "type": 64}
MAX_NAME_CHARS = 200

# One C encoder for every reply: compact separators, NaN/Infinity refused (ValueError), no
# circular-reference markers (a reused markers dict could keep stale entries after an error; a
# cycle ends in RecursionError instead). Either error sends the reply through ``sanitize``.
_encode = json.encoder.c_make_encoder(
    None, json.JSONEncoder(allow_nan=False).default, json.encoder.encode_basestring_ascii,
    None, ":", ",", False, False, False) if json.encoder.c_make_encoder else None
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
_SCAN = json.JSONDecoder().scan_once


def dumps(obj):
    """``obj`` as compact ASCII JSON text (NaN/Infinity refused), as ``_ENCODER.encode`` would
    write it, through the reusable C encoder when there is one."""
    if _encode is None or isinstance(obj, str):
        return _ENCODER.encode(obj)
    return "".join(_encode(obj, 0))


def encode_reply(obj):
    """One reply line (bytes, newline included). Values that JSON cannot carry (sets, objects,
    NaN inside ``info``, deep nesting, lone surrogates) are made safe by ``sanitize`` only when
    needed; what still fails becomes an ``InvalidResult`` reply to the same id."""
    try:
        data = dumps(obj).encode() + b"\n"
        if b"\\ud" in data and not plain(obj, 64):
            data = dumps(sanitize(obj, -64)).encode() + b"\n"
    except Exception:
        try:
            data = dumps(sanitize(obj)).encode() + b"\n"
        except Exception as exc:
            data = json.dumps({"id": obj.get("id"), "ok": False, "error": {
                "type": "InvalidResult", "reason": "bad_result",
                "message": "result is not JSON-serialisable: %s" % _short(exc)}}).encode() + b"\n"
    return data


def decode_request(line):
    """One request line -> its object, as ``json.loads`` reads it (``ValueError`` otherwise).
    The parent writes one compact object per line; the C scanner reads that directly, anything
    else (leading spaces, other encodings, errors) goes through ``json.loads`` itself."""
    if line[:1] == b"{":
        try:
            text = line.decode("utf-8", "surrogatepass")
            value, end = _SCAN(text, 0)
        except (ValueError, StopIteration):
            return json.loads(line)
        if end == len(text) or not text[end:].strip(" \t\n\r"):
            return value
    return json.loads(line)


def _short(exc, limit=2000):
    try:
        text = str(exc)
    except BaseException:
        text = "<unprintable %s>" % type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def invalid(reason, message):
    return {"type": "InvalidResult", "reason": reason, "message": message}


def sanitize(value, depth=0):
    """Make ``info`` JSON-safe: keep JSON types, stringify the rest, bound depth and size,
    replace lone surrogates. (``depth`` below 0 gives room for deeper values: ``send`` uses it
    to only mend text in replies that are already well formed.)"""
    if depth > 8:
        return "<too deep>"
    if isinstance(value, str):
        return mend_text(value)
    if value is None or isinstance(value, (bool, int)):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2 ** 63:
            return str(value)
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {mend_text(str(k)[:200]): sanitize(v, depth + 1)
                for k, v in list(value.items())[:1000]}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [sanitize(v, depth + 1) for v in list(value)[:1000]]
    text = repr(value)
    return mend_text(text[:1000])


def valid_text(text):
    """True when ``text`` can be encoded as UTF-8 (it holds no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def mend_text(text):
    """``text`` with each lone surrogate replaced by U+FFFD."""
    return text if valid_text(text) else text.encode("utf-8", "surrogatepass").decode(
        "utf-8", "replace")


def _flat_ascii(info):
    """True when every key of the dict ``info`` is ASCII text and every value is ASCII text, an
    int, a bool or None (a plain loop: a generator inside ``all()`` costs twice as much)."""
    for key, value in info.items():
        if type(key) is not str or not key.isascii():
            return False
        kind = type(value)
        if kind is str:
            if not value.isascii():
                return False
        elif not (kind is int or kind is bool or value is None):
            return False
    return True


def plain(value, limit=RESULT_DEPTH):
    """True when ``value`` can be sent as is: JSON types only, finite floats, string keys,
    valid text, at most ``limit`` levels deep. Otherwise ``sanitize`` it first."""
    if type(value) is dict and _flat_ascii(value):
        return True  # the usual info: a flat dict of ASCII text, ints, bools, None
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is str:
            if not valid_text(item):
                return False
        elif kind is dict or kind is list or kind is tuple:
            if depth >= limit or (kind is dict and not all(type(k) is str and valid_text(k)
                                                            for k in item)):
                return False
            stack.extend((sub, depth + 1) for sub in (item.values() if kind is dict else item))
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif not (item is None or kind is bool or kind is int):
            return False
    return True


def bounded_error(err):
    """An error reply's fields cut to the parent's sizes, text mended."""
    out = {}
    for key, value in err.items():
        limit = ERROR_FIELD_CHARS.get(key)
        if limit is not None:
            text = mend_text(value if isinstance(value, str) else str(value))
            out[key] = text if len(text) <= limit else text[:limit - 3] + "..."
        elif key == "line":
            out[key] = value if type(value) is int else None
    return out


def check_obs(obs, where, cap):
    if not isinstance(obs, str):
        return invalid("bad_%s_type" % where, "observation must be str, got %s" % type(obs).__name__)
    if len(obs) > cap:
        return invalid("observation_too_large",
                       "observation has %d characters (limit %d)" % (len(obs), cap))
    if not obs.isascii() and not valid_text(obs):  # isascii first: the hot path's call
        return invalid("bad_text", "observation is not valid Unicode (it holds a lone "
                       "surrogate)")
    return None


def check_reset(result, cap):
    if not isinstance(result, tuple) or len(result) != 2:
        return None, invalid("bad_reset_type", "reset() must return (observation: str, info: dict),"
                             " got %s" % _describe(result))
    obs, info = result
    err = check_obs(obs, "reset", cap)
    if err:
        return None, err
    if not isinstance(info, dict):
        return None, invalid("bad_reset_type", "reset() info must be a dict, got %s"
                             % type(info).__name__)
    return [obs, info], None


def check_step(result, cap):
    """``([obs, reward, terminated, truncated, info], None)`` for a valid step result, else
    ``(None, error)``. The usual result (exact types, an ASCII observation, a float reward)
    passes every check in one expression; anything else takes the checks one by one."""
    if type(result) is tuple and len(result) == 5:
        obs, reward, terminated, truncated, info = result
        if (type(obs) is str and len(obs) <= cap and obs.isascii() and type(reward) is float
                and 0.0 <= reward <= 1.0 and type(terminated) is bool
                and type(truncated) is bool and type(info) is dict):
            return [obs, reward, terminated, truncated, info], None
    if not isinstance(result, tuple) or len(result) != 5:
        return None, invalid("bad_step_type", "step() must return a 5-tuple (observation, reward,"
                             " terminated, truncated, info), got %s" % _describe(result))
    obs, reward, terminated, truncated, info = result
    err = check_obs(obs, "step", cap)
    if err:
        return None, err
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return None, invalid("bad_step_type", "reward must be a number, got %s"
                             % type(reward).__name__)
    reward = float(reward)
    if not math.isfinite(reward):
        return None, invalid("reward_not_finite", "reward must be finite, got %r" % reward)
    if not 0.0 <= reward <= 1.0:
        return None, invalid("reward_out_of_range", "reward must be in [0, 1], got %r" % reward)
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool):
            return None, invalid("bad_step_type", "%s must be a bool, got %s"
                                 % (name, type(flag).__name__))
    if not isinstance(info, dict):
        return None, invalid("bad_step_type", "info must be a dict, got %s" % type(info).__name__)
    return [obs, reward, terminated, truncated, info], None


def _describe(value):
    if isinstance(value, (tuple, list)):
        return "%s of length %d" % (type(value).__name__, len(value))
    return type(value).__name__
