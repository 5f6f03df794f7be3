"""Env slots: one async interface over a barrier-free vector env or a plain list of envs.

The orchestrator runs one coroutine per trajectory on one env slot; it needs only
``reset(env_id, seed)`` and ``step(env_id, action)`` awaitables. A ``gymllm`` vector env provides
``areset_env`` / ``astep_env``; a list of (possibly wrapped) envs is driven through
``gymllm.core.areset_env`` / ``astep_env`` (sync envs run in an executor, off the event loop).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from gymllm.errors import ConfigError, explain


class EnvSlots(Protocol):
    num_envs: int

    async def reset(self, env_id: int, seed: int | None) -> tuple[Any, dict]: ...

    async def step(self, env_id: int, action: str) -> tuple[Any, float, bool, bool, dict]: ...


class VectorSlots:
    """Slots over a vector env with per-env async ``areset_env`` / ``astep_env``."""

    def __init__(self, vec: Any):
        self.vec = vec
        self.num_envs = int(vec.num_envs)

    async def reset(self, env_id: int, seed: int | None) -> tuple[Any, dict]:
        return await self.vec.areset_env(env_id, seed=seed)

    async def step(self, env_id: int, action: str) -> tuple[Any, float, bool, bool, dict]:
        return await self.vec.astep_env(env_id, action)


class ListSlots:
    """Slots over a list of single envs (TextEnv or any Gymnasium env with str actions)."""

    def __init__(self, envs: Sequence[Any]):
        self.envs = list(envs)
        self.num_envs = len(self.envs)

    async def reset(self, env_id: int, seed: int | None) -> tuple[Any, dict]:
        from gymllm.core import areset_env

        return await areset_env(self.envs[env_id], seed=seed)

    async def step(self, env_id: int, action: str) -> tuple[Any, float, bool, bool, dict]:
        from gymllm.core import astep_env

        return await astep_env(self.envs[env_id], action)


def as_env_slots(envs: Any) -> EnvSlots:
    """Wrap a vector env, a list of envs, or pass through an object that already is ``EnvSlots``."""
    if isinstance(envs, (VectorSlots, ListSlots)):
        return envs
    if hasattr(envs, "areset_env") and hasattr(envs, "astep_env") and hasattr(envs, "num_envs"):
        return VectorSlots(envs)
    if (
        isinstance(envs, (list, tuple))
        and envs
        and all(hasattr(e, "reset") and hasattr(e, "step") for e in envs)
    ):
        return ListSlots(envs)
    raise ConfigError(
        explain(
            "rollout envs",
            expected="a gymllm vector env (areset_env/astep_env) or a non-empty list of envs",
            received=type(envs).__name__,
            fix="pass gymllm.make_vec(id, num_envs=N) or [gymllm.make(id) for _ in range(N)]",
        )
    )
