"""gymllm ids live in Gymnasium's own registry under the ``gymllm/`` namespace.

    gymllm.register("MyTask-v0", entry_point="my_pkg.envs:MyTask", max_turns=...)   # -> "gymllm/MyTask-v0"
    env = gymllm.make("gymllm/Echo-v0")        # same as gymnasium.make(...) once gymllm is imported
    vec = gymllm.make_vec("gymllm/Echo-v0", num_envs=8, autoreset_mode="same_step")
    vec = gymllm.make_vec(["gymllm/Echo-v0", "gymllm/Arithmetic-v0"])   # mixed sub-envs

An id may also name a user's module, in the three forms :func:`resolve_env_id` reads (one
resolver for ``make``, ``make_vec``, ``gymllm train --env.id``, ``gymllm eval`` and suite files):
a registered id; Gymnasium's ``module:EnvId-v0`` (the module is imported first, so the
``register`` call it makes at import runs); ``module:factory`` (a callable returning an env, called
with the env kwargs)::

    vec = gymllm.make_vec("my_pkg.envs:MyTask-v0", num_envs=8)
    env = gymllm.make("my_pkg.envs:make_env", difficulty=2)

Text envs own their invariants (order of reset/step, action checks), so ids registered here turn
Gymnasium's passive env checker and order-enforcing wrapper off by default: ``make`` returns the
``TextEnv`` itself (plus ``TimeLimit`` when ``max_episode_steps`` is given), which keeps its async
twins reachable. Pass ``disable_env_checker=False`` / ``order_enforce=True`` to get them back.

Importing this module imports every module in ``gymllm.envs.ENV_MODULES`` (each registers its own
ids); ``import gymllm`` imports this module, and none of them imports JAX.
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from gymllm.errors import ConfigError, explain
from gymllm.validation import is_int, require

__all__ = [
    "NAMESPACE",
    "register",
    "make",
    "make_vec",
    "registered_ids",
    "full_id",
    "resolve_env_id",
    "nearest_ids",
    "load_callable",
]

NAMESPACE = "gymllm"
#: an env id in Gymnasium's ``[namespace/](name)[-v(version)]`` form, ending in a version
_VERSIONED = re.compile(r"^(?:[\w:.-]+/)?[\w:.-]+?-v\d+$")


def full_id(env_id: str) -> str:
    """``"Echo-v0"`` -> ``"gymllm/Echo-v0"``; ids with a namespace are returned unchanged."""
    require(
        isinstance(env_id, str) and env_id,
        "env id",
        expected="a non-empty str such as 'gymllm/Echo-v0'",
        received=env_id,
        fix="pass a registered id (see gymllm.registration.registered_ids())",
    )
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
    gym.register(
        id=env_id,
        entry_point=entry_point,
        max_episode_steps=max_episode_steps,
        kwargs=dict(kwargs or {}),
        **spec_kwargs,
    )


def registered_ids() -> list[str]:
    """Every id under ``gymllm/`` in Gymnasium's registry, sorted."""
    return sorted(k for k in gym.registry if k.startswith(NAMESPACE + "/"))


def _unknown_id(env_id: str) -> ConfigError:
    close = difflib.get_close_matches(env_id, registered_ids(), n=3)
    hint = (
        f"did you mean {', '.join(close)}?" if close else "see gymllm.registration.registered_ids()"
    )
    return ConfigError(
        explain("gymllm.make", expected="a registered env id", received=env_id, fix=hint)
    )


# ------------------------------------------------------------------ env ids in three forms


def nearest_ids(env_id: str, n: int = 3) -> list[str]:
    """The registered ids closest to ``env_id`` (``difflib``), ``gymllm/`` ids first in the search."""
    reg = gym.registry
    names = sorted(reg)
    close = difflib.get_close_matches(env_id, names, n=n, cutoff=0.5)
    if not close and "/" not in env_id:
        close = difflib.get_close_matches(f"gymllm/{env_id}", names, n=n, cutoff=0.5)
    return close


def _registered(env_id: str) -> str | None:
    reg = gym.registry
    for candidate in (env_id if "/" in env_id else f"gymllm/{env_id}", env_id):
        if candidate in reg:
            return candidate
    return None


def _unknown(env_id: str, where: str) -> ConfigError:
    close = nearest_ids(env_id)
    fix = (
        f"did you mean {', '.join(repr(c) for c in close)}? (`gymllm envs` lists every registered id)"
        if close
        else "`gymllm envs` lists the registered ids; a module of your own is named as 'my_pkg.envs:MyEnv-v0' "
        "(Gymnasium's convention: the module registers the id on import) or 'my_pkg.envs:make_env'"
    )
    return ConfigError(
        explain(
            where,
            expected="a registered env id, 'module:EnvId-v0' or 'module:factory'",
            received=env_id,
            fix=fix,
        )
    )


