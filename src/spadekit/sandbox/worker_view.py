"""Stage one of a standard-tier worker started as root where the kernel allows a mount
namespace: a private view of the host, then the worker proper under neutral paths.

The standard tier has no namespaces from bubblewrap, and Landlock, which denies listing and
reading /proc there, cannot deny path lookups: ``os.stat("/proc/PID")`` would still tell a
program every host pid and its owner, and ``os.getcwd()`` the host path of its scratch
directory. Run as a script (``python -I -S -B worker_view.py``), standard library only, as root,
before anything untrusted exists in the process, this reads one line from the parent (trusted):
``{"scratch", "lib", "uid", "python", "env"}`` (host paths of the worker's scratch directory and
of the runtime library, the worker's uid, its interpreter and environment), then:

1. enters a new mount namespace whose mounts never propagate back to the host;
2. mounts a procfs of its own on /proc with ``hidepid=invisible,subset=pid``: a process there
   sees no process of another uid, so the worker, which has a per-worker uid, sees only itself
   (Linux >= 5.8 gives every procfs mount its own options; an older kernel refuses these
   options, so the host's /proc is never changed);
3. mounts a small tmpfs on /tmp with the scratch directory bound at ``/tmp/scratch`` (the
   working directory and ``HOME``) and the runtime library bound read-only at ``/tmp/lib``, and
   makes /tmp itself read-only: neither host path is reachable from the worker or shown to it;
4. drops to the worker's uid with no groups, and checks it did;
5. executes the worker, ``/tmp/lib/spadekit/sandbox/worker.py``, which reads the next line (its
   boot config, with the neutral paths) as usual. Nothing of this stage survives the exec.

On any failure it writes a start error as the worker's hello and exits, so the parent refuses
the worker. ``--probe`` does steps 1 to 3 in a throwaway namespace (its own process) and prints
whether they work here (``spadekit.sandbox.isolation`` asks before it plans the tier).
"""

import ctypes
import json
import os
import sys

VIEW_ROOT = "/tmp"
VIEW_SCRATCH = VIEW_ROOT + "/scratch"
VIEW_LIB = VIEW_ROOT + "/lib"
WORKER = VIEW_LIB + "/spadekit/sandbox/worker.py"
PROC_OPTIONS = b"hidepid=invisible,subset=pid"

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]
    libc.unshare.argtypes = [ctypes.c_int]
    return libc


def _mount(libc, source, target, fstype, flags, data=None):
    enc = lambda v: None if v is None else os.fsencode(v)  # noqa: E731
    if libc.mount(enc(source), enc(target), enc(fstype), flags, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "mount %s on %s: %s" % (source or fstype, target, os.strerror(err)))


def private_view(libc, scratch, lib):
    """Steps 1-3 (module docstring): ``scratch`` and ``lib`` (host paths) are bound at the
    neutral paths, ``lib`` read-only."""
    if libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "unshare(CLONE_NEWNS): %s" % os.strerror(err))
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    # opened in the new namespace (a bind source must be one of its mounts), before /tmp,
    # where both may live, is covered
    fds = [os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for path in (scratch, lib)]
    try:
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, PROC_OPTIONS)
        _mount(libc, "tmpfs", VIEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=0755")
        for path, fd, flags in ((VIEW_SCRATCH, fds[0], 0), (VIEW_LIB, fds[1], MS_RDONLY)):
            os.mkdir(path, 0o755)
            _mount(libc, "/proc/self/fd/%d" % fd, path, None, MS_BIND)
            _mount(libc, None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | flags)
        _mount(libc, None, VIEW_ROOT, None,
               MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    finally:
        for fd in fds:
            os.close(fd)


def drop_to(uid):
    """Become ``uid`` (and gid ``uid``) with no supplementary groups; raise unless it holds."""
    if not isinstance(uid, int) or isinstance(uid, bool) or uid <= 0:
        raise ValueError("the worker needs an unprivileged uid, got %r" % (uid,))
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or \
            os.getgroups():
        raise OSError("dropping to uid %d did not hold" % uid)


def _read_line(fd):
    """One line from ``fd``, byte by byte: what follows it is the worker's."""
    out = bytearray()
    while len(out) < 1 << 16:
        chunk = os.read(fd, 1)
        if not chunk or chunk == b"\n":
            return bytes(out)
        out += chunk
    raise ValueError("the view line is too long")


def _fail(message):
    line = json.dumps({"id": 0, "ok": False, "error": {
        "type": "SandboxStartError", "message": "private view failed: %s" % message}})
    try:
        os.write(1, line.encode() + b"\n")
    finally:
        os._exit(1)


def main():
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # cleared by the uid change; the worker re-arms it
    try:
        view = json.loads(_read_line(0))
        private_view(libc, view["scratch"], view["lib"])
        os.chdir(VIEW_SCRATCH)
        drop_to(view["uid"])
        python = view["python"]
        env = {str(k): str(v) for k, v in view["env"].items()}
    except Exception as exc:  # the parent reads this as the worker's hello
        _fail("%s: %s" % (type(exc).__name__, exc))
    try:
        os.execve(python, [python, "-I", "-S", "-B", WORKER], env)
    except OSError as exc:
        _fail("exec %s: %s" % (python, exc))


def probe():
    """Steps 1-3 in this (throwaway) process, binding read-only system directories; prints
    ``{"ok": ..., "detail": ...}``."""
    try:
        private_view(_libc(), "/usr", "/usr")
        os.stat("/proc/self")
        out = {"ok": True, "detail": "private mount namespace: /proc of its own (%s), "
               "scratch at %s, runtime library at %s" % (PROC_OPTIONS.decode(), VIEW_SCRATCH,
                                                         VIEW_LIB)}
    except Exception as exc:
        out = {"ok": False, "detail": "%s: %s" % (type(exc).__name__, exc)}
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1:] == ["--probe"]:
        probe()
    else:
        main()
