"""Conformance checkers for text envs: ``check_env(env)`` and ``check_vector_env(vec)`` (lazy imports)."""

from __future__ import annotations

from gymllm._lazy import lazy_exports, lazy_table

_LAZY = lazy_table(
    __name__,
    {
        ".env_checker": ("check_env", "EnvCheckError"),
        ".vector_checker": ("check_vector_env", "LatencyJitter"),
    },
)

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, cache=False)
