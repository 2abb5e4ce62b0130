"""Replies are untrusted data: attacks on the parent from the worker's side of the pipe.

Two halves. A property-based fuzzer drives the parent's whole reply handling (``Sandbox`` over
real pipes, a thread playing the worker) with arbitrary, malformed, deep, huge and hostile
replies for every message type: the public call returns a correct value or raises a typed
``SandboxError``, nothing else. Then real programs in the real sandbox replace the worker's own
``send`` (or write to its protocol pipe) from inside ``__init__``/``reset``/``step`` to forge
replies: each ends in a typed error that kills that worker, nothing of it survives, and the pool
still serves the next program.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import ECHO, assert_pool_works, live_processes_of_uid, process_alive
from spadekit.common.errors import InvalidResult, ProtocolViolation, SandboxClosed, SandboxError
from spadekit.sandbox import SandboxConfig, SandboxPool
from spadekit.sandbox import replies
from spadekit.sandbox.batch import start_many, step_many
from spadekit.sandbox.sandbox import RemoteEnv, Sandbox
from spadekit.sandbox import worker as worker_mod

# ---------------------------------------------------------------------------------------------
# the parent over real pipes, a thread as the worker

FAKE_CONFIG = SandboxConfig(step_timeout=2.0, reset_timeout=2.0, create_timeout=2.0,
                            load_timeout=2.0, call_timeout=2.0, max_observation_chars=4096,
                            max_reply_bytes=1 << 20)


class _Proc:
    def __init__(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        err_r, err_w = os.pipe()
        os.close(err_w)  # the worker prints nothing: its output reader ends at once
        self.stdin = os.fdopen(req_w, "wb", buffering=0)
        self.stdout = os.fdopen(rep_r, "rb", buffering=0)
        self.stderr = os.fdopen(err_r, "rb", buffering=0)
        self.requests = os.fdopen(req_r, "rb")
        self.replies = rep_w
        self.pid = -1

    def wait(self, timeout=None) -> int:
        return 0


class FakeWorker:
    """What ``Sandbox`` needs of a worker process; the other pipe ends belong to the test."""

    plan = None
    uid = None

    def __init__(self) -> None:
        self.proc = _Proc()
        self.closed = False

    def kill(self) -> None:
        if not self.closed:
            self.closed = True
            self.proc.stdin.close()  # the responder's blocked writes fail instead of hanging
            self.proc.stdout.close()

    def wake(self) -> None:
        pass

    def rest(self) -> None:
        pass


def respond(worker: FakeWorker, answers: list[bytes], seen: list) -> threading.Thread:
    """Answer the next requests, one ``answers`` item each, then end the reply pipe (EOF)."""

    def run() -> None:
        try:
            for data in answers:
                line = worker.proc.requests.readline()
                if not line:
                    return
                seen.append(json.loads(line)["id"])
                view = memoryview(data)
                while view:
                    view = view[os.write(worker.proc.replies, view):]
        except OSError:
            pass
        finally:
            os.close(worker.proc.replies)
            worker.proc.requests.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _plain_json(value) -> None:
    """A value the parent hands on: strict JSON round trip, valid Unicode throughout."""
    text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")


def drive(op: str, data: bytes):
    """One public call of ``op`` answered by ``data``; returns (sandbox, value or exception)."""
    worker = FakeWorker()
    sb = Sandbox(worker, FAKE_CONFIG)
    seen: list = []
    answers = [data]
    if op == "start_many":  # create (the reply under test), then a well-formed reset
        answers.append(b'{"id":2,"ok":true,"result":["ready",{}]}\n')
    thread = respond(worker, answers, seen)
    env = RemoteEnv(sb, 1, None)
    calls = {
        "load": lambda: sb.load("class AEnv: pass"),
        "create": lambda: sb.new_env(max_turns=12),
        "reset": lambda: env.reset(seed=0),
        "step": lambda: env.step("a"),
        "solution": env.solution,
        "tools": env.tools,
        "drop": lambda: sb.request("drop", {"instance": 1}),
        "step_many": lambda: step_many([(env, "a")])[0],
        "start_many": lambda: start_many([(sb, 12, 0, None)])[0],
    }
    try:
        out = calls[op]()
    except SandboxError as exc:
        out = exc
    thread.join(5)
    sb.close()
    assert seen[:1] == [1], "the fake worker did not see the request"
    return sb, out


def check_outcome(op: str, sb: Sandbox, out) -> None:
    if isinstance(out, SandboxError):
        if isinstance(out, ProtocolViolation):
            assert sb.failure is out and sb.worker.closed
        json.dumps(out.to_dict(), allow_nan=False, default=str)
        return
    if op == "create":
        _plain_json([out.instance, out.max_turns])
    elif op == "start_many":
        _plain_json([out[0].instance, out[0].max_turns, out[1], out[2]])
    else:
        _plain_json(out)
    if op == "load":
        assert set(out) == {"class_name", "has_solution", "has_tools", "doc"}
        assert isinstance(out["class_name"], str) and out["class_name"].endswith("Env")
        assert type(out["has_solution"]) is bool and type(out["has_tools"]) is bool
    elif op == "create":
        assert type(out.instance) is int and out.instance > 0
        assert out.max_turns is None or (type(out.max_turns) is int and 1 <= out.max_turns <= 12)
    elif op == "reset":
        obs, info = out
        assert isinstance(obs, str) and len(obs) <= 4096 and isinstance(info, dict)
    elif op in ("step", "step_many"):
        obs, reward, term, trunc, info = out
        assert isinstance(obs, str) and len(obs) <= 4096
        assert type(reward) is float and math.isfinite(reward) and 0.0 <= reward <= 1.0
        assert type(term) is bool and type(trunc) is bool and isinstance(info, dict)
    elif op == "start_many":
        env, obs, info = out
        assert isinstance(env, RemoteEnv) and isinstance(obs, str) and isinstance(info, dict)
        assert env.max_turns is None or 1 <= env.max_turns <= 12
    elif op == "solution":
        assert isinstance(out, list) and all(isinstance(a, str) for a in out)
    elif op == "tools":
        assert isinstance(out, list) and all(isinstance(t, dict) for t in out)


# ---------------------------------------------------------------------------------------------
# strategies: near-valid and hostile replies for every message type

LONE = st.sampled_from(["\ud800", "\udfff", "ok\udc80", "\udbff\u0041"])
TEXT = st.one_of(st.text(max_size=12), LONE, st.just("\x1b]52;c;ZXZpbA==\x07"))
NUMBER = st.one_of(st.integers(-3, 20), st.integers(-2 ** 70, 2 ** 70),
                   st.floats(allow_nan=True, allow_infinity=True))
SCALAR = st.one_of(st.none(), st.booleans(), NUMBER, TEXT)
JSON = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
INFO = st.one_of(st.dictionaries(TEXT, JSON, max_size=3), JSON)
OBS = st.one_of(TEXT, st.just("x" * 5000), JSON)

RESULTS = {
    "load": st.one_of(st.fixed_dictionaries({
        "class_name": st.one_of(st.just("GoodEnv"), TEXT, st.just("E" * 300 + "Env"), JSON),
        "has_solution": st.one_of(st.booleans(), JSON),
        "has_tools": st.one_of(st.booleans(), JSON),
        "doc": st.one_of(st.just(""), TEXT, st.just("d" * 600), JSON)}), JSON),
    "create": st.one_of(st.fixed_dictionaries({
        "instance": st.one_of(st.integers(-2, 2 ** 60), JSON),
        "max_turns": st.one_of(st.none(), st.integers(-5, 10 ** 13), st.just(True),
                               st.just("12"), st.just(12.0), JSON)}), JSON),
    "reset": st.one_of(st.tuples(OBS, INFO).map(list), JSON),
    "step": st.one_of(st.tuples(OBS, st.one_of(NUMBER, st.booleans(), TEXT), SCALAR, SCALAR,
                                INFO).map(list), JSON),
    "solution": st.one_of(st.lists(TEXT, max_size=4), JSON),
    "tools": st.one_of(st.lists(st.dictionaries(TEXT, JSON, max_size=3), max_size=3), JSON),
    "drop": st.one_of(st.just(True), JSON),
}
RESULTS["step_many"] = RESULTS["step"]
RESULTS["start_many"] = RESULTS["create"]

ERROR = st.one_of(st.fixed_dictionaries({
    "type": st.one_of(st.sampled_from(sorted(replies.ERROR_KINDS) + ["Bogus", "SandboxClosed"]),
                      JSON),
    "message": st.one_of(TEXT, st.just("m" * 5000), JSON)},
    optional={"reason": st.one_of(TEXT, JSON), "exc_type": st.one_of(TEXT, st.just("T" * 300)),
              "traceback": st.one_of(TEXT, st.just("t" * 9000)), "kind": TEXT,
              "line": st.one_of(st.none(), st.integers(), JSON), "extra": JSON}), JSON)


def envelopes(result):
    return st.one_of(
        st.fixed_dictionaries({"id": st.just(1), "ok": st.just(True), "result": result}),
        st.fixed_dictionaries({"id": st.just(1), "ok": st.just(False), "error": ERROR}),
        st.fixed_dictionaries({"id": st.one_of(st.just(True), st.just(1.0), st.just(2), JSON),
                               "ok": st.one_of(st.booleans(), JSON), "result": result},
                              optional={"error": ERROR, "more": JSON}),
        JSON)


def encoded(result):
    """Reply bytes: an envelope encoded in one of several ways, plus hostile raw lines."""
    line = st.tuples(envelopes(result), st.booleans()).map(
        lambda t: json.dumps(t[0], ensure_ascii=t[1], allow_nan=True).encode(
            "utf-8", "surrogatepass"))
    ending = st.sampled_from([b"\n", b"", b"\n" + b'{"id": 2, "ok": true, "result": 1}\n',
                              b"\n\n", b" \n"])
    raw = st.one_of(
        st.binary(max_size=64),
        st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(1, 200_000).map(lambda n: b"[" * n),
        st.integers(1, 50_000).map(lambda n: b'{"id":1,"ok":true,"result":' + b'{"a":' * n
                                   + b"1" + b"}" * n + b"}"),
        st.integers(1, 3).map(lambda n: b'{"id":1,"ok":true,"result":"' + b"x" * (
            n * 700_000) + b'"}'),
        st.sampled_from([b'{"id":1,"ok":true,"result":["o",NaN,false,false,{}]}',
                         b'{"id":1,"ok":true,"result":["o",1e999,false,false,{}]}',
                         b'{"id":1,"ok":true,"result":["o",0.5,false,false,{"v":-Infinity}]}',
                         b'{"id":1,"ok":true,"result":["\\ud800",0.5,false,false,{}]}',
                         b'{"id":1,"ok":true,"result":["o",0.5,false,false,{"\\udfff":1}]}',
                         b'{"id":1,"ok":true,"result":["o",0.5,false,false,{}]}'
                         b'{"id":1,"ok":true,"result":1}',
                         b'\xed\xa0\x80', b'{"id":1,"ok":true,"result":"\xff"}',
                         b'{"id":1,"ok":true,"result":' + b"9" * 5000 + b"}"]))
    return st.one_of(st.tuples(line, ending).map(lambda t: t[0] + t[1]),
                     st.tuples(raw, ending).map(lambda t: t[0] + t[1]))


OPS = sorted(RESULTS)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_replies_give_a_correct_value_or_a_typed_error(data):
    op = data.draw(st.sampled_from(OPS), label="op")
    reply = data.draw(encoded(RESULTS[op]), label="reply")
    sb, out = drive(op, reply)
    check_outcome(op, sb, out)


@pytest.mark.parametrize("op", OPS)
def test_a_well_formed_reply_still_passes(op):
    """The fuzzer's other half: a correct reply of each type is accepted as it is."""
    good = {"load": {"class_name": "GoodEnv", "has_solution": True, "has_tools": False,
                     "doc": "d\u00e9"},
            "create": {"instance": 3, "max_turns": 10 ** 12},
            "reset": ["start \U0001f600", {"k": [1, 2.5, None]}],
            "step": ["obs", 1, True, False, {"a": {"b": "\u00e9"}}],
            "solution": ["\\boxed{1}"], "drop": True,
            "tools": [{"type": "function", "function": {
                "name": "look", "description": "d",
                "parameters": {"type": "object", "properties": {}}}}]}
    good["step_many"], good["start_many"] = good["step"], good["create"]
    sb, out = drive(op, json.dumps({"id": 1, "ok": True, "result": good[op]}).encode() + b"\n")
    check_outcome(op, sb, out)
    assert not isinstance(out, SandboxError), out
    if op in ("create", "start_many"):  # 10**12 from the program, clamped to the caller's cap
        assert (out if op == "create" else out[0]).max_turns == 12


