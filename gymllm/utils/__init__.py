"""Conformance checkers for text envs: ``check_env(env)`` and ``check_vector_env(vec)`` (lazy imports)."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "check_env": "gymllm.utils.env_checker",
    "EnvCheckError": "gymllm.utils.env_checker",
    "check_vector_env": "gymllm.utils.vector_checker",
    "LatencyJitter": "gymllm.utils.vector_checker",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gymllm.utils' has no attribute {name!r}")
