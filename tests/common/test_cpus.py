"""``spadekit.common.cpus``: the CPUs a process may use follow its affinity mask and its cgroup's
CPU quota, never the host's core count; torch's thread count (the policy's and the SFT
trainer's) is taken from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spadekit.common import cpus

SRC = str(Path(__file__).resolve().parents[2] / "src")


CPUS_OF_A_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); "
                   "from spadekit.common.cpus import usable_cpus; print(usable_cpus())")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to narrow")
def test_usable_cpus_follow_the_affinity_mask():
    one = next(iter(os.sched_getaffinity(0)))
    code = f"import os; os.sched_setaffinity(0, {{{one}}})\n" + CPUS_OF_A_CHILD.replace("; ", "\n")
    done = subprocess.run([sys.executable, "-c", code, SRC],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "1"


def _cpu_cgroup_dir() -> Path | None:
    for base in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct")):
        if (base / "cpu.cfs_quota_us").exists() and os.access(base, os.W_OK):
            return base
    return None


@pytest.mark.skipif(_cpu_cgroup_dir() is None, reason="no writable cgroup v1 cpu controller")
def test_usable_cpus_follow_a_cgroup_cpu_quota():
    """A child moved into a cgroup with half a CPU of quota, or into an unlimited cgroup below
    it (a systemd slice, a pod), counts 1 usable CPU."""
    group = _cpu_cgroup_dir() / f"spadekit-test-cpus-{os.getpid()}"
    group.mkdir()
    inner = group / "unlimited"
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("50000")
        inner.mkdir()
        for where in (group, inner):
            code = (f"import os; open({str(where / 'cgroup.procs')!r}, 'w')"
                    ".write(str(os.getpid()))\n" + CPUS_OF_A_CHILD.replace("; ", "\n"))
            done = subprocess.run([sys.executable, "-c", code, SRC],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            assert done.stdout.split()[-1] == "1", where
    finally:
        if inner.exists():
            inner.rmdir()
        group.rmdir()


def fake_machine(tmp_path, monkeypatch, cgroup: bytes, files: dict[str, str]) -> None:
    """Point ``spadekit.common.cpus`` at a made-up ``/proc/self/cgroup`` and ``/sys/fs/cgroup``
    tree under ``tmp_path`` (``files``: path below /sys/fs/cgroup -> content)."""
    real = Path
    (tmp_path / "cgroup").write_bytes(cgroup)
    for rel, text in files.items():
        (tmp_path / "sys" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "sys" / rel).write_text(text)

    def path(*parts):
        joined = real(*parts)
        if str(joined) == "/proc/self/cgroup":
            return tmp_path / "cgroup"
        if str(joined).startswith("/sys/fs/cgroup"):
            return tmp_path / "sys" / str(joined)[len("/sys/fs/cgroup"):].lstrip("/")
        return joined

    monkeypatch.setattr(cpus, "Path", path)


@pytest.mark.parametrize("limits,want", [
    ({}, None),                                                    # no cpu.max anywhere
    ({"kubepods/pod/c1": "max 100000"}, None),                     # unlimited
    ({"kubepods/pod/c1": "50000 100000"}, 1),                      # half a CPU: 1
    ({"kubepods/pod/c1": "250000 100000"}, 3),                     # 2.5 CPUs: 3
    ({"kubepods/pod": "400000 100000", "kubepods/pod/c1": "max 100000"}, 4),  # the pod's
    ({"kubepods/pod": "400000 100000", "kubepods/pod/c1": "150000 100000"}, 2),  # tightest
    ({"": "200000 100000"}, 2),                                    # a container's own root
    ({"kubepods/pod/c1": "100000 0"}, None),                       # a period of 0: skipped
    ({"kubepods/pod/c1": "garbage"}, None),                        # unreadable: skipped
])
def test_a_cgroup_v2_cpu_max_caps_the_usable_cpus(tmp_path, monkeypatch, limits, want):
    files = {f"{rel}/cpu.max".lstrip("/"): text for rel, text in limits.items()}
    fake_machine(tmp_path, monkeypatch, b"0::/kubepods/pod/c1\n", files)
    assert cpus.cgroup_cpu_quota() == want
    host = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert cpus.usable_cpus() == (min(host, want) if want else host)


def test_a_cgroup_v1_cfs_quota_caps_the_usable_cpus(tmp_path, monkeypatch):
    fake_machine(tmp_path, monkeypatch, b"4:cpu,cpuacct:/docker/abc\n3:pids:/docker/abc\n",
                 {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000",
                  "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
                  "cpu,cpuacct/cpu.cfs_quota_us": "-1",
                  "cpu,cpuacct/cpu.cfs_period_us": "100000"})
    assert cpus.cgroup_cpu_quota() == 2


def test_a_cgroup_named_in_bytes_that_are_not_utf8_still_counts(tmp_path, monkeypatch):
    """cgroup names are bytes: the quota of one whose name is not UTF-8 is still read."""
    name = os.fsdecode(b"pod-\xff\xfe")
    fake_machine(tmp_path, monkeypatch, b"0::/pod-\xff\xfe\n",
                 {"cpu.max": "300000 100000", f"{name}/cpu.max": "100000 100000"})
    assert cpus.cgroup_cpu_quota() == 1


@pytest.mark.parametrize("cgroup", [
    b"garbage\n\n1:cpu:/../../x\n0::/a:b\n",                      # no colons, climbs out
    b"0::/pod-\xff\xfe\n",                                          # a name that is not UTF-8
    b"", b"\x00\x00\n0::/" + b"a/" * 5000 + b"\n",
])
def test_odd_cgroup_files_never_stop_a_session(tmp_path, monkeypatch, cgroup):
    """Lines without colons, a path that climbs out, bytes that are not UTF-8, NULs, a very
    deep path: skipped, never raised."""
    fake_machine(tmp_path, monkeypatch, cgroup, {"cpu.max": "300000 100000"})
    assert cpus.cgroup_cpu_quota() == 3  # the root's own file still counts
    assert cpus.usable_cpus() >= 1


def test_the_policy_threads_follow_the_usable_cpus_not_the_host_cores(monkeypatch):
    """Eight usable CPUs on any host give torch seven threads (one left for the sandbox workers
    and the trainer's other threads); the environment variable still decides when set."""
    import torch

    from spadekit.policy import hf

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("SPADEKIT_TORCH_THREADS", raising=False)
        for usable, want in ((8, 7), (1, 1), (2, 1)):
            monkeypatch.setattr(hf, "usable_cpus", lambda n=usable: n)
            assert hf.configure_cpu_threads() == want == torch.get_num_threads()
        monkeypatch.setenv("SPADEKIT_TORCH_THREADS", "3")
        assert hf.configure_cpu_threads() == 3 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_the_warm_start_trains_on_the_usable_cpus_and_restores_the_count(tmp_path, monkeypatch):
    import torch

    from spadekit.policy.registry import load_policy
    from spadekit.train import sft

    policy = load_policy("tiny")
    tok = policy.tokenizer
    prompt, answer = tok.encode("question 1:"), tok.encode(" the answer is 1")
    example = sft.SFTExample(prompt + answer, [0] * len(prompt) + [1] * len(answer))
    before = torch.get_num_threads()
    seen: list[int] = []
    monkeypatch.setattr(sft, "usable_cpus", lambda: before + 2)
    cfg = sft.SFTConfig(epochs=1, use_peft=False, grad_accum=1, max_tokens_per_microbatch=64)
    sft.SFTRun(policy, cfg, tmp_path / "a").fit([example] * 2,
                                                progress=lambda *_: seen.append(
                                                    torch.get_num_threads()))
    assert seen and set(seen) == {before + 2}
    assert torch.get_num_threads() == before
    seen.clear()
    cfg = sft.SFTConfig(epochs=1, use_peft=False, grad_accum=1, max_tokens_per_microbatch=64,
                        threads=1)
    sft.SFTRun(policy, cfg, tmp_path / "b").fit([example] * 2,
                                                progress=lambda *_: seen.append(
                                                    torch.get_num_threads()))
    assert set(seen) == {1} and torch.get_num_threads() == before


def test_doctor_reports_the_usable_cpus_beside_the_host_cores():
    from spadekit.cli.doctor import collect

    system = collect()["system"]
    assert system["usable_cpus"] == cpus.usable_cpus() and system["cpus"] == os.cpu_count()
