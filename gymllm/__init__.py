"""gymllm: text environments as Gymnasium environments, and barrier-free GRPO for LLM agents in JAX.

The public surface is small and imported lazily, so ``import gymllm`` stays cheap (no JAX import):

    import gymllm
    env = gymllm.make("gymllm/Arithmetic-v0")
    vec = gymllm.make_vec("gymllm/Arithmetic-v0", num_envs=8)
    gymllm.utils.check_env(env)                 # every subpackage is reachable as an attribute

As in Gymnasium (``gymnasium.wrappers``, ``gymnasium.utils``), each subpackage and module listed
in :data:`SUBMODULES` is an attribute of ``gymllm``, imported on first access (module
``__getattr__``), so ``gymllm.train.train(...)`` works after a bare ``import gymllm`` and the
JAX-backed ones (``models``, ``inference``, ``algos``) cost nothing until they are used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Top-level names and the module each comes from (imported on first access).
_LAZY = {
    "make": "gymllm.registration",
    "make_vec": "gymllm.registration",
    "register": "gymllm.registration",
    "TextEnv": "gymllm.core",
}

# Subpackages and modules reachable as ``gymllm.<name>`` (imported on first access), in layer order.
SUBMODULES: tuple[str, ...] = (
    "errors",
    "types",
    "atomic",
    "validation",
    "telemetry",
    "ray_support",
    "spaces",
    "space_text",
    "core",
    "vector",
    "utils",
    "trajectories",
    "multiagent",
    "wrappers",
    "tools",
    "registration",
    "envs",
    "models",
    "inference",
    "rollout",
    "suites",
    "algos",
    "train",
    "viewer",
    "cli",
)

__all__ = ["__version__", "SUBMODULES", *_LAZY, *SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")  # also sets the package attribute
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(
            f"module 'gymllm' has no attribute {name!r} (public names: {', '.join(sorted(__all__))})"
        )
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


from gymllm import registration as _registration  # noqa: E402,F401  make, make_vec, register
from gymllm.envs import register_all as _register_all  # noqa: E402  env modules import registration.register

_register_all()  # every "gymllm/" id in Gymnasium's registry (no JAX)
