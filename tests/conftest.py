"""Shared pytest setup. Keep JAX on the CPU and deterministic in the default tier."""

import gc
import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop every compiled XLA program after each test module. Each one keeps memory mappings of its
    code; the whole default tier compiles enough of them to pass the kernel's limit on mappings per
    process (vm.max_map_count, 65530 by default), after which the next compile segfaults. Modules
    that share compiled shapes recompile them instead."""
    yield
    import jax

    jax.clear_caches()
    gc.collect()
