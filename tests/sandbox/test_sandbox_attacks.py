"""The attack matrix: hostile programs against the real sandbox, judged by host side effects.

Every attack is an environment whose ``step`` misbehaves. Each test asserts (1) no effect on the
host, (2) a typed result or error, (3) nothing left running afterwards, and (4) that the pool still
serves a good program. Runs once per isolation tier that boots here (strong, standard).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import assert_pool_works, live_processes_of_uid, process_alive
from spadekit.common.errors import (EnvRaised, InvalidResult, ProtocolViolation, ResourceLimit,
                             SandboxClosed, SandboxTimeout, WorkerDied)

TEMPLATE = '''
import os, sys, time, json, socket, ctypes, threading, subprocess, gc
class AttackEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
    def reset(self, seed=None, options=None):
        return "ready", {{}}
    def step(self, action):
        arg = json.loads(action) if action.startswith("{{") else {{}}
        out = []
{body}
        return json.dumps(out), 0.0, False, False, {{}}
'''


def program(body: str) -> str:
    lines = body.strip("\n").splitlines()
    return TEMPLATE.format(body="\n".join("        " + line for line in lines))


def attack(pool, body: str, arg: dict | None = None):
    """Run one attack step; returns (sandbox, result-or-exception)."""
    sb = pool.acquire(program(body))
    env = sb.new_env()
    env.reset(seed=0)
    try:
        obs, *_ = env.step(json.dumps(arg or {}))
        result = json.loads(obs)
    except Exception as exc:  # the typed error is the result under test
        result = exc
    return sb, result


def finish(pool, sb) -> None:
    """Close the sandbox, check nothing of it survives, check the pool still works."""
    uid = sb.worker.uid
    sb.close()
    if uid is not None:
        deadline = time.monotonic() + 2
        while live_processes_of_uid(uid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert live_processes_of_uid(uid) == []
    assert not os.path.exists(sb.worker.scratch)
    assert_pool_works(pool)


def test_tcp_and_udp_to_loopback_are_blocked(pool):
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    tcp.settimeout(0.3)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.3)
    body = '''
for kind in ("tcp", "udp", "unix"):
    try:
        if kind == "tcp":
            s = socket.create_connection(("127.0.0.1", arg["tcp"]), timeout=1); s.sendall(b"x")
        elif kind == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"x", ("127.0.0.1", arg["udp"]))
        else:
            s = socket.socket(socket.AF_UNIX); s.connect("/run/docker.sock")
        out.append(kind + " ok")
    except Exception as e:
        out.append(kind + " blocked " + type(e).__name__)
'''
    sb, result = attack(pool, body, {"tcp": tcp.getsockname()[1], "udp": udp.getsockname()[1]})
    assert all("blocked" in r for r in result), result
    with pytest.raises(socket.timeout):
        tcp.accept()
    with pytest.raises(socket.timeout):
        udp.recvfrom(10)
    tcp.close()
    udp.close()
    finish(pool, sb)


def test_writes_outside_scratch_are_blocked(pool, tmp_path):
    host_file = tmp_path / "escaped.txt"
    os.chmod(tmp_path, 0o777)
    body = '''
for path in (arg["host"], "/etc/sbx_probe_x", "/tmp/../etc/sbx_probe_y", "/usr/sbx_probe"):
    try:
        with open(path, "w") as fh:
            fh.write("pwned")
        out.append("wrote " + path)
    except Exception as e:
        out.append("blocked " + type(e).__name__)
with open("scratch_ok.txt", "w") as fh:
    fh.write("scratch is writable")
out.append("scratch ok")
'''
    sb, result = attack(pool, body, {"host": str(host_file)})
    assert result[-1] == "scratch ok"
    assert all(r.startswith("blocked") for r in result[:-1]), result
    assert not host_file.exists()
    assert not os.path.exists("/etc/sbx_probe_x") and not os.path.exists("/etc/sbx_probe_y")
    assert not os.path.exists("/usr/sbx_probe")
    finish(pool, sb)


def test_secrets_and_parent_environment_are_unreadable(pool, monkeypatch):
    secret = "spadekit-test-secret-7f3a9"
    monkeypatch.setenv("SPADEKIT_TEST_SECRET", secret)
    body = '''
out.append(json.dumps(dict(os.environ)))
for path in ("/etc/shadow", os.path.expanduser("~root/.bashrc"), "/root/.bashrc",
             "/proc/%d/environ" % os.getppid(), "/proc/1/environ", "/proc/%d/environ" % arg["parent"]):
    try:
        with open(path, "rb") as fh:
            out.append(fh.read(4096).decode("latin-1"))
    except Exception as e:
        out.append("blocked " + type(e).__name__)
'''
    sb, result = attack(pool, body, {"parent": os.getpid()})
    text = json.dumps(result)
    assert secret not in text
    assert "root:" not in text  # /etc/shadow lines start with root:
    assert all(r.startswith("blocked") for r in result[1:3]), result[1:3]
    finish(pool, sb)


def test_fork_bomb_subprocess_and_daemons_are_blocked(pool):
    body = '''
import posix
for name, fn in (("os.fork", os.fork), ("posix.fork", posix.fork),
                 ("libc.fork", lambda: ctypes.CDLL(None, use_errno=True).fork()),
                 ("subprocess", lambda: subprocess.Popen(["/bin/sh", "-c", "sleep 30"], start_new_session=True)),
                 ("execv", lambda: os.execv("/bin/sh", ["sh", "-c", "sleep 30"]))):
    try:
        r = fn()
        if r == 0:
            os.setsid(); time.sleep(30); os._exit(0)
        out.append(name + " -> " + str(r))
    except Exception as e:
        out.append(name + " blocked " + type(e).__name__)
'''
    sb, result = attack(pool, body)
    for line in result:
        assert "blocked" in line or line.endswith("-> -1"), result
    finish(pool, sb)


def test_memory_bomb_is_a_resource_limit(pool):
    body = '''
try:
    huge = bytearray(30 * 1024 ** 3)
except MemoryError:
    out.append("30 GB refused")
chunks = []
while True:
    chunks.append(bytearray(64 * 1024 * 1024))
'''
    small = pool.config.replace(memory_mb=320, step_timeout=20.0)
    from spadekit.sandbox import Sandbox

    sb = Sandbox.start(small, pool.plan)
    sb.load(program(body))
    env = sb.new_env()
    env.reset()
    with pytest.raises(ResourceLimit) as err:
        env.step("{}")
    assert err.value.kind == "memory"
    assert sb.alive  # MemoryError is caught inside the worker; it survives
    env.reset()
    finish(pool, sb)


def test_cpu_loop_that_swallows_exceptions_times_out(pool):
    body = '''
while True:
    try:
        while True:
            pass
    except BaseException:
        pass
'''
    sb, result = attack(pool, body)
    assert isinstance(result, SandboxTimeout) and result.op == "step"
    assert not sb.alive
    with pytest.raises(SandboxClosed):
        sb.request("ping", {})
    finish(pool, sb)


def test_sleep_times_out(pool):
    sb, result = attack(pool, "time.sleep(60)")
    assert isinstance(result, SandboxTimeout)
    finish(pool, sb)


def test_segfault_is_worker_died_with_traceback(pool):
    sb, result = attack(pool, "ctypes.string_at(0)")
    assert isinstance(result, WorkerDied), result
    assert result.signal == "SIGSEGV" or "Segmentation fault" in result.stderr_tail
    assert "Fatal Python error" in result.stderr_tail
    finish(pool, sb)


def test_os_exit_is_worker_died_with_code(pool):
    sb, result = attack(pool, "os._exit(3)")
    assert isinstance(result, WorkerDied) and result.returncode == 3
    finish(pool, sb)


def test_sys_exit_is_env_raised_and_worker_survives(pool):
    sb, result = attack(pool, "sys.exit(3)")
    assert isinstance(result, EnvRaised) and result.exc_type == "SystemExit"
    assert "AttackEnv" in result.traceback or "step" in result.traceback
    env = sb.new_env()
    assert env.reset(seed=1)[0] == "ready"
    finish(pool, sb)


def test_stdout_flood_keeps_protocol_and_bounded_capture(pool):
    body = '''
chunk = "x" * 65535 + "\\n"
for _ in range(300):
    sys.stdout.write(chunk)
for _ in range(300):
    os.write(1, chunk.encode()); os.write(2, chunk.encode())
print("END-OF-FLOOD")
out.append("flooded")
'''
    sb, result = attack(pool, body)
    assert result == ["flooded"]
    env = sb.new_env()
    env.reset(seed=0)
    assert json.loads(env.step("{}")[0]) == ["flooded"]
    deadline = time.monotonic() + 5  # the drain thread may be a moment behind the reply
    while "END-OF-FLOOD" not in sb.output_tail() and time.monotonic() < deadline:
        time.sleep(0.02)
    tail = sb.output_tail()
    assert len(tail.encode()) <= sb.config.stderr_tail_bytes
    assert "END-OF-FLOOD" in tail
    finish(pool, sb)


def test_signals_to_parent_pid1_and_canary_are_blocked(pool):
    canary = subprocess.Popen(["sleep", "60"])
    try:
        body = '''
import signal
for pid in (os.getppid(), 1, arg["parent"], arg["canary"], -1):
    try:
        os.kill(pid, signal.SIGKILL)
        out.append("killed %d" % pid)
    except Exception as e:
        out.append("blocked %s" % type(e).__name__)
'''
        sb, result = attack(pool, body, {"parent": os.getpid(), "canary": canary.pid})
        assert all(r.startswith("blocked") for r in result), result
        time.sleep(0.1)
        assert canary.poll() is None
        finish(pool, sb)
    finally:
        canary.kill()
        canary.wait()


def test_huge_observation_is_invalid_result(pool):
    src = program("pass").replace('return json.dumps(out), 0.0', 'return "x" * 5_000_000, 0.0')
    sb = pool.acquire(src)
    env = sb.new_env()
    env.reset()
    with pytest.raises(InvalidResult) as err:
        env.step("go")
    assert err.value.reason == "observation_too_large"
    finish(pool, sb)


@pytest.mark.parametrize("ret,reason", [
    ('("obs", 0.5, False, {})', "bad_step_type"),
    ('("obs", "1", False, False, {})', "bad_step_type"),
    ('("obs", float("nan"), False, False, {})', "reward_not_finite"),
    ('("obs", 1.5, False, False, {})', "reward_out_of_range"),
    ('(["obs"], 0.5, False, False, {})', "bad_step_type"),
    ('("obs", 0.5, "yes", False, {})', "bad_step_type"),
    ('("obs", 0.5, False, False, None)', "bad_step_type"),
])
def test_wrong_step_types_are_invalid_results(pool, ret, reason):
    src = program("pass").replace('return json.dumps(out), 0.0, False, False, {}', "return " + ret)
    sb = pool.acquire(src)
    env = sb.new_env()
    env.reset()
    with pytest.raises(InvalidResult) as err:
        env.step("go")
    assert err.value.reason == reason
    assert sb.alive
    finish(pool, sb)


def test_thread_spam_is_contained(pool):
    body = '''
n = 0
try:
    for _ in range(5000):
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        n += 1
except Exception as e:
    out.append("stopped " + type(e).__name__)
out.append(n)
'''
    sb, result = attack(pool, body)
    if isinstance(result, list):
        assert result[-1] < 5000 and result[0].startswith("stopped"), result
    else:
        assert isinstance(result, (EnvRaised, ResourceLimit, WorkerDied)), result
    finish(pool, sb)


def test_runaway_recursion_is_typed(pool):
    body = '''
def f(n):
    return f(n + 1) + 1
f(0)
'''
    sb, result = attack(pool, body)
    assert isinstance(result, ResourceLimit) and result.kind == "recursion"
    sb2, result2 = attack(pool, "sys.setrecursionlimit(10**8)\n" + body)
    # Python 3.11 keeps Python frames on the heap: this grows until a limit, the deadline or the
    # C stack gives out, whichever comes first; all three are typed and contained.
    assert isinstance(result2, (WorkerDied, ResourceLimit, SandboxTimeout)), result2
    finish(pool, sb)
    finish(pool, sb2)


def test_forged_oversized_protocol_line_kills_worker(pool):
    body = '''
proto = sys.modules["__main__"].PROTO_OUT
os.write(proto, b"{" * (3 * 1024 * 1024))
'''
    sb, result = attack(pool, body)
    assert isinstance(result, ProtocolViolation), result
    assert not sb.alive
    finish(pool, sb)


def test_forged_reply_line_is_detected(pool):
    body = '''
proto = sys.modules["__main__"].PROTO_OUT
os.write(proto, b'{"id": 999, "ok": true, "result": ["won", 1.0, true, false, {}]}\\n')
'''
    sb, result = attack(pool, body)
    assert isinstance(result, ProtocolViolation), result
    finish(pool, sb)


def test_file_size_limit_is_typed(pool):
    body = '''
with open("big.bin", "wb") as fh:
    for _ in range(64):
        fh.write(b"0" * (1024 * 1024))
'''
    sb, result = attack(pool, body)
    assert isinstance(result, ResourceLimit) and result.kind == "file_size", result
    finish(pool, sb)


def test_kernel_surface_syscalls_are_refused(pool):
    body = '''
libc = ctypes.CDLL(None, use_errno=True)
for name, call in (("ptrace", lambda: libc.ptrace(16, 1, 0, 0)),
                   ("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
                   ("unshare", lambda: libc.unshare(0x10000000)),
                   ("setuid", lambda: libc.setuid(0)),
                   ("bpf", lambda: libc.syscall(321, 0, 0, 0))):
    out.append([name, call(), ctypes.get_errno()])
'''
    sb, result = attack(pool, body)
    for name, ret, err in result:
        assert ret == -1 and err in (1, 13, 38), (name, ret, err)  # EPERM, EACCES, ENOSYS
    finish(pool, sb)


def test_isolation_layers_are_reported(pool):
    layers = pool.report.worker_layers
    assert layers["seccomp"]["applied"] is True
    if pool.report.layers["landlock"].available:
        assert layers["landlock"]["applied"] is True
    if os.geteuid() == 0:
        assert layers["rlimits"]["nproc"] == pool.config.max_processes


def test_nothing_leaks_after_pool_close(tmp_path):
    from conftest import TEST_CONFIG, TIERS
    from spadekit.sandbox import SandboxConfig, SandboxPool

    if not TIERS:
        pytest.skip("no safe tier")
    pool = SandboxPool(SandboxConfig(**TEST_CONFIG), warm=3)
    boxes = [pool.acquire(program("out.append(1)")) for _ in range(3)]
    for sb in boxes:
        env = sb.new_env()
        env.reset()
        env.step("{}")
    time.sleep(0.3)  # let the warm refill happen, then close everything
    held = pool.sandboxes()
    assert len(held) >= 4
    uids = [sb.worker.uid for sb in held]
    scratches = [sb.worker.scratch for sb in held]
    cgroups = [d for sb in held if sb.worker.cgroup for d in sb.worker.cgroup.dirs]
    pool.close()
    for uid in uids:
        if uid is not None:
            assert live_processes_of_uid(uid) == []
    assert not any(os.path.exists(p) for p in scratches)
    assert not any(p.exists() for p in cgroups)


def test_asyncio_use(pool):
    import asyncio

    from conftest import ECHO

    async def play(n):
        sb = await pool.aacquire(ECHO)
        env = sb.new_env()
        await env.areset(seed=n)
        obs = (await env.astep(f"a{n}"))[0]
        sb.close()
        return obs

    async def main():
        return await asyncio.gather(*(play(i) for i in range(4)))

    assert asyncio.run(main()) == [f"echo:a{i}" for i in range(4)]


def test_threads_share_a_pool_safely(pool):
    from concurrent.futures import ThreadPoolExecutor

    from conftest import ECHO

    def play(n):
        with pool.acquire(ECHO) as sb:
            env = sb.new_env()
            env.reset(seed=n)
            return [env.step(str(i))[0] for i in range(20)]

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(play, range(8)))
    assert all(r == [f"echo:{i}" for i in range(20)] for r in results)


def test_parent_signal_handlers_untouched():
    assert signal.getsignal(signal.SIGINT) is not None


KILLED_PARENT = r'''
import json, sys, threading, time
sys.path.insert(0, sys.argv[1])
from spadekit.sandbox import SandboxConfig, SandboxPool
pool = SandboxPool(SandboxConfig(tier=sys.argv[2], step_timeout=120.0), warm=2)
sb = pool.acquire("""
class SpinEnv:
    def reset(self, seed=None, options=None):
        return "spin", {}
    def step(self, action):
        while True:
            try:
                pass
            except BaseException:
                pass