@pytest.mark.parametrize("line", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"id":1,"ok":true,"result":' + b"[" * 40 + b"]" * 40 + b"}",
    b'{"id":1,"ok":true,"result":["' + b"[" * 5000 + b'",0.5,false,false,{}]}',
], ids=["100k-deep", "40-deep", "brackets-in-a-string"])
def test_depth_is_measured_before_parsing(line):
    if b'"[' in line:  # brackets inside a string are text, not nesting
        assert replies.decode_line(line)["result"][0] == "[" * 5000
        return
    with pytest.raises(replies.BadReply, match="deeper"):
        replies.decode_line(line)


def test_decoding_survives_a_raised_recursion_limit():
    """Even with a recursion limit far above what the C stack holds, a deep line is refused
    before the recursive parser sees it."""
    old = os.sys.getrecursionlimit()
    os.sys.setrecursionlimit(10 ** 6)
    try:
        with pytest.raises(replies.BadReply):
            replies.decode_line(b"[" * 900_000 + b"]" * 900_000)
    finally:
        os.sys.setrecursionlimit(old)


@pytest.mark.parametrize("turns,cap,want", [(10 ** 12, 12, 12), (8, 12, 8), (-1, 12, None),
                                            (0, 12, None), (10 ** 12, None,
                                                            replies.TURNS_CEILING)])
