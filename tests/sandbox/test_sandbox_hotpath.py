"""The step hot path of the sandbox protocol: fast, and exactly as strict as the slow path.

The reply checks once made an isolated step cost ~1.4x a bare pipe round trip (target 1.3x).
Profiling showed the checks themselves were cheap; the time went to Python-level JSON machinery
on both sides (``json.loads``' encoding detection and regex passes, a fresh ``JSONEncoder``
pipeline per reply, ``JSONDecoder.decode``'s regex passes in the parent) and to a generator in
the flat-``info`` check. The fast paths that replaced them must give the same values and the
same refusals as the functions they stand for: property tests compare them on arbitrary input.
Two budget tests then serve one real step request through the worker's ``serve`` and decode one
reply in the parent under a profiler, and fail if that machinery comes back.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys

from hypothesis import HealthCheck, given, settings, strategies as st

from spadekit.sandbox import replies, worker, worker_replies
from spadekit.sandbox.sandbox import RemoteEnv

JSON_LEAF = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
             | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
JSON = st.recursive(JSON_LEAF, lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=20)
WHITESPACE = st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2028", max_size=3)
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def outcome(fn, arg):
    """``("ok", repr(value))`` or ``("error", True)`` for any ``ValueError`` (BadReply and
    JSONDecodeError included), ``("error", type)`` for anything else."""
    try:
        return "ok", repr(fn(arg))
    except ValueError:
        return "error", True
    except Exception as exc:  # noqa: BLE001 - the type itself is compared
        return "error", type(exc)


def lines(values=JSON):
    """Lines as the parent writes them, mutated: spaces around, other encodings, junk after."""
    return st.one_of(
        values.map(lambda v: json.dumps(v).encode() + b"\n"),
        st.tuples(WHITESPACE, values, WHITESPACE, st.sampled_from(["", "x", "{}", "1", "]"]),
                  st.sampled_from(["utf-8", "utf-16", "utf-32-le", "utf-8-sig"])).map(
            lambda t: (t[0] + json.dumps(t[1], ensure_ascii=False) + t[2] + t[3]).encode(
                t[4], "surrogatepass")),
        st.binary(max_size=40),
        st.binary(max_size=40).map(lambda b: b"{" + b))


@SETTINGS
@given(line=lines())
def test_worker_request_decoding_is_json_loads(line):
    assert outcome(worker_replies.decode_request, line) == outcome(json.loads, line)


@SETTINGS
@given(line=lines(JSON | st.sampled_from([float("nan"), float("inf"), 1e308]).map(
    lambda x: [x, {"x": -x}])))
def test_parent_reply_parsing_is_the_full_decoder(line):
    """``replies._parse`` against ``_DECODER.decode`` itself: same value, or both refuse (NaN,
    Infinity, overflowing floats and trailing data included)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return
    for candidate in (text, text.replace("1e+308", "1e999")):
        assert outcome(replies._parse, candidate) == outcome(replies._DECODER.decode, candidate)


@SETTINGS
@given(rid=st.integers(0, 2 ** 53), result=JSON)
def test_reply_encoding_is_the_compact_encoder(rid, result):
    """What ``JSONEncoder(allow_nan=False, separators=(",", ":")).encode`` wrote before."""
    obj = {"id": rid, "ok": True, "result": result}
    expected = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode() + b"\n"
    assert worker_replies.encode_reply(obj) == expected


class _Odd:
    """Not JSON; its repr (what ``sanitize`` sends instead) holds a lone surrogate. Drawn with
    ``st.builds``: a strategy that showed this repr would break hypothesis' own report."""

    def __repr__(self) -> str:
        return "odd\ud800"


def _cycle():
    loop: list = [1]
    loop.append(loop)
    return loop


HOSTILE = st.recursive(
    JSON_LEAF | st.sampled_from([float("nan"), float("inf"), "\ud800", "a\udfff", {1, 2},
                                 frozenset(), b"bytes", 10 ** 30, (1, "\ud83d")])
    | st.builds(_cycle) | st.builds(_Odd),
    lambda kids: st.lists(kids, max_size=3) | st.tuples(kids, kids)
    | st.dictionaries(st.one_of(st.text(max_size=3), st.integers(), st.just("\udc80")), kids,
                      max_size=3), max_leaves=12)


class Hostile:
    """An environment whose step ``info`` and ``solution()`` are whatever the test gives."""

    value = None

    def step(self, action):
        return "obs", 1, True, False, self.value

    def solution(self):
        return self.value


def serve_one(env, request: bytes, calls: list | None = None) -> bytes:
    """``request`` served by the worker's real ``serve`` (dispatch, checks, ``send`` into a
    real pipe) with ``env`` as instance 7; the one reply line it wrote. With ``calls``, the
    Python functions ``serve`` entered are appended to it."""
    read_end, write_end = os.pipe()
    saved = (worker.PROTO_OUT, dict(worker.STATE))
    worker.PROTO_OUT = write_end
    worker.STATE.update(instances={7: env}, cfg={"max_observation_chars": 65536})
    try:
        if calls is None:
            worker.serve(io.BytesIO(request))
        else:
            calls += python_calls(lambda: worker.serve(io.BytesIO(request)))
    finally:
        worker.PROTO_OUT = saved[0]
        worker.STATE.clear()
        worker.STATE.update(saved[1])
        os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    return data[:-1]


