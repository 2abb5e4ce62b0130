"""The sandbox run by an ordinary user (no root: user namespaces instead of per-worker uids).

As root we cannot become an ordinary user in-process, so the test runs a small driver script
as ``nobody`` under the system interpreter, with a copy of spadekit's sources, pyseccomp,
psutil and pydantic in a world-readable directory. The driver builds a pool, plays a few attacks, and prints
JSON; the test judges the host side effects. Skipped where the machine does not allow it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

NOBODY = 65534
SRC = Path(__file__).resolve().parents[2] / "src"

DRIVER = r'''
import json, os, socket, sys
sys.path.insert(0, sys.argv[2])
from spadekit.sandbox import SandboxConfig, SandboxPool
from spadekit.common.errors import SandboxError

victim = sys.argv[1]
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen(1)
listener.settimeout(0.3)
ATTACK = """
import os, json, socket
class AttackEnv:
    def reset(self, seed=None, options=None):
        return "ready", {}
    def step(self, action):
        arg = json.loads(action); out = []
        try:
            open(arg["victim"], "a").write("pwned"); out.append("wrote")
        except Exception as e:
            out.append("write blocked")
        try:
            os.kill(arg["parent"], 9); out.append("killed")
        except Exception as e:
            out.append("kill blocked")
        try:
            socket.create_connection(("127.0.0.1", arg["port"]), timeout=1); out.append("connected")
        except Exception as e:
            out.append("connect blocked")
        try:
            os.fork(); out.append("forked")
        except Exception as e:
            out.append("fork blocked")
        if arg.get("hang"):
            while True:
                pass
        return json.dumps(out), 0.0, False, False, {}
"""
pool = SandboxPool(SandboxConfig(step_timeout=2.0), warm=1)
res = {"tier": pool.report.tier, "root": pool.report.root}
sb = pool.acquire(ATTACK)
env = sb.new_env()
env.reset()
res["worker"] = sb.layers
res["attack"] = json.loads(env.step(json.dumps({"victim": victim, "parent": os.getpid(),
                                                "port": listener.getsockname()[1]}))[0])
try:
    listener.accept(); res["accepted"] = True
except socket.timeout:
    res["accepted"] = False
try:
    env.step(json.dumps({"victim": victim, "parent": os.getpid(), "port": 1, "hang": True}))
except SandboxError as exc:
    res["hang"] = type(exc).__name__
sb.close()
with pool.acquire(ATTACK.replace("arg = json.loads(action)", "arg = {}")) as sb2:
    res["pool_after"] = sb2.new_env().reset()[0]
LIMITS = """
import ctypes, json, os
class LimitsEnv:
    def reset(self, seed=None, options=None):
        libc = ctypes.CDLL(None, use_errno=True)
        st = os.statvfs(".")
        return json.dumps({"msgget": [libc.msgget(0, 0o1600), ctypes.get_errno()],
                           "scratch_mb": st.f_blocks * st.f_frsize / 1048576}), {}
    def step(self, action):
        return "ok", 0.0, True, False, {}
"""
with pool.acquire(LIMITS) as sb3:
    env3 = sb3.new_env()
    res["limits"] = json.loads(env3.reset()[0])
    import time
    time.sleep(0.2)
    res["stopped_while_idle"] = sb3.worker.stops
    res["after_stop"] = env3.step("x")[0]
pool.close()
print(json.dumps(res))
'''


def _system_python() -> str | None:
    for cand in (f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}",
                 "/usr/bin/python3"):
        if os.path.exists(cand):
            return cand
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an ordinary user")
def test_sandbox_as_ordinary_user():
    # pytest's tmp_path lives under a root-only directory: use a world-searchable one instead
    tmp_path = Path(tempfile.mkdtemp(prefix="spadekit-unpriv-"))
    try:
        _run_as_nobody(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _run_as_nobody(tmp_path: Path) -> None:
    python = _system_python()
    if python is None or shutil.which("bwrap") is None:
        pytest.skip("no system python3 or bubblewrap")
    import psutil
    import pyseccomp

    lib = tmp_path / "lib"
    shutil.copytree(SRC / "spadekit", lib / "spadekit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(pyseccomp.__file__, lib / "pyseccomp.py")
    shutil.copytree(Path(psutil.__file__).parent, lib / "psutil",
                    ignore=shutil.ignore_patterns("__pycache__", "tests"))
    import annotated_types
    import pydantic
    import pydantic_core
    import typing_extensions
    import typing_inspection

    for module in (pydantic, pydantic_core, annotated_types, typing_inspection):  # the config
        shutil.copytree(Path(module.__file__).parent, lib / module.__name__,
                        ignore=shutil.ignore_patterns("__pycache__", "tests"))
    shutil.copy(typing_extensions.__file__, lib / "typing_extensions.py")
    (tmp_path / "driver.py").write_text(DRIVER)
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    os.chown(victim, NOBODY, NOBODY)
    for dirpath, dirnames, filenames in os.walk(tmp_path):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    os.chmod(victim, 0o644)
    os.chown(tmp_path, NOBODY, NOBODY)
    probe = subprocess.run([python, "-c", "import ctypes, json"], user=NOBODY, group=NOBODY,
                           extra_groups=[], capture_output=True, cwd=tmp_path)
    if probe.returncode != 0:
        pytest.skip("the system python does not run as nobody here")
    proc = subprocess.run([python, "-I", str(tmp_path / "driver.py"), str(victim), str(lib)],
                          user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path,
                          env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0 and "no sandbox tier works" in proc.stderr:
        pytest.skip("user namespaces are not available to ordinary users here")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["root"] is False
    assert res["tier"] in ("strong", "standard")
    assert res["attack"] == ["write blocked", "kill blocked", "connect blocked", "fork blocked"]
    assert res["accepted"] is False
    assert res["hang"] == "SandboxTimeout"
    assert res["pool_after"] == "ready"
    assert res["limits"]["msgget"] == [-1, 1]  # EPERM: seccomp denies SysV IPC
    if res["tier"] == "strong":  # bwrap --size: a private tmpfs of sandbox.scratch_mb
        assert res["limits"]["scratch_mb"] == 64.0
    assert res["stopped_while_idle"] >= 1 and res["after_stop"] == "ok"
    assert victim.read_text() == "original"
