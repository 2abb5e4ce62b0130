"""Compile the sandbox's seccomp filter (parent side) into raw BPF bytes.

The trainer compiles the filter once with ``pyseccomp`` and hands the bytes to each worker, which
installs them with one ``prctl`` before any untrusted code runs. Policy: default allow; deny new
processes (threads still work), sockets, signals to anyone, kernel-surface syscalls (ptrace,
mounts, namespaces, bpf, perf, io_uring, keys, modules, uid changes...), SysV and POSIX-mq IPC,
terminal injection ioctls, and every question about another process (``getppid``; pid-taking
syscalls unless the pid is 0; ``pidfd_open``, ``kcmp``, owner-setting fcntl/ioctl, clocks of
other processes). The list with reasons: docs/design/sandbox.md.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile

CLONE_THREAD = 0x00010000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

IPC = (
    "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semtimedop", "semtimedop_time64", "semctl",
    "shmget", "shmat", "shmdt", "shmctl", "ipc",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedsend_time64", "mq_timedreceive",
    "mq_timedreceive_time64", "mq_notify", "mq_getsetattr",
)
"""SysV and POSIX-message-queue IPC (names an architecture lacks are skipped)."""

PID_ARG0 = ("getpgid", "getsid", "setpgid", "sched_getaffinity", "sched_setaffinity",
            "sched_getparam", "sched_setparam", "sched_getscheduler", "sched_setscheduler",
            "sched_rr_get_interval", "sched_getattr", "sched_setattr", "prlimit64",
            "get_robust_list", "migrate_pages", "move_pages")
"""Syscalls whose first argument is a pid: refused unless it is 0 (the caller)."""
WHO_ARG1 = ("getpriority", "setpriority", "ioprio_get", "ioprio_set")
"""Syscalls whose second argument names a process, group or user: refused unless it is 0."""
CLOCK_ARG0 = ("clock_gettime", "clock_getres", "clock_nanosleep", "timer_create")
"""Clock calls: a negative clock id (the CPU clock of a pid or thread) is refused."""
F_SETOWN, F_SETOWN_EX = 8, 15
FIOSETOWN, SIOCSPGRP = 0x8901, 0x8902

DENY_EPERM = (
    "fork", "vfork", "execve", "execveat",
    "socket", "socketpair",
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_send_signal",
    "pidfd_getfd", "ptrace", "process_vm_readv", "process_vm_writev",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "move_mount", "open_tree",
    "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "syslog",
    "acct", "open_by_handle_at", "name_to_handle_at", "setuid", "setgid", "setreuid",
    "setregid", "setresuid", "setresgid", "setgroups", "setfsuid", "setfsgid", "mknod",
    "mknodat", "personality", "quotactl", "lookup_dcookie", "vhangup", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "iopl",
    "ioperm", "uselib", "nfsservctl", "fanotify_init",
    "getppid", "pidfd_open", "kcmp", "capget", "capset", "process_madvise", "process_mrelease",
) + IPC


class SeccompUnavailable(RuntimeError):
    """pyseccomp or the system libseccomp is missing, or the filter could not be compiled."""


@functools.lru_cache(maxsize=1)
def compile_filter() -> bytes:
    """Return the BPF program (a sequence of 8-byte ``sock_filter`` entries) for this machine."""
    try:
        import pyseccomp as sc
    except Exception as exc:  # ImportError, or OSError when libseccomp.so is missing
        raise SeccompUnavailable(f"pyseccomp unavailable: {exc}") from exc
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        if os.uname().machine == "x86_64":
            # x32 syscalls share the x86_64 audit arch; give them the same rules.
            try:
                flt.add_arch(sc.Arch.X32)
            except Exception:
                pass
        for name in DENY_EPERM:
            _try_rule(flt, sc.ERRNO(errno.EPERM), name)
        _try_rule(flt, sc.ERRNO(errno.ENOSYS), "clone3")
        _try_rule(flt, sc.ERRNO(errno.EPERM), "clone",
                  sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
        for req in (TIOCSTI, TIOCLINUX, FIOSETOWN, SIOCSPGRP):
            _try_rule(flt, sc.ERRNO(errno.EPERM), "ioctl",
                      sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, req))
        for cmd in (F_SETOWN, F_SETOWN_EX):
            _try_rule(flt, sc.ERRNO(errno.EPERM), "fcntl",
                      sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, cmd))
        for name in PID_ARG0:
            _try_rule(flt, sc.ERRNO(errno.EPERM), name, sc.Arg(0, sc.NE, 0))
        for name in WHO_ARG1:
            _try_rule(flt, sc.ERRNO(errno.EPERM), name, sc.Arg(1, sc.NE, 0))
        for name in CLOCK_ARG0:  # negative ids, sign- or zero-extended, are above 2**31 - 1
            _try_rule(flt, sc.ERRNO(errno.EINVAL), name, sc.Arg(0, sc.GT, 0x7FFFFFFF))
        with tempfile.TemporaryFile() as fh:
            flt.export_bpf(fh)
            fh.seek(0)
            data = fh.read()
    except SeccompUnavailable:
        raise
    except Exception as exc:
        raise SeccompUnavailable(f"could not compile the seccomp filter: {exc}") from exc
    if not data or len(data) % 8:
        raise SeccompUnavailable("libseccomp exported an empty or malformed BPF program")
    return data


def _try_rule(flt, action: int, name: str, *args) -> None:
    """Add one rule; a syscall this architecture does not have is skipped (nothing to deny).
    Any other failure raises: silently dropping a deny rule would weaken the sandbox."""
    import pyseccomp as sc

    if sc.resolve_syscall(sc.Arch.NATIVE, name) < 0:
        return
    flt.add_rule(action, name, *args)
