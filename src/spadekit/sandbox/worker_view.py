"""Stage one of a standard-tier worker started as root where the kernel allows a mount
namespace: a minimal root of its own, then the worker proper under neutral paths.

Run as a script (standard library only, as root, before anything untrusted exists), it reads one
trusted line ``{"scratch", "lib", "read", "uid", "python", "env"}``, enters a new mount
namespace, builds a root holding only read-only binds of ``SYSTEM_READ`` and the ``read`` paths,
``/dev/null``, a private /proc (``hidepid=invisible``) and /tmp with scratch at ``/tmp/scratch``
and the runtime library at ``/tmp/lib``, pivots into it, drops to the worker's uid with no groups
(checked) and executes the worker. Every other host path does not exist for the worker. On any
failure it writes a start error as the hello and exits. ``--probe`` tests the steps here. The
steps in detail: docs/design/sandbox.md.
"""

import ctypes
import json
import os
import platform
import stat
import sys

VIEW_ROOT = "/tmp"
VIEW_SCRATCH = VIEW_ROOT + "/scratch"
VIEW_LIB = VIEW_ROOT + "/lib"
WORKER = VIEW_LIB + "/spadekit/sandbox/worker.py"
PROC_OPTIONS = b"hidepid=invisible,subset=pid"
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime")
"""Host paths every worker's interpreter reads (bound read-only into its root)."""
BUILD_AT = VIEW_ROOT
"""Where the new root's tmpfs is mounted (in the namespace only) while it is built."""

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
SYS_PIVOT_ROOT = {"x86_64": 155, "amd64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41,
                  "ppc64le": 203, "ppc64": 203, "s390x": 217}


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.syscall.restype = ctypes.c_long
    return libc


def _mount(libc, source, target, fstype, flags, data=None):
    enc = lambda v: None if v is None else os.fsencode(v)  # noqa: E731
    if libc.mount(enc(source), enc(target), enc(fstype), flags, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "mount %s on %s: %s" % (source or fstype, target, os.strerror(err)))


def root_layout(read):
    """What the new root holds: ``(symlinks, binds)``, ``symlinks`` a list of ``(path, target)``
    for host paths that are symlinks, ``binds`` the sorted host paths (real paths, none under
    another, none under /tmp, /proc or /dev, which the view makes itself) bound read-only at the
    same path. Paths that do not exist on the host are left out; a relative one is refused
    (``ValueError``)."""
    symlinks, wanted = [], []
    for path in tuple(SYSTEM_READ) + tuple(read):
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError("a bind path must be absolute, got %r" % (path,))
        path = os.path.normpath(path)
        if not os.path.lexists(path):
            continue
        if os.path.islink(path):
            symlinks.append((path, os.readlink(path)))
        real = os.path.realpath(path)
        if os.path.exists(real):
            wanted.append(real)
    binds = []
    for path in sorted(set(wanted)):
        if path == "/" or any(path == top or path.startswith(top + "/")
                              for top in (VIEW_ROOT, "/proc", "/dev")):
            continue
        if not any(path.startswith(b.rstrip("/") + "/") for b in binds):
            binds.append(path)
    links = {}
    for path, target in symlinks:  # a link inside a bound directory is there already
        if path not in binds and not any(path.startswith(b + "/") for b in binds):
            links[path] = target
    return sorted(links.items()), binds


