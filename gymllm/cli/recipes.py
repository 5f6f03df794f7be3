"""Recipes: small TOML files whose tables mirror a frozen config dataclass, applied as overrides.

The recipes gymllm ships are package data in ``gymllm/recipes/`` (``examples/*.toml`` in the source
tree are links to them), so ``gymllm train calc_math`` finds its recipe wherever gymllm is installed;
a user's own TOML file is given by its path. A recipe ``gymllm/recipes/arithmetic_tiny.toml`` like::

    preset = "tiny"            # optional: start from a named preset
    [env]
    id = "gymllm/Arithmetic-v0"
    [learner]
    num_steps = 20

is applied field by field onto the preset's config with :func:`apply_overrides`; an unknown key is
a :class:`~gymllm.errors.ConfigError` that names the key and the allowed ones.
"""

from __future__ import annotations

import dataclasses
import pathlib
import tomllib
import typing
from typing import Any

from gymllm.errors import ConfigError

RECIPES_DIR = pathlib.Path(__file__).resolve().parents[1] / "recipes"  # package data: gymllm/recipes/*.toml
EXAMPLES_DIR = RECIPES_DIR  # the name older callers (tests/test_recipes.py) use for the shipped recipes


def shipped_recipes() -> list[str]:
    """The names of the recipes gymllm ships (``gymllm train NAME``)."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def find_recipe(name_or_path: str) -> pathlib.Path:
    """Resolve a recipe given as a path to a TOML file (the user's own) or as the name of a shipped one."""
    candidates = [pathlib.Path(name_or_path), RECIPES_DIR / name_or_path, RECIPES_DIR / f"{name_or_path}.toml"]
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(
        f"recipe {name_or_path!r} not found: expected a TOML file path or one of {shipped_recipes()} "
        f"(shipped in {RECIPES_DIR}). Fix: pass a path to a .toml recipe, or one of those names."
    )


def load_recipe(name_or_path: str) -> dict[str, Any]:
    path = find_recipe(name_or_path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"recipe {str(path)!r} is not valid TOML ({e}). Fix: check the line it names.") from e


def apply_overrides(cfg: Any, overrides: dict[str, Any], *, where: str = "") -> Any:
    """Return ``cfg`` (a frozen dataclass) with ``overrides`` applied recursively by field name."""
    if not dataclasses.is_dataclass(cfg):
        raise ConfigError(f"{where or 'recipe'}: expected a config section, received a value {cfg!r}.")
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    hints = typing.get_type_hints(type(cfg))
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        name = key.replace("-", "_")
        path = f"{where}.{name}" if where else name
        if name not in fields:
            raise ConfigError(
                f"bad recipe key {path!r}: expected one of {sorted(fields)}, received {key!r}. "
                f"Fix: rename or remove {key!r}."
            )
        current = getattr(cfg, name)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            changes[name] = apply_overrides(current, value, where=path)
        else:
            changes[name] = _coerce(value, hints.get(name))
    try:
        return dataclasses.replace(cfg, **changes)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"recipe section {where or '(top level)'!r}: {e}") from e


def _coerce(value: Any, hint: Any) -> Any:
    """TOML gives lists and ints; configs like tuples and floats."""
    origin = typing.get_origin(hint)
    if isinstance(value, list) and (hint is tuple or origin is tuple):
        return tuple(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
