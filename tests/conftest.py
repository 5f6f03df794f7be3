"""Shared pytest setup. JAX on the CPU and deterministic in the default tier; on the accelerator JAX
finds with ``GYMLLM_TEST_DEVICE=accelerator`` (see ``tests/accel.py``).

* ``GYMLLM_TEST_DEVICE`` unset or ``cpu``: ``JAX_PLATFORMS=cpu`` unless the environment says otherwise.
* ``GYMLLM_TEST_DEVICE=accelerator``: ``JAX_PLATFORMS`` is left as the environment has it (unset: JAX
  picks the TPU or GPU); the session stops at once, with the reason, when JAX finds none. Once this
  process holds the chip, ``JAX_PLATFORMS=cpu`` is set for the processes tests start.
* Markers: ``tpu`` / ``gpu`` tests run only on that platform and are skipped elsewhere with the reason;
  ``highest_precision`` (on a module) runs it under ``jax_default_matmul_precision="highest"`` on an
  accelerator; ``loopback`` tests, and every test of :data:`LOOPBACK_MODULES`, are skipped with the
  reason on a machine where no TCP socket can be bound on 127.0.0.1.
* Workers (pytest-xdist, ``-n auto`` in ``addopts``): one per core up to :data:`MAX_WORKERS` on the
  CPU, none on the accelerator (one process at a time may hold a TPU). Each module runs whole on one
  worker (its module fixtures load once), and the modules that start Ray clusters share one worker,
  one after another. ``-n 0`` runs everything in this process.
"""

import atexit
import gc
import os
import shutil
import tempfile

import pytest

from accel import loopback_unavailable, platform, requested_device

DEVICE = requested_device()
if DEVICE == "cpu":
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

#: test modules whose tests all open TCP sockets on 127.0.0.1 (HTTP servers, Ray clusters, OpenEnv,
#: the training proxy, the viewer's browser); a single test elsewhere carries ``@pytest.mark.loopback``
LOOPBACK_MODULES = frozenset(
    {
        "test_cluster_train.py",
        "test_engine_pool.py",
        "test_fuzz_servers.py",
        "test_multihost.py",
        "test_openenv.py",
        "test_proxy.py",
        "test_proxy_train.py",
        "test_serve_env_hostile.py",
        "test_server.py",
        "test_server_engine_faults.py",
        "test_server_hostile.py",
        "test_suite_cluster.py",
        "test_vector_ray.py",
        "test_viewer.py",
    }
)
#: single tests that bind a socket on 127.0.0.1 (file::name), and (file, fixture) pairs whose fixture does
LOOPBACK_TESTS = frozenset({"test_sandbox.py::test_no_network"})
LOOPBACK_FIXTURES = frozenset({("test_sandbox_escapes.py", "world")})


#: test modules that start a local Ray cluster: run on one worker, one after another
RAY_MODULES = frozenset(
    {"test_cluster_train.py", "test_engine_pool.py", "test_suite_cluster.py", "test_vector_ray.py"}
)
#: most workers ``-n auto`` starts on the CPU (each holds a JAX runtime and the models its modules load)
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    if DEVICE == "accelerator":
        return 0
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def needs_loopback(item) -> bool:
    name = item.path.name
    return (
        name in LOOPBACK_MODULES
        or item.get_closest_marker("loopback") is not None
        or f"{name}::{getattr(item, 'originalname', item.name)}" in LOOPBACK_TESTS
        or any((name, f) in LOOPBACK_FIXTURES for f in getattr(item, "fixturenames", ()))
    )


def pytest_configure(config):
    if DEVICE != "accelerator":
        return
    if platform() == "cpu":
        import jax

        pytest.exit(
            f"GYMLLM_TEST_DEVICE=accelerator: expected a TPU or GPU visible to JAX, received {jax.devices()} "
            f"(JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')!r}). Fix: run on the accelerator machine with "
            "jax[tpu] or jax[cuda12] installed and JAX_PLATFORMS unset (or naming it), or unset "
            "GYMLLM_TEST_DEVICE for the CPU.",
            returncode=4,
        )
    # this process holds the chip now (one process at a time may hold a TPU): processes the tests start
    # run JAX on the CPU (this process's backends are set up already; the variable no longer moves them)
    os.environ["JAX_PLATFORMS"] = "cpu"


def pytest_report_header(config):
    import jax

    d = jax.devices()[0]
    return f"gymllm test device: {d.platform} ({d.device_kind}, {len(jax.devices())} device(s)); GYMLLM_TEST_DEVICE={DEVICE}"


def pytest_collection_modifyitems(config, items):
    here = platform()
    no_loopback = loopback_unavailable()
    for item in items:
        # xdist's loadgroup: a module stays on one worker; the Ray modules share one
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("ray" if name in RAY_MODULES else name))
        for plat in ("tpu", "gpu"):
            if item.get_closest_marker(plat) is not None and here != plat:
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"needs a {plat.upper()}; JAX's device here is {here} "
                        "(GYMLLM_TEST_DEVICE=accelerator on that machine runs it)"
                    )
                )
        if no_loopback and needs_loopback(item):
            item.add_marker(pytest.mark.skip(reason=no_loopback))


@pytest.fixture(autouse=True, scope="module")
def _matmul_precision(request):
    """``jax_default_matmul_precision="highest"`` for a module marked ``highest_precision`` on an
    accelerator (global, so the engine's own thread compiles under it too), restored after it."""
    if request.node.get_closest_marker("highest_precision") is None or platform() == "cpu":
        yield
        return
    import jax

    before = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", before)


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
