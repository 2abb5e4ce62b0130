"""What a standard-tier program learns of host files by looking their paths up.

Landlock denies reading and listing what it does not allow, but not path lookups: with only
/proc and /tmp replaced, ``os.stat`` on any host path it can name told a program that the file
exists, its size, owner and modification time (the trainer's files, the run database,
checkpoints, ~/.ssh, /etc/shadow...). With the private view (root, a mount namespace) the
worker now runs in a minimal root of its own (``spadekit.sandbox.worker_view``): read-only
binds of what the interpreter needs, its scratch and runtime library under /tmp, a private
/proc and /dev/null; every other host path does not exist for it.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TEST_CONFIG, TIERS
from spadekit.sandbox import SandboxConfig, SandboxPool

ROOT = Path(__file__).resolve().parents[2]

STAT_SPY = r'''
import json, os

class StatEnv:
    def reset(self, seed=None, options=None):
        return "stat", {}

    def step(self, action):
        arg = json.loads(action)
        out = {}
        for path in arg["paths"]:
            try:
                st = os.stat(path)
                out[path] = [st.st_size, st.st_uid, int(st.st_mtime)]
            except OSError as exc:
                out[path] = exc.errno
        import math, decimal, fractions, random, re, collections  # the stdlib still loads
        return json.dumps({"stat": out,
                           "math": math.sqrt(16.0) + random.Random(1).randint(0, 0)}), \
            0.0, True, False, {}
'''


def _standard_pool():
    if "standard" not in TIERS:
        pytest.skip("the standard tier does not boot here")
    pool = SandboxPool(SandboxConfig(tier="standard", **TEST_CONFIG), warm=0)
    if not pool.plan.private_view:
        from spadekit.sandbox.isolation import probe_layers

        why = probe_layers(pool.config)["private_view"].detail
        pool.close()
        pytest.skip(f"no private view here (root and a mount namespace needed): {why}")
    return pool


def _spy(pool, paths):
    sb = pool.acquire(STAT_SPY)
    try:
        env = sb.new_env()
        env.reset()
        return json.loads(env.step(json.dumps({"paths": list(paths)}))[0]), sb.worker.scratch
    finally:
        sb.close()


def test_standard_tier_program_cannot_stat_host_files():
    """A file of the trainer's and /etc/shadow."""
    if "standard" not in TIERS:
        pytest.skip("the standard tier does not boot here")
    pool = SandboxPool(SandboxConfig(tier="standard", **TEST_CONFIG), warm=0)
    try:
        seen, _ = _spy(pool, [str(ROOT / "README.md"), "/etc/shadow"])
    finally:
        pool.close()
    visible = {p: v for p, v in seen["stat"].items() if isinstance(v, list)}
    assert not visible, f"host files visible (size, uid, mtime): {visible}"


