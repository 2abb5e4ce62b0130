"""Nothing of a local Ray instance that spadekit started outlives the process that started it.

``RayReaper.start(ray_dir)``, called before ``ray.init``, starts a watchdog in its own session.
It follows the driver's Ray processes and all their descendants (``psutil.Process``: a reused
pid is never mistaken for one). When the driver is gone, however it died, the watchdog SIGSTOPs
every one still running, picks up descendants found meanwhile, and SIGKILLs them all.
``close()`` (after ``ray.shutdown()``) does the same for what a clean shutdown left. The watchdog
(``main``) runs as ``python -I ray_reaper.py DRIVER_PID RAY_DIR`` on the standard library and
psutil. Why: docs/design/rollout.md.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import psutil

POLL_S = 0.25
"""How often the watchdog looks for new Ray processes below the driver while Ray starts
(``STARTUP_S``); ``SLOW_S`` after that (a worker started later is found below its raylet)."""
STARTUP_S = 60.0
SLOW_S = 2.0
REAP_S = 10.0
"""How long the watchdog keeps stopping and killing what it follows once the driver is gone."""


def running(proc: psutil.Process) -> bool:
    """Whether ``proc`` is still the process recorded (same pid and start time) and not a
    zombie (nothing left to kill: its parent reaps it)."""
    try:
        return proc.is_running() and proc.status() not in (psutil.STATUS_ZOMBIE,
                                                           psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def children(proc: psutil.Process | int, recursive: bool = False) -> list[psutil.Process]:
    """The children (or all descendants) of ``proc``, or [] if it is gone."""
    try:
        return psutil.Process(proc).children(recursive) if isinstance(proc, int) \
            else proc.children(recursive)
    except psutil.Error:
        return []


def is_ray_process(proc: psutil.Process, ray_dir: str) -> bool:
    """Whether ``proc`` runs a Ray program: its command line names a file of the Ray package
    (``ray_dir``: the GCS and raylet binaries, the dashboard, log monitor and autoscaler
    scripts) or a worker title Ray set (``ray::...``)."""
    try:
        cmd = " ".join(proc.cmdline())  # a title Ray set may come back split at spaces
    except psutil.Error:
        return False
    return cmd.startswith("ray::") or ray_dir.rstrip("/") + "/" in cmd


class Follower:
    """The Ray processes below one driver, by pid (a ``psutil.Process`` keeps the start time)."""

    def __init__(self, driver: int, ray_dir: str, me: int) -> None:
        self.driver = driver
        self.ray_dir = ray_dir
        self.me = me
        self.known: dict[int, psutil.Process] = {}

    def alive(self) -> list[psutil.Process]:
        return [proc for proc in self.known.values() if running(proc)]

    def _add(self, proc: psutil.Process) -> bool:
        if proc.pid == self.me or self.known.get(proc.pid) == proc or not running(proc):
            return False
        self.known[proc.pid] = proc
        return True

    def scan(self, driver_alive: bool = True) -> int:
        """Record new Ray children of the driver and new descendants of every known process;
        returns how many were new."""
        new = 0
        if driver_alive:
            # every scan looks again at each child not yet known: between its fork and its
            # exec a child still shows the driver's command line
            for proc in children(self.driver):
                if proc.pid not in self.known and is_ray_process(proc, self.ray_dir):
                    new += self._add(proc)
        live = self.alive()
        self.known = {proc.pid: proc for proc in live}  # forget the dead
        walked: set[int] = set()
        for proc in live:
            if proc.pid not in walked:  # a known process below another was walked with it
                below = children(proc, recursive=True)
                walked.update(child.pid for child in below)
                new += sum(self._add(child) for child in below)
        return new

    def signal_all(self, sig: int) -> int:
        """Send ``sig`` to every known process that is still the one recorded; returns how
        many were signalled. A pidfd pins the process before it is checked."""
        sent = 0
        for proc in list(self.known.values()):
            try:
                fd = os.pidfd_open(proc.pid)
            except (OSError, AttributeError):
                fd = None
            try:
                if not running(proc):
                    continue
                if fd is None:
                    os.kill(proc.pid, sig)
                else:
                    signal.pidfd_send_signal(fd, sig)
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
        killed: set[psutil.Process] = set()
        while True:
            self.signal_all(signal.SIGSTOP)
            while self.scan(driver_alive=False):
                self.signal_all(signal.SIGSTOP)
            live = self.alive()
            if not live:
                return len(killed)
            killed.update(live)
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
                [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()),
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


__all__ = ["Follower", "RayReaper", "is_ray_process", "main", "running"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
