"""Registered gymllm environments and the adapters that bring other envs in.

Each module listed in ``ENV_MODULES`` registers its envs under ``gymllm/`` when imported;
:func:`register_all` imports them all (called by ``gymllm.registration``). Env modules must not
import JAX at import time.
"""

from __future__ import annotations

import importlib
import warnings

from gymllm._lazy import lazy_exports

ENV_MODULES: list[str] = [
    # one line per module; each registers its own ids on import
    "gymllm.envs.basic",
    "gymllm.envs.arithmetic",
    "gymllm.envs.arithmetic_tool",
    "gymllm.envs.games",
    "gymllm.envs.catalogue",
    "gymllm.envs.catalogue_textarena",
    "gymllm.envs.tiny_tasks",
    "gymllm.envs.countdown",
    "gymllm.envs.math_word",
    "gymllm.envs.calc_math",
    "gymllm.envs.code",
    "gymllm.envs.terminal",
    "gymllm.envs.openenv_adapter",
]

_LAZY = {
    "from_gymnasium": "gymllm.envs.gymnasium_adapter",
    "from_pettingzoo": "gymllm.envs.pettingzoo_adapter",
    "from_openenv": "gymllm.envs.openenv_adapter",
}

_registered = False
import_errors: dict[str, BaseException] = {}  # env module -> the exception its import raised


def register_all() -> None:
    """Import every env module once so that all ``gymllm/`` ids are in Gymnasium's registry.

    A module that fails to import is recorded in ``import_errors`` and warned about, so one broken
    env module does not make ``import gymllm`` fail (tests assert ``import_errors`` is empty).
    """
    global _registered
    if _registered:
        return
    _registered = True
    for name in ENV_MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - isolate one broken env module, report it
            import_errors[name] = e
            warnings.warn(
                f"gymllm: env module {name} failed to import ({type(e).__name__}: {e}); its ids are "
                "not registered. Fix the module or its dependency.",
                RuntimeWarning,
                stacklevel=2,
            )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, cache=False)
