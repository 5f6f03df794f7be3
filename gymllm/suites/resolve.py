"""Env ids a suite (or ``--env.id``) may name, resolved to what ``gymllm.make`` / ``gymllm.make_vec`` take.

Three forms, checked in this order:

* a registered id: ``gymllm/Arithmetic-v0`` (``Arithmetic-v0`` means the same), or any id in
  Gymnasium's registry (``CartPole-v1``);
* Gymnasium's own ``module:EnvId-v0`` convention: ``module`` is imported first (so the
  ``gymnasium.register`` / ``gymllm.register`` call it makes runs), then ``EnvId-v0`` is looked up
  (also as ``gymllm/EnvId-v0``);
* ``module:factory``: ``module`` is imported and ``factory`` (a callable returning an env, given the
  table's ``kwargs``) is the env.

    target = resolve_env_id("my_pkg.envs:MyTask-v0")     # -> "MyTask-v0" (registered by my_pkg.envs)
    env = gymllm.make(target, **kwargs)
    vec = make_vec_for(target, 8, kwargs, max_turns=4)

An unknown id is a :class:`~gymllm.errors.ConfigError` naming the nearest registered ids; a module
that fails to import, or a factory that is missing or not callable, says which and how to fix it.
The resolver itself lives in :mod:`gymllm.registration`, so ``gymllm.make``, ``gymllm.make_vec``,
``gymllm train --env.id`` and ``gymllm eval`` take the same three forms; this module adds the
suite runner's ``make_env_for`` / ``make_vec_for`` (a ``max_turns`` limit on either kind of target).
"""

from __future__ import annotations

import functools
from typing import Any, Callable


__all__ = ["make_vec_for", "make_env_for", "target_name"]


def target_name(target: str | Callable[..., Any]) -> str:
    """A printable name of a resolved target (the id, or ``module:qualname``)."""
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"


def make_env_for(
    target: str | Callable[..., Any],
    kwargs: dict[str, Any] | None = None,
    *,
    max_turns: int | None = None,
) -> Any:
    """One env of ``target`` with ``kwargs``; ``max_turns`` as Gymnasium's ``max_episode_steps`` (a
    ``TimeLimit``, as ``gymllm.make`` adds for a registered id)."""
    from gymllm.registration import make

    kwargs = dict(kwargs or {})
    if isinstance(target, str):
        return make(target, **kwargs, **({"max_episode_steps": max_turns} if max_turns else {}))
    env = target(**kwargs)
    if max_turns:
        from gymnasium.wrappers import TimeLimit

        env = TimeLimit(env, max_episode_steps=max_turns)
    return env


def make_vec_for(
    target: str | Callable[..., Any],
    num_envs: int,
    kwargs: dict[str, Any] | None = None,
    *,
    max_turns: int | None = None,
    **vector_kwargs: Any,
) -> Any:
    """A barrier-free ``gymllm.make_vec`` of ``num_envs`` sub-envs of ``target`` (an id or a factory)."""
    from gymllm.registration import make_vec

    kwargs = dict(kwargs or {})
    if isinstance(target, str):
        return make_vec(
            target,
            num_envs=num_envs,
            vector_kwargs=vector_kwargs or None,
            **kwargs,
            **({"max_episode_steps": max_turns} if max_turns else {}),
        )
    return make_vec(
        functools.partial(make_env_for, target, kwargs, max_turns=max_turns),
        num_envs=num_envs,
        vector_kwargs=vector_kwargs or None,
    )
