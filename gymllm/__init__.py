"""gymllm: text environments as Gymnasium environments, and barrier-free GRPO for LLM agents in JAX.

The public surface is small and imported lazily, so ``import gymllm`` stays cheap (no JAX import):

    import gymllm
    env = gymllm.make("gymllm/Arithmetic-v0")
    vec = gymllm.make_vec("gymllm/Arithmetic-v0", num_envs=8)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "make": "gymllm.registration",
    "make_vec": "gymllm.registration",
    "register": "gymllm.registration",
    "TextEnv": "gymllm.core",
    "spaces": "gymllm.spaces",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if module.__name__.endswith("." + name) else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gymllm' has no attribute {name!r}")


from gymllm import registration as _registration  # noqa: E402,F401  registers all "gymllm/" ids (no JAX)
