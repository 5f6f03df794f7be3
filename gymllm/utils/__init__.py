"""Conformance checkers for text envs: ``check_env(env)`` and ``check_vector_env(vec)`` (lazy imports)."""

from __future__ import annotations

from gymllm._lazy import lazy_exports

_LAZY = {
    "check_env": "gymllm.utils.env_checker",
    "EnvCheckError": "gymllm.utils.env_checker",
    "check_vector_env": "gymllm.utils.vector_checker",
    "LatencyJitter": "gymllm.utils.vector_checker",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, cache=False)