def resolve_env_id(env_id: str, *, where: str = "env id") -> str | Callable[..., Any]:
    """What ``env_id`` names: a registry key (str) or an env factory (callable), in the three forms of
    the module doc (checked in that order).
    ``where`` names the setting in error messages (e.g. ``"suite core.toml, [[env]] #2, key 'id'"``)."""
    require(
        isinstance(env_id, str) and env_id.strip(),
        where,
        expected="a non-empty str such as 'gymllm/Arithmetic-v0'",
        received=env_id,
        fix="set id = 'gymllm/Arithmetic-v0' (`gymllm envs` lists the ids)",
    )
    found = _registered(env_id)
    if found is not None:
        return found
    if ":" not in env_id:
        raise _unknown(env_id, where)
    module, _, attr = env_id.partition(":")
    require(
        module and attr,
        where,
        expected="'module:EnvId-v0' or 'module:factory' (both sides non-empty)",
        received=env_id,
        fix="e.g. 'my_pkg.envs:MyEnv-v0'",
    )
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(
            explain(
                where,
                expected=f"an importable module before ':' ({module!r})",
                received=f"{env_id} ({type(e).__name__}: {e})",
                fix=f"install the package that provides {module!r}, or put its directory on "
                "PYTHONPATH",
            )
        ) from e
    if _VERSIONED.match(attr) and not callable(getattr(mod, attr, None)):
        found = _registered(attr)
        if found is None:
            close = nearest_ids(attr)
            raise ConfigError(
                explain(
                    where,
                    expected=f"module {module!r} to register {attr!r} when imported (gymnasium.register or "
                    "gymllm.register at its top level)",
                    received=f"{env_id} (not registered after the import)",
                    fix=f"register {attr!r} in {module}"
                    + (f", or did you mean {', '.join(map(repr, close))}?" if close else ""),
                )
            )
        return found
    factory = getattr(mod, attr, None)
    if not callable(factory):
        public = sorted(n for n in vars(mod) if not n.startswith("_") and callable(getattr(mod, n)))
        close = difflib.get_close_matches(attr, public, n=3)
        raise ConfigError(
            explain(
                where,
                expected=f"a callable {attr!r} in module {module!r} that returns an env",
                received=env_id if factory is None else f"{env_id} ({type(factory).__name__})",
                fix=f"did you mean {', '.join(repr(f'{module}:{c}') for c in close)}?"
                if close
                else f"define `def {attr}(**kwargs): return MyEnv(**kwargs)` in {module}",
            )
        )
    return factory


def load_callable(
    spec: str, where: str, *, form: str, expected: str, fix: str
) -> Callable[..., Any]:
    """The callable a ``"module:name"`` spec names (``name`` may be dotted: ``module:Class.method``).

    A ConfigError at ``where`` when the module does not import or lacks the name (``form`` spells the
    spec for that message, e.g. ``"MODULE:FN"``), or when what it names is not callable (``expected``
    says what was wanted, ``fix`` how to name one)."""
    module, _, attr = spec.partition(":")
    try:
        fn: Any = importlib.import_module(module)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError, ValueError) as e:  # ValueError: an empty module name
        raise ConfigError(
            explain(
                where,
                expected=f"an importable {form}",
                received=spec,
                fix=f"check the module path and the name ({type(e).__name__}: {e})",
            )
        ) from e
    if not callable(fn):
        raise ConfigError(
            explain(where, expected=expected, received=f"{spec} = {type(fn).__name__}", fix=fix)
        )
    return fn


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
        if isinstance(id, str) and ":" in id:  # 'module:EnvId-v0' / 'module:factory'
            return make(resolve_env_id(id, where="gymllm.make"), **kwargs)
        raise _unknown_id(env_id)
    return gym.make(env_id, **kwargs)


def _env_fn(
    item: str | Callable[[], gym.Env],
    wrappers: Sequence[Callable[[gym.Env], gym.Env]],
    kwargs: dict,
):
    require(
        isinstance(item, str) or callable(item),
        "gymllm.make_vec(id)",
        expected="an env id, an env factory, or a list of them",
        received=item,
        fix="pass 'gymllm/Echo-v0' or lambda: MyEnv()",
    )
    if isinstance(item, str) and _resolve(item) not in gym.registry:
        if ":" not in item:
            raise _unknown_id(_resolve(item))
        item = resolve_env_id(item, where="gymllm.make_vec")  # 'module:EnvId-v0' / 'module:factory'
        if callable(item):
            factory = item
            item = lambda: factory(**kwargs)  # noqa: E731 - the factory takes the sub-env kwargs

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
    require(
        items,
        "gymllm.make_vec(id)",
        expected="at least one env id",
        received=id,
        fix="pass an id or a non-empty list of ids",
    )
    n = len(items) if num_envs is None and len(items) > 1 else (1 if num_envs is None else num_envs)
    require(
        is_int(n) and n >= 1,
        "gymllm.make_vec(num_envs)",
        expected="an int >= 1",
        received=num_envs,
        fix="pass num_envs=8",
    )
    vkw = dict(vector_kwargs or {})
    import dataclasses

    for key in (
        f.name for f in dataclasses.fields(VectorEnvConfig)
    ):  # the vector env's own settings
        if key in kwargs:
            vkw[key] = kwargs.pop(key)
    config = VectorEnvConfig(**vkw)
    fns = [_env_fn(items[i % len(items)], wrappers, kwargs) for i in range(n)]
    return VectorEnv(fns, config=config)