def test_max_turns_is_clamped(turns, cap, want):
    assert replies.check_create({"instance": 1, "max_turns": turns}, cap) == (1, want)


@pytest.mark.parametrize("turns", ["12", True, 12.0, [12]])
def test_max_turns_of_the_wrong_type_is_refused(turns):
    with pytest.raises(replies.BadReply):
        replies.check_create({"instance": 1, "max_turns": turns}, 12)


def test_worker_limits_agree_with_the_parent_schema():
    assert worker_mod.ERROR_FIELD_CHARS == replies.MAX_ERROR_FIELD_CHARS
    assert worker_mod.MAX_NAME_CHARS == replies.MAX_NAME_CHARS
    assert worker_mod.RESULT_DEPTH + 4 <= replies.MAX_DEPTH


# ---------------------------------------------------------------------------------------------
# real programs that forge replies from inside the worker

FORGER = '''
import os, sys, json, threading, time
_MAIN = sys.modules["__main__"]  # the worker script: its send() writes every reply


def forge(make):
    """The next reply the worker sends is make(request id) instead."""
    real = _MAIN.send

    def fake(obj):
        _MAIN.send = real
        os.write(_MAIN.PROTO_OUT, make(obj.get("id")))
    _MAIN.send = fake


{top}


class ForgeEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
        {init}

    def reset(self, seed=None, options=None):
        {reset}
        return "ready", {{}}

    def step(self, action):
        {step}
        return "obs", 0.0, False, False, {{}}
'''


