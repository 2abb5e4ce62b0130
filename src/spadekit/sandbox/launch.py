"""Start one isolated worker process: command line, uid, scratch space, cgroup, boot config.

``spawn(config, plan)`` (a :class:`Plan` from ``spadekit.sandbox.isolation``) returns a
:class:`WorkerProcess` that has sent its ``hello`` and waits for a program: nothing untrusted has
run yet, which makes warm pools safe. Per-worker uids are allocated host-wide (lock files in a
root-owned directory, plus a check that no process runs as the uid); scratch space is a
size-limited tmpfs where the tier allows one. :meth:`WorkerProcess.kill` SIGKILLs the worker's
whole process tree (psutil) and cgroup and frees its uid and scratch, leaving no orphan. A
worker idle for ``idle_stop_ms`` is SIGSTOPped through a pidfd until its next request.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import functools
import json
import os
import py_compile
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from spadekit.common.errors import SandboxStartError
from spadekit.sandbox import cgroup as cg
from spadekit.sandbox import packages
from spadekit.sandbox.config import SandboxConfig
from spadekit.sandbox.worker_view import VIEW_LIB, VIEW_ROOT, VIEW_SCRATCH  # noqa: F401

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # .../spadekit
WORKER_REL = "spadekit/sandbox/worker.py"
INNER_LIB = "/sbx/lib"
INNER_SCRATCH = "/scratch"
VIEW_REL = "spadekit/sandbox/worker_view.py"


@dataclass(frozen=True)
class Plan:
    """Which isolation layers a worker gets."""

    tier: str
    bwrap: str | None = None  # path of the bwrap binary, or None
    per_worker_uid: bool = False
    landlock: bool = False
    seccomp_bpf: bytes | None = None
    cgroup_mode: str | None = None
    cgroup_cpu: bool = False  # the cgroups carry a CPU quota
    scratch_tmpfs: bool = False  # outside bwrap: mount a tmpfs on the scratch dir (needs root)
    private_view: bool = False
    """Outside bwrap, as root where the kernel allows a mount namespace: the worker starts in
    ``worker_view.py``, which gives it a minimal root of its own (no other host path exists
    there), a /proc in which its uid sees no other process and neutral paths for its scratch
    and runtime library, then drops to its uid."""
    python: str = field(default_factory=lambda: os.path.realpath(sys.executable))
    python_prefix: str = field(default_factory=lambda: os.path.realpath(sys.base_prefix))


RUNTIME_PARTS = ("__init__.py", "common/__init__.py", "common/errors.py", "envs",
                 "sandbox/worker.py", "sandbox/worker_replies.py", "sandbox/worker_view.py")


@functools.lru_cache(maxsize=1)
def runtime_lib() -> str:
    """A world-readable copy of the standard-library-only parts of spadekit that workers need
    (the worker script, ``spadekit.envs`` for programs to import, ``spadekit.common.errors``). Workers
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
    # compiled once here: a worker runs with -B and cannot write bytecode itself
    tag = sys.implementation.cache_tag
    for dirpath, _dirnames, filenames in os.walk(root) if tag else ():
        for name in filenames:
            if name.endswith(".py"):
                py_compile.compile(os.path.join(dirpath, name), cfile=os.path.join(
                    dirpath, "__pycache__", f"{name[:-3]}.{tag}.pyc"), doraise=False,
                    quiet=2, optimize=0)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    atexit.register(shutil.rmtree, root, True)
    return root


UID_RANGE = 100_000
"""Per-worker uids are ``uid_base + k`` for ``k`` below this."""


def uid_lock_dir() -> str:
    """The root-owned directory of per-uid lock files, shared by every spadekit process on the
    host (created on first use). Raises ``SandboxStartError`` if it is not safe to trust."""
    base = "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else \
        tempfile.gettempdir()
    path = os.path.join(base, "spadekit-uids")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SandboxStartError(f"cannot create the uid lock directory {path}: {exc}") from exc
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise SandboxStartError(f"{path} must be a directory owned by root and writable only "
                                "by root (it decides which uids workers run as)")
    return path


