"""gymllm ids live in Gymnasium's own registry under the ``gymllm/`` namespace.

    gymllm.register("MyTask-v0", entry_point="my_pkg.envs:MyTask", max_turns=...)   # -> "gymllm/MyTask-v0"
    env = gymllm.make("gymllm/Echo-v0")        # same as gymnasium.make(...) once gymllm is imported
    vec = gymllm.make_vec("gymllm/Echo-v0", num_envs=8, autoreset_mode="same_step")
    vec = gymllm.make_vec(["gymllm/Echo-v0", "gymllm/Arithmetic-v0"])   # mixed sub-envs

Text envs own their invariants (order of reset/step, action checks), so ids registered here turn
Gymnasium's passive env checker and order-enforcing wrapper off by default: ``make`` returns the
``TextEnv`` itself (plus ``TimeLimit`` when ``max_episode_steps`` is given), which keeps its async
twins reachable. Pass ``disable_env_checker=False`` / ``order_enforce=True`` to get them back.

Importing this module imports every module in ``gymllm.envs.ENV_MODULES`` (each registers its own
ids); ``import gymllm`` imports this module, and none of them imports JAX.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from gymllm.errors import ConfigError, explain

__all__ = ["NAMESPACE", "register", "make", "make_vec", "registered_ids", "full_id"]

NAMESPACE = "gymllm"
_VECTOR_KEYS = ("autoreset_mode", "backend", "max_concurrency", "step_timeout", "on_error", "mp_context", "inline_below_s",
                "ray_options")


def full_id(env_id: str) -> str:
    """``"Echo-v0"`` -> ``"gymllm/Echo-v0"``; ids with a namespace are returned unchanged."""
    if not isinstance(env_id, str) or not env_id:
        raise ConfigError(explain("env id", expected="a non-empty str such as 'gymllm/Echo-v0'", received=env_id,
                                  fix="pass a registered id (see gymllm.registration.registered_ids())"))
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def _resolve(env_id: str) -> str:
    """The registry key for ``env_id``: ``gymllm/<id>`` when registered, else the id as given (e.g. ``CartPole-v1``)."""
    ns = full_id(env_id)
    return ns if ns in gym.registry or env_id not in gym.registry else env_id


def register(
    id: str,
    entry_point: str | Callable[..., gym.Env],
    *,
    max_episode_steps: int | None = None,
    kwargs: dict[str, Any] | None = None,
    **spec_kwargs: Any,
) -> None:
    """Register ``id`` (``gymllm/`` is prepended when there is no namespace) in Gymnasium's registry.

    Re-registering the same id with the same entry point is a no-op (modules may be re-imported).
    """
    env_id = full_id(id)
    old = gym.registry.get(env_id)
    if old is not None and old.entry_point == entry_point and (old.kwargs or {}) == (kwargs or {}):
        return
    spec_kwargs.setdefault("disable_env_checker", True)
    spec_kwargs.setdefault("order_enforce", False)
    gym.register(id=env_id, entry_point=entry_point, max_episode_steps=max_episode_steps,
                 kwargs=dict(kwargs or {}), **spec_kwargs)


def registered_ids() -> list[str]:
    """Every id under ``gymllm/`` in Gymnasium's registry, sorted."""
    return sorted(k for k in gym.registry if k.startswith(NAMESPACE + "/"))


def _unknown_id(env_id: str) -> ConfigError:
    close = difflib.get_close_matches(env_id, registered_ids(), n=3)
    hint = f"did you mean {', '.join(close)}?" if close else "see gymllm.registration.registered_ids()"
    return ConfigError(explain("gymllm.make", expected="a registered env id", received=env_id, fix=hint))


def make(id: str | Callable[..., gym.Env], **kwargs: Any) -> gym.Env:
    """``gymnasium.make`` for gymllm ids (``"Echo-v0"`` means ``"gymllm/Echo-v0"``), with a clear unknown-id error.

    ``kwargs`` go to the env constructor, except Gymnasium's own ``max_episode_steps``,
    ``disable_env_checker``, ``order_enforce`` and ``render_mode`` handling, as in ``gymnasium.make``.
    A callable ``id`` is called with ``kwargs`` instead.
    """
    if callable(id):
        return id(**kwargs)
    env_id = _resolve(id)
    if env_id not in gym.registry:
        raise _unknown_id(env_id)
    return gym.make(env_id, **kwargs)


def _env_fn(item: str | Callable[[], gym.Env], wrappers: Sequence[Callable[[gym.Env], gym.Env]], kwargs: dict):
    if not (isinstance(item, str) or callable(item)):
        raise ConfigError(explain("gymllm.make_vec(id)", expected="an env id, an env factory, or a list of them",
                                  received=item, fix="pass 'gymllm/Echo-v0' or lambda: MyEnv()"))
    if isinstance(item, str) and _resolve(item) not in gym.registry:
        raise _unknown_id(_resolve(item))

    def fn() -> gym.Env:
        env = make(item, **kwargs) if isinstance(item, str) else item()
        for w in wrappers:
            env = w(env)
        return env

    return fn


def make_vec(
    id: str | Callable[[], gym.Env] | Sequence[str | Callable[[], gym.Env]],
    num_envs: int | None = None,
    *,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    **kwargs: Any,
):
    """A barrier-free :class:`gymllm.vector.VectorEnv` of ``num_envs`` sub-envs.

    ``id`` is one env id / factory, or a list of them (mixed sub-envs: sub-env ``i`` uses item
    ``i % len(list)``; ``num_envs`` defaults to the list's length). Vector options
    (``autoreset_mode``, ``backend``, ``max_concurrency``, ``step_timeout``, ``on_error``,
    ``mp_context``, ``ray_options`` with ``backend="ray"``; see :class:`gymllm.vector.VectorEnvConfig`
    and :class:`gymllm.vector.RayOptions`) may be given directly or in
    ``vector_kwargs``; the remaining ``kwargs`` go to every sub-env's ``make``. ``wrappers`` wrap
    each sub-env.
    """
    from gymllm.vector import VectorEnv, VectorEnvConfig

    items = list(id) if isinstance(id, (list, tuple)) else [id]
    if not items:
        raise ConfigError(explain("gymllm.make_vec(id)", expected="at least one env id", received=id,
                                  fix="pass an id or a non-empty list of ids"))
    n = len(items) if num_envs is None and len(items) > 1 else (1 if num_envs is None else num_envs)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(explain("gymllm.make_vec(num_envs)", expected="an int >= 1", received=num_envs,
                                  fix="pass num_envs=8"))
    vkw = dict(vector_kwargs or {})
    for key in _VECTOR_KEYS:
        if key in kwargs:
            vkw[key] = kwargs.pop(key)
    config = VectorEnvConfig(**vkw)
    fns = [_env_fn(items[i % len(items)], wrappers, kwargs) for i in range(n)]
    return VectorEnv(fns, config=config)

