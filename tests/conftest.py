"""Shared fixtures: real sandbox pools per isolation tier, and host-side checks.

The tests mirror the package: ``tests/<layer>/test_<module>.py`` for ``spadekit.<layer>``
(``tests/test_layers.py`` checks the layering itself).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
# tests mirror the package (tests/<layer>/test_<module>.py); shared pieces (tests/*.py) and test
# modules that others reuse (e.g. test_selfplay's programs) import by their plain names
_TESTS = Path(__file__).resolve().parent
for _sub in sorted(p for p in _TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_sub) not in sys.path:
        sys.path.append(str(_sub))
# under pytest-xdist each worker's torch uses one thread: two workers on two cores with two
# OpenMP threads each only spin against each other (a test that wants threads sets them itself)
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
# tests keep their caches (Reasoning Gym items, spadekit.eval.rg_cache) out of the user's home
os.environ.setdefault("SPADEKIT_CACHE_DIR", tempfile.mkdtemp(prefix="spadekit-test-cache-"))
# and the trackers (logging.backends) offline, out of the home directory: trackio's store in a
# temp dir (read once, at its import), W&B's runs in each run directory, its caches in a temp dir
os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="spadekit-test-trackio-")
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
os.environ.pop("WANDB_DIR", None)
_WANDB_HOME = tempfile.mkdtemp(prefix="spadekit-test-wandb-")
for _name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
    os.environ[_name] = os.path.join(_WANDB_HOME, _name.lower())

from spadekit.common.errors import SandboxError  # noqa: E402
from spadekit.sandbox import SandboxConfig, SandboxPool  # noqa: E402

ECHO = '''
class EchoEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
    def reset(self, seed=None, options=None):
        self.t = 0
        return "echo ready", {"seed": seed}
    def step(self, action):
        self.t += 1
        return "echo:" + action, 0.5, False, self.t >= self.max_turns, {}
'''

TEST_CONFIG = dict(step_timeout=2.0, reset_timeout=2.0, load_timeout=5.0, call_timeout=3.0)


def available_tiers() -> list[str]:
    """The tiers that boot on this machine (strong and/or standard)."""
    from spadekit.sandbox.isolation import detect

    found = []
    for tier in ("strong", "standard"):
        try:
            detect(SandboxConfig(tier=tier, **TEST_CONFIG))
            found.append(tier)
        except SandboxError:
            pass
    return found


TIERS = available_tiers()


# Under pytest-xdist (``-n``): each test file runs whole on one worker (``--dist loadfile``: a
# module's fixtures, a vLLM engine or a model, load once), and the files that take minutes are
# handed out first, so no worker is left with one of them at the end. Slowest first, as measured
# on 2 cores; a file not listed keeps its place after them. Only the order changes.
HEAVY_FIRST = (
    "selfplay/test_faults.py", "selfplay/test_generation_faults.py",
    "selfplay/test_learning_bundled.py", "policy/test_vllm_server.py",
    "policy/test_vllm_engine.py", "selfplay/test_async_rollouts.py",
    "selfplay/test_config_knobs.py", "selfplay/test_selfplay_distributed.py",
    "selfplay/test_signals_e2e.py", "rollout/test_no_orphans.py", "selfplay/test_warmstart.py",
    "selfplay/test_checkpoints.py", "selfplay/test_warm_cache.py", "policy/test_weight_probe.py",
    "selfplay/test_selfplay.py", "selfplay/test_review23.py", "rollout/test_ray_envs.py",
    "selfplay/test_review_hacks.py", "integrations/test_slime_adapter.py",
    "train/test_distributed.py", "runs/test_tracking.py", "benchmarks/test_gpu_check.py",
)


def pytest_collection_modifyitems(session, config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}

    def key(item):
        path = Path(str(item.fspath)).resolve()
        try:
            rel = path.relative_to(_TESTS).as_posix()
        except ValueError:
            rel = path.as_posix()
        return rank.get(rel, len(rank))

    items.sort(key=key)  # stable: the order inside each file, and of the files after, is kept


def _selected_modules(session) -> list:
    return list({id(m): m for m in (getattr(i, "module", None) for i in session.items)
                 if m is not None}.values())


def pytest_collection_finish(session):
    """A selected test module's ``start_early()`` (tests/policy/test_vllm_server.py: its
    ``vllm serve`` starts in the background while the tests before it run)."""
    if session.config.option.collectonly:
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # under pytest-xdist every worker collects every module but runs only some: a module's
        # fixture starts what it needs when it runs (no server started twice, none unused)
        return
    for module in _selected_modules(session):
        start = getattr(module, "start_early", None)
        if callable(start):
            start()


def pytest_sessionfinish(session):
    """The matching ``stop_early()``: whatever a module started early and never took is
    stopped."""
    for module in _selected_modules(session):
        stop = getattr(module, "stop_early", None)
        if callable(stop):
            stop()


@pytest.fixture(scope="session", params=TIERS or ["none"])
def pool(request):
    if request.param == "none":
        pytest.skip("no safe sandbox tier works on this machine")
    p = SandboxPool(SandboxConfig(tier=request.param, **TEST_CONFIG), warm=2)
    yield p
    p.close()


def assert_pool_works(pool: SandboxPool) -> None:
    sb = pool.acquire(ECHO)
    try:
        env = sb.new_env(max_turns=3)
        assert env.reset(seed=1) == ("echo ready", {"seed": 1})
        assert env.step("hi")[:2] == ("echo:hi", 0.5)
    finally:
        sb.close()


def process_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def live_processes_of_uid(uid: int) -> list[int]:
    """Non-zombie processes owned by ``uid`` on the host."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}")
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if st.st_uid == uid and state != b"Z":
            found.append(int(entry))
    return found


@pytest.fixture(scope="session")
def bundled_hf():
    """The bundled model through transformers (float32, CPU), loaded once per session (about
    10 s) for the modules that compare an engine with the trainer (tests/policy/test_vllm_*.py).
    A module that changes its weights puts them back: ``bundled_original`` checks it did."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from spadekit.policy import load_policy

    return load_policy("smollm2-135m")


@pytest.fixture(scope="session")
def bundled_weights(bundled_hf):
    """The bundled model's weights as loaded (copies), before any test changed them."""
    return {k: v.detach().clone() for k, v in bundled_hf.model.state_dict().items()}


@pytest.fixture(scope="module")
def bundled_original(bundled_hf, bundled_weights):
    """A copy of ``bundled_weights`` for a module that trains ``bundled_hf`` and restores it
    (its own copy: what the module does to it cannot hide a change); after the module, fails
    unless every weight is back to what was loaded."""
    import torch

    yield {k: v.clone() for k, v in bundled_weights.items()}
    changed = [k for k, v in bundled_hf.model.state_dict().items()
               if not torch.equal(v, bundled_weights[k])]
    assert not changed, f"the module left the shared bundled model changed: {changed[:5]}"