def test_no_host_tree_outside_what_the_interpreter_needs_is_there():
    from spadekit.sandbox.launch import runtime_lib

    pool = _standard_pool()
    marker = f"spadekit-test-{os.getpid()}"
    with open("/dev/shm/" + marker, "w"):  # in the host's /dev/shm
        pass
    try:
        host = [str(ROOT), str(ROOT / "src" / "spadekit" / "__init__.py"), os.getcwd(),
                os.path.expanduser("~"), "/root", "/home", "/etc/passwd", "/etc/hostname",
                "/etc", "/var/lib", "/var/log", "/run", "/srv", "/opt", "/mnt", "/sys",
                "/boot", runtime_lib(), os.path.realpath(sys.executable), sys.prefix,
                "/dev/zero", "/dev/sda", "/proc/1", "/dev/shm/" + marker]
        tops = ["/" + name for name in os.listdir("/")]  # listing is Landlock's; stat is not
        devs = ["/dev/" + name for name in os.listdir("/dev")]
        seen, scratch = _spy(pool, host + tops + devs + ["/tmp/scratch", "/tmp/lib", "/usr",
                                                         "/proc/self", "/etc/ld.so.cache"])
    finally:
        pool.close()
        if os.path.exists("/dev/shm/" + marker):
            os.unlink("/dev/shm/" + marker)
    stat = seen["stat"]
    found = {p: stat[p] for p in host + [scratch] if isinstance(stat.get(p), list)}
    # the interpreter's own dirs may be bound (a system Python under /usr, or its prefix);
    # nothing of the trainer's, the user's or the host's configuration is
    found = {p: v for p, v in found.items() if not p.startswith("/usr/") and p != "/etc"}
    assert found == {}, f"host paths visible to stat: {found}"
    assert all(isinstance(stat[p], list) for p in
               ("/tmp/scratch", "/tmp/lib", "/usr", "/dev/null", "/proc/self",
                "/etc/ld.so.cache")), stat
    top = {p for p in tops if isinstance(stat[p], list)}
    assert top <= {"/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc",
                   "/tmp", "/proc", "/dev", "/var"}, top
    assert {p for p in devs if isinstance(stat[p], list)} <= {"/dev/null", "/dev/shm"}
    assert stat["/dev/shm/" + marker] == errno.ENOENT  # an empty /dev/shm of its own
    assert seen["math"] == 4.0


def test_doctor_says_what_the_standard_tier_still_shows_of_host_files(monkeypatch):
    if "standard" not in TIERS:
        pytest.skip("the standard tier does not boot here")
    from rich.console import Console

    from spadekit.cli.doctor import _host_view_text
    from spadekit.sandbox import isolation

    def text(view):
        console = Console(width=400, record=True)
        console.print(_host_view_text(view))
        return console.export_text()

    if isolation.probe_layers(SandboxConfig())["private_view"].available:
        view = isolation.tier_limits(SandboxConfig(allow_unsafe=True))["standard"]["host_view"]
        assert view["files"] == "hidden", view
        assert "/usr" in view["files_shown"] and "/etc/ld.so.cache" in view["files_shown"]
        assert "host files hidden" in text(view)
    monkeypatch.setattr(isolation, "_private_view_works",
                        lambda root, config: (False, "refused here (test)"))
    view = isolation.tier_limits(SandboxConfig(allow_unsafe=True))["standard"]["host_view"]
    assert view["files"] == "visible" and view["visible_host_files"] > 0, view
    assert "host file(s) visible to stat" in text(view)


_PARTS = st.sampled_from(["usr", "lib", "lib64", "bin", "etc", "tmp", "proc", "dev", "var",
                          "root", "ld.so.cache", "localtime", "python3", "x", ".."])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_PARTS, min_size=1, max_size=4).map(lambda p: "/" + "/".join(p)),
                max_size=8))
def test_the_root_layout_binds_each_host_path_once_and_never_where_the_view_builds(paths):
    """``root_layout`` (host paths -> symlinks and binds of the new root): binds are real,
    existing paths, none inside another, none under the parts the view makes itself."""
    from spadekit.sandbox.worker_view import SYSTEM_READ, root_layout

    links, binds = root_layout(paths)
    assert binds == sorted(set(binds))
    for b in binds:
        assert b == os.path.realpath(b) and os.path.exists(b) and b != "/"
        assert not any(b == top or b.startswith(top + "/") for top in ("/tmp", "/proc", "/dev"))
        assert not any(b.startswith(o + "/") for o in binds if o != b)
    for path, target in links:
        assert os.path.islink(path) and os.readlink(path) == target
    for path in SYSTEM_READ:  # what the interpreter needs is always reachable
        real = os.path.realpath(path)
        if os.path.exists(real):
            assert any(real == b or real.startswith(b + "/") for b in binds), (path, binds)


def test_the_root_layout_refuses_relative_paths():
    from spadekit.sandbox.worker_view import root_layout

    for bad in ("usr", "", 3, None):
        with pytest.raises(ValueError):
            root_layout([bad])
