"""Errors of the vector env's own state (sub-env failures are :class:`gymllm.errors.EnvError`)."""

from __future__ import annotations

from gymllm.errors import GymLLMError

__all__ = ["EnvIdError", "VectorStateError"]


class EnvIdError(GymLLMError, IndexError):
    """An env id that is not in ``range(num_envs)``, or listed twice in one call."""


class VectorStateError(GymLLMError, RuntimeError):
    """A call that the vector env's state does not allow (env already in flight, nothing to recv, closed)."""
