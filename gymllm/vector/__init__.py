"""The barrier-free vector env for text sub-envs (see :mod:`gymllm.vector.vector_env`)."""

from gymnasium.vector import AutoresetMode

from gymllm.vector.config import RayOptions, VectorEnvConfig
from gymllm.vector.vector_env import VectorEnv
from gymllm.vector.errors import EnvIdError, VectorStateError

__all__ = [
    "AutoresetMode",
    "EnvIdError",
    "RayOptions",
    "VectorEnv",
    "VectorEnvConfig",
    "VectorStateError",
]
