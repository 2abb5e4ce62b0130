"""The child side of the sandbox: one process that hosts one environment program.

Run as a script (``python -I -S -B worker.py``), standard library only. It moves the protocol
onto private file descriptors (``print()`` in a program cannot corrupt it), reads one trusted
config line, applies rlimits, Landlock and the parent's seccomp BPF, reports them in a ``hello``,
then serves ``load``/``create``/``reset``/``step``/``call``/``drop``. Every result is checked
here and again by the parent; every exception becomes an error reply and the worker stays alive.
Every instance has its own ``random`` (and numpy legacy) stream from ``RANDOM_SEED``, so episodes
play as if alone however they interleave. Replies stay inside the parent's schema
(``worker_replies.py``). Deadlines are the parent's: nothing here relies on signals.
"""

import ctypes
import faulthandler
import json
import os
import resource
import sys

if __name__ == "__main__":  # the worker script: its package root (three levels up) is on the
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(  # path for this import
        os.path.abspath(__file__)))))
# Re-exported: the parent runs check_reset/check_step on every reply (sandbox.py, local_env.py).
from spadekit.sandbox.worker_replies import (ERROR_FIELD_CHARS, MAX_NAME_CHARS,  # noqa: F401,E402
                                             RESULT_DEPTH, _short, bounded_error, check_obs,
                                             check_reset, check_step, decode_request,
                                             encode_reply, invalid, mend_text, plain, sanitize,
                                             valid_text)

if __name__ == "__main__":
    del sys.path[0]  # only: the boot config decides the path programs see

PROTO_IN = None
PROTO_OUT = None
STATE = {"module": None, "cls": None, "instances": {}, "next_id": 1, "cfg": {}}

RANDOM_SEED = 20260822
"""The fixed state every instance's random streams start from (and the program's load runs in)."""

# ---------------------------------------------------------------------------------------------
# isolation layers


def apply_rlimits(limits):
    applied = {}
    for name, value in limits.items():
        res = getattr(resource, "RLIMIT_" + name.upper(), None)
        if res is None or value is None:
            continue
        value = int(value)
        try:
            soft, hard = resource.getrlimit(res)
            new_hard = value if hard == resource.RLIM_INFINITY or hard > value else hard
            resource.setrlimit(res, (min(value, new_hard), new_hard))
            applied[name] = min(value, new_hard)
        except (ValueError, OSError) as exc:
            applied[name] = "failed: %s" % exc
    return applied


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.syscall.restype = ctypes.c_long
        _LIBC.prctl.restype = ctypes.c_int
    return _LIBC


PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446

LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1, 2, 4, 8
LL_FS_V1 = (1 << 13) - 1
LL_REFER, LL_TRUNCATE, LL_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
LL_FILE_ONLY = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV
LL_NET_BIND_TCP, LL_NET_CONNECT_TCP = 1, 2
LL_SCOPE_ABSTRACT_UNIX, LL_SCOPE_SIGNAL = 1, 2


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _Ruleset(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


def landlock_abi():
    try:
        abi = _libc().syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), 1)
    except Exception:
        return 0
    return max(int(abi), 0)