def forger(top: str = "pass", init: str = "pass", reset: str = "pass", step: str = "pass") -> str:
    return FORGER.format(top=top, init=init, reset=reset, step=step)


def ok_step(result: str) -> str:
    return "forge(lambda r: b'{\"id\":%d,\"ok\":true,\"result\":" + result + "}\\n' % r)"


FORGED_STEPS = {
    "wrong id": "forge(lambda r: b'{\"id\":%d,\"ok\":true,\"result\":[\"won\",1.0,true,false,{}]}"
                "\\n' % (r + 1))",
    "list instead of object": "forge(lambda r: b'[%d,true,[\"won\",1.0,true,false,{}]]\\n' % r)",
    "NaN in info": ok_step('[\"won\",1.0,true,false,{\"v\":NaN}]'),
    "Infinity reward": ok_step('[\"won\",Infinity,true,false,{}]'),
    "overflowing reward": ok_step('[\"won\",1e999,true,false,{}]'),
    "reward true": ok_step('[\"won\",true,true,false,{}]'),
    "reward out of range": ok_step('[\"won\",7,true,false,{}]'),
    "lone surrogate": ok_step('[\"\\\\ud800 won\",1.0,true,false,{}]'),
    "lone surrogate in a key": ok_step('[\"won\",1.0,true,false,{\"\\\\udfff\":1}]'),
    "raw surrogate bytes": ok_step('[\"\\xed\\xa0\\x80\",1.0,true,false,{}]'),
    "100k-deep nesting": "forge(lambda r: b'{\"id\":%d,\"ok\":true,\"result\":' % r + b'[' * "
                         "100000 + b']' * 100000 + b'}\\n')",
    "deep info": "forge(lambda r: b'{\"id\":%d,\"ok\":true,\"result\":[\"o\",1.0,true,false,' % r"
                 " + b'{\"a\":' * 60 + b'1' + b'}' * 60 + b']}\\n')",
    "huge observation": "forge(lambda r: b'{\"id\":%d,\"ok\":true,\"result\":[\"' % r + b'x' * "
                        "900000 + b'\",1.0,true,false,{}]}\\n')",
    "load reply to a step": ok_step('{\"class_name\":\"XEnv\",\"has_solution\":true,'
                                    '\"has_tools\":false,\"doc\":\"\"}'),
    "create reply to a step": ok_step('{\"instance\":1,\"max_turns\":12}'),
    "garbage bytes": "forge(lambda r: b'\\xff\\xfe\\x00garbage\\n')",
    "two replies at once": "forge(lambda r: b'{\"id\":%d,\"ok\":true,\"result\":[\"o\",0.0,false,"
                           "false,{}]}\\n{\"id\":%d,\"ok\":true,\"result\":[\"won\",1.0,true,false,"
                           "{}]}\\n' % (r, r + 1))",
    "extra envelope key": "forge(lambda r: b'{\"id\":%d,\"ok\":true,\"result\":[\"o\",0.0,false,"
                          "false,{}],\"reward\":1}\\n' % r)",
    "start error": "forge(lambda r: b'{\"id\":%d,\"ok\":false,\"error\":{\"type\":"
                   "\"SandboxStartError\",\"message\":\"x\"}}\\n' % r)",
    "unknown error type": "forge(lambda r: b'{\"id\":%d,\"ok\":false,\"error\":{\"type\":"
                          "\"KeyError\",\"message\":\"x\"}}\\n' % r)",
    "huge error field": "forge(lambda r: b'{\"id\":%d,\"ok\":false,\"error\":{\"type\":"
                        "\"EnvRaised\",\"message\":\"x\",\"exc_type\":\"' % r + b'T' * 5000 + "
                        "b'\"}}\\n')",
    "error as a list": "forge(lambda r: b'{\"id\":%d,\"ok\":false,\"error\":[1]}\\n' % r)",
    "write to the pipe directly": "os.write(_MAIN.PROTO_OUT, b'{\"id\":1,\"ok\":true}\\n')",
}


