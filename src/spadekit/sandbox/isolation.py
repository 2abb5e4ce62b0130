"""Detect which isolation layers this machine offers and pick the strongest working tier.

- ``strong``: bubblewrap namespaces + seccomp + Landlock + rlimits, per-worker uid and cgroup
  where the host allows;
- ``standard``: no namespaces; seccomp + Landlock + rlimits (+ per-worker uid, tmpfs scratch and,
  as root where a mount namespace is allowed, a private view, ``worker_view``);
- ``weak``: rlimits and a new session only; refused for untrusted code unless ``allow_unsafe``.

``detect()`` probes each layer, then proves the chosen tier by booting a real worker with it;
on failure it falls back to the next tier and records why. Cached per process. What each tier
shows of the host: docs/design/sandbox.md.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field

from spadekit.common.errors import InsecureSandboxError, SandboxError, SandboxStartError
from spadekit.sandbox import cgroup, packages
from spadekit.sandbox.config import TIERS, SandboxConfig
from spadekit.sandbox.launch import (PACKAGE_DIR, UIDS, VIEW_REL, VIEW_ROOT, Plan, mount_tmpfs,
                                     runtime_lib, sweep_stale_dirs, uid_lock_dir, unmount,
                                     view_reads)
from spadekit.sandbox.worker_view import SYSTEM_READ
from spadekit.sandbox.seccomp_filter import IPC, SeccompUnavailable, compile_filter

MINIMUM_SAFE_TIER = "standard"


@dataclass
class Layer:
    name: str
    available: bool
    detail: str


@dataclass
class IsolationReport:
    tier: str
    root: bool
    layers: dict[str, Layer]
    attempts: list[dict] = field(default_factory=list)
    worker_layers: dict = field(default_factory=dict)

    @property
    def safe(self) -> bool:
        return TIERS.index(self.tier) <= TIERS.index(MINIMUM_SAFE_TIER)

    def to_dict(self) -> dict:
        return {"tier": self.tier, "safe_for_untrusted_code": self.safe, "root": self.root,
                "layers": {k: asdict(v) for k, v in self.layers.items()},
                "attempts": self.attempts, "worker_layers": self.worker_layers}


def landlock_abi() -> int:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        return max(int(libc.syscall(444, None, ctypes.c_size_t(0), 1)), 0)
    except Exception:
        return 0


def _bwrap_works(path: str, uid: int | None) -> tuple[bool, str]:
    kwargs: dict = {}
    if uid is not None:
        kwargs.update(user=uid, group=uid, extra_groups=[])
    try:
        out = subprocess.run([path, "--unshare-all", "--unshare-user", "--die-with-parent",
                              "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
                             capture_output=True, timeout=10, **kwargs)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bwrap failed to run: {exc}"
    if out.returncode != 0:
        return False, "bwrap cannot create namespaces here: " + out.stderr.decode(
            "utf-8", "replace").strip()[:300]
    return True, f"{path} (user, pid, net, ipc, uts, mount namespaces)"


def _readable_by_others(path: str) -> bool:
    """True when every directory above ``path`` is world-searchable and the file world-readable."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        d = os.sep.join(parts[:i]) or "/"
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


def _interpreter_for_uid(config: SandboxConfig) -> tuple[str, str] | None:
    """An interpreter (and its prefix) that an unprivileged uid can run outside namespaces."""
    want = config.python or os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if _readable_by_others(want) and _readable_by_others(os.path.join(prefix, "lib")):
        return want, prefix
    # Workers and environment programs need only the standard library, so a system Python of
    # another minor version serves too (the same version is preferred).
    same = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (same, "/usr/bin/python3"):
        if os.path.exists(candidate) and _readable_by_others(candidate) and \
                _system_python_ok(candidate):
            return os.path.realpath(candidate), "/usr"
    return None


