"""Shared pytest setup. Keep JAX on the CPU and deterministic in the default tier."""

import atexit
import gc
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One persistent compilation cache for the session (gymllm.utils.compile_cache), in a fresh temporary
# directory: runs never write to the user's ~/.cache, and a program compiled once (>= 1 s to compile)
# is loaded by every later module (they recompile after the cache clear below) and every subprocess
# (`gymllm train` runs) instead of compiled again. Removed at exit.
_XLA_CACHE = tempfile.mkdtemp(prefix="gymllm-test-xla-")
atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
os.environ.setdefault("GYMLLM_COMPILE_CACHE", _XLA_CACHE)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _XLA_CACHE)


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
