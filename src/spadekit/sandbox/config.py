"""Settings of the sandbox: deadlines, resource limits, isolation choices.

Every field has a default that suits model-written text environments on a small machine; the
self-play config tree embeds this dataclass under ``sandbox``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from spadekit.common.errors import ConfigError

TIERS = ("strong", "standard", "weak")
"""Isolation tiers, strongest first (see ``spadekit.sandbox.isolation``)."""


@dataclass(frozen=True)
class SandboxConfig:
    # wall-clock deadlines, seconds
    start_timeout: float = 15.0
    """Worker boot until its ``hello`` (interpreter start + isolation)."""
    load_timeout: float = 10.0
    """Executing the program's module code."""
    create_timeout: float = 5.0
    """Constructing the Env class."""
    reset_timeout: float = 5.0
    step_timeout: float = 5.0
    call_timeout: float = 10.0
    """``solution()``, ``tools()`` and other method calls."""

    # resource limits of each worker
    memory_mb: int = 1024
    """Address-space rlimit and, where cgroups are usable, the cgroup memory limit."""
    cpu_seconds: int = 600
    """RLIMIT_CPU backstop over the worker's whole life (deadlines are the real guard)."""
    max_open_files: int = 64
    max_file_size_mb: int = 16
    max_processes: int = 64
    """RLIMIT_NPROC for the per-worker uid and cgroup ``pids.max`` (threads count)."""
    scratch_mb: int = 64
    """Size of each worker's writable scratch space (its working directory, and ``/tmp`` on the
    strong tier): a private tmpfs of this size (bwrap ``--size`` on the strong tier; a tmpfs
    mounted on the scratch directory on the standard tier when running as root). Elsewhere only
    ``max_file_size_mb`` per file applies; ``spadekit doctor`` says which holds. tmpfs pages
    count against the worker's memory cgroup where there is one."""
    cpu_quota: float = 1.0
    """CPUs each worker may use while it runs (cgroup CPU controller: v1 ``cpu.cfs_quota_us``
    or v2 ``cpu.max``), where per-worker cgroups are usable."""
    idle_stop_ms: float = 20.0
    """A worker that has had no request for this long is stopped (SIGSTOP) until its next
    request, so threads a program left running burn no CPU between requests; 0 disables."""
    max_program_chars: int = 1_000_000
    max_reply_bytes: int = 1 << 20
    max_observation_chars: int = 65536
    stderr_tail_bytes: int = 8192
    """How much of the worker's own output (prints, tracebacks) is kept, as a ring buffer."""

    # isolation
    tier: str = "auto"
    """``auto`` picks the strongest tier that works here; or force ``strong``/``standard``/``weak``."""
    allow_unsafe: bool = False
    """Permit running untrusted programs below the ``standard`` tier (never the default)."""
    use_cgroups: bool = True
    """Put each worker in its own pids+memory cgroup when the host allows it."""
    uid_base: int = 1_400_000
    """Root only: workers run as uids ``uid_base + k`` with no groups (never shared by live workers)."""
    python: str | None = None
    """Interpreter for workers; default: the running interpreter."""
    preload: tuple[str, ...] = ("random", "re", "math", "itertools", "collections", "json",
                                "string", "functools", "heapq")
    """Modules each worker imports while booting (before any program), so that loading a
    program does not pay for them; off the critical path with a warm pool. Add
    ``spadekit.envs.tooluse`` (about 35 ms: it needs ``inspect``) for tool-use-heavy runs."""
    hash_seed: int = 0
    """PYTHONHASHSEED inside workers, so set iteration order (and so env behaviour) is reproducible."""
    compat: bool = True
    """Run programs written for the SPADE reference's contract (``spadekit.envs.compat``): the
    common standard-library names, ``np`` and math_verify's ``parse``/``verify`` usable without
    an import (bound only when the program mentions them; third-party ones imported on first
    use), a pre-loaded ``ToolUseBaseEnv``, ``get_tools()``, ``reset()`` without ``options``,
    string solutions and flat tool schemas. False: the plain spadekit contract only."""
    packages: tuple[str, ...] = ("numpy", "math_verify")
    """Third-party packages programs may import (with what they require), found in this
    interpreter's environment; only those are importable and readable in workers
    (``spadekit.sandbox.packages``). ``()`` allows none."""

    def __post_init__(self) -> None:
        if self.tier not in ("auto",) + TIERS:
            raise ConfigError(f"sandbox.tier must be one of auto, {', '.join(TIERS)}; "
                              f"got {self.tier!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith(("_timeout", "_mb", "_seconds", "_chars", "_bytes", "_files",
                                "_processes")) and not (isinstance(value, (int, float))
                                                        and value > 0):
                raise ConfigError(f"sandbox.{f.name} must be a positive number, got {value!r}")
        if not (isinstance(self.cpu_quota, (int, float)) and math.isfinite(self.cpu_quota)
                and self.cpu_quota > 0):
            raise ConfigError(f"sandbox.cpu_quota must be a positive number of CPUs, got "
                              f"{self.cpu_quota!r}")
        if not (isinstance(self.idle_stop_ms, (int, float)) and self.idle_stop_ms >= 0):
            raise ConfigError(f"sandbox.idle_stop_ms must be >= 0 (0 disables), got "
                              f"{self.idle_stop_ms!r}")

    def replace(self, **changes) -> "SandboxConfig":
        return dataclasses.replace(self, **changes)

    def deadline(self, op: str) -> float:
        return {"load": self.load_timeout, "create": self.create_timeout,
                "reset": self.reset_timeout, "step": self.step_timeout}.get(op, self.call_timeout)
