"""The config parser (``spadekit.selfplay.config.load_config``) against random dotted overrides:
a value inside a knob's declared type and range loads and lands on that knob; a value outside
it, of the wrong type, or an unknown key, is a ``ConfigError`` that names the dotted knob (and
the range it broke). The knobs and ranges are read from the field declarations themselves."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Any

import annotated_types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spadekit.common.errors import ConfigError
from spadekit.rollout.engine import RolloutConfig
from spadekit.runs.tracking import LoggingConfig
from spadekit.sandbox.config import SandboxConfig
from spadekit.sandbox.validate import ValidatorSettings
from spadekit.selfplay.checkpoints import CheckpointConfig
from spadekit.selfplay.config import SelfPlayConfig, load_config
from spadekit.selfplay.warm_cache import WarmstartConfig
from spadekit.selfplay.watch import WatchConfig

CROSS_CHECKED = {
    "designer.temperature": "must equal rollout.temperature",
    "train.temperature": "the loop sets it from rollout.temperature",
    "train.seed": "the loop sets it from seed",
    "num_generations": "exactly one of it and agent_samples_per_round",
    "agent_samples_per_round": "exactly one of it and num_generations",
    "reward.plateau_low": "at most reward.plateau_high",
    "reward.plateau_high": "at least reward.plateau_low",
    "eval.every": "needs eval.suites",
    "env_max_turns": "a kit grammar needs a turn cap of 2 (cpu-tiny has none; kept simple)",
    "rollout.temperature": "at least MIN_TEMPERATURE, and equal to designer.temperature",
    "rollout.max_staleness": "1 or more needs generation_model and checkpoint_every=1",
}
"""Knobs whose valid values also depend on another knob (their own tests cover them)."""


def _bounds(hint: Any) -> tuple[type, float | None, float | None, bool, bool] | None:
    """``(int or float, low, high, low inclusive, high inclusive)`` of a plain strict number
    field (its ``Field(ge=..)`` etc.), else None."""
    if typing.get_origin(hint) is not typing.Annotated:
        return None
    base, *meta = typing.get_args(hint)
    if base not in (int, float):
        return None
    low = high = None
    low_in = high_in = True
    for item in meta:
        for m in getattr(item, "metadata", [item]):
            if isinstance(m, annotated_types.Ge):
                low = m.ge
            elif isinstance(m, annotated_types.Gt):
                low, low_in = m.gt, False
            elif isinstance(m, annotated_types.Le):
                high = m.le
            elif isinstance(m, annotated_types.Lt):
                high, high_in = m.lt, False
    return base, low, high, low_in, high_in


def numeric_knobs(cls: type = SelfPlayConfig, prefix: str = "") -> dict[str, tuple]:
    """Every number knob declared with the strict types, by dotted path."""
    out: dict[str, tuple] = {}
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        inner = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
        if dataclasses.is_dataclass(inner):
            out.update(numeric_knobs(inner, f"{prefix}{f.name}."))
        elif (b := _bounds(hint)) is not None and f"{prefix}{f.name}" not in CROSS_CHECKED:
            out[f"{prefix}{f.name}"] = b
    return out


KNOBS = numeric_knobs()


def test_the_walk_finds_the_declared_knobs():
    assert {"reward.regret_scale", "rounds", "train.learning_rate", "validation.action_margin",
            "designer.max_new_tokens", "rollout.max_new_tokens", "rollout.top_p",
            "sandbox.step_timeout", "sandbox.memory_mb", "checkpoint.keep_last",
            "warmstart.held_out_share", "watch.action_margin", "watch.spot_checks"} <= set(KNOBS)
    assert KNOBS["reward.regret_scale"] == (float, 0, None, False, True)


@st.composite
def valid(draw) -> tuple[str, Any]:
    path = draw(st.sampled_from(sorted(KNOBS)))
    kind, low, high, _, _ = KNOBS[path]
    if kind is int:
        value = draw(st.integers(low if low is not None else -1000,
                                 high if high is not None else 1000))
        if path.startswith(("rounds", "envs_per_round", "regen_interval", "memory_size",
                            "designer.", "train.", "sandbox.", "eval.", "rollout.",
                            "warmstart.", "watch.", "checkpoint.")) and value > 64:
            value = 64  # keeps the config cheap to hold; the range is the point
        return path, value
    value = draw(st.floats(low if low is not None else -1e6, high if high is not None else 1e6,
                           exclude_min=low is not None and not KNOBS[path][3],
                           exclude_max=high is not None and not KNOBS[path][4],
                           allow_nan=False, allow_infinity=False))
    return path, value


@st.composite
def out_of_range(draw) -> tuple[str, Any, str]:
    path = draw(st.sampled_from(sorted(p for p, b in KNOBS.items()
                                       if b[1] is not None or b[2] is not None)))
    kind, low, high, low_in, high_in = KNOBS[path]
    side = draw(st.sampled_from([s for s, b in (("low", low), ("high", high)) if b is not None]))
    gap = draw(st.integers(1, 100) if kind is int else st.floats(1e-3, 100))
    if side == "low":
        return path, (low - gap), f"must be {'>=' if low_in else '>'} {low:g}"
    return path, (high + gap), f"must be {'<=' if high_in else '<'} {high:g}"


def _text(value: Any) -> str:
    return json.dumps(value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid())
def test_a_value_inside_the_declared_range_loads(override):
    path, value = override
    cfg = load_config("cpu-tiny", overrides=[f"{path}={_text(value)}"])
    got: Any = cfg
    for part in path.split("."):
        got = getattr(got, part)
    assert got == value and type(got) is type(KNOBS[path][0](value))


@settings(max_examples=60, deadline=None)
@given(out_of_range())
def test_a_value_outside_the_range_names_the_knob_and_the_range(case):
    path, value, must = case
    with pytest.raises(ConfigError) as err:
        load_config("cpu-tiny", overrides=[f"{path}={_text(value)}"])
    assert str(err.value).startswith(f"{path}: {must} (got "), str(err.value)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(KNOBS)), st.sampled_from([True, False, "abc", [1], {"a": 1}]))
def test_a_value_of_the_wrong_type_names_the_knob(path, value):
    """A bool is not an int or a number; a string, a list or a mapping is not a number."""
    with pytest.raises(ConfigError) as err:
        load_config("cpu-tiny", overrides=[f"{path}={_text(value)}"])
    assert str(err.value).startswith(f"{path}: must be "), str(err.value)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["reward", "train", "designer", "rollout", "validation", "sandbox",
                        "logging", "checkpoint", "warmstart", "watch", ""]),
       st.from_regex(r"[a-z]{3,12}", fullmatch=True))
def test_an_unknown_key_is_named(section, name):
    path = f"{section}.zz_{name}" if section else f"zz_{name}"
    with pytest.raises(ConfigError, match=f"unknown setting\\(s\\) {path}$"):
        load_config("cpu-tiny", overrides=[f"{path}=1"])


def test_the_message_of_a_bad_regret_scale():
    with pytest.raises(ConfigError, match=r"^reward\.regret_scale: must be > 0 \(got -1\)$"):
        load_config("cpu-tiny", overrides=["reward.regret_scale=-1"])
    with pytest.raises(ConfigError, match=r"^reward\.regret_scale: must be a finite number"):
        load_config("cpu-tiny", overrides=["reward.regret_scale=inf"])
    assert math.isclose(load_config("cpu-tiny", overrides=["reward.regret_scale=2e-1"])
                        .reward.regret_scale, 0.2)


SECTIONS = {"rollout": RolloutConfig, "sandbox": SandboxConfig, "logging": LoggingConfig,
            "checkpoint": CheckpointConfig, "warmstart": WarmstartConfig, "watch": WatchConfig,
            "ValidatorSettings": ValidatorSettings}
SECTION_KNOBS = {f"{name}.{knob}": bounds for name, cls in SECTIONS.items()
                 for knob, bounds in numeric_knobs(cls).items()}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(p for p, b in SECTION_KNOBS.items()
                              if b[1] is not None or b[2] is not None)), st.data())
def test_a_section_built_alone_names_its_knob_and_range(path, data):
    """A section built in code (not through ``load_config``) checks the same declarations and
    names the knob where the section sits in a config."""
    name, knob = path.split(".")
    kind, low, high, low_in, high_in = SECTION_KNOBS[path]
    side = data.draw(st.sampled_from([s for s, b in (("low", low), ("high", high))
                                      if b is not None]))
    gap = data.draw(st.integers(1, 100) if kind is int else st.floats(1e-3, 100))
    value, must = ((low - gap, f"must be {'>=' if low_in else '>'} {low:g}") if side == "low"
                   else (high + gap, f"must be {'<=' if high_in else '<'} {high:g}"))
    with pytest.raises(ConfigError) as err:
        SECTIONS[name](**{knob: value})
    assert str(err.value).startswith(f"{path}: {must} (got "), str(err.value)
    with pytest.raises(ConfigError, match=f"^{path}: must be "):
        SECTIONS[name](**{knob: True})


@pytest.mark.parametrize("knob, value, message", [
    ("checkpoint.keep_last", 0, r"^checkpoint\.keep_last: must be >= 1 \(got 0\)$"),
    ("rollout.max_staleness", -1, r"^rollout\.max_staleness: must be >= 0 \(got -1\)$"),
    ("rollout.max_staleness", "1", r"^rollout\.max_staleness: must be an int \(got '1'\)$"),
    ("sandbox.tier", "medium", r"^sandbox\.tier: must be one of 'auto', 'strong'"),
    ("rollout.stop", [1], r"^rollout\.stop\[0\]: must be a string"),
    ("logging.backends", ["nope"], r"^logging\.backends: unknown backend 'nope'"),
    ("warmstart.combos", 0, r"^warmstart\.combos: must be >= 1 \(got 0\)$"),
    ("watch.action_margin", 1.5, r"^watch\.action_margin: must be <= 1 \(got 1\.5\)$"),
])
def test_a_bad_section_value_through_the_config(knob, value, message):
    with pytest.raises(ConfigError, match=message):
        load_config("cpu-tiny", overrides=[f"{knob}={_text(value)}"])


def test_validator_settings_name_their_knob():
    with pytest.raises(ConfigError, match=r"^ValidatorSettings\.seeds: must be at least 1"):
        ValidatorSettings(seeds=())
    with pytest.raises(ConfigError, match=r"^ValidatorSettings\.seeds\[0\]: must be an int"):
        ValidatorSettings(seeds=("0",))
    assert RolloutConfig(stop="END").stop == ("END",)
