"""Registered gymllm environments and the adapters that bring other envs in.

Each module listed in ``ENV_MODULES`` registers its envs under ``gymllm/`` when imported;
:func:`register_all` imports them all (called by ``gymllm.registration``). Env modules must not
import JAX at import time.
"""

from __future__ import annotations

import importlib
from typing import Any

ENV_MODULES: list[str] = [
    # one line per module; each registers its own ids on import
]

_LAZY = {
    "from_gymnasium": "gymllm.envs.gymnasium_adapter",
    "from_pettingzoo": "gymllm.envs.pettingzoo_adapter",
}

_registered = False


def register_all() -> None:
    """Import every env module once so that all ``gymllm/`` ids are in Gymnasium's registry."""
    global _registered
    if _registered:
        return
    _registered = True
    for name in ENV_MODULES:
        importlib.import_module(name)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gymllm.envs' has no attribute {name!r}")
