"""The field types every config section declares with, and ``section``: a dataclass whose fields
pydantic checks (types strict: a bool is not an int, a string is not a number; ranges from
``Field``). A bad value is a ``ConfigError`` naming the dotted knob and the allowed range
(``config_error``), e.g. ``reward.regret_scale: must be > 0 (got -1)``.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Annotated, Any

import pydantic
from pydantic import BeforeValidator, Field, StrictBool, StrictInt, StrictStr

from spadekit.common.errors import ConfigError

Str = StrictStr
Bool = StrictBool
Int = StrictInt
PosInt = Annotated[StrictInt, Field(ge=1)]
Count = Annotated[StrictInt, Field(ge=0)]
Number = Annotated[pydantic.StrictFloat, Field(allow_inf_nan=False)]
"""A finite float (an int is taken and made a float)."""
NonNegative = Annotated[pydantic.StrictFloat, Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[pydantic.StrictFloat, Field(gt=0, allow_inf_nan=False)]
Unit = Annotated[pydantic.StrictFloat, Field(ge=0, le=1)]
Strings = Annotated[tuple[StrictStr, ...],
                    BeforeValidator(lambda v: (v,) if isinstance(v, str) else v)]
"""A tuple of strings; one string is a tuple of one."""


def section(cls: type | None = None, *, frozen: bool = True, knob: str = "") -> Any:
    """A dataclass whose fields pydantic checks on construction (unknown fields refused);
    a bad value raises ``ConfigError`` naming ``knob.field`` (``knob``: where the section sits
    in a config, e.g. ``rollout``)."""
    def make(c: type) -> type:
        c = pydantic.dataclasses.dataclass(frozen=frozen,
                                           config=pydantic.ConfigDict(extra="forbid"))(c)
        init = c.__init__

        @functools.wraps(init)
        def checked(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                init(self, *args, **kwargs)
            except pydantic.ValidationError as exc:
                raise config_error(exc, c, knob) from None

        c.__init__ = checked
        return c

    return make(cls) if cls is not None else make


_RANGES = {"greater_than_equal": ">= {ge}", "greater_than": "> {gt}",
           "less_than_equal": "<= {le}", "less_than": "< {lt}"}
_KINDS = {"int": "an int", "float": "a number", "bool": "true or false", "string": "a string",
          "list": "a list", "tuple": "a list", "dict": "a mapping", "dataclass": "a mapping",
          "finite_number": "a finite number", "literal_error": "one of {expected}",
          "too_short": "at least {min_length} item(s) long"}


def config_error(exc: pydantic.ValidationError, root: type, knob: str = "") -> ConfigError:
    """The first error of ``exc`` as one line: ``reward.regret_scale: must be > 0 (got -1)``;
    an error a section's own check raised keeps its message."""
    err = exc.errors(include_url=False)[0]
    where, kind, ctx = _dotted(root, err["loc"]), err["type"], err.get("ctx") or {}
    if knob:
        where = f"{knob}.{where}" if where != "config" else knob
    if isinstance(ctx.get("error"), ValueError):
        return ConfigError(str(ctx["error"]))
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        return ConfigError(f"unknown setting(s) {where}")
    if kind in _RANGES:
        must = _RANGES[kind].format(**{k: f"{v:g}" if isinstance(v, float) else v
                                       for k, v in ctx.items()})
    else:
        name = kind.removesuffix("_type").removesuffix("_parsing").removesuffix("_exact")
        must = _KINDS.get(kind, _KINDS.get(name, err["msg"].lower())).format(**ctx)
    return ConfigError(f"{where}: must be {must} (got {err['input']!r})")


def _dotted(cls: Any, loc: tuple) -> str:
    """The dotted knob of a pydantic error location (union member tags dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) \
            else set()
        if part not in fields:
            return f"{out}.{part}" if fields and out else (str(part) if fields else out)
        out += f".{part}" if out else part
        cls = _section_type(typing.get_type_hints(cls)[part])
    return out or "config"


def _section_type(hint: Any) -> Any:
    """The dataclass a field holds (alone, in a list or optional), else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if (found := _section_type(arg)) is not None:
            return found
    return None


__all__ = ["section", "config_error", "Str", "Bool", "Int", "PosInt", "Count", "Number",
           "NonNegative", "Positive", "Unit", "Strings"]
