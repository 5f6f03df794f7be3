"""A command-line flag that carries a JSON object (``--env-kwargs '{"digits": 1}'``): :func:`json_object`."""

from __future__ import annotations

import json

from gymllm.errors import ConfigError, explain
from gymllm.validation import require

__all__ = ["json_object"]


def json_object(text: str, flag: str = "--env-kwargs") -> dict:
    """``text`` parsed as a JSON object; anything else (invalid JSON, a list, a number) is a
    :class:`~gymllm.errors.ConfigError` that names ``flag``."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ConfigError(
            explain(
                flag,
                expected="a JSON object, e.g. '{\"digits\": 1}'",
                received=text,
                fix=f"write valid JSON ({e}); quote the object for your shell",
            )
        ) from None
    require(
        isinstance(value, dict),
        flag,
        expected="a JSON object",
        received=text,
        fix="wrap the arguments in {...}",
    )
    return value
