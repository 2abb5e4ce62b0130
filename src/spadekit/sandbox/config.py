"""Settings of the sandbox: deadlines, resource limits, isolation choices.

Every field has a default that suits model-written text environments on a small machine; the
self-play config tree embeds this dataclass under ``sandbox``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from spadekit.common.config_fields import (Bool, Count, Int, NonNegative, PosInt, Positive, Str,
                                           Strings, section)

TIERS = ("strong", "standard", "weak")
"""Isolation tiers, strongest first (see ``spadekit.sandbox.isolation``)."""


@section(knob="sandbox")
class SandboxConfig:
    # wall-clock deadlines, seconds
    start_timeout: Positive = 15.0
    """Worker boot until its ``hello`` (interpreter start + isolation)."""
    load_timeout: Positive = 10.0
    """Executing the program's module code."""
    create_timeout: Positive = 5.0
    """Constructing the Env class."""
    reset_timeout: Positive = 5.0
    step_timeout: Positive = 5.0
    call_timeout: Positive = 10.0
    """``solution()``, ``tools()`` and other method calls."""

    # resource limits of each worker
    memory_mb: PosInt = 1024
    """Address-space rlimit and, where cgroups are usable, the cgroup memory limit."""
    cpu_seconds: PosInt = 600
    """RLIMIT_CPU backstop over the worker's whole life (deadlines are the real guard)."""
    max_open_files: PosInt = 64
    max_file_size_mb: PosInt = 16
    max_processes: PosInt = 64
    """RLIMIT_NPROC for the per-worker uid and cgroup ``pids.max`` (threads count)."""
    scratch_mb: PosInt = 64
    """Size of each worker's writable scratch space (its working directory, and ``/tmp`` on the
    strong tier): a private tmpfs of this size (bwrap ``--size`` on the strong tier; a tmpfs
    mounted on the scratch directory on the standard tier when running as root). Elsewhere only
    ``max_file_size_mb`` per file applies; ``spadekit doctor`` says which holds. tmpfs pages
    count against the worker's memory cgroup where there is one."""
    cpu_quota: Positive = 1.0
    """CPUs each worker may use while it runs (cgroup CPU controller: v1 ``cpu.cfs_quota_us``
    or v2 ``cpu.max``), where per-worker cgroups are usable."""
    idle_stop_ms: NonNegative = 20.0
    """A worker that has had no request for this long is stopped (SIGSTOP) until its next
    request, so threads a program left running burn no CPU between requests; 0 disables."""
    max_program_chars: PosInt = 1_000_000
    max_reply_bytes: PosInt = 1 << 20
    max_observation_chars: PosInt = 65536
    stderr_tail_bytes: PosInt = 8192
    """How much of the worker's own output (prints, tracebacks) is kept, as a ring buffer."""

    # isolation
    tier: Literal[("auto",) + TIERS] = "auto"
    """``auto`` picks the strongest tier that works here; or force ``strong``/``standard``/``weak``."""
    allow_unsafe: Bool = False
    """Permit running untrusted programs below the ``standard`` tier (never the default)."""
    use_cgroups: Bool = True
    """Put each worker in its own pids+memory cgroup when the host allows it."""
    uid_base: Count = 1_400_000
    """Root only: workers run as uids ``uid_base + k`` with no groups (never shared by live workers)."""
    python: Str | None = None
    """Interpreter for workers; default: the running interpreter."""
    preload: Strings = ("random", "re", "math", "itertools", "collections", "json",
                                "string", "functools", "heapq")
    """Modules each worker imports while booting (before any program), so that loading a
    program does not pay for them; off the critical path with a warm pool. Add
    ``spadekit.envs.tooluse`` (about 35 ms: it needs ``inspect``) for tool-use-heavy runs."""
    hash_seed: Int = 0
    """PYTHONHASHSEED inside workers, so set iteration order (and so env behaviour) is reproducible."""
    compat: Bool = True
    """Run programs written for the SPADE reference's contract (``spadekit.envs.compat``): the
    common standard-library names, ``np`` and math_verify's ``parse``/``verify`` usable without
    an import (bound only when the program mentions them; third-party ones imported on first
    use), a pre-loaded ``ToolUseBaseEnv``, ``get_tools()``, ``reset()`` without ``options``,
    string solutions and flat tool schemas. False: the plain spadekit contract only."""
    packages: Strings = ("numpy", "math_verify")
    """Third-party packages programs may import (with what they require), found in this
    interpreter's environment; only those are importable and readable in workers
    (``spadekit.sandbox.packages``). ``()`` allows none."""

    def replace(self, **changes) -> "SandboxConfig":
        return dataclasses.replace(self, **changes)

    def deadline(self, op: str) -> float:
        return {"load": self.load_timeout, "create": self.create_timeout,
                "reset": self.reset_timeout, "step": self.step_timeout}.get(op, self.call_timeout)
