"""``--engine FIELD=VALUE``: the one parser the benchmarks share for an :class:`EngineConfig` setting."""

from __future__ import annotations

import ast
import dataclasses
import json
from typing import Any


def parse(text: str, flag: str = "--engine", reserved: tuple[str, ...] = ()) -> tuple[str, Any]:
    """``"FIELD=VALUE"`` -> (field, value). The value is read as JSON (``512``, ``true``, ``false``),
    else as a Python literal (``True``, ``(8, 16)``), else kept as text (``chunk``). Raises
    ``SystemExit`` naming the fields when FIELD is not one of ``EngineConfig``'s or is one of
    ``reserved`` (settings the benchmark sets with flags of its own)."""
    from gymllm.inference.config import EngineConfig

    field, sep, raw = text.partition("=")
    names = [f.name for f in dataclasses.fields(EngineConfig) if f.name not in reserved]
    if not sep or field not in names:
        own = f" ({', '.join(reserved)} have flags of their own)" if reserved else ""
        raise SystemExit(
            f"{flag}: expected FIELD=VALUE with FIELD one of EngineConfig's ({', '.join(names)}), "
            f"received {text!r}{own}; fix: e.g. {flag} kv_write=chunk"
        )
    for read in (json.loads, ast.literal_eval):
        try:
            return field, read(raw)
        except (ValueError, SyntaxError):
            continue
    return field, raw
