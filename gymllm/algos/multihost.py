"""Multi-host learner: one process per host, joined by ``jax.distributed.initialize``.

Every process runs the same program: it initializes the distributed system *before any other JAX
call*, builds the learner's mesh over ``jax.devices()`` (all processes' devices, see
:func:`gymllm.algos.sharding.make_mesh`) and submits the same groups; each process places only its
own shards of every micro-batch, the jitted gradient's all-reduce crosses processes (gloo on CPU,
NCCL on GPU, ICI on TPU), and every process ends the step with the same (sharded) parameters.

    # host i of N (or N local processes, for a try on one machine):
    GYMLLM_COORDINATOR=host0:1234 GYMLLM_NUM_PROCESSES=N GYMLLM_PROCESS_ID=i \\
    GYMLLM_LOCAL_DEVICES=2 python my_train.py      # GYMLLM_LOCAL_DEVICES: CPU only (host devices)

    from gymllm.algos.multihost import initialize_from_env, gather
    initialize_from_env()                            # first thing: before any JAX computation
    # or, explicitly (a Ray learner-host actor, the address handed from host 0):
    # initialize_distributed("host0:1234", num_processes=N, process_id=i)
    mesh = make_mesh(ShardingConfig(data=N, fsdp=2)) # data across hosts, FSDP within a host
    learner = StreamingLearner(..., mesh=mesh)
    params = gather(learner.trainable)               # NumPy copies of the global arrays, on every process

Tested with two local CPU processes (``tests/test_multihost.py``): loss and update equal the
single-process run on the same global batch.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from gymllm.validation import check_range, require
from gymllm.errors import ConfigError, explain

ENV_COORDINATOR = "GYMLLM_COORDINATOR"
ENV_NUM_PROCESSES = "GYMLLM_NUM_PROCESSES"
ENV_PROCESS_ID = "GYMLLM_PROCESS_ID"
ENV_LOCAL_DEVICES = "GYMLLM_LOCAL_DEVICES"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MultiHostConfig:
    """coordinator_address: ``host:port`` of process 0 (every process passes the same one);
    local_devices: CPU host devices per process (0 = XLA's default, one)."""

    coordinator_address: str
    num_processes: int
    process_id: int
    local_devices: int = 0

    def __post_init__(self) -> None:
        host, _, port = self.coordinator_address.rpartition(":")
        require(
            bool(host and port.isdigit()),
            "MultiHostConfig.coordinator_address",
            expected="'host:port'",
            received=self.coordinator_address,
            fix="e.g. '10.0.0.1:1234' or '127.0.0.1:1234'",
        )
        check_range("MultiHostConfig", "num_processes", self.num_processes, lo=1)
        check_range(
            "MultiHostConfig", "process_id", self.process_id, lo=0, hi=self.num_processes - 1
        )
        check_range("MultiHostConfig", "local_devices", self.local_devices, lo=0)


def config_from_env(environ: Mapping[str, str] | None = None) -> MultiHostConfig | None:
    """The config in ``GYMLLM_COORDINATOR`` / ``GYMLLM_NUM_PROCESSES`` / ``GYMLLM_PROCESS_ID``
    (/ ``GYMLLM_LOCAL_DEVICES``); None when ``GYMLLM_COORDINATOR`` is unset (a single process)."""
    env = os.environ if environ is None else environ
    if not env.get(ENV_COORDINATOR):
        return None
    try:
        num, pid = int(env[ENV_NUM_PROCESSES]), int(env[ENV_PROCESS_ID])
        local = int(env.get(ENV_LOCAL_DEVICES, "0") or 0)
    except (KeyError, ValueError) as exc:
        raise ConfigError(
            explain(
                "multi-host environment",
                expected=f"integers in {ENV_NUM_PROCESSES} and "
                f"{ENV_PROCESS_ID} when {ENV_COORDINATOR} is set",
                received={k: env.get(k) for k in (ENV_NUM_PROCESSES, ENV_PROCESS_ID)},
                fix=f"export {ENV_NUM_PROCESSES}=N {ENV_PROCESS_ID}=i (0 <= i < N)",
            )
        ) from exc
    return MultiHostConfig(
        coordinator_address=env[ENV_COORDINATOR],
        num_processes=num,
        process_id=pid,
        local_devices=local,
    )


def initialize(cfg: MultiHostConfig) -> None:
    """``jax.distributed.initialize`` for ``cfg``; on CPU also the host device count and gloo
    collectives. Must run before any JAX computation (it fails clearly otherwise)."""
    import jax

    if cfg.local_devices:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={cfg.local_devices}".strip()
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=cfg.coordinator_address,
        num_processes=cfg.num_processes,
        process_id=cfg.process_id,
    )


def initialize_distributed(
    coordinator_address: str, num_processes: int, process_id: int, *, local_devices: int = 0
) -> MultiHostConfig:
    """:func:`initialize` from explicit arguments (what a learner-host actor calls with the
    coordinator address handed from host 0); returns the validated config."""
    cfg = MultiHostConfig(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_devices=local_devices,
    )
    initialize(cfg)
    return cfg


def free_coordinator_address(host: str = "127.0.0.1") -> str:
    """``host:port`` with a port free on this host now, for process 0 to coordinate on (the caller
    hands it to every process; a port taken in between makes ``jax.distributed`` fail clearly)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return f"{host}:{s.getsockname()[1]}"


def initialize_from_env(environ: Mapping[str, str] | None = None) -> MultiHostConfig | None:
    """:func:`initialize` from the environment (see :func:`config_from_env`); a no-op returning
    None when ``GYMLLM_COORDINATOR`` is unset."""
    cfg = config_from_env(environ)
    if cfg is not None:
        initialize(cfg)
    return cfg


def gather(tree: Any) -> Any:
    """NumPy copies of (globally sharded) arrays, the whole value on every process."""
    import jax
    import numpy as np

    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def is_main_process() -> bool:
    """Process 0 writes logs, checkpoints metadata and reports; the others only compute."""
    import jax

    return jax.process_index() == 0