def apply_landlock(read_paths, write_paths):
    """Restrict this process: read/exec below ``read_paths``, read/write below ``write_paths``,
    no TCP bind/connect (ABI >= 4), no signals or abstract unix sockets leaving the domain
    (ABI >= 6). Returns a description of what was applied."""
    abi = landlock_abi()
    if abi < 1:
        return {"abi": 0, "applied": False}
    libc = _libc()
    fs = LL_FS_V1
    if abi >= 2:
        fs |= LL_REFER
    if abi >= 3:
        fs |= LL_TRUNCATE
    if abi >= 5:
        fs |= LL_IOCTL_DEV
    attr = _Ruleset(fs, 0, 0)
    size = 8
    if abi >= 4:
        attr.net = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = LL_SCOPE_ABSTRACT_UNIX | LL_SCOPE_SIGNAL
        size = 24
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                           0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    read = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR
    rules = []
    for paths, access in ((read_paths, read), (write_paths, fs & ~LL_REFER)):
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                mask = access & fs
                if not os.path.isdir(path):
                    mask &= LL_FILE_ONLY
                rule = _PathBeneath(mask, fd)
                if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) < 0:
                    raise OSError(ctypes.get_errno(), "landlock_add_rule failed for %s" % path)
                rules.append(path)
            finally:
                os.close(fd)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(ruleset)
    return {"abi": abi, "applied": True, "tcp_denied": abi >= 4, "scoped": abi >= 6,
            "rules": len(rules)}


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def apply_seccomp(bpf_hex):
    code = bytes.fromhex(bpf_hex)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP failed")
    return {"applied": True, "instructions": len(code) // 8}


# ---------------------------------------------------------------------------------------------
# protocol


def send(obj):
    """Write one reply line (``encode_reply``: values JSON cannot carry are made safe first).
    A module global on purpose: the forged-reply tests replace it from inside a program."""
    data = encode_reply(obj)
    n = os.write(PROTO_OUT, data)
    if n < len(data):
        view = memoryview(data)[n:]
        while view:
            view = view[os.write(PROTO_OUT, view):]


def error_from_exception(exc):
    import traceback  # imported on first use: it costs a worker's boot ~10 ms

    tb = traceback.format_exc(limit=20)
    if len(tb) > 8000:
        tb = tb[:2000] + "\n...\n" + tb[-6000:]
    name = type(exc).__name__
    msg = _short(exc)
    if isinstance(exc, MemoryError):
        return {"type": "ResourceLimit", "kind": "memory", "message": "MemoryError: " + msg,
                "traceback": tb}
    if isinstance(exc, RecursionError):
        return {"type": "ResourceLimit", "kind": "recursion", "message": "RecursionError: " + msg,
                "traceback": tb}
    if isinstance(exc, OSError) and exc.errno == 27:  # EFBIG from RLIMIT_FSIZE
        return {"type": "ResourceLimit", "kind": "file_size", "message": msg, "traceback": tb}
    return {"type": "EnvRaised", "exc_type": name, "message": "%s: %s" % (name, msg),
            "traceback": tb}


# ---------------------------------------------------------------------------------------------
# per-instance random streams


class Streams:
    """The random streams of each instance, made the live ones around each op on it.

    The module ``random``: each instance owns a ``random.Random`` seeded with ``RANDOM_SEED``,
    and entering an instance points the module's functions (``random.randint``, ``random.seed``
    ...) at that generator's methods: one dict update, no state copied. A program that keeps
    its own references to the shared generator's methods (``from random import randint`` at
    module level, a class attribute or a default argument: found once, after load) gets the
    slower, complete swap instead: the shared generator's state saved and restored per
    instance with ``_random.Random``'s C methods. numpy is looked up in ``sys.modules`` only
    (never imported here): from the first op that finds it loaded, its legacy global generator
    is saved and restored too, each instance starting from ``RANDOM_SEED``."""

    def __init__(self):
        self.gens = {}
        self.states = {}
        self.current = None
        self.names = None
        self.copying = False
        self.np_random = None
        self.np_initial = None

    def start(self):
        """Before the program loads: the shared generator gets the fixed state."""
        import random

        random.seed(RANDOM_SEED)
        self._names()

    def _names(self):
        import random

        inst = random._inst
        self.names = [name for name, value in vars(random).items()
                      if getattr(value, "__self__", None) is inst]
        return inst

    def loaded(self, module):
        """After load: does the program hold methods of the shared generator itself?"""
        import random

        inst = random._inst
        held = []
        for value in list(vars(module).values()):
            held.append(value)
            if isinstance(value, type) and value.__module__ == module.__name__:
                held += list(vars(value).values())
        for value in list(held):
            fn = getattr(value, "__func__", value)
            held += list(getattr(fn, "__defaults__", None) or ())
        self.copying = any(getattr(v, "__self__", None) is inst for v in held)

    def _numpy(self):
        if self.np_random is None:
            np = sys.modules.get("numpy")
            rnd = getattr(np, "random", None) if np is not None else None
            if rnd is None or not callable(getattr(rnd, "get_state", None)):
                return None
            try:
                self.np_initial = rnd.RandomState(RANDOM_SEED).get_state()
            except Exception:
                return None
            self.np_random = rnd
        return self.np_random

    def enter(self, iid):
        """Make ``iid``'s streams the live ones (saving those of the instance they replace)."""
        if self.current == iid:
            return
        import random

        if self.names is None:
            self._names()
        rnd = self._numpy()
        old = self.current
        keep = old is not None and old in STATE["instances"]
        if self.copying:
            import _random

            inst = random._inst
            if keep:
                self.states[old] = (_random.Random.getstate(inst), inst.gauss_next)
            py, gauss = self.states.pop(iid, None) or (
                _random.Random.getstate(random.Random(RANDOM_SEED)), None)
            _random.Random.setstate(inst, py)
            inst.gauss_next = gauss
        else:
            bound = self.gens.get(iid)
            if bound is None:
                gen = random.Random(RANDOM_SEED)
                bound = self.gens[iid] = {name: getattr(gen, name) for name in self.names}
            vars(random).update(bound)
        if rnd is not None:
            if keep:
                self.states[("np", old)] = rnd.get_state()
            rnd.set_state(self.states.pop(("np", iid), None) or self.np_initial)
        self.current = iid

    def drop(self, iid):
        self.gens.pop(iid, None)
        self.states.pop(iid, None)
        self.states.pop(("np", iid), None)
        if self.current == iid:
            self.current = None


STREAMS = Streams()

# ---------------------------------------------------------------------------------------------
# operations


def op_load(req):
    code = req["code"]
    filename = req.get("filename") or "<env>"
    try:
        compiled = compile(code, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        return {"type": "ProgramLoadError", "reason": "syntax", "message": "%s: %s" % (
            type(exc).__name__, _short(exc)), "line": getattr(exc, "lineno", None)}
    module = type(sys)("spadekit_env_program")
    module.__file__ = filename
    sys.modules["spadekit_env_program"] = module
    compat = STATE["cfg"].get("compat")
    STREAMS.start()
    try:
        if compat:  # reference-contract names the program mentions (spadekit.envs.compat)
            from spadekit.envs.compat import prepare
            prepare(module.__dict__, compiled)
        exec(compiled, module.__dict__)
    except BaseException as exc:
        err = error_from_exception(exc)
        if err["type"] == "EnvRaised":
            err = {"type": "ProgramLoadError", "reason": "load_error", "message": err["message"],
                   "traceback": err["traceback"]}
        return err
    # The program's own top-level classes (imported base classes such as ToolEnv don't count).
    declared = [name for name, value in list(module.__dict__.items())
                if isinstance(value, type) and name.endswith("Env")
                and value.__module__ == module.__name__ and value.__qualname__ == name]
    if not declared:
        return {"type": "ProgramLoadError", "reason": "no_env_class",
                "message": "the program defines no top-level class whose name ends in 'Env'"}
    if len(declared) > 1:
        return {"type": "ProgramLoadError", "reason": "multiple_env_classes",
                "message": "the program defines %d Env classes (%s); exactly one is required"
                % (len(declared), ", ".join(declared))}
    if len(declared[0]) > MAX_NAME_CHARS or not declared[0].isidentifier():
        return {"type": "ProgramLoadError", "reason": "no_env_class", "message": "the Env class "
                "name %s is not a Python identifier of at most %d characters"
                % (mend_text(repr(declared[0])[:300]), MAX_NAME_CHARS)}
    cls = module.__dict__[declared[0]]
    STATE["module"], STATE["cls"] = module, cls
    STREAMS.loaded(module)
    return {"result": {"class_name": declared[0],
                       "has_solution": _overrides(cls, "solution"),
                       "has_tools": callable(getattr(cls, "tools", None)) or bool(
                           compat and callable(getattr(cls, "get_tools", None))),
                       "doc": mend_text(cls.__doc__.strip()[:500] if isinstance(
                           cls.__doc__, str) else "")}}


def _overrides(cls, name):
    """True when ``cls`` has a callable ``name`` that is not just the spadekit base class's
    placeholder (``ToolEnv.solution`` raises NotImplementedError)."""
    fn = getattr(cls, name, None)
    if not callable(fn):
        return False
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return not klass.__module__.startswith("spadekit.")
    return True


def op_create(req):
    cls = STATE["cls"]
    if cls is None:
        return {"type": "ProgramLoadError", "reason": "load_error", "message": "no program loaded"}
    kwargs = req.get("kwargs") or {}
    iid = STATE["next_id"]
    STATE["next_id"] += 1
    STREAMS.enter(iid)  # the constructor draws from the new instance's own streams
    try:
        try:
            env = cls(**kwargs)
        except TypeError:
            if not kwargs:
                raise
            env = cls()
            if "max_turns" in kwargs:
                try:
                    env.max_turns = kwargs["max_turns"]
                except Exception:
                    pass
    except BaseException as exc:
        err = error_from_exception(exc)
        if err["type"] == "EnvRaised":
            err = {"type": "ProgramLoadError", "reason": "construct_failed",
                   "message": "constructing %s failed: %s" % (cls.__name__, err["message"]),
                   "traceback": err["traceback"]}
        STREAMS.drop(iid)
        return err
    STATE["instances"][iid] = env
    max_turns = getattr(env, "max_turns", None)
    if isinstance(max_turns, bool) or not isinstance(max_turns, int):
        max_turns = None
    return {"result": {"instance": iid, "max_turns": max_turns}}


def _instance(req):
    iid = req.get("instance")
    env = STATE["instances"].get(iid)
    if env is None:
        raise LookupError("no environment instance %r" % iid)
    STREAMS.enter(iid)
    return env


def op_reset(req):
    env = _instance(req)
    kwargs = {"seed": req.get("seed")}
    compat = STATE["cfg"].get("compat")
    if req.get("options") is not None:
        kwargs["options"] = req["options"]
        if compat:  # a reference-style reset(seed=None) takes no options
            from spadekit.envs.compat import accepts_keyword
            if not accepts_keyword(env.reset, "options"):
                del kwargs["options"]
    try:
        result = env.reset(**kwargs)
    except BaseException as exc:
        return error_from_exception(exc)
    value, err = check_reset(result, STATE["cfg"].get("max_observation_chars", 65536))
    return err or _result(value, 1)


def op_step(req):
    env = _instance(req)
    try:
        result = env.step(req["action"])
    except BaseException as exc:
        return error_from_exception(exc)
    value, err = check_step(result, STATE["cfg"].get("max_observation_chars", 65536))
    if err:
        return err
    info = value[4]  # a dict (check_step); the usual empty one needs no walk: the hot path
    if info and not plain(info):
        value[4] = sanitize(info)
    return {"result": value}


def _result(value, at):
    """The reply of a checked reset/step result, its ``info`` (at index ``at``) made plain."""
    if not plain(value[at]):
        value[at] = sanitize(value[at])
    return {"result": value}


CALLABLE = {"solution", "tools", "render", "close"}


def op_call(req):
    env = _instance(req)
    name = req["method"]
    if name not in CALLABLE and not name.startswith("get_"):
        return invalid("bad_result", "method %r may not be called through the sandbox" % name)
    fn = getattr(env, name, None)
    if name == "tools" and not callable(fn) and STATE["cfg"].get("compat"):
        fn = getattr(env, "get_tools", None)  # the reference's name for it
    if fn is None or not callable(fn):
        return {"type": "EnvRaised", "exc_type": "AttributeError",
                "message": "AttributeError: environment has no method %r" % name, "traceback": ""}
    try:
        value = fn(*req.get("args", []))
    except BaseException as exc:
        return error_from_exception(exc)
    return {"result": value if plain(value) else sanitize(value)}


def op_drop(req):
    STATE["instances"].pop(req.get("instance"), None)
    STREAMS.drop(req.get("instance"))
    return {"result": True}


def op_ping(req):
    return {"result": {"instances": len(STATE["instances"])}}


OPS = {"load": op_load, "create": op_create, "reset": op_reset, "step": op_step,
       "call": op_call, "drop": op_drop, "ping": op_ping}


def serve(reader):
    while True:
        line = reader.readline()
        if not line:
            return
        try:
            req = decode_request(line)
            handler = OPS[req["op"]]
        except Exception as exc:
            send({"id": None, "ok": False, "error": {"type": "ProtocolViolation",
                                                     "message": "bad request: %s" % exc}})
            continue
        try:
            reply = handler(req)
        except LookupError as exc:
            reply = {"type": "EnvRaised", "exc_type": "LookupError", "message": str(exc),
                     "traceback": ""}
        except BaseException as exc:  # a bug in the worker itself, or a corrupted interpreter
            reply = error_from_exception(exc)
        if "result" in reply:
            send({"id": req.get("id"), "ok": True, "result": reply["result"]})
        else:
            send({"id": req.get("id"), "ok": False, "error": bounded_error(reply)})


def main():
    global PROTO_IN, PROTO_OUT
    PROTO_IN = os.dup(0)
    PROTO_OUT = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    for stream in (sys.stdout, sys.stderr):  # program output reaches the parent's ring buffer
        stream.reconfigure(line_buffering=True, write_through=True)  # at once, unbuffered
    faulthandler.enable(file=sys.stderr, all_threads=True)
    # Die with the parent (the trainer, or bwrap which itself dies with the trainer), even when
    # busy in a loop that never reads the protocol again.
    # (If the parent died before this line, the protocol pipe is closed and the read below ends.)
    _libc().prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    reader = os.fdopen(PROTO_IN, "rb", buffering=1 << 16)
    cfg = json.loads(reader.readline())
    STATE["cfg"] = cfg
    view = cfg.get("view")  # started by worker_view.py: it must have dropped to this uid
    if view and (os.getuid() != view["uid"] or os.geteuid() != view["uid"] or not view["uid"]):
        send({"id": 0, "ok": False, "error": {"type": "SandboxStartError", "message":
                                              "isolation failed: the worker runs as uid %d, "
                                              "not %r" % (os.geteuid(), view["uid"])}})
        return
    layers = {"pid": os.getpid(), "uid": os.getuid(), "rlimits": apply_rlimits(cfg.get("rlimits",
                                                                                    {}))}
    if view:
        layers["view"] = {"proc": view["proc"], "scratch": cfg.get("chdir")}
    try:
        if cfg.get("landlock"):
            ll = cfg["landlock"]
            layers["landlock"] = apply_landlock(ll["read"], ll["write"])
        if cfg.get("seccomp_bpf"):
            layers["seccomp"] = apply_seccomp(cfg["seccomp_bpf"])
    except Exception as exc:
        send({"id": 0, "ok": False, "error": {"type": "SandboxStartError",
                                              "message": "isolation failed: %s" % exc}})
        return
    if cfg.get("chdir"):
        os.chdir(cfg["chdir"])
    for path in reversed(cfg.get("sys_path", [])):
        sys.path.insert(0, path)
    if cfg.get("packages"):  # allowlisted third-party packages only (spadekit.sandbox.packages)
        from spadekit.envs.compat import install_finder
        install_finder(cfg["packages"]["roots"], cfg["packages"]["dists"])
    sys.setrecursionlimit(int(cfg.get("recursion_limit", 2000)))
    preloaded = []
    for name in cfg.get("preload", []):  # warm the import cache before any program arrives
        try:
            __import__(name)
            preloaded.append(name)
        except Exception:
            pass
    layers["preloaded"] = len(preloaded)
    send({"id": 0, "ok": True, "result": {"ready": True, "layers": layers}})
    serve(reader)


if __name__ == "__main__":
    main()
