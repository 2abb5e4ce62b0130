"""Processes forked from interpreters that have already imported torch, transformers and spadekit.

A process that runs the loop spends about 13 s of a 2-core machine importing torch and
transformers before it does anything; the fault and resume tests start dozens of them
(``benchmarks/chaos.py``'s children, ``spadekit serve`` and ``spadekit selfplay``). Here a
*zygote* (one interpreter, started once per test worker) imports those modules and then forks
one child per request; the child takes the requester's stdin, stdout and stderr (passed over a
Unix socket), environment, working directory and arguments, and runs ``-m MODULE`` or a script
as ``__main__`` exactly as ``python`` would, then exits through the normal interpreter shutdown
(atexit handlers, flushed streams, joined threads).

:class:`ForkedPopen` is a :class:`subprocess.Popen` whose child comes from a zygote: pipes,
``communicate``, timeouts, ``send_signal``, ``returncode`` (a signal's negative number) all
behave as for a fresh process, and the child is a real process: SIGKILL, SIGSTOP and SIGTERM
reach it, its sandboxes and files are its own.

What a fresh interpreter would differ in, and how it is kept:

- Hash seed: each zygote has its own random one, and :func:`popen` alternates between two
  zygotes, so consecutive processes (a run and its resume, two reference runs) hash strings
  differently, as two fresh interpreters would; a result that depends on set order still shows.
- Random state: Python's ``random`` reseeds itself in a forked child; numpy's global generator
  is reseeded from ``os.urandom`` here (a fresh interpreter seeds it from the OS too).
- Environment read at import: a request whose ``PYTHON*``, thread-count or path variables
  differ from the zygote's gets a zygote of its own, and a request the zygote cannot serve
  (other interpreter, ``-c``, flags) is an ordinary :class:`subprocess.Popen`.

``SPADEKIT_TEST_PREFORK=0`` turns it off (every process fresh).
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")

PRELOAD = ("torch", "numpy", "transformers:LlamaConfig", "transformers:LlamaForCausalLM",
           "transformers:PreTrainedTokenizerFast", "transformers:AutoTokenizer",
           "transformers:AutoModelForCausalLM", "peft", "spadekit.cli", "spadekit.selfplay.loop",
           "spadekit.policy.registry", "spadekit.policy.tiny",
           "spadekit.train.trainer")
"""What a zygote imports before it forks (the costly part of starting a spadekit process);
``module:name`` also resolves ``name`` (transformers builds its lazy module's index on the first
such lookup, seconds of its own). Nothing here draws a random number or starts a thread."""

KEYED = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "TORCH", "TRANSFORMERS", "HF_",
         "TOKENIZERS", "CUDA", "VLLM")
"""Environment variables read at import (or that decide what an import finds): a request must
match its zygote in all of them."""

_ZYGOTE = r'''
import importlib, json, os, select, signal, socket, sys, traceback

sock = socket.socket(fileno=int(sys.argv[1]))
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # die with the test process
except Exception:
    pass
for item in sys.argv[2:]:
    name, _, attr = item.partition(":")
    try:
        module = importlib.import_module(name)
        if attr:
            getattr(module, attr)
    except (ImportError, AttributeError):  # an optional one: the child imports it if it must
        pass
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.signal(signal.SIGCHLD, lambda *_: None)
signal.set_wakeup_fd(wake_w)
children = set()


def child(req, fds):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in (wake_r, wake_w):
        os.close(fd)
    sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    try:
        import numpy
        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))
    except ImportError:
        pass
    import runpy
    argv = req["argv"]
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1)
    raise SystemExit(0)


def reap():
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        sock.send(json.dumps({"exit": pid, "status": status}).encode())


sock.send(b'{"ready": true}')
while True:
    ready, _, _ = select.select([sock, wake_r], [], [], 1.0)
    if wake_r in ready:
        os.read(wake_r, 4096)
    reap()
    if sock not in ready:
        continue
    data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
    if not data:
        break
    req = json.loads(data)
    pid = os.fork()
    if pid == 0:
        child(req, fds)
    for fd in fds:
        os.close(fd)
    children.add(pid)
    sock.send(json.dumps({"pid": pid}).encode())
for pid in children:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
'''


class ZygoteError(RuntimeError):
    """The zygote did not start, or died."""


class Zygote:
    """One preloaded interpreter that forks children on request (module docstring)."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] | None = None):
        preload = PRELOAD if preload is None else preload
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(env)
        env.setdefault("PYTHONHASHSEED", str(int.from_bytes(os.urandom(4), "little")))
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE, str(theirs.fileno()),
                                      *preload], pass_fds=[theirs.fileno()], env=env,
                                     stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours
        self.ready = threading.Event()
        self.dead = False
        self._send = threading.Lock()
        self._replies: queue.Queue = queue.Queue()
        self._exits: dict[int, int] = {}
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True, name="zygote-reader").start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                with self._changed:
                    self.dead = True
                    self._changed.notify_all()
                self._replies.put(None)
                self.ready.set()
                return
            msg = json.loads(data)
            if "ready" in msg:
                self.ready.set()
            elif "pid" in msg:
                self._replies.put(msg["pid"])
            elif "exit" in msg:
                with self._changed:
                    self._exits[msg["exit"]] = msg["status"]
                    self._changed.notify_all()

    def spawn(self, argv: list[str], fds: list[int], env: dict[str, str], cwd: str) -> int:
        if not self.ready.wait(300) or self.dead:
            raise ZygoteError(f"the zygote did not start (rc {self.proc.poll()})")
        with self._send:
            socket.send_fds(self.sock, [json.dumps({"argv": argv, "env": env,
                                                    "cwd": cwd}).encode()], fds)
            pid = self._replies.get(timeout=60)
        if pid is None:
            raise ZygoteError("the zygote died")
        return pid

    def status(self, pid: int, block: bool) -> int | None:
        """The raw wait status of child ``pid``; None while it runs (``block=False``)."""
        with self._changed:
            while pid not in self._exits:
                if self.dead:  # its children were killed with it, or reparented
                    return None if os.path.exists(f"/proc/{pid}") and not block else 9
                if not block:
                    return None
                self._changed.wait(1.0)
            return self._exits[pid]

    def close(self) -> None:
        """End the zygote (its children still running are killed with it)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader; the zygote reads EOF
            self.sock.close()
        except OSError:
            pass
        finally:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ForkedPopen(subprocess.Popen):
    """A :class:`subprocess.Popen` whose child a zygote forks (module docstring)."""

    def __init__(self, zygote: Zygote, args, **kwargs):
        self._zygote = zygote
        super().__init__(args, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
                       c2pwrite, errread, errwrite, *_rest):
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
               errwrite if errwrite != -1 else 2]
        try:
            self.pid = self._zygote.spawn(
                [str(a) for a in args[1:]], fds, dict(os.environ if env is None else env),
                os.fspath(cwd) if cwd is not None else os.getcwd())
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _try_wait(self, wait_flags):
        status = self._zygote.status(self.pid, block=not wait_flags & os.WNOHANG)
        return (0, 0) if status is None else (self.pid, status)

    def _internal_poll(self, _deadstate=None, **_kwargs):
        if self.returncode is None:
            status = self._zygote.status(self.pid, block=False)
            if status is not None:
                self._handle_exitstatus(status)
        return self.returncode


_lock = threading.Lock()
_zygotes: dict[tuple, list[Zygote]] = {}
_turn: dict[tuple, int] = {}
_failed: set[tuple] = set()


def enabled() -> bool:
    return os.environ.get("SPADEKIT_TEST_PREFORK", "1") != "0" and hasattr(socket, "send_fds")


def _servable(args) -> bool:
    """``[sys.executable, -m MODULE, ...]`` or ``[sys.executable, SCRIPT.py, ...]``."""
    if not isinstance(args, (list, tuple)) or len(args) < 2:
        return False
    if os.path.realpath(str(args[0])) != os.path.realpath(sys.executable):
        return False
    first = str(args[1])
    return (first == "-m" and len(args) > 2) or (not first.startswith("-")
                                                  and first.endswith(".py"))


def _key(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(KEYED)))


def popen(args, **kwargs) -> subprocess.Popen:
    """:class:`subprocess.Popen` (same arguments), the child forked from a preloaded zygote when
    the command is this interpreter running ``-m MODULE`` or a script; two zygotes per
    environment, taken in turn (module docstring)."""
    unsupported = {"preexec_fn", "executable", "shell", "pass_fds", "start_new_session",
                   "process_group", "user", "group", "extra_groups", "umask"}
    if not enabled() or not _servable(args) or any(kwargs.get(k) for k in unsupported):
        return subprocess.Popen(args, **kwargs)
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    key = _key(env)
    with _lock:
        if key in _failed:
            return subprocess.Popen(args, **kwargs)
        pair = _zygotes.get(key)
        if pair is None or any(z.dead for z in pair):
            for z in pair or []:
                z.close()
            pair = _zygotes[key] = [Zygote(env), Zygote(env)]
        zygote = pair[_turn.get(key, 0) % 2]
        _turn[key] = _turn.get(key, 0) + 1
    try:
        return ForkedPopen(zygote, args, **kwargs)
    except ZygoteError as exc:  # a broken zygote costs time, never a result: fresh processes
        warnings.warn(f"prefork: {exc}; this environment's processes start fresh",
                      stacklevel=2)
        with _lock:
            _failed.add(key)
        return subprocess.Popen(args, **kwargs)


def run(args, *, timeout=None, check=False, input=None, capture_output=False, **kwargs):
    """:func:`subprocess.run` over :func:`popen`."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with popen(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        except BaseException:
            proc.kill()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


@atexit.register
def close_all() -> None:
    with _lock:
        for pair in _zygotes.values():
            for z in pair:
                z.close()
        _zygotes.clear()