def uids_in_use(low: int, high: int) -> set[int]:
    """Uids in ``[low, high)`` that own a process on the host (zombies included), as the owner of
    /proc/PID shows it (one ``stat`` per process). The lock files are the allocation; this check
    is the second line (a non-dumpable process shows as root)."""
    found: set[int] = set()
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                try:
                    uid = entry.stat(follow_symlinks=False).st_uid
                except OSError:
                    continue
                if low <= uid < high:
                    found.add(uid)
    return found


class _UidAllocator:
    """Hands out per-worker uids that no other live worker on the host has. A uid is ours while
    this process holds an exclusive ``flock`` on its lock file in ``uid_lock_dir()`` (the kernel
    drops the lock when the process dies, however it dies), and it is handed out only if no
    process runs as it (a worker that outlived a killed trainer). Thread-safe; ``flock`` locks
    belong to an open file, so two pools in one process exclude each other too."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[int, int] = {}  # uid -> fd of its locked file
        self.cursor: dict[int, int] = {}  # base -> where to start when the host's cursor is out

    def take(self, base: int) -> int:
        """A free uid in ``[base, base + UID_RANGE)``, tried round robin from the one after the
        last handed out on the host (the ``next-BASE`` cursor file, under its own lock), so a
        uid just given back is not reused at once. The cursor only orders the search; the
        per-uid locks alone make a uid ours. A cursor not lockable within ``CURSOR_WAIT_S`` or
        not a regular file is passed over for this process's own."""
        with self.lock:
            folder = uid_lock_dir()
            busy = uids_in_use(base, base + UID_RANGE)
            cursor = _lock_cursor(os.path.join(folder, f"next-{base}"))
            try:
                start = self.cursor.get(base, 0) if cursor is None else _read_cursor(cursor)
                for step in range(UID_RANGE):
                    uid = base + (start + step) % UID_RANGE
                    if uid in self.held or uid in busy:
                        continue
                    fd = os.open(os.path.join(folder, str(uid)),
                                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError:  # another process holds it
                        os.close(fd)
                        continue
                    self.held[uid] = fd
                    self.cursor[base] = (uid - base + 1) % UID_RANGE
                    if cursor is not None:
                        _write_cursor(cursor, self.cursor[base])
                    return uid
            finally:
                if cursor is not None:
                    os.close(cursor)  # and its lock
        raise SandboxStartError(f"no free per-worker uid in [{base}, {base + UID_RANGE})")

    def give(self, uid: int | None) -> None:
        with self.lock:
            fd = self.held.pop(uid, None)
        if fd is not None:
            os.close(fd)


CURSOR_WAIT_S = 0.5


def _lock_cursor(path: str) -> int | None:
    """The host-wide cursor file, open and exclusively locked, or None when it is not a regular
    file or stays locked for ``CURSOR_WAIT_S`` (never an unbounded wait)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                     0o600)
    except OSError:  # a symlink, a directory
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a device
            raise OSError("not a regular file")
        deadline = time.monotonic() + CURSOR_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)
    except OSError:
        os.close(fd)
        return None


def _read_cursor(fd: int) -> int:
    """The offset a locked cursor file holds; 0 (the start of the range) when it is damaged."""
    try:
        return int(os.pread(fd, 32, 0).decode("ascii").strip() or 0)
    except (ValueError, UnicodeDecodeError, OSError):
        return 0


def _write_cursor(fd: int, offset: int) -> None:
    """Best effort: a cursor that cannot be written only orders the next search less well."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(offset).encode("ascii"), 0)
    except OSError:
        pass


UIDS = _UidAllocator()
_COUNTER = iter(range(1 << 62))
_monotonic = time.monotonic


class WorkerProcess:
    """A started worker: the process handle plus everything that must be cleaned up with it."""

    def __init__(self, proc: subprocess.Popen, scratch: str, uid: int | None, cgroup, plan: Plan,
                 idle_stop_s: float = 0.0, scratch_mounted: bool = False):
        self.proc = proc
        self.scratch = scratch
        self.uid = uid
        self.cgroup = cgroup
        self.plan = plan
        self.host_pids: set[int] = {proc.pid}
        self.hello: dict = {}
        self.closed = False
        self.idle_stop_s = idle_stop_s
        self.scratch_mounted = scratch_mounted
        self.busy = False
        self.stopped = False
        self.idle_since = time.monotonic()
        self.stops = 0  # how many times the worker was stopped while idle
        self._state = threading.Lock()
        self._pidfds: list[int] = []
        self._watched = False

    def adopt_tree(self) -> None:
        """Record the worker's process tree and move it into its cgroup. Called right after the
        hello, when seccomp already forbids new processes, so the tree is complete and final."""
        self.host_pids |= descendants(self.proc.pid)
        if self.cgroup is not None:
            self.cgroup.add(sorted(self.host_pids))
        if self.idle_stop_s > 0:
            for pid in sorted(self.host_pids):
                try:  # a pidfd names the process itself: no signal can reach a reused pid
                    self._pidfds.append(os.pidfd_open(pid))
                except (OSError, AttributeError):
                    pass

    # -- idle stopping: ``wake`` before each request, ``rest`` after it (Sandbox.request) -------

    def wake(self) -> None:
        # Lock-free on the hot path: ``busy`` is set before ``stopped`` is read here, and the
        # stopper sets ``stopped`` before it reads ``busy`` again, so one of the two sees the
        # other (the GIL orders these stores).
        self.busy = True
        if self.stopped:
            with self._state:
                if self.stopped and not self.closed:
                    self._signal(signal.SIGCONT)
                self.stopped = False

    def rest(self) -> None:
        self.idle_since = _monotonic()
        self.busy = False
        if not self._watched and self._pidfds:
            self._watched = True
            IDLE.watch(self)

    def stop_if_idle(self, now: float) -> bool:
        """Stop the worker if it has been idle long enough; False once it is closed."""
        with self._state:
            if self.closed:
                return False
            if not self.busy and not self.stopped and now - self.idle_since >= self.idle_stop_s:
                self.stopped = True
                if self.busy:  # a request began meanwhile: let it run
                    self.stopped = False
                else:
                    self._signal(signal.SIGSTOP)
                    self.stops += 1
            return True

    def _signal(self, sig: int) -> None:
        for fd in self._pidfds:
            try:
                signal.pidfd_send_signal(fd, sig)
            except OSError:
                pass

    def kill(self) -> None:
        """SIGKILL everything the worker owns and free its uid, cgroup and scratch space."""
        with self._state:
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
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds = []
        if self.cgroup is not None:
            self.cgroup.kill()
            self.cgroup.remove()
        if self.scratch_mounted:
            unmount(self.scratch)
        shutil.rmtree(self.scratch, ignore_errors=True)
        UIDS.give(self.uid)


class _IdleStopper:
    """One daemon thread per process that stops workers idle for their ``idle_stop_s``. It polls
    at half the shortest idle time while it watches workers and sleeps when it watches none."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.workers: set[WorkerProcess] = set()
        self.thread: threading.Thread | None = None

    def watch(self, worker: WorkerProcess) -> None:
        with self.cond:
            self.workers.add(worker)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True,
                                               name="spadekit-sandbox-idle-stop")
                self.thread.start()
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.workers:
                    self.cond.wait()
                workers = list(self.workers)
            now = time.monotonic()
            gone = [w for w in workers if not w.stop_if_idle(now)]
            with self.cond:
                self.workers.difference_update(gone)
            time.sleep(max(0.002, min(w.idle_stop_s for w in workers) / 2))


IDLE = _IdleStopper()

MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2


@functools.cache
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def mount_tmpfs(path: str, size_mb: int, uid: int | None) -> None:
    """Mount a tmpfs of ``size_mb`` MiB on ``path`` (root only), owned by ``uid``, mode 0700."""
    opts = f"size={size_mb}m,mode=0700" + (f",uid={uid},gid={uid}" if uid is not None else "")
    if _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV,
                     opts.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting a tmpfs on {path}: {os.strerror(err)}")


def unmount(path: str) -> None:
    _libc().umount2(os.fsencode(path), MNT_DETACH)


def descendants(pid: int) -> set[int]:
    """The pids of every live descendant of ``pid`` (empty when ``pid`` is gone)."""
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def worker_config(config: SandboxConfig, plan: Plan, scratch: str,
                  uid: int | None = None) -> dict:
    """The boot config line sent to the worker (paths as the worker sees them)."""
    inside = plan.bwrap is not None
    view = plan.private_view and not inside
    lib_dir = INNER_LIB if inside else VIEW_LIB if view else runtime_lib()
    scratch = INNER_SCRATCH if inside else VIEW_SCRATCH if view else scratch
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
        "compat": config.compat,
        "max_observation_chars": config.max_observation_chars,
    }
    cfg["chdir"] = scratch
    if view:
        cfg["view"] = {"uid": uid, "proc": "private (hidepid=invisible)"}
    allowed = packages.for_workers(tuple(config.packages))
    if allowed.roots:
        cfg["packages"] = allowed.worker_config()
    if plan.landlock:
        read = ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime",
                plan.python_prefix, os.path.dirname(plan.python), lib_dir]
        write = ["/dev/null", scratch] + (["/tmp"] if inside else [])
        read += list(allowed.paths)
        cfg["landlock"] = {"read": read, "write": write}
    if plan.seccomp_bpf:
        cfg["seccomp_bpf"] = plan.seccomp_bpf.hex()
    return cfg


def view_reads(config: SandboxConfig, plan: Plan) -> list[str]:
    """Host paths a private view binds read-only besides ``worker_view.SYSTEM_READ``: the
    interpreter's prefix and directory, the allowlisted packages."""
    return [plan.python_prefix, os.path.dirname(plan.python),
            *packages.for_workers(tuple(config.packages)).paths]


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
            if os.path.ismount(path):  # a standard-tier scratch tmpfs
                unmount(str(path))
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


PROBE_UID = 65534  # nobody: only ever the id of the probe below, which runs ``cat``
SETPRIV_CANDIDATES = ("/usr/bin/setpriv", "/bin/setpriv")


@functools.lru_cache(maxsize=1)
def setpriv_path() -> str | None:
    """util-linux's ``setpriv`` from the system directories (never from ``PATH``), once it has
    shown that it does the job; else None (``as_user`` then lets ``Popen`` change the ids).

    The probe runs ``cat /proc/self/status`` through it as uid and gid ``PROBE_UID`` with the
    options ``as_user`` gives and checks every uid and gid field and the empty group list: a
    ``setpriv`` that rejects an option (busybox's applet knows only four) or does less than
    asked is not used."""
    cat = next((c for c in ("/usr/bin/cat", "/bin/cat") if os.access(c, os.X_OK)), None)
    if cat is None:
        return None
    for path in SETPRIV_CANDIDATES:
        if not os.access(path, os.X_OK):
            continue
        try:
            done = subprocess.run([*_setpriv_argv(path, PROBE_UID), cat, "/proc/self/status"],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=10, env={"PATH": "/usr/bin:/bin"}, close_fds=True)
        except (OSError, subprocess.SubprocessError):
            continue
        fields = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
        want = [str(PROBE_UID)] * 4
        if (done.returncode == 0 and fields.get("Uid", "").split() == want
                and fields.get("Gid", "").split() == want and not fields.get("Groups", "x").split()):
            return path
    return None


def _setpriv_argv(setpriv: str, uid: int) -> list[str]:
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def as_user(argv: list[str], uid: int) -> tuple[list[str], dict]:
    """``argv`` and the ``Popen`` arguments that run it as ``uid`` (group ``uid``, no
    supplementary groups): through ``setpriv`` where it works (the caller is then started with
    ``vfork()``, never copying a trainer's page tables), else by ``Popen`` itself."""
    setpriv = setpriv_path()
    if setpriv is None:
        return argv, {"user": uid, "group": uid, "extra_groups": []}
    return [*_setpriv_argv(setpriv, uid), *argv], {}


def bwrap_argv(plan: Plan, scratch_mb: int, env: dict[str, str],
               read_only: tuple[str, ...] = ()) -> list[str]:
    """The bwrap command line. Scratch is a private tmpfs of ``scratch_mb`` MiB, and ``/tmp``
    points into it (one budget for both); ``/dev`` is read-only, so ``/dev/shm`` is too."""
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
    for path in read_only:  # allowlisted packages (``spadekit.sandbox.packages``)
        if not path.startswith(plan.python_prefix + "/"):
            argv += ["--ro-bind-try", path, path]
    argv += ["--ro-bind", runtime_lib(), INNER_LIB,
             "--size", str(scratch_mb * 1024 * 1024), "--tmpfs", INNER_SCRATCH,
             "--symlink", INNER_SCRATCH, "/tmp",
             "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev", "--clearenv"]
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
    mounted = False
    inside = plan.bwrap is not None
    view = plan.private_view and not inside
    try:
        if view and uid is None:
            raise SandboxStartError("a private view needs a per-worker uid (root)")
        if uid is not None:
            os.chown(scratch, uid, uid)
        os.chmod(scratch, 0o700)
        if plan.scratch_tmpfs and not inside:
            mount_tmpfs(scratch, config.scratch_mb, uid)
            mounted = True
        group = cg.WorkerCgroup.create(plan.cgroup_mode, f"{os.getpid()}-{serial}",
                                       config.memory_mb, config.max_processes,
                                       config.cpu_quota if plan.cgroup_cpu else None)
        py = [plan.python, "-I", "-S", "-B"]
        if inside:
            argv = bwrap_argv(plan, config.scratch_mb, child_env(config, INNER_SCRATCH),
                              packages.for_workers(tuple(config.packages)).paths) + py + [
                f"{INNER_LIB}/{WORKER_REL}"]
            env = {"PATH": "/usr/bin:/bin"}
        elif view:  # starts as root in worker_view.py, which drops to ``uid`` itself
            argv = py + [os.path.join(runtime_lib(), VIEW_REL)]
            env = {"PATH": "/usr/bin:/bin"}
        else:
            argv = py + [os.path.join(runtime_lib(), WORKER_REL)]
            env = child_env(config, scratch)
        kwargs: dict = {}
        if uid is not None and not view:
            argv, kwargs = as_user(argv, uid)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=scratch, close_fds=True,
                                start_new_session=True, **kwargs)
        worker = WorkerProcess(proc, scratch, uid, group, plan, config.idle_stop_ms / 1000.0,
                               mounted)
    except Exception as exc:
        if proc is not None:
            proc.kill()
        if group is not None:
            group.remove()
        if mounted:
            unmount(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
        UIDS.give(uid)
        raise SandboxStartError(f"could not start a sandbox worker: {exc}") from exc
    boot = json.dumps(worker_config(config, plan, scratch, uid)) + "\n"
    if view:  # worker_view.py's line first: host paths it binds at neutral ones
        boot = json.dumps({"scratch": scratch, "lib": runtime_lib(), "uid": uid,
                           "read": view_reads(config, plan), "python": plan.python,
                           "env": child_env(config, VIEW_SCRATCH)}) + "\n" + boot
    try:
        proc.stdin.write(boot.encode())
        proc.stdin.flush()
    except OSError:
        pass  # the worker died at once; the hello read below reports it
    return worker