def ticks() -> float:
    """Now, in clock ticks since boot (the unit of a process's start time)."""
    with open("/proc/uptime") as fh:
        return float(fh.read().split()[0]) * os.sysconf("SC_CLK_TCK")


def no_survivors(pool, sb, since: float | None = None) -> None:
    """Close the sandbox, check nothing of it survives, check the pool still works. Processes
    of its uid started after ``since`` (taken before the attack killed the worker) belong to a
    later worker that was handed the freed uid."""
    uid = sb.worker.uid
    closed_at = ticks() if since is None else since
    sb.close()

    def left() -> list[int]:  # of the closed worker: its uid may already serve a new one
        mine = live_processes_of_uid(uid) if uid is not None else []
        return [p for p in mine if _started(p) <= closed_at] + [
            p for p in sb.worker.host_pids if process_alive(p)]

    deadline = time.monotonic() + 3
    while left() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert left() == []
    assert_pool_works(pool)


def _started(pid: int) -> float:
    """Start time of ``pid`` in clock ticks since boot (infinite when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return float(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return math.inf


@pytest.mark.parametrize("case", sorted(FORGED_STEPS))
def test_a_forged_step_reply_is_a_protocol_violation(pool, case):
    sb = pool.acquire(forger(step=FORGED_STEPS[case]))
    env = sb.new_env(max_turns=12)
    env.reset(seed=0)
    since = ticks()
    with pytest.raises(ProtocolViolation):
        env.step("go")
    assert not sb.alive
    with pytest.raises(SandboxClosed):
        env.step("again")
    no_survivors(pool, sb, since)


@pytest.mark.parametrize("case", ["NaN in info", "two replies at once", "100k-deep nesting"])
def test_a_forged_reply_in_a_batch_fails_that_worker_only(pool, case):
    bad, good = pool.acquire(forger(step=FORGED_STEPS[case])), pool.acquire(ECHO)
    try:
        (bad_env, *_), (good_env, *_) = start_many([(bad, 12, 0, None), (good, 12, 0, None)])
        since = ticks()
        out = step_many([(bad_env, "go"), (good_env, "hi")])
        assert isinstance(out[0], ProtocolViolation) and out[1][0] == "echo:hi"
        assert not bad.alive and good.alive
    finally:
        good.close()
    no_survivors(pool, bad, since)


LATE = ("threading.Thread(target=lambda: (time.sleep(0.2), os.write(_MAIN.PROTO_OUT, "
        "b'{\"id\":99,\"ok\":true,\"result\":[\"won\",1.0,true,false,{}]}\\n'))).start()")


def test_a_late_reply_from_a_thread_is_caught_at_the_next_request(pool):
    """A worker that keeps running between requests (idle stopping off) lets the program's thread
    write its reply 0.2 s after the step: the next request finds the bytes waiting and is
    refused before it is sent."""
    running = SandboxPool(dataclasses.replace(pool.config, idle_stop_ms=0), warm=0)
    try:
        sb = running.acquire(forger(step=LATE))
        env = sb.new_env()
        env.reset(seed=0)
        assert env.step("go")[0] == "obs"  # the real reply came first
        time.sleep(0.5)
        since = ticks()
        with pytest.raises(ProtocolViolation, match="before step was sent"):
            env.step("go")
        no_survivors(running, sb, since)
    finally:
        running.close()


def test_a_late_reply_from_a_stopped_worker_is_never_taken(pool):
    """A worker stopped while idle (``idle_stop_ms``, on in ``pool``) writes the late reply only
    once the next request wakes it, racing the true reply: that request is refused (the forged
    line came first, with the wrong id) or answered truly (it came after, and the next request
    finds it waiting). Either way the forged win is never taken, and a refusal comes within a
    few requests (each step starts another late writer). (A thread that guesses the next id
    can have its line taken for that one step, then the true reply finds the worker killed; it
    gains nothing the program's own ``step`` could not return, through the same checks.)"""
    sb = pool.acquire(forger(step=LATE))
    env = sb.new_env()
    env.reset(seed=0)
    since = ticks()
    answers = []
    with pytest.raises(ProtocolViolation):
        for _ in range(6):
            answers.append(env.step("go")[0])
            time.sleep(0.3)
    assert answers and set(answers) == {"obs"}, answers
    assert sb.worker.stops >= 1  # the worker was stopped between the steps
    no_survivors(pool, sb, since)


@pytest.mark.parametrize("turns,want", [("10 ** 12", 12), ("-1", None), ("5", 5)])
def test_an_honest_max_turns_is_clamped(pool, turns, want):
    sb = pool.acquire(forger(init=f"self.max_turns = {turns}"))
    assert sb.new_env(max_turns=12).max_turns == want
    assert sb.alive
    no_survivors(pool, sb)


@pytest.mark.parametrize("value,want", [('"12"', ProtocolViolation), ("true", ProtocolViolation),
                                        ("12.0", ProtocolViolation), ("1000000000000", 12),
                                        ("-1", None)])
def test_a_forged_max_turns_is_refused_or_clamped(pool, value, want):
    init = ("forge(lambda r: b'{\"id\":%d,\"ok\":true,\"result\":{\"instance\":1,\"max_turns\":"
            + value + "}}\\n' % r)")
    sb = pool.acquire(forger(init=init))
    since = ticks()
    if want is ProtocolViolation:
        with pytest.raises(ProtocolViolation):
            sb.new_env(max_turns=12)
        assert not sb.alive
    else:
        env = sb.new_env(max_turns=12)
        assert env.max_turns == want
        assert env.reset(seed=0) == ("ready", {})
    no_survivors(pool, sb, since)


@pytest.mark.parametrize("result", [
    '{"class_name":"' + "E" * 5000 + 'Env","has_solution":true,"has_tools":false,"doc":""}',
    '{"class_name":7,"has_solution":true,"has_tools":false,"doc":""}',
    '{"class_name":"XEnv","has_solution":"yes","has_tools":false,"doc":""}',
    '["XEnv"]',
], ids=["long-name", "int-name", "string-flag", "list"])
def test_a_forged_load_reply_is_a_protocol_violation(pool, result):
    top = "forge(lambda r: b'{\"id\":%d,\"ok\":true,\"result\":" + result + "}\\n' % r)"
    with pytest.raises(ProtocolViolation):
        pool.acquire(forger(top=top))
    assert_pool_works(pool)


def test_a_forged_reset_reply_is_a_protocol_violation(pool):
    sb = pool.acquire(forger(reset=ok_step('["ready", {"v": NaN}]')))
    env = sb.new_env()
    since = ticks()
    with pytest.raises(ProtocolViolation):
        env.reset(seed=0)
    no_survivors(pool, sb, since)


HONEST = '''
class HonestEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
    def reset(self, seed=None, options=None):
        return "ready", {}
    def step(self, action):
        deep = 1
        for _ in range(100):
            deep = [deep]
        if action == "surrogate":
            return "bad \\ud800 text", 0.0, False, False, {}
        if action == "info":
            return "ok", 0.5, False, False, {"nan": float("nan"), "deep": deep,
                                              "s\\udc80": "x\\ud800y", "big": 10 ** 30}
        if action == "raise":
            raise type("E" * 500 + "rror", (Exception,), {})("boom \\udfff " + "m" * 9000)
        return "ok", 0.5, False, False, {}
'''


def test_honest_values_outside_the_schema_are_mended_in_the_worker(pool):
    """What a program may legitimately return stays typed and the worker stays alive: a lone
    surrogate in an observation is an InvalidResult, odd info is sanitised, a huge exception
    is cut to the schema's sizes."""
    sb = pool.acquire(HONEST)
    env = sb.new_env()
    env.reset(seed=0)
    with pytest.raises(InvalidResult) as err:
        env.step("surrogate")
    assert err.value.reason == "bad_text" and sb.alive
    obs, reward, _t, _tr, info = env.step("info")
    _plain_json(info)
    assert info["nan"] == "nan" and info["big"] == str(10 ** 30)
    assert "<too deep>" in json.dumps(info["deep"])
    mend = worker_mod.mend_text
    assert info[mend("s\udc80")] == mend("x\ud800y") and "\ufffd" in mend("x\ud800y")
    with pytest.raises(SandboxError) as raised:
        env.step("raise")
    assert raised.value.reason == "env_raised" and sb.alive
    assert len(raised.value.exc_type) <= 200 and len(raised.value.message) <= 4000
    assert "\ufffd" in raised.value.message
    assert env.step("fine")[0] == "ok"
    no_survivors(pool, sb)
