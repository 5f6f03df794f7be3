"""Sharding the learner on a ``jax.sharding.Mesh`` with a data axis and an FSDP axis.

* Micro-batch rows are split over both axes (``P(("data", "fsdp"))``): every device computes the
  loss of its rows; the jitted gradient sums over all rows (XLA inserts the all-reduce).
* Parameters and optimizer moments are sharded over ``fsdp`` on their largest dimension that the
  axis size divides (replicated otherwise), and replicated over ``data``.
The math is the same as on one device: only where the numbers live changes (tests check that the
update on 4 host CPU devices equals the single-device one).

Multi-host: every process calls :func:`gymllm.algos.multihost.initialize_from_env` (which wraps
``jax.distributed.initialize``) before any JAX computation, then builds the mesh over
``jax.devices()`` (all processes' devices, in process order: data across hosts, FSDP within one)
with :func:`make_mesh`. Every process submits the same groups; :func:`shard_batch` and
:func:`shard_params` place only the process's own shards (``device_put`` of the same host value on
every process) and the same jitted step runs everywhere (tested with two local CPU processes).
On one machine, ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` gives 4 CPU devices to try it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from gymllm.validation import check_range, require


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardingConfig:
    """data x fsdp devices (both 1 = a single device, no mesh)."""

    data: int = 1
    """Devices the batch is split over (data parallel; data x fsdp = 1: a single device, no mesh)."""
    fsdp: int = 1
    """Devices the weights and optimizer state are sharded over (FSDP)."""

    def __post_init__(self) -> None:
        check_range("ShardingConfig", "data", self.data, lo=1)
        check_range("ShardingConfig", "fsdp", self.fsdp, lo=1)

    @property
    def num_devices(self) -> int:
        return self.data * self.fsdp


def make_mesh(cfg: ShardingConfig, devices: list[Any] | None = None) -> Mesh | None:
    """A ``(data, fsdp)`` mesh over the first ``data * fsdp`` devices; None for one device."""
    if cfg.num_devices == 1:
        return None
    devices = list(devices if devices is not None else jax.devices())
    require(
        len(devices) >= cfg.num_devices,
        "ShardingConfig",
        expected=f"{cfg.num_devices} devices (data x fsdp)",
        received=f"{len(devices)} devices",
        fix="lower data/fsdp or, on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N",
    )
    grid = np.array(devices[: cfg.num_devices]).reshape(cfg.data, cfg.fsdp)
    return Mesh(grid, ("data", "fsdp"))


def param_spec(shape: tuple[int, ...], fsdp: int) -> P:
    """Shard the largest dimension divisible by ``fsdp`` over the fsdp axis."""
    if fsdp > 1:
        for d in sorted(range(len(shape)), key=lambda i: -shape[i]):
            if shape[d] % fsdp == 0:
                spec = [None] * len(shape)
                spec[d] = "fsdp"
                return P(*spec)
    return P()


def shard_params(mesh: Mesh | None, tree: Any) -> Any:
    if mesh is None:
        return tree
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(
        lambda x: jax.device_put(x, NamedSharding(mesh, param_spec(np.shape(x), fsdp))), tree
    )


def shard_batch(mesh: Mesh | None, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Place micro-batch arrays with their rows split over (data, fsdp)."""
    if mesh is None:
        return {k: jax.numpy.asarray(v) for k, v in arrays.items()}
    n = mesh.shape["data"] * mesh.shape["fsdp"]
    out = {}
    for k, v in arrays.items():
        require(
            not (v.shape[0] % n),
            "LearnerConfig.micro_batch_size",
            expected=f"a multiple of {n} (mesh devices)",
            received=v.shape[0],
            fix=f"use micro_batch_size divisible by {n}",
        )
        out[k] = jax.device_put(
            v, NamedSharding(mesh, P(("data", "fsdp"), *([None] * (v.ndim - 1))))
        )
    return out
