"""Shared pytest setup. Keep JAX on the CPU and deterministic in the default tier."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