@SETTINGS
@given(value=HOSTILE, nest=st.integers(0, 80), op=st.sampled_from(["step", "call"]))
def test_worker_replies_always_pass_the_parent_schema(value, nest, op):
    """Whatever a program returns, the worker's reply is one the parent accepts: a step result
    that ``checked_step`` passes, a method result, or a well-formed error."""
    for _ in range(nest):
        value = [value] if nest % 2 else {"k": value}
    env = Hostile()
    env.value = value
    request = (b'{"id":5,"op":"step","instance":7,"action":"a"}\n' if op == "step" else
               b'{"id":5,"op":"call","instance":7,"method":"solution","args":[]}\n')
    ok, result = replies.envelope(replies.decode_line(serve_one(env, request)), 5)
    if not ok:
        replies.check_error(result)
    elif op == "step":
        RemoteEnv(_Box(), 7, None).checked_step(result)


class _Box:  # what RemoteEnv's checks read of its sandbox
    class config:
        max_observation_chars = 65536


FLAT_INFO = st.dictionaries(
    st.one_of(st.text(max_size=4), st.integers(), st.just("\udc80"), st.just("é")),
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4), st.just("\ud800"),
              st.floats(), st.lists(st.integers(), max_size=2), st.builds(_Odd)), max_size=5)


@SETTINGS
@given(info=FLAT_INFO)
def test_flat_info_shortcut_agrees_with_the_full_walk(info):
    """The loop that accepts the usual flat ASCII ``info`` at once says what the general walk
    says (wrapping the dict in a list sends it through the walk, one level deeper)."""
    assert worker_replies.plain(info) == worker_replies.plain([info], worker_replies.RESULT_DEPTH
                                                              + 1)


class _Tuple(tuple):
    """A tuple that is not exactly ``tuple``: ``check_step`` takes its one-by-one checks."""


ODD_PART = st.one_of(st.none(), st.integers(-2, 2), st.just("\ud800"), st.floats(), st.just([]),
                     st.booleans(), st.text(max_size=2))
STEP = st.tuples(st.text(max_size=6) | st.just("é" * 3), st.floats(0, 1), st.booleans(),
                 st.booleans(), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@SETTINGS
@given(parts=STEP, spoil=st.integers(-1, 4), bad=ODD_PART, cap=st.integers(0, 8))
def test_step_check_shortcut_agrees_with_the_checks_one_by_one(parts, spoil, bad, cap):
    """A valid step result with at most one part replaced: the one-expression shortcut (exact
    tuple) and the one-by-one checks (a tuple subclass) give the same verdict and value."""
    if spoil >= 0:
        parts = parts[:spoil] + (bad,) + parts[spoil + 1:]
    fast, slow = worker_replies.check_step(parts, cap), worker_replies.check_step(
        _Tuple(parts), cap)
    assert repr(fast) == repr(slow)
    if fast[0] is not None:
        assert [type(v) for v in fast[0]] == [type(v) for v in slow[0]]
    if spoil < 0 and len(parts[0]) <= cap:
        assert fast[1] is None  # a valid result is accepted


# ---------------------------------------------------------------------------------------------
# budgets: the Python functions one step runs


JSON_DIR = os.path.dirname(json.__file__)


def python_calls(fn):
    """The Python-level functions ``fn()`` enters, as (file, name)."""
    seen = []

    def hook(frame, event, _arg):
        if event == "call":
            seen.append((frame.f_code.co_filename, frame.f_code.co_name))

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


class EchoEnv:
    def step(self, action):
        return "obs:" + action, 0.5, False, False, {"t": 3, "done": False}


def test_a_served_step_runs_no_python_json_machinery():
    """One step request through the worker's own ``serve`` (its real reader loop, dispatch,
    checks and ``send``, writing to a real pipe): none of the json package's Python functions,
    no generator, and the reply is what the parent accepts."""
    request = b'{"id":41,"op":"step","instance":7,"action":"go north"}\n'
    serve_one(EchoEnv(), request)  # warm: first-use imports are not the hot path
    calls: list = []
    line = serve_one(EchoEnv(), request, calls)
    ok, result = replies.envelope(replies.decode_line(line), 41)
    assert ok and result == ["obs:go north", 0.5, False, False, {"t": 3, "done": False}]
    assert not [c for c in calls if c[0].startswith(JSON_DIR)], calls
    assert not [c for c in calls if c[1] == "<genexpr>"], calls
    own = {worker.__file__, worker_replies.__file__, __file__}
    assert {c[0] for c in calls} <= own, calls  # nothing but the worker's code and the program


def test_the_parent_decodes_and_checks_a_step_reply_without_the_python_decoder():
    line = (b'{"id":9,"ok":true,"result":["obs:go north",0.5,false,false,'
            b'{"t":3,"note":"caf\\u00e9"}]}')
    expected = ("obs:go north", 0.5, False, False, {"t": 3, "note": "café"})

    env = RemoteEnv(_Box(), 1, None)

    def decode():
        ok, raw = replies.envelope(replies.decode_line(line), 9)
        assert ok and env.checked_step(raw) == expected

    decode()
    calls = python_calls(decode)
    assert not [c for c in calls if c[0].startswith(JSON_DIR)], calls
    assert not [c for c in calls if c[1] == "<genexpr>"], calls


def test_decoding_keeps_refusing_what_the_full_decoder_refuses():
    """Spot checks next to the property tests: trailing data, NaN, overflow, bad UTF-8."""
    for bad in (b'{"id":1,"ok":true,"result":1} {}', b'{"id":1,"ok":true,"result":NaN}',
                b'{"id":1,"ok":true,"result":1e999}', b'{"id":1,"ok":true,"result":"\xff"}',
                b'{"id":1,"ok":true,"result":1}\x0c', b""):
        assert outcome(replies.decode_line, bad) == ("error", True), bad
    assert replies.decode_line(b' \t{"id":1,"ok":true,"result":1}\r\n')["result"] == 1
    assert math.isnan(json.loads("NaN"))  # the worker-side decoder keeps json.loads' rules
    assert outcome(worker_replies.decode_request, b'{"a":NaN}\n')[0] == "ok"