""")
env = sb.new_env()
env.reset()
held = pool.sandboxes()
print(json.dumps({"uids": [s.worker.uid for s in held],
                  "pids": sorted(p for s in held for p in s.worker.host_pids),
                  "scratch": [s.worker.scratch for s in held]}), flush=True)
env.step("go")
'''


def test_killed_trainer_leaves_no_worker_behind(tmp_path):
    """SIGKILL the process that owns a pool while a worker spins: every worker dies with it,
    and the next start sweeps the directories it left."""
    from conftest import TIERS

    from spadekit.sandbox.launch import sweep_stale_dirs

    src = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src")
    for tier in TIERS:
        proc = subprocess.Popen([__import__("sys").executable, "-c", KILLED_PARENT, src, tier],
                                stdout=subprocess.PIPE, text=True)
        info = json.loads(proc.stdout.readline())
        time.sleep(0.3)  # the step is now spinning inside the sandbox
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 3
        alive = info["pids"]
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [p for p in info["pids"] if process_alive(p)]
        assert alive == [], (tier, alive)
        for uid in info["uids"]:
            if uid is not None:
                assert live_processes_of_uid(uid) == []
        sweep_stale_dirs()
        assert not any(os.path.exists(p) for p in info["scratch"])


def test_every_tier_the_layers_allow_actually_boots():
    """Guard against a silently lost tier: when the probes say a tier's layers exist, the tier
    must boot, so the attack matrix above really ran against it."""
    from conftest import TEST_CONFIG, TIERS

    from spadekit.sandbox import SandboxConfig
    from spadekit.sandbox.isolation import plan_for, probe_layers

    config = SandboxConfig(**TEST_CONFIG)
    layers = probe_layers(config)
    for tier in ("strong", "standard"):
        if not isinstance(plan_for(tier, layers, config), str):
            assert tier in TIERS, f"{tier} has its layers but did not boot"
