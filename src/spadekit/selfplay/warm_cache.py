"""The warm-started model a run starts from, built once and cached.

With ``warmstart.pool`` set (``procedural``, ``library`` or a pool directory), a run starts from
``model`` after ``spadekit warmstart`` on that pool with the run's own prompts. The result lives
under ``<cache>/warmstart/<key>/`` (``model/``, ``warmstart.json``, ``pool/``, a completion
marker written last), built under a lock in a temporary folder and renamed into place; a
killed build is removed and restarted by the next. ``key`` (:func:`cache_key`) hashes everything
the examples and training depend on: model spec, ``warmstart`` section, setting, turn cap,
designer prompt and output settings, chat template, format aids, corpus, :data:`CACHE_FORMAT`
and the source of :data:`KEY_SOURCES`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator

from pydantic import Field, StrictFloat

from spadekit.common.config_fields import Bool, Count, Int, PosInt, Positive, Str, section
from spadekit.common.errors import ConfigError

__all__ = ["CACHE_FORMAT", "WarmstartConfig", "applies", "build_procedural_pool", "cache_key",
           "resolve_generation_model", "warm_model_dir"]

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
MARKER = ".spadekit-complete.json"


@section(knob="warmstart")
class WarmstartConfig:
    pool: Str | None = None
    """What the run's model is warm-started on before self-play: ``procedural``, ``library``
    or a pool directory; None: the run starts from ``model`` itself (the paper)."""
    model: Str = "smollm2-135m"
    """The model these settings are for: a run whose ``model`` is another one starts from
    its model unchanged (the recipe's sizes were measured on the bundled SmolLM2-135M);
    ``any``: any model."""
    base: Str | None = None
    """Set by the run (never by hand): the model the warm start was built from, recorded
    with ``model`` replaced by the cached warm start's path, so that a resume finds the warm
    start again or rebuilds it where the cache was cleared."""
    programs: PosInt = 48
    """At most this many programs of the pool (a seeded draw)."""
    combos: PosInt | None = None
    """The procedural pool's compositions: at most this many of the training split's (a
    seeded draw that uses every part of the split), so that the warm start leaves
    compositions a designer can find that are new to it; None: all of them."""
    per_combo: PosInt = 1
    """Procedural programs written per composition (each on another document and seed)."""
    epochs: PosInt = 4
    learning_rate: Positive = 5.0e-4
    lora_r: PosInt = 32
    lora_layers: PosInt | None = 15
    """LoRA on the last this many decoder layers (``spadekit.train.sft``); None: all."""
    agent_seeds: Count = 0
    """Solution episodes per program as agent examples (0: the designer role only)."""
    held_out_share: Annotated[StrictFloat, Field(ge=0, lt=1)] = 0.1
    seed: Int = 0
    seed_memory: Bool = True
    """A fresh run's memory starts with the warm start's programs: the designer's references
    are what it learnt from, and the dedup gate keeps copies of them out of the pool."""

    def __post_init__(self) -> None:
        if self.pool is not None and not str(self.pool).strip():
            raise ConfigError("warmstart.pool must be procedural, library, a pool directory "
                              "or null")

    def sft(self) -> Any:
        from spadekit.train.sft import SFTConfig

        return SFTConfig(epochs=self.epochs, learning_rate=self.learning_rate,
                         lora_r=self.lora_r, lora_alpha=2 * self.lora_r,
                         lora_layers=self.lora_layers,
                         max_tokens_per_microbatch=2600, grad_accum=1, seed=self.seed,
                         bf16=True)


def applies(config: Any) -> bool:
    """Whether ``config``'s run starts from a warm start (``warmstart.pool`` set, and
    ``warmstart.model`` is the run's model or ``any``)."""
    ws = config.warmstart
    if ws.pool is None:
        return False
    if ws.model in ("any", ws.base or config.model):
        return True
    log.warning("warmstart.model is %s but the run's model is %s: no warm start (set "
                "warmstart.model=any to warm-start this model)", ws.model, config.model)
    return False


def _cache_root() -> Path:
    from spadekit.policy.bundled import cache_dir

    return cache_dir().resolve() / "warmstart"  # absolute: config.yaml records the path


#: The source files that write the examples (prompts, programs, the SFT): their text is in
#: the key, so a new spadekit that changes them builds a new warm start.
KEY_SOURCES = ("envs/procedural/compose.py", "envs/procedural/mechanics.py",
               "envs/procedural/kit.py", "selfplay/kit_identity.py",
               "selfplay/prompts.py", "selfplay/procedural_pool.py", "selfplay/warmstart.py",
               "selfplay/warm_cache.py", "train/sft.py", "train/model_prep.py",
               "rollout/aids.py", "policy/base.py")
_PER_EXAMPLE_ONLY = ("seed_memory", "base")
"""``warmstart`` fields that do not change the warm start itself."""
_NOT_EXAMPLES = ("temperature", "top_p", "repair_attempts", "judge", "judge_temperature",
                 "judge_max_new_tokens", "hint_model", "model", "hint_temperature",
                 "max_new_tokens", "hint_max_new_tokens", "grammar")
"""``designer`` fields that only sample or check later (no example changes with them)."""


def _file_digest(path: Path) -> str | None:
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    if path.is_dir():
        digest = hashlib.sha256()
        for item in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(str(item.relative_to(path)).encode() + b"\0" + item.read_bytes())
        return digest.hexdigest()
    return None


SOURCE_ROOT = Path(__file__).resolve().parents[1]
"""Where :data:`KEY_SOURCES` are read (the installed ``spadekit`` package)."""


def _code_digest() -> str:
    root = SOURCE_ROOT
    digest = hashlib.sha256()
    for name in KEY_SOURCES:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    return digest.hexdigest()


def cache_key(config: Any) -> str:
    """The hash of everything a warm start of ``config`` depends on (see the module): the
    settings, the contents of a pool directory and of a corpus file, and the source of the
    code that writes the examples (:data:`KEY_SOURCES`)."""
    ws = config.warmstart
    pool = ws.pool
    if pool not in (None, "procedural", "library"):
        pool = [str(Path(pool).expanduser().resolve()),
                _file_digest(Path(pool).expanduser() / "pool.jsonl")]
    corpus = config.corpus
    if corpus is not None and str(corpus).strip().lower() not in ("", "default"):
        corpus = [str(Path(corpus).expanduser().resolve()),
                  _file_digest(Path(corpus).expanduser())]
    designer = dataclasses.asdict(config.designer)
    for name in _NOT_EXAMPLES:
        designer.pop(name, None)
    rollout = ({"response_prefix": dict(config.rollout.response_prefix),
                "demonstrations": list(config.rollout.demonstrations),
                "system_prompt": getattr(config.rollout, "system_prompt", None)}
               if ws.agent_seeds == 0 else {k: v for k, v in dataclasses.asdict(
                   config.rollout).items() if k != "action_grammar"})  # replayed, not sampled
    payload = {"format": CACHE_FORMAT, "code": _code_digest(),
               "model": ws.base or config.model,
               "warmstart": {**{k: v for k, v in dataclasses.asdict(ws).items()
                                if k not in _PER_EXAMPLE_ONLY}, "pool": pool},
               "setting": config.setting, "turn_cap": config.turn_cap, "designer": designer,
               "chat_template": dataclasses.asdict(config.chat_template), "rollout": rollout,
               "validation": dataclasses.asdict(config.validation),
               "sandbox_packages": list(getattr(config.sandbox, "packages", ()) or ()),
               "corpus": corpus, "grounding": config.grounding, "use_memory": config.use_memory}
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _complete(folder: Path, key: str) -> bool:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    model = folder / "model"
    weights = list(model.glob("*.safetensors")) + list(model.glob("*.bin"))
    sizes = marker.get("weights") or {}
    return (marker.get("key") == key and (model / "config.json").exists() and bool(weights)
            and all((model / name).is_file() and (model / name).stat().st_size == size
                    for name, size in sizes.items()))


def warm_model_dir(config: Any, *, policy: Any = None,
                   progress: Callable[[str, int, int, float | None], None] | None = None
                   ) -> Path | None:
    """The warm-started model folder of ``config`` (built now unless cached), or None when
    ``warmstart.pool`` is unset. ``policy``: the base model already loaded (else loaded)."""
    if not applies(config):
        return None
    if config.warmstart.base:  # a resumed run: build (or find) it from the original model
        config = dataclasses.replace(config, model=config.warmstart.base)
    key = cache_key(config)
    root = _cache_root()
    target = root / key
    if _complete(target, key):
        return target / "model"
    with _lock(root / f".{key}.lock"):
        if _complete(target, key):
            return target / "model"
        for stale in root.glob(f".{key}.tmp-*"):  # a killed build's (the lock is ours)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=root))
        try:
            _build(config, tmp, policy, progress)
            sizes = {p.name: p.stat().st_size for p in (tmp / "model").iterdir() if p.is_file()}
            (tmp / MARKER).write_text(json.dumps({"key": key, "format": CACHE_FORMAT,
                                                  "weights": sizes}) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target / "model"


def _build(config: Any, out: Path, policy: Any,
           progress: Callable[[str, int, int, float | None], None] | None) -> None:
    from spadekit.selfplay.warmstart import run_warmstart

    ws = config.warmstart
    source = ws.pool
    if source == "procedural":
        source = str(build_procedural_pool(config, out / "pool", progress))
    run_warmstart(config, source, out, ws.sft(), policy=policy,
                  seeds_per_program=ws.agent_seeds, held_out_share=ws.held_out_share,
                  max_programs=ws.programs, progress=progress)
    shutil.rmtree(out / "state", ignore_errors=True)  # the SFT's resumable state


def build_procedural_pool(config: Any, out: Path,
                          progress: Callable[[str, int, int, float | None], None] | None = None
                          ) -> Path:
    """The procedural training pool for ``config``: the training combinations (seeded by
    ``warmstart.seed``), themed on the training half of the corpus, turn limit = the run's
    turn cap, validated in the sandbox; near-duplicates dropped; game-kit programs when the
    designer's ``prompt_style`` is ``kit``. Returns ``out``."""
    from spadekit.runs.pool import write_pool
    from spadekit.sandbox import SandboxPool
    from spadekit.sandbox.validate import Validator
    from spadekit.selfplay.corpus import load_corpus
    from spadekit.selfplay.procedural_pool import (build_pool, candidates, draw_combos,
                                                   split_combos, split_documents, write_split)

    ws = config.warmstart
    seed = ws.seed
    parts = split_combos(seed)
    docs = [(d.id, d.text) for d in load_corpus(config.corpus)]
    train_docs, _held = split_documents(docs, seed)
    style = "kit" if config.designer.prompt_style == "kit" else "whole"
    combos = parts.train if ws.combos is None else draw_combos(parts.train, ws.combos, seed)
    programs = candidates(combos, train_docs, seed, ws.per_combo, config.turn_cap, style)
    settings = config.validation.settings(config.turn_cap)
    with SandboxPool(config.sandbox, warm=2) as pool, Validator(pool, settings) as validator:
        built = build_pool(programs, validator, seed=seed, progress=None if progress is None
                           else (lambda done, n: progress("procedural pool", done, n, None)))
    if not built.kept:
        raise ConfigError("the procedural pool came out empty: no program validated "
                          f"({built.summary()['invalid_reasons']})")
    write_pool(out, built.kept)
    write_split(parts, out)
    (out / "procedural.json").write_text(json.dumps(built.summary(), indent=1) + "\n")
    return out


@contextlib.contextmanager
def progress_bars() -> Iterator[Callable[[str, int, int, float | None], None]]:
    """A ``progress(phase, done, total, loss)`` callback drawing one rich bar per phase on
    stderr (what a warm start shows while it builds)."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    bars: dict[str, Any] = {}
    progress = Progress(TextColumn("[bold]warm start: {task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=False)

    def update(phase: str, done: int, total: int, loss: float | None) -> None:
        if not bars:
            progress.start()
        if phase not in bars:
            bars[phase] = progress.add_task(phase, total=total, note="")
        progress.update(bars[phase], completed=done, total=total,
                        note="" if loss is None else f"loss {loss:.3f}")

    try:
        yield update
    finally:
        if bars:
            progress.stop()


def resolve_generation_model(spec: str | None, model: str) -> str | None:
    """``generation_model: auto``: in-process vLLM on ``model`` when vLLM is installed (the
    fastest engine here), else None (the trained model generates); other values unchanged."""
    if spec != "auto":
        return spec
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    if model == "smollm2-135m":
        return "vllm:smollm2-135m"
    if model.startswith("hf:") and (Path(model[3:]) / "config.json").exists():
        return f"vllm:{model[3:]}"
    return None  # a test model or a hub name vLLM would fetch: the trained model generates
