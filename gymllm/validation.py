"""The checks every frozen config dataclass runs in ``__post_init__``, and the one function that applies
nested overrides (a recipe's tables, a run's ``config.json``) onto such a dataclass.

Every failed check raises :class:`~gymllm.errors.ConfigError` with a message built by
:func:`~gymllm.errors.explain`: which field (``Class.field``), what was expected, what was received,
and how to fix it::

    require(self.num_slots >= 1, "EngineConfig.num_slots", expected="an int >= 1", received=self.num_slots,
            fix="use e.g. 16")
    check_range("RolloutConfig", "group_size", self.group_size, lo=1, integer=True)
    check_choice("EnvSection", "agent", self.agent, ("model", "tool"))

A base layer: imports nothing of gymllm but :mod:`gymllm.errors`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Callable, Iterable, Mapping

from gymllm.errors import ConfigError, explain

__all__ = [
    "require",
    "require_instance",
    "require_one_of",
    "field_error",
    "is_int",
    "is_number",
    "check_choice",
    "check_range",
    "check_order",
    "check_fields",
    "apply_overrides",
]


def require(
    ok: bool,
    what: str,
    *,
    expected: str,
    received: Any,
    fix: str,
    error: Callable[[str], Exception] = ConfigError,
) -> None:
    """Raise ``error(explain(what, ...))`` (a :class:`~gymllm.errors.ConfigError` unless told) unless
    ``ok``."""
    if not ok:
        raise error(explain(what, expected=expected, received=received, fix=fix))


def require_instance(
    value: Any,
    kind: type | tuple[type, ...],
    what: str,
    *,
    expected: str,
    fix: str,
    error: Callable[[str], Exception] = ConfigError,
) -> None:
    """:func:`require` that ``value`` is an instance of ``kind``; the message names the type received."""
    ok = isinstance(value, kind)
    require(ok, what, expected=expected, received=type(value).__name__, fix=fix, error=error)


def require_one_of(
    value: Any,
    allowed: tuple[Any, ...],
    what: str,
    *,
    fix: str,
    error: Callable[[str], Exception] = ConfigError,
) -> None:
    """:func:`require` that ``value`` is one of ``allowed``, expected written ``'a', 'b' or 'c'``."""
    names = [repr(a) for a in allowed]
    expected = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    require(value in allowed, what, expected=expected, received=value, fix=fix, error=error)


def field_error(
    obj: Any, field: str, expected: str, fix: str, *, what: str | None = None
) -> ConfigError:
    """The :class:`~gymllm.errors.ConfigError` for ``obj``'s ``field`` (named ``what``, default
    ``Class.field``), its value received."""
    what = what or f"{type(obj).__name__}.{field}"
    return ConfigError(explain(what, expected=expected, received=getattr(obj, field), fix=fix))


def is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite real ``int``/``float`` (not a ``bool``, not NaN or infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_choice(
    cls: str, field: str, value: Any, allowed: Iterable[Any], *, fix: str | None = None
) -> None:
    """``value`` is one of ``allowed``."""
    allowed = list(allowed)
    require(
        value in allowed,
        f"{cls}.{field}",
        expected=f"one of {allowed}",
        received=value,
        fix=fix or f"set {field} to one of {allowed}",
    )


def check_range(
    cls: str,
    field: str,
    value: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    integer: bool = False,
    optional: bool = False,
    fix: str | None = None,
) -> None:
    """``value`` is a finite number (an int with ``integer``; None too with ``optional``) within
    ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    if optional and value is None:
        return
    op = ">" if lo_open else ">="
    bounds = " and ".join(
        x
        for x in (f"{op} {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else "")
        if x
    )
    kind = "an int" if integer else "a number"
    expected = " ".join(x for x in ("None or" if optional else "", kind, bounds) if x)
    ok = is_int(value) if integer else is_number(value)
    ok = (
        ok
        and not (lo is not None and (value <= lo if lo_open else value < lo))
        and not (hi is not None and value > hi)
    )
    require(
        ok,
        f"{cls}.{field}",
        expected=expected,
        received=value,
        fix=fix or f"choose {field} {bounds or kind}",
    )


def check_order(cls: str, lo_name: str, lo: Any, hi_name: str, hi: Any) -> None:
    """``lo <= hi``: a config's lower bound ``lo_name`` does not pass its upper bound ``hi_name``."""
    require(
        lo <= hi,
        f"{cls}.{lo_name}",
        expected=f"<= {hi_name} ({hi})",
        received=lo,
        fix=f"lower {lo_name} or raise {hi_name}",
    )


def check_fields(cls: str, obj: Any, fields: Iterable[str], *, fix: str, **bounds: Any) -> None:
    """:func:`check_range` of each of ``obj``'s ``fields`` (class ``cls``) with the same ``bounds``;
    ``fix`` is a template whose ``{field}`` names the field."""
    for field in fields:
        check_range(cls, field, getattr(obj, field), fix=fix.format(field=field), **bounds)


def apply_overrides(cfg: Any, overrides: Mapping[str, Any], *, where: str = "") -> Any:
    """``cfg`` (a frozen dataclass) with ``overrides`` applied by field name, recursively into nested
    dataclasses (a nested mapping onto a dataclass field updates it field by field). A key may be
    spelled with dashes. TOML and JSON give lists and ints where a field is a tuple or a float: they
    are converted. An unknown key is a ``ConfigError`` that names it and the allowed ones; a bad value
    is the section's own ``ConfigError``."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise ConfigError(
            explain(
                where or "config",
                expected="a config section (a table)",
                received=cfg,
                fix="write it as a [table] of its fields",
            )
        )
    if not isinstance(overrides, Mapping):
        raise ConfigError(
            explain(
                where or "config",
                expected="a table of fields",
                received=overrides,
                fix=f"write [{where or 'section'}] with field = value lines",
            )
        )
    fields = {f.name for f in dataclasses.fields(cfg)}
    hints = typing.get_type_hints(type(cfg))
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        name = key.replace("-", "_")
        path = f"{where}.{name}" if where else name
        if name not in fields:
            raise ConfigError(
                explain(
                    f"config key {path!r}",
                    expected=f"one of {sorted(fields)}",
                    received=key,
                    fix=f"rename or remove {key!r}",
                )
            )
        current = getattr(cfg, name)
        if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
            changes[name] = apply_overrides(current, value, where=path)
        else:
            changes[name] = _coerce(value, hints.get(name))
    try:
        return dataclasses.replace(cfg, **changes)
    except TypeError as e:  # a dataclass refusing a value of the wrong kind
        raise ConfigError(
            explain(
                where or "config",
                expected=f"values of {type(cfg).__name__}'s field types",
                received=overrides,
                fix=str(e),
            )
        ) from e


def _coerce(value: Any, hint: Any) -> Any:
    """Lists -> tuples where the field is a tuple; ints -> floats where it is a float."""
    hint_args = typing.get_args(hint)
    wants = {hint, typing.get_origin(hint), *hint_args, *(typing.get_origin(a) for a in hint_args)}
    if isinstance(value, list) and tuple in wants:
        return tuple(value)
    if is_int(value) and float in wants and int not in wants:
        return float(value)
    return value
