"""Run untrusted environment programs in isolated worker processes.

Layer 2: sandbox.
May import: common, envs.

- ``SandboxPool``: warm pool; ``pool.acquire(code)`` returns a ``Sandbox`` hosting that program.
- ``Sandbox``: one worker, one program; ``sandbox.new_env(max_turns=...)`` returns a ``RemoteEnv``
  with ``reset``/``step``/``solution``/``tools``.
- ``detect``: which isolation tier this machine gives (see ``spadekit.sandbox.isolation``).
- ``SandboxConfig``: deadlines and limits.
Failures are typed (``spadekit.common.errors``).
"""

from spadekit.sandbox.config import SandboxConfig
from spadekit.sandbox.isolation import IsolationReport, detect
from spadekit.sandbox.pool import SandboxPool
from spadekit.sandbox.sandbox import RemoteEnv, Sandbox

__all__ = ["SandboxConfig", "SandboxPool", "Sandbox", "RemoteEnv", "IsolationReport", "detect"]
