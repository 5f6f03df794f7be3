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
"""

from __future__ import annotations

import difflib
import functools
import importlib
import re
from typing import Any, Callable

from gymllm.errors import ConfigError, explain

__all__ = ["resolve_env_id", "nearest_ids", "make_vec_for", "make_env_for", "target_name"]

#: an env id in Gymnasium's ``[namespace/](name)[-v(version)]`` form, ending in a version
_VERSIONED = re.compile(r"^(?:[\w:.-]+/)?[\w:.-]+?-v\d+$")


def _registry() -> Any:
    import gymnasium as gym

    import gymllm.registration  # noqa: F401 - importing it registers every gymllm id

    return gym.registry


def nearest_ids(env_id: str, n: int = 3) -> list[str]:
    """The registered ids closest to ``env_id`` (``difflib``), ``gymllm/`` ids first in the search."""
    reg = _registry()
    names = sorted(reg)
    close = difflib.get_close_matches(env_id, names, n=n, cutoff=0.5)
    if not close and "/" not in env_id:
        close = difflib.get_close_matches(f"gymllm/{env_id}", names, n=n, cutoff=0.5)
    return close


def _registered(env_id: str) -> str | None:
    reg = _registry()
    for candidate in (env_id if "/" in env_id else f"gymllm/{env_id}", env_id):
        if candidate in reg:
            return candidate
    return None


def _unknown(env_id: str, where: str) -> ConfigError:
    close = nearest_ids(env_id)
    fix = (f"did you mean {', '.join(repr(c) for c in close)}? (`gymllm envs` lists every registered id)" if close
           else "`gymllm envs` lists the registered ids; a module of your own is named as 'my_pkg.envs:MyEnv-v0' "
                "(Gymnasium's convention: the module registers the id on import) or 'my_pkg.envs:make_env'")
    return ConfigError(explain(where, expected="a registered env id, 'module:EnvId-v0' or 'module:factory'",
                               received=env_id, fix=fix))


def resolve_env_id(env_id: str, *, where: str = "env id") -> str | Callable[..., Any]:
    """What ``env_id`` names: a registry key (str) or an env factory (callable); see the module doc.
    ``where`` names the setting in error messages (e.g. ``"suite core.toml, [[env]] #2, key 'id'"``)."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise ConfigError(explain(where, expected="a non-empty str such as 'gymllm/Arithmetic-v0'", received=env_id,
                                  fix="set id = 'gymllm/Arithmetic-v0' (`gymllm envs` lists the ids)"))
    found = _registered(env_id)
    if found is not None:
        return found
    if ":" not in env_id:
        raise _unknown(env_id, where)
    module, _, attr = env_id.partition(":")
    if not module or not attr:
        raise ConfigError(explain(where, expected="'module:EnvId-v0' or 'module:factory' (both sides non-empty)",
                                  received=env_id, fix="e.g. 'my_pkg.envs:MyEnv-v0'"))
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(explain(where, expected=f"an importable module before ':' ({module!r})",
                                  received=f"{env_id} ({type(e).__name__}: {e})",
                                  fix=f"install the package that provides {module!r}, or put its directory on "
                                      "PYTHONPATH")) from e
    if _VERSIONED.match(attr) and not callable(getattr(mod, attr, None)):
        found = _registered(attr)
        if found is None:
            close = nearest_ids(attr)
            raise ConfigError(explain(
                where, expected=f"module {module!r} to register {attr!r} when imported (gymnasium.register or "
                                "gymllm.register at its top level)",
                received=f"{env_id} (not registered after the import)",
                fix=f"register {attr!r} in {module}" + (f", or did you mean {', '.join(map(repr, close))}?" if close
                                                         else "")))
        return found
    factory = getattr(mod, attr, None)
    if not callable(factory):
        public = sorted(n for n in vars(mod) if not n.startswith("_") and callable(getattr(mod, n)))
        close = difflib.get_close_matches(attr, public, n=3)
        raise ConfigError(explain(where, expected=f"a callable {attr!r} in module {module!r} that returns an env",
                                  received=env_id if factory is None else f"{env_id} ({type(factory).__name__})",
                                  fix=f"did you mean {', '.join(repr(f'{module}:{c}') for c in close)}?" if close
                                  else f"define `def {attr}(**kwargs): return MyEnv(**kwargs)` in {module}"))
    return factory


def target_name(target: str | Callable[..., Any]) -> str:
    """A printable name of a resolved target (the id, or ``module:qualname``)."""
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"


def make_env_for(target: str | Callable[..., Any], kwargs: dict[str, Any] | None = None, *,
                 max_turns: int | None = None) -> Any:
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


def make_vec_for(target: str | Callable[..., Any], num_envs: int, kwargs: dict[str, Any] | None = None, *,
                 max_turns: int | None = None, **vector_kwargs: Any) -> Any:
    """A barrier-free ``gymllm.make_vec`` of ``num_envs`` sub-envs of ``target`` (an id or a factory)."""
    from gymllm.registration import make_vec

    kwargs = dict(kwargs or {})
    if isinstance(target, str):
        return make_vec(target, num_envs=num_envs, vector_kwargs=vector_kwargs or None,
                        **kwargs, **({"max_episode_steps": max_turns} if max_turns else {}))
    return make_vec(functools.partial(make_env_for, target, kwargs, max_turns=max_turns), num_envs=num_envs,
                    vector_kwargs=vector_kwargs or None)
