"""The envs ``gymllm serve-env`` serves: :func:`make_env_factory` (an env id or ``module:factory`` ->
a factory of text envs; a Gymnasium env whose actions are not text goes through
:func:`gymllm.envs.from_gymnasium`) and :func:`is_async_native` (whether the server awaits it).
"""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym

from gymllm.core import TextEnv, overrides_hook
from gymllm.registration import load_callable
from gymllm.spaces import Text
from gymllm.validation import require_instance

__all__ = ["make_env_factory", "is_async_native"]


def make_env_factory(env: str, env_kwargs: dict[str, Any] | None = None) -> Callable[[], gym.Env]:
    """A no-argument factory of text envs for ``env`` (an id or ``module:factory``)."""
    kwargs = dict(env_kwargs or {})
    if ":" in env:
        fn = load_callable(
            env,
            "gymllm serve-env ENV",
            form="'module:factory'",
            expected="a callable factory",
            fix="name a function or class that returns a gymnasium.Env",
        )

        def build() -> gym.Env:
            return _as_text_env(fn(**kwargs), None, kwargs)
    else:
        import gymllm

        def build() -> gym.Env:
            return _as_text_env(gymllm.make(env, **kwargs), env, kwargs)

    return build


def _as_text_env(made: Any, env_id: str | None, kwargs: dict) -> gym.Env:
    require_instance(
        made,
        gym.Env,
        "gymllm serve-env ENV",
        expected="a factory returning a gymnasium.Env",
        fix="return the env instance",
    )
    if isinstance(made.action_space, Text):
        return made
    from gymllm.envs.gymnasium_adapter import from_gymnasium

    if env_id is not None:  # made again through the adapter (it picks the ansi render mode)
        made.close()
        return from_gymnasium(env_id, env_kwargs=kwargs)
    return from_gymnasium(made)


def is_async_native(env: gym.Env) -> bool:
    """Whether ``env`` (or the TextEnv it wraps) has a native ``async def _astep``."""
    u = getattr(env, "unwrapped", env)
    return (
        isinstance(u, TextEnv)
        and overrides_hook(u, "_astep")
        and callable(getattr(env, "astep", None))
    )