def _make_parents(root, path):
    """Create the directories of ``path`` under ``root`` (a fresh tmpfs), never following a
    symlink; return the full path of ``path`` there, or None when a symlink is in the way."""
    here = root
    for part in path.strip("/").split("/")[:-1]:
        here = os.path.join(here, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            os.mkdir(here, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            return None
    return os.path.join(root, path.strip("/"))


def _build_root(libc, new, fds, links, binds):
    """Step 2 (docs/design/sandbox.md) on the tmpfs at ``new``; ``fds`` holds an O_PATH fd for each
    bind source, ``"scratch"``, ``"lib"`` and ``"null"``."""
    for sub in ("tmp", "proc", "dev", "dev/shm"):  # /dev/shm: empty, read-only like the root
        os.mkdir(os.path.join(new, sub), 0o755)
    targets = []
    for path in binds:  # every mount point first: nothing is created inside a bind
        target = _make_parents(new, path)
        if target is None or os.path.lexists(target):
            continue
        if os.path.isdir(path):
            os.mkdir(target, 0o755)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o444))
        targets.append((path, target))
    for path, link in links:
        target = _make_parents(new, path)
        if target is not None and not os.path.lexists(target):
            os.symlink(link, target)
    os.close(os.open(os.path.join(new, "dev/null"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o666))
    for path, target in targets:
        _mount(libc, "/proc/self/fd/%d" % fds[path], target, None, MS_BIND)
        _mount(libc, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    null = os.path.join(new, "dev/null")
    _mount(libc, "/proc/self/fd/%d" % fds["null"], null, None, MS_BIND)
    _mount(libc, None, null, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NOEXEC)
    _mount(libc, "proc", os.path.join(new, "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
           PROC_OPTIONS)
    tmp = os.path.join(new, "tmp")
    _mount(libc, "tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=0755")
    for name, flags in (("scratch", 0), ("lib", MS_RDONLY)):
        target = os.path.join(tmp, name)
        os.mkdir(target, 0o755)
        _mount(libc, "/proc/self/fd/%d" % fds[name], target, None, MS_BIND)
        _mount(libc, None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | flags)
    for mount_point in (tmp, new):
        _mount(libc, None, mount_point, None,
               MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _enter(libc, new):
    """Step 3: make ``new`` the root; return how (``"pivot_root"`` or ``"chroot"``)."""
    os.chdir(new)
    number = SYS_PIVOT_ROOT.get(platform.machine().lower())
    if number is not None and libc.syscall(number, b".", b".") == 0:
        if libc.umount2(b".", MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "detaching the old root: %s" % os.strerror(err))
        how = "pivot_root"
    else:
        os.chroot(".")
        how = "chroot"
    os.chdir("/")
    return how


def private_view(libc, scratch, lib, read=()):
    """Steps 1-3 (docs/design/sandbox.md): ``scratch`` and ``lib`` (host paths) are bound at the
    neutral paths, ``lib`` read-only, ``read`` (host paths) read-only where they are; returns
    how the root was entered."""
    links, binds = root_layout(read)
    if libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "unshare(CLONE_NEWNS): %s" % os.strerror(err))
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    # opened in the new namespace (a bind source must be one of its mounts), before the tmpfs
    # the root is built on covers /tmp, where scratch and lib may live
    fds = {}
    try:
        for key, path, flags in ([("scratch", scratch, os.O_DIRECTORY),
                                  ("lib", lib, os.O_DIRECTORY), ("null", "/dev/null", 0)] +
                                 [(b, b, 0) for b in binds]):
            fds[key] = os.open(path, os.O_PATH | os.O_CLOEXEC | flags)
        _mount(libc, "tmpfs", BUILD_AT, "tmpfs", MS_NOSUID | MS_NODEV,
               b"size=256k,nr_inodes=4096,mode=0755")
        _build_root(libc, BUILD_AT, fds, links, binds)
    finally:
        for fd in fds.values():
            os.close(fd)
    return _enter(libc, BUILD_AT)


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
        read = view.get("read", [])
        if not isinstance(read, list):
            raise ValueError("read must be a list of paths")
        private_view(libc, view["scratch"], view["lib"], read)
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
        how = private_view(_libc(), "/usr", "/usr")
        os.stat("/proc/self")
        top = sorted(os.listdir("/"))
        if sorted(os.listdir(VIEW_ROOT)) != ["lib", "scratch"] or not os.path.isdir("/usr"):
            raise OSError("the new root does not hold what it should: %s" % top)
        out = {"ok": True, "detail": "private mount namespace, minimal root (%s; only %s): "
               "/proc of its own (%s), scratch at %s, runtime library at %s" % (
                   how, ", ".join("/" + t for t in top), PROC_OPTIONS.decode(), VIEW_SCRATCH,
                   VIEW_LIB)}
    except Exception as exc:
        out = {"ok": False, "detail": "%s: %s" % (type(exc).__name__, exc)}
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1:] == ["--probe"]:
        probe()
    else:
        main()