def _system_python_ok(path: str) -> bool:
    try:
        out = subprocess.run([path, "-I", "-S", "-c", "import sys; print(sys.version_info >= "
                              "(3, 10))"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.stdout.strip() == "True"


def probe_layers(config: SandboxConfig) -> dict[str, Layer]:
    root = os.geteuid() == 0
    layers: dict[str, Layer] = {}
    layers["uid"] = Layer("uid", root, "per-worker unprivileged uids (running as root)" if root
                          else "runs as the current user (not root)")
    if root:
        try:
            layers["uid"].detail += f"; allocated host-wide (lock files in {uid_lock_dir()})"
        except SandboxError as exc:  # spawning will refuse too: never run workers as root
            layers["uid"].detail += f"; NOT allocatable: {exc.message}"
    bwrap = shutil.which("bwrap")
    if bwrap:
        try:
            probe_uid = UIDS.take(config.uid_base) if root else None
        except SandboxError as exc:
            ok, detail = False, exc.message
        else:
            try:
                ok, detail = _bwrap_works(bwrap, probe_uid)
            finally:
                UIDS.give(probe_uid)
        layers["namespaces"] = Layer("namespaces", ok, detail)
    else:
        layers["namespaces"] = Layer("namespaces", False, "bubblewrap not installed "
                                     "(apt-get install bubblewrap)")
    abi = landlock_abi()
    layers["landlock"] = Layer("landlock", abi >= 1, f"ABI {abi}" + (
        "" if abi >= 4 else " (no TCP rules: needs ABI 4)") if abi else
        "not supported by this kernel")
    try:
        bpf = compile_filter()
        layers["seccomp"] = Layer("seccomp", True, f"{len(bpf) // 8} BPF instructions")
    except SeccompUnavailable as exc:
        layers["seccomp"] = Layer("seccomp", False, str(exc))
    mode, detail = cgroup.detect() if config.use_cgroups else (None, "disabled by config")
    layers["cgroup"] = Layer("cgroup", mode is not None, detail if mode is None else
                             f"{mode}: {detail}")
    cpu_ok, cpu_detail = cgroup.detect_cpu(mode)
    layers["cpu"] = Layer("cpu", cpu_ok, (f"{cpu_detail}: {config.cpu_quota:g} CPU per worker"
                                          if cpu_ok else cpu_detail))
    layers["idle_stop"] = Layer("idle_stop", config.idle_stop_ms > 0 and hasattr(os, "pidfd_open"),
                                f"SIGSTOP after {config.idle_stop_ms:g} ms without a request"
                                if config.idle_stop_ms > 0 else "disabled by config")
    layers["scratch_mount"] = Layer("scratch_mount", *_can_mount_tmpfs(root))
    layers["private_view"] = Layer("private_view", *_private_view_works(root, config))
    layers["ipc"] = Layer("ipc", layers["seccomp"].available,
                          "seccomp denies SysV message queues, semaphores, shared memory and "
                          f"POSIX message queues ({len(IPC)} syscall names)"
                          if layers["seccomp"].available else "seccomp unavailable")
    layers["rlimits"] = Layer("rlimits", True, f"AS {config.memory_mb} MiB, CPU "
                              f"{config.cpu_seconds}s, NOFILE {config.max_open_files}, NPROC "
                              f"{config.max_processes}, FSIZE {config.max_file_size_mb} MiB")
    return layers


def _can_mount_tmpfs(root: bool) -> tuple[bool, str]:
    """Whether this process can mount a tmpfs (the standard tier's scratch limit)."""
    if not root:
        return False, "not root: scratch limited per file only (RLIMIT_FSIZE)"
    import tempfile

    probe = tempfile.mkdtemp(prefix="spadekit-mountprobe-")
    try:
        mount_tmpfs(probe, 1, None)
    except OSError as exc:
        return False, f"cannot mount a tmpfs ({exc.strerror}): scratch limited per file only"
    else:
        unmount(probe)
        return True, "tmpfs mounted on each worker's scratch directory"
    finally:
        os.rmdir(probe)


def _private_view_works(root: bool, config: SandboxConfig) -> tuple[bool, str]:
    """Whether a standard-tier worker can get a private view here (``worker_view.py --probe``
    run as root: a mount namespace, a procfs mount of its own with ``hidepid=invisible``, binds
    under a tmpfs on /tmp), and what it shows otherwise."""
    exposed = ("standard tier shows host processes to stat(/proc/PID), every host file's "
               "size, owner and mtime to stat, and the scratch directory's host path")
    if not root:
        return False, f"not root: {exposed}"
    blocked = [p for p in _view_paths(config) if p == VIEW_ROOT or
               p.startswith(VIEW_ROOT + "/")]
    if blocked:
        return False, f"{blocked[0]} lies under {VIEW_ROOT}, which the view replaces: {exposed}"
    try:
        out = subprocess.run([sys.executable, "-I", "-S", "-B",
                              os.path.join(runtime_lib(), VIEW_REL), "--probe"],
                             capture_output=True, text=True, timeout=20)
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        ok, detail = seen["ok"] is True, str(seen["detail"])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError,
            TypeError) as exc:
        ok, detail = False, f"the probe failed: {exc}"
    return (True, detail) if ok else (False, f"the kernel refuses it ({detail[:200]}): "
                                             f"{exposed}")


def _view_paths(config: SandboxConfig) -> list[str]:
    """Host paths a worker reads by their own name (interpreter, prefix, allowlisted packages):
    a private view must leave them where they are."""
    found = _interpreter_for_uid(config)
    python, prefix = found if found else (os.path.realpath(sys.executable),
                                          os.path.realpath(sys.base_prefix))
    return [os.path.dirname(python), prefix,
            *packages.for_workers(tuple(config.packages)).paths]


def plan_for(tier: str, layers: dict[str, Layer], config: SandboxConfig) -> Plan | str:
    """The plan for ``tier``, or a string saying why this machine cannot give it."""
    root = layers["uid"].available
    seccomp = compile_filter() if layers["seccomp"].available else None
    cg_mode = cgroup.detect()[0] if layers["cgroup"].available else None
    cg_cpu = cg_mode is not None and layers["cpu"].available
    tmpfs = layers["scratch_mount"].available
    python = os.path.realpath(config.python or sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if root and tier in ("strong", "standard"):
        found = _interpreter_for_uid(config)
        if found is None:
            return ("no interpreter that an unprivileged uid can read (the running one lives "
                    "under a private directory; install python3 system-wide)")
        python, prefix = found
    if tier == "strong":
        missing = [n for n in ("namespaces", "seccomp") if not layers[n].available]
        if missing:
            return "missing " + ", ".join(missing)
        return Plan("strong", bwrap=shutil.which("bwrap"), per_worker_uid=root,
                    landlock=layers["landlock"].available, seccomp_bpf=seccomp,
                    cgroup_mode=cg_mode, cgroup_cpu=cg_cpu, python=python, python_prefix=prefix)
    if tier == "standard":
        missing = [n for n in ("seccomp", "landlock") if not layers[n].available]
        if missing:
            return "missing " + ", ".join(missing)
        view = root and layers.get("private_view", Layer("private_view", False, "")).available
        return Plan("standard", per_worker_uid=root, landlock=True, seccomp_bpf=seccomp,
                    cgroup_mode=cg_mode, cgroup_cpu=cg_cpu, scratch_tmpfs=tmpfs, python=python,
                    python_prefix=prefix, private_view=view)
    return Plan("weak", per_worker_uid=False, cgroup_mode=cg_mode, cgroup_cpu=cg_cpu,
                scratch_tmpfs=tmpfs, python=python, python_prefix=prefix)


_CACHE: dict[tuple, tuple[IsolationReport, Plan]] = {}
_CACHE_LOCK = threading.Lock()


def detect(config: SandboxConfig | None = None) -> tuple[IsolationReport, Plan]:
    """Probe, pick and prove a tier. Raises ``InsecureSandboxError`` when the best working tier is
    below ``standard`` and ``allow_unsafe`` is off, or ``SandboxStartError`` when a forced tier
    does not work."""
    from spadekit.sandbox.sandbox import Sandbox

    config = config or SandboxConfig()
    key = (config.tier, config.use_cgroups, config.python, config.uid_base, config.allow_unsafe,
           config.cpu_quota, config.idle_stop_ms)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
        layers = probe_layers(config)
        report = IsolationReport(tier="weak", root=layers["uid"].available, layers=layers)
        wanted = TIERS if config.tier == "auto" else (config.tier,)
        chosen: Plan | None = None
        cgroup.sweep_stale(cgroup.detect()[0] if layers["cgroup"].available else None)
        sweep_stale_dirs()
        for tier in wanted:
            plan = plan_for(tier, layers, config)
            if isinstance(plan, str):
                report.attempts.append({"tier": tier, "ok": False, "why": plan})
                continue
            try:
                sb = Sandbox.start(config, plan)
            except SandboxError as exc:
                report.attempts.append({"tier": tier, "ok": False, "why": exc.message})
                continue
            report.worker_layers = sb.layers
            sb.close()
            report.attempts.append({"tier": tier, "ok": True, "why": "worker booted"})
            chosen = plan
            report.tier = tier
            break
        if chosen is None:
            raise SandboxStartError("no sandbox tier works on this machine: " + "; ".join(
                f"{a['tier']}: {a['why']}" for a in report.attempts), attempts=report.attempts)
        if not report.safe and not config.allow_unsafe:
            raise InsecureSandboxError(
                f"only the '{report.tier}' isolation tier works here, which cannot contain "
                "untrusted programs (" + "; ".join(f"{a['tier']}: {a['why']}" for a in
                                                  report.attempts if not a["ok"]) +
                "). Install bubblewrap and libseccomp2, or pass allow_unsafe=True "
                "(--unsafe) to accept the risk.", attempts=report.attempts)
        _CACHE[key] = (report, chosen)
        return report, chosen


LIMITS_PROBE = '''
import ctypes, errno, json, os
class LimitsProbeEnv:
    def reset(self, seed=None, options=None):
        return "probe", {}
    def step(self, action):
        libc = ctypes.CDLL(None, use_errno=True)
        def call(fn, *args):
            ret = fn(*args)
            return "allowed" if ret != -1 else "denied (%s)" % errno.errorcode.get(ctypes.get_errno(), "?")
        out = {"msgget": call(libc.msgget, 0, 0o1600), "semget": call(libc.semget, 0, 1, 0o1600),
               "shmget": call(libc.shmget, 0, 4096, 0o1600)}
        try:
            rt = ctypes.CDLL("librt.so.1", use_errno=True)
            rt.mq_open.restype = ctypes.c_int
            out["mq_open"] = call(rt.mq_open, b"/spadekit-doctor", os.O_CREAT | os.O_RDWR, 0o600, None)
        except OSError as exc:
            out["mq_open"] = "no librt: %s" % exc
        try:
            os.close(os.open("/dev/shm/spadekit-doctor", os.O_CREAT | os.O_RDWR, 0o600))
            os.unlink("/dev/shm/spadekit-doctor")
            out["dev_shm"] = "writable"
        except OSError as exc:
            out["dev_shm"] = "not writable (%s)" % errno.errorcode.get(exc.errno, "?")
        st = os.statvfs(".")
        out["scratch_mb"] = st.f_blocks * st.f_frsize / 1048576
        arg = json.loads(action) if action.startswith("{") else {}
        seen = []
        for pid in arg.get("pids", []):
            try:
                os.stat("/proc/%d" % pid)
                seen.append(pid)
            except OSError:
                pass
        out["pids_seen"] = seen
        out["files_seen"] = [p for p in arg.get("files", []) if os.path.lexists(p)]
        try:
            out["cwd"] = os.getcwd()
        except OSError as exc:
            out["cwd"] = "unknown (%s)" % errno.errorcode.get(exc.errno, "?")
        out["ppid"] = os.getppid()
        out["home"] = os.environ.get("HOME", "")
        return json.dumps(out), 0.0, True, False, {}
'''


def _host_pids(exclude: set[int], cap: int = 400) -> list[int]:
    """Up to ``cap`` live host pids (this process first) not in ``exclude``, all above 100 (a
    pid namespace's own pids are small numbers)."""
    pids = [os.getpid()]
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit() and int(entry.name) > 100 and len(pids) < cap:
                pids.append(int(entry.name))
    return [p for p in dict.fromkeys(pids) if p not in exclude]


def files_shown(config: SandboxConfig, plan: Plan) -> list[str]:
    """The host paths a worker's filesystem still holds with a private root (bwrap's, or the
    private view's): what its interpreter reads, read-only."""
    system = list(SYSTEM_READ) + (["/sbin"] if plan.bwrap else [])
    paths = list(dict.fromkeys(system + view_reads(config, plan)))
    return [p for p in paths if not any(p.startswith(q.rstrip("/") + "/") for q in paths)]


def host_files(config: SandboxConfig, plan: Plan) -> list[str]:
    """Host paths a worker must not find (the trainer's files, the user's, the host's
    configuration) that exist here and lie outside ``files_shown``."""
    shown = [os.path.realpath(p) for p in files_shown(config, plan)]
    out = []
    for path in (str(PACKAGE_DIR / "__init__.py"), os.getcwd(), os.path.expanduser("~"),
                 "/etc/passwd", "/etc/hostname", "/etc/shadow", "/root", "/home", "/run",
                 "/var/log"):
        real = os.path.realpath(path)
        if os.path.lexists(path) and not any(real == s or real.startswith(s.rstrip("/") + "/")
                                             for s in shown):
            out.append(path)
    return list(dict.fromkeys(out))


def host_view(seen: dict, sb, plan: Plan, config: SandboxConfig | None = None) -> dict:
    """What a worker saw of the host (from ``LIMITS_PROBE``): other host processes, the
    trainer's pid, the host path of its scratch directory, host files it can stat."""
    own = set(sb.worker.host_pids)
    others = [p for p in seen.get("pids_seen", []) if p not in own]
    host_path = sb.worker.scratch in (seen.get("cwd"), seen.get("home"))
    how = ("own pid namespace" if plan.bwrap else "private /proc (hidepid=invisible)"
           if plan.private_view else "stat(/proc/PID) finds them: Landlock denies listing and "
           "reading /proc, not lookups")
    return {"processes": "visible" if others else "hidden", "how": how,
            "visible_host_pids": len(others),
            "parent_pid": "visible" if seen.get("ppid") == os.getpid() else "hidden",
            "paths": "host" if host_path else "neutral", "cwd": str(seen.get("cwd")),
            "files": "visible" if seen.get("files_seen") else "hidden",
            "visible_host_files": len(seen.get("files_seen", [])),
            "files_shown": (files_shown(config or SandboxConfig(), plan)
                            if plan.bwrap or plan.private_view else ["every host path"])}


def tier_limits(config: SandboxConfig | None = None) -> dict[str, dict]:
    """For each tier that can run untrusted code (``strong``, ``standard``): whether it works
    here and, from a real worker at that tier, its scratch size limit, CPU controls, IPC
    denial and what it sees of the host (``host_view``: other host processes, the trainer's
    pid, its scratch directory's host path), each probed inside the worker, not inferred from
    the plan."""
    from spadekit.sandbox.sandbox import Sandbox

    config = config or SandboxConfig()
    layers = probe_layers(config)
    out: dict[str, dict] = {}
    for tier in ("strong", "standard"):
        plan = plan_for(tier, layers, config)
        if isinstance(plan, str):
            out[tier] = {"available": False, "why": plan}
            continue
        try:
            with Sandbox.start(config, plan) as sb:
                sb.load(LIMITS_PROBE, "limits_probe.py")
                env = sb.new_env()
                env.reset()
                pids = _host_pids(set(sb.worker.host_pids))
                seen = json.loads(env.step(json.dumps({"pids": pids, "files": host_files(
                    config, plan)}))[0])
                view = host_view(seen, sb, plan, config)
        except (SandboxError, ValueError) as exc:
            out[tier] = {"available": False, "why": getattr(exc, "message", str(exc))}
            continue
        if plan.bwrap:
            how = "private tmpfs, bwrap --size (also /tmp)"
        elif plan.scratch_tmpfs:
            how = "tmpfs mounted on the scratch directory"
        else:
            how = f"none: only RLIMIT_FSIZE {config.max_file_size_mb} MiB per file"
        limited = bool(plan.bwrap or plan.scratch_tmpfs)
        out[tier] = {
            "available": True,
            "scratch": {"limit_mb": config.scratch_mb if limited else None, "how": how,
                        "measured_mb": round(float(seen.get("scratch_mb", 0)), 1)},
            "cpu": {"quota_cpus": config.cpu_quota if plan.cgroup_cpu else None,
                    "controller": layers["cpu"].detail if plan.cgroup_cpu else "none (" +
                    layers["cpu"].detail + ")",
                    "idle_stop_ms": config.idle_stop_ms if layers["idle_stop"].available
                    else None},
            "ipc": {"namespace": plan.bwrap is not None,
                    **{k: str(seen.get(k)) for k in ("msgget", "semget", "shmget", "mq_open",
                                                     "dev_shm")}},
            "host_view": view,
        }
    return out
