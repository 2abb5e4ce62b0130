"""Nothing of a local Ray instance that spadekit started outlives the process that started it.

``RayReaper.start(ray_dir)``, called before ``ray.init``, starts a watchdog in its own session.
It follows the driver's Ray processes and all their descendants, each known by pid and start
time (a reused pid is never mistaken). When the driver is gone, however it died, the watchdog
SIGSTOPs every one still running, picks up descendants found meanwhile, and SIGKILLs them all.
``close()`` (after ``ray.shutdown()``) does the same for what a clean shutdown left. The watchdog
(``main``) runs as ``python -I -S ray_reaper.py DRIVER_PID RAY_DIR`` on the standard library
only. Why: docs/design/rollout.md.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 0.25
"""How often the watchdog looks for new Ray processes below the driver while Ray starts
(``STARTUP_S``); ``SLOW_S`` after that (Ray starts its node and agents at once; a worker
started later is found below its raylet, which the reap stops before it looks again)."""
STARTUP_S = 60.0
SLOW_S = 2.0
REAP_S = 10.0
"""How long the watchdog keeps stopping and killing what it follows once the driver is gone."""


# -- /proc, standard library only -----------------------------------------------------------

def parse_start_time(stat: bytes) -> int | None:
    """The start time in a ``/proc/PID/stat`` line, or None for an exited process (a zombie:
    nothing left to kill, its parent reaps it) or a line that is not one. The command name
    between the parentheses may hold anything, ``)`` and spaces too: fields follow the last
    ``)``."""
    try:
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):
            return None
        return int(fields[19])
    except (ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), or None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return parse_start_time(fh.read())
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """The children of ``pid`` (every thread's), or [] if it is gone."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):  # a thread that just ended, or a kernel without the file
            continue
    return out


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read(1 << 16)
    except OSError:
        return b""


def is_ray_process(pid: int, ray_dir: bytes) -> bool:
    """Whether ``pid`` runs a Ray program: its command line names a file of the Ray package
    (the GCS and raylet binaries, the dashboard, log monitor and autoscaler scripts) or a
    worker title Ray set (``ray::...``)."""
    cmd = _cmdline(pid)
    return cmd.startswith(b"ray::") or (ray_dir + b"/") in cmd


class Follower:
    """The Ray processes below one driver, as ``{pid: start time}``."""

    def __init__(self, driver: int, ray_dir: str, me: int) -> None:
        self.driver = driver
        self.ray_dir = os.fsencode(ray_dir.rstrip("/"))
        self.me = me
        self.known: dict[int, int] = {}

    def alive(self) -> list[int]:
        return [pid for pid, t in self.known.items() if start_time(pid) == t]

    def _add(self, pid: int) -> bool:
        t = start_time(pid)
        if t is None or pid == self.me or self.known.get(pid) == t:
            return False
        self.known[pid] = t
        return True

    def scan(self, driver_alive: bool = True) -> int:
        """Record new Ray children of the driver and new descendants of every known process;
        returns how many were new."""
        new = 0
        if driver_alive:
            # every scan looks again at each child not yet known: between its fork and its
            # exec a child still shows the driver's command line
            for pid in children(self.driver):
                if pid != self.me and pid not in self.known and \
                        is_ray_process(pid, self.ray_dir):
                    new += self._add(pid)
        todo = self.alive()
        self.known = {pid: self.known[pid] for pid in todo}  # forget the dead
        while todo:
            for child in children(todo.pop()):
                if self._add(child):
                    new += 1
                    todo.append(child)
        return new

    def signal_all(self, sig: int) -> int:
        """Send ``sig`` to every known process that is still the one recorded; returns how
        many were signalled. A pidfd pins the process, checked against its start time."""
        sent = 0
        for pid, t in list(self.known.items()):
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):
                fd = None
                if start_time(pid) != t:
                    continue
            try:
                if fd is None:
                    os.kill(pid, sig)
                elif start_time(pid) == t:
                    signal.pidfd_send_signal(fd, sig)
                else:
                    continue
                sent += 1
            except OSError:
                pass
            finally:
                if fd is not None:
                    os.close(fd)
        return sent

    def reap(self, seconds: float = REAP_S) -> int:
        """Stop every known process (a stopped one starts nothing), pick up descendants found
        meanwhile, then kill them all; repeated until none is left or ``seconds`` passed.
        Returns how many processes were killed."""
        end = time.monotonic() + seconds
        killed: set[tuple[int, int]] = set()
        while True:
            self.signal_all(signal.SIGSTOP)
            while self.scan(driver_alive=False):
                self.signal_all(signal.SIGSTOP)
            live = self.alive()
            if not live:
                return len(killed)
            killed.update((pid, self.known[pid]) for pid in live)
            self.signal_all(signal.SIGKILL)
            if time.monotonic() >= end:
                return len(killed)
            time.sleep(0.05)


def main(argv: list[str]) -> int:
    """The watchdog: follow the driver's Ray processes until the driver is gone (stdin closes
    or this process is reparented), then reap them."""
    driver, ray_dir = int(argv[0]), argv[1]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # only the driver's end decides when this ends
    follower = Follower(driver, ray_dir, os.getpid())
    fd = sys.stdin.fileno()
    began = time.monotonic()
    while os.getppid() == driver:
        follower.scan()
        wait = POLL_S if time.monotonic() - began < STARTUP_S else SLOW_S
        try:
            ready, _, _ = select.select([fd], [], [], wait)
        except InterruptedError:
            continue
        if ready:
            try:
                if not os.read(fd, 4096):
                    break  # the driver closed its end, or died
            except OSError:
                break
    follower.reap()
    return 0


# -- the driver's side -----------------------------------------------------------------------

class RayReaper:
    """The driver's handle on its watchdog: ``start`` before ``ray.init``, ``close`` after
    ``ray.shutdown``. The watchdog holds the read end of a pipe whose write end only this
    process has (not inherited across exec), so it learns of the driver's death at once."""

    def __init__(self, proc: subprocess.Popen, write_fd: int) -> None:
        self.proc = proc
        self.write_fd: int | None = write_fd

    @classmethod
    def start(cls, ray_dir: str) -> "RayReaper":
        """A watchdog for the Ray processes this process is about to start (``ray_dir``: the
        directory of the installed ``ray`` package). Raises ``OSError`` if it cannot start."""
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()),
                 ray_dir], stdin=read_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                close_fds=True, start_new_session=True)
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        return cls(proc, write_fd)

    @classmethod
    def for_ray(cls, ray: object) -> "RayReaper | None":
        """``start`` for the imported ``ray`` module; None, with a warning, where no watchdog
        can start (Ray still works, without the guarantee)."""
        import logging

        try:
            return cls.start(os.path.dirname(os.path.abspath(ray.__file__)))  # type: ignore
        except OSError as exc:
            logging.getLogger(__name__).warning(
                "no watchdog for the local Ray instance (%s): if this process is killed, some "
                "Ray processes may outlive it", exc)
            return None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self, timeout: float = REAP_S + 5.0) -> None:
        """Let the watchdog reap what is left of Ray now, and wait for it."""
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


__all__ = ["Follower", "RayReaper", "is_ray_process", "main", "parse_start_time"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
