"""The barrier-free vector env for text sub-envs (see :mod:`gymllm.vector.vector_env`)."""

from gymllm.vector.config import AutoresetMode, RayOptions, VectorEnvConfig
from gymllm.vector.vector_env import EnvIdError, VectorEnv, VectorStateError

__all__ = ["AutoresetMode", "EnvIdError", "RayOptions", "VectorEnv", "VectorEnvConfig", "VectorStateError"]
