"""Start one isolated worker process: command line, uid, scratch dir, cgroup, boot config.

A ``Plan`` says which layers to use (it comes from ``spadekit.sandbox.isolation``);
``spawn(config, plan)`` returns a ``WorkerProcess`` that has sent its ``hello`` and waits for a
program. Nothing untrusted has run at that point, which is what makes warm pools safe.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from spadekit.errors import SandboxStartError
from spadekit.sandbox import cgroup as cg
from spadekit.sandbox.config import SandboxConfig

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # .../spadekit
WORKER_REL = "spadekit/sandbox/worker.py"
INNER_LIB = "/sbx/lib"
INNER_SCRATCH = "/scratch"


@dataclass(frozen=True)
class Plan:
    """Which isolation layers a worker gets."""

    tier: str
    bwrap: str | None = None  # path of the bwrap binary, or None
    per_worker_uid: bool = False
    landlock: bool = False
    seccomp_bpf: bytes | None = None
    cgroup_mode: str | None = None
    python: str = field(default_factory=lambda: os.path.realpath(sys.executable))
    python_prefix: str = field(default_factory=lambda: os.path.realpath(sys.base_prefix))


RUNTIME_PARTS = ("__init__.py", "errors.py", "envs", "sandbox/worker.py")


@functools.lru_cache(maxsize=1)
def runtime_lib() -> str:
    """A world-readable copy of the standard-library-only parts of spadekit that workers need
    (the worker script, ``spadekit.envs`` for programs to import, ``spadekit.errors``). Workers
    never see the rest of the installed package, and the copy works wherever the package lives
    (a private home directory, a virtualenv). Removed when this process exits."""
    root = tempfile.mkdtemp(prefix=f"spadekit-rt-{os.getpid()}-")
    os.chmod(root, 0o755)
    for part in RUNTIME_PARTS:
        src = PACKAGE_DIR / part
        dst = Path(root) / "spadekit" / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dst)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    atexit.register(shutil.rmtree, root, True)
    return root


class _UidAllocator:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: set[int] = set()
        self.next = 0

    def take(self, base: int) -> int:
        with self.lock:
            start = base + (os.getpid() % 100) * 10000
            for _ in range(10000):
                uid = start + self.next % 10000
                self.next += 1
                if uid not in self.live:
                    self.live.add(uid)
                    return uid
        raise SandboxStartError("no free per-worker uid (10000 live workers in one process?)")

    def give(self, uid: int | None) -> None:
        with self.lock:
            self.live.discard(uid)


UIDS = _UidAllocator()
_COUNTER = iter(range(1 << 62))


class WorkerProcess:
    """A started worker: the process handle plus everything that must be cleaned up with it."""

    def __init__(self, proc: subprocess.Popen, scratch: str, uid: int | None, cgroup, plan: Plan):
        self.proc = proc
        self.scratch = scratch
        self.uid = uid
        self.cgroup = cgroup
        self.plan = plan
        self.host_pids: set[int] = {proc.pid}
        self.hello: dict = {}
        self.closed = False

    def adopt_tree(self) -> None:
        """Record the worker's process tree and move it into its cgroup. Called right after the
        hello, when seccomp already forbids new processes, so the tree is complete and final."""
        self.host_pids |= descendants(self.proc.pid)
        if self.cgroup is not None:
            self.cgroup.add(sorted(self.host_pids))

    def kill(self) -> None:
        """SIGKILL everything the worker owns and free its uid, cgroup and scratch dir."""
        if self.closed:
            return
        self.closed = True
        pids = set(self.host_pids)
        if self.cgroup is not None:
            pids |= self.cgroup.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self.cgroup is not None:
            self.cgroup.kill()
            self.cgroup.remove()
        shutil.rmtree(self.scratch, ignore_errors=True)
        UIDS.give(self.uid)


def descendants(pid: int) -> set[int]:
    """All descendants of ``pid``: through /proc/PID/task/TID/children where the kernel has it,
    else by scanning the parent links of every process."""
    try:
        return _walk(pid, _children_files)
    except OSError:
        table = _children_table()
        return _walk(pid, lambda p: table.get(p, []))


def _walk(pid: int, children_of) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children_of(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _children_files(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
            out += [int(c) for c in fh.read().split()]
    return out


def _children_table() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def worker_config(config: SandboxConfig, plan: Plan, scratch: str) -> dict:
    """The boot config line sent to the worker (paths as the worker sees them)."""
    inside = plan.bwrap is not None
    lib_dir = INNER_LIB if inside else runtime_lib()
    scratch = INNER_SCRATCH if inside else scratch
    cfg: dict = {
        "rlimits": {
            "as": config.memory_mb * 1024 * 1024,
            "cpu": config.cpu_seconds,
            "nofile": config.max_open_files,
            "fsize": config.max_file_size_mb * 1024 * 1024,
            "core": 0,
            "nproc": config.max_processes if plan.per_worker_uid else None,
        },
        "sys_path": [lib_dir],
        "preload": list(config.preload),
        "max_observation_chars": config.max_observation_chars,
    }
    cfg["chdir"] = scratch
    if plan.landlock:
        read = ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime",
                plan.python_prefix, os.path.dirname(plan.python), lib_dir]
        write = ["/dev/null", scratch] + (["/tmp"] if inside else [])
        cfg["landlock"] = {"read": read, "write": write}
    if plan.seccomp_bpf:
        cfg["seccomp_bpf"] = plan.seccomp_bpf.hex()
    return cfg


def sweep_stale_dirs() -> int:
    """Remove scratch and runtime directories left by spadekit processes that were killed (their
    names carry the owner's pid); returns how many were removed."""
    removed = 0
    tmp = Path(tempfile.gettempdir())
    for path in tmp.glob("spadekit-*-*-*"):
        parts = path.name.split("-")
        if parts[1] not in ("sbx", "rt") or not parts[2].isdigit():
            continue
        if not Path(f"/proc/{parts[2]}").exists():
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def bwrap_argv(plan: Plan, scratch: str, env: dict[str, str]) -> list[str]:
    argv = [plan.bwrap, "--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr"]
    for top in ("lib", "lib64", "bin", "sbin", "lib32", "libx32"):
        host = Path("/") / top
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"/{top}"]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"/{top}"]
    for etc in ("/etc/ld.so.cache", "/etc/localtime"):
        argv += ["--ro-bind-try", etc, etc]
    if not plan.python_prefix.startswith("/usr/"):
        argv += ["--ro-bind", plan.python_prefix, plan.python_prefix]
    pydir = os.path.dirname(plan.python)
    if not pydir.startswith(("/usr/", plan.python_prefix)):
        argv += ["--ro-bind", pydir, pydir]
    argv += ["--ro-bind", runtime_lib(), INNER_LIB,
             "--tmpfs", "/tmp", "--bind", scratch, INNER_SCRATCH,
             "--proc", "/proc", "--dev", "/dev", "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return argv + ["--chdir", INNER_SCRATCH]


def child_env(config: SandboxConfig, home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
            "PYTHONHASHSEED": str(config.hash_seed), "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def spawn(config: SandboxConfig, plan: Plan) -> WorkerProcess:
    """Start a worker and wait for its hello. Raises ``SandboxStartError`` on any failure and
    leaves nothing behind."""
    serial = next(_COUNTER)
    uid = UIDS.take(config.uid_base) if plan.per_worker_uid else None
    scratch = tempfile.mkdtemp(prefix=f"spadekit-sbx-{os.getpid()}-{serial}-")
    group = None
    proc = None
    try:
        if uid is not None:
            os.chown(scratch, uid, uid)
        os.chmod(scratch, 0o700)
        group = cg.WorkerCgroup.create(plan.cgroup_mode, f"{os.getpid()}-{serial}",
                                       config.memory_mb, config.max_processes)
        inside = plan.bwrap is not None
        py = [plan.python, "-I", "-S", "-B"]
        if inside:
            argv = bwrap_argv(plan, scratch, child_env(config, INNER_SCRATCH)) + py + [
                f"{INNER_LIB}/{WORKER_REL}"]
            env = {"PATH": "/usr/bin:/bin"}
        else:
            argv = py + [os.path.join(runtime_lib(), WORKER_REL)]
            env = child_env(config, scratch)
        kwargs: dict = {}
        if uid is not None:
            kwargs.update(user=uid, group=uid, extra_groups=[])
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=scratch, close_fds=True,
                                start_new_session=True, **kwargs)
        worker = WorkerProcess(proc, scratch, uid, group, plan)
    except Exception as exc:
        if proc is not None:
            proc.kill()
        if group is not None:
            group.remove()
        shutil.rmtree(scratch, ignore_errors=True)
        UIDS.give(uid)
        raise SandboxStartError(f"could not start a sandbox worker: {exc}") from exc
    boot = json.dumps(worker_config(config, plan, scratch)) + "\n"
    try:
        proc.stdin.write(boot.encode())
        proc.stdin.flush()
    except OSError:
        pass  # the worker died at once; the hello read below reports it
    return worker
