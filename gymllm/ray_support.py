"""The one place gymllm starts or joins Ray (a base layer: the vector env's Ray backend, the engine pool's
replicas and the trainer's cluster mode all come here).

- :func:`require_ray` imports Ray or raises :class:`~gymllm.errors.MissingExtraError` naming the extra.
- :func:`init_ray` joins a running cluster (``address="auto"`` or ``"host:port"``) or starts a local
  one bound to 127.0.0.1; a no-op when this process is already connected.
- :class:`LocalCluster` starts a real multi-node cluster on this machine (``ray.cluster_utils.Cluster``,
  every node on the loopback address, checked through ``ray.nodes()``) for tests, benchmarks and a try
  of cluster mode on one machine; nodes can be added and removed (a lost host).

Importing this module sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` and ``RAY_USAGE_STATS_ENABLED=0``
in ``os.environ`` where they are unset (import it before ``ray``); nothing else in gymllm does.

Usage statistics: Ray reports them to an outside server unless ``RAY_USAGE_STATS_ENABLED=0``. Every
Ray that gymllm starts gets ``RAY_USAGE_STATS_ENABLED=0`` unless the user set the variable already
(set it to 1 to turn reporting back on).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from gymllm.errors import ConfigError, MissingExtraError, explain

__all__ = ["require_ray", "init_ray", "LocalCluster", "LOOPBACK"]

LOOPBACK = "127.0.0.1"


def _quiet_env() -> None:
    """Environment every Ray process gymllm starts inherits: no usage reporting, nodes on 127.0.0.1.

    Ray picks a node's address when ``ray._private.ray_constants`` is imported: with
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` it takes the loopback address (on Linux too), which keeps
    a local cluster's traffic on 127.0.0.1.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def _check_loopback_binding() -> None:
    """A local Ray must bind 127.0.0.1; that is fixed when Ray's constants were first imported."""
    import ray._private.ray_constants as constants  # noqa: PLC2701 - Ray's own switch, read only

    if constants.ENABLE_RAY_CLUSTER:
        raise ConfigError(
            explain(
                "a local Ray",
                expected="nodes bound to 127.0.0.1",
                received="Ray imported before gymllm set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0",
                fix="export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (or import gymllm.ray_support "
                "before ray), or join a running cluster with address='auto'",
            )
        )


def require_ray() -> Any:
    """Return the ``ray`` module, or raise :class:`MissingExtraError` (``pip install 'gymllm[ray]'``)."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - exercised where ray is absent
        raise MissingExtraError("ray", "ray") from exc
    return ray


def init_ray(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    resources: Mapping[str, float] | None = None,
    namespace: str | None = None,
) -> Any:
    """Connect this process to Ray and return the module.

    ``address=None`` starts a local single-node Ray bound to 127.0.0.1 (``num_cpus`` and custom
    ``resources`` as given); ``"auto"`` or ``"host:port"`` joins a running cluster (started with
    ``ray start --head``). Already connected: returns at once (the arguments are not checked against
    the running cluster).
    """
    _quiet_env()
    ray = require_ray()
    if ray.is_initialized():
        return ray
    if address is None:
        _check_loopback_binding()
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "namespace": namespace,
    }
    if address is None:
        kwargs.update(address="local", num_cpus=num_cpus, resources=dict(resources or {}))
    elif num_cpus is not None or resources:
        raise ConfigError(
            explain(
                "init_ray",
                expected="num_cpus / resources only for a local Ray (address=None)",
                received={"address": address, "num_cpus": num_cpus, "resources": resources},
                fix="declare resources on `ray start --resources=...` for a running cluster",
            )
        )
    else:
        kwargs["address"] = address
    ray.init(**kwargs)
    return ray


class LocalCluster:
    """A real multi-node Ray cluster on this machine, every node on 127.0.0.1 (not ``local_mode``).

        with LocalCluster([{"num_cpus": 1}, {"num_cpus": 1, "resources": {"sandbox": 1}}]) as cluster:
            ...                      # this process is connected (ray.init(address=cluster.address))
            cluster.remove_node(cluster.nodes[1])   # a lost host

    Each node spec holds ``ray start`` keyword arguments (``num_cpus``, ``resources``, ...); the first
    is the head. Each node is its own raylet process; actors on a removed node die with it.
    """

    def __init__(
        self, nodes: Sequence[Mapping[str, Any]] = ({"num_cpus": 1},), *, connect: bool = True
    ):
        if not nodes:
            raise ConfigError(
                explain(
                    "LocalCluster(nodes)",
                    expected="at least one node spec (the head)",
                    received=list(nodes),
                    fix="pass e.g. [{'num_cpus': 1}]",
                )
            )
        _quiet_env()
        require_ray()
        _check_loopback_binding()
        from ray.cluster_utils import Cluster

        self._specs = [dict(n) for n in nodes]
        self._cluster = Cluster(initialize_head=True, head_node_args=self._specs[0])
        self.nodes: list[Any] = [self._cluster.head_node]
        for spec in self._specs[1:]:
            self.nodes.append(self._cluster.add_node(**spec))
        self._connected = False
        if connect:
            self.connect()

    @property
    def address(self) -> str:
        """The head's ``host:port`` (what ``ray.init(address=...)`` and ``--cluster.address`` take)."""
        return self._cluster.address

    def connect(self) -> Any:
        """Connect this process (the driver) and check that every node is on the loopback address."""
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        self._connected = True
        self._cluster.wait_for_nodes()
        off = [
            n["NodeManagerAddress"]
            for n in ray.nodes()
            if n["Alive"] and n["NodeManagerAddress"] != LOOPBACK
        ]
        if off:
            self.shutdown()
            raise ConfigError(
                explain(
                    "LocalCluster",
                    expected=f"every node on {LOOPBACK}",
                    received=off,
                    fix="set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported",
                )
            )
        return ray

    def add_node(self, **spec: Any) -> Any:
        """Start one more node (a new host joining); returns its handle."""
        node = self._cluster.add_node(**spec)
        self.nodes.append(node)
        if self._connected:
            self._cluster.wait_for_nodes()
        return node

    def remove_node(self, node: Any) -> None:
        """Kill one node's processes (a lost host): its actors die and its tasks fail."""
        self._cluster.remove_node(node, allow_graceful=False)
        self.nodes.remove(node)

    def node_id(self, node: Any) -> str:
        """The Ray node id (hex) of a node handle, for scheduling strategies and ``ray.nodes()``."""
        return node.node_id

    def shutdown(self) -> None:
        """Disconnect this process and stop every node. Idempotent."""
        ray = require_ray()
        if ray.is_initialized():
            ray.shutdown()
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None  # type: ignore[assignment]
        self._connected = False

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


_quiet_env()  # before anything imports ray's constants (see _quiet_env)
