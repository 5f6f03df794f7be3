"""The trainer on a Ray cluster: the one place that builds env workers, the engine pool and learner
hosts from a :class:`~gymllm.train.train_config.TrainConfig` (``cluster.backend="ray"``).

    gymllm train --preset tiny --cluster.backend ray --cluster.env-workers 2 --cluster.engine-replicas 2
    gymllm train ... --cluster.backend ray --cluster.address auto --cluster.learner-hosts 2

:class:`RayComponents` implements :class:`gymllm.train.components.Components`, so the run (orchestrator,
checkpoints, resume, telemetry, run directory) stays in the driver and does not know where its parts
live:

- env workers: ``gymllm.make_vec(id, num_envs, backend="ray", ray_options=...)``: the sub-envs in
  ``cluster.env_workers`` actors (``env_num_cpus`` / ``env_resources`` each);
- engine replicas: ``cluster.engine_replicas`` :class:`~gymllm.inference.replica.ReplicaHost` actors
  behind one :class:`~gymllm.inference.pool.EnginePool` (the Engine protocol: routing, failover,
  one weight push through the object store);
- the learner: in the driver (``learner_hosts=0``) or in ``learner_hosts`` :class:`LearnerHost`
  actors (one per host: ``STRICT_SPREAD``), joined through ``jax.distributed``: host 0 picks the
  coordinator address on its own node and the driver hands it to every host
  (:func:`join_learner_hosts`); every host runs the same learner on the same groups and places its
  own rows (:mod:`gymllm.algos.multihost`), host 0's report is the run's. :class:`LearnerGroup` and
  :class:`GroupCheckpointer` give the run the learner's and checkpointer's interfaces.

A suite's mixture (``--env.suite``) on Ray: the ``env.num_envs`` sub-envs are
:class:`~gymllm.suites.training.SuiteSlotEnv` s in the env workers (:func:`mixture_on_ray`); the draw of
each group's env and the per-env figures stay in the driver's
:class:`~gymllm.suites.training.MixtureEnvs`.

``gymllm eval suite --eval.suite S --cluster.backend ray`` uses the same parts through :class:`SuiteOnRay`: each
policy's engine is ``cluster.engine_replicas`` replica actors behind one pool, each env of the suite
has its sub-envs in ``cluster.env_workers`` env actors (at most one per sub-env).

Ray is imported here only (through :mod:`gymllm.ray_support`); ``backend="none"`` never loads this module.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import pathlib
from typing import Any, Mapping

from gymllm.train.train_config import ClusterSection, ModelSection, TrainConfig
from gymllm.train.wiring import engine_config
from gymllm.errors import ConfigError, explain
from gymllm.validation import require

__all__ = [
    "RayComponents",
    "LearnerHost",
    "LearnerGroup",
    "GroupCheckpointer",
    "replica_spec",
    "env_ray_options",
    "actor_options",
    "join_learner_hosts",
    "connect",
    "mixture_on_ray",
    "SuiteOnRay",
]


def actor_options(
    num_cpus: float, resources: Mapping[str, float], num_gpus: float = 0.0
) -> dict[str, Any]:
    """Ray ``.options(...)`` for one actor: its CPUs, GPUs and custom resources."""
    out: dict[str, Any] = {"num_cpus": float(num_cpus)}
    if num_gpus:
        out["num_gpus"] = float(num_gpus)
    res = {k: float(v) for k, v in resources.items() if v}
    if res:
        out["resources"] = res
    return out


def env_ray_options(cluster: ClusterSection) -> dict[str, Any]:
    """The vector env's ``ray_options``: how many env-worker actors and what each reserves."""
    return {
        "num_workers": cluster.env_workers,
        **actor_options(cluster.env_num_cpus, cluster.env_resources),
    }


def local_demand(cluster: ClusterSection) -> tuple[int, dict[str, float]]:
    """CPUs and custom resources a local Ray (``cluster.address=None``) declares: this machine's CPUs,
    or more when the actors reserve more (they time-share the cores), plus every custom resource
    the actors ask for, so that a one-machine try of cluster mode never waits for a missing host."""
    import math
    import os

    c = cluster
    cpus = (
        c.env_workers * c.env_num_cpus
        + c.engine_replicas * c.engine_num_cpus
        + c.learner_hosts * c.learner_num_cpus
    )
    resources: dict[str, float] = collections.Counter()
    for n, res in (
        (c.env_workers, c.env_resources),
        (c.engine_replicas, c.engine_resources),
        (c.learner_hosts, c.learner_resources),
    ):
        for k, v in res.items():
            resources[k] += n * float(v)
    return max(os.cpu_count() or 1, math.ceil(cpus)), dict(resources)


def connect(cluster: ClusterSection, *, env_groups: int = 1) -> tuple[Any, bool]:
    """``(ray, connected_here)``: join ``cluster.address``, or start a local Ray on 127.0.0.1 that holds
    every actor asked for (:func:`local_demand`; ``env_groups`` vector envs of ``env_workers`` actors
    each); ``connected_here`` is False when this process was connected already."""
    from gymllm.ray_support import init_ray, require_ray

    ray = require_ray()
    connected_here = not ray.is_initialized()
    if connected_here and cluster.address is None:
        cpus, resources = local_demand(
            dataclasses.replace(cluster, env_workers=cluster.env_workers * max(1, env_groups))
        )
        return init_ray(None, num_cpus=cpus, resources=resources), connected_here
    return init_ray(cluster.address), connected_here


def tiny_kwargs(m: ModelSection) -> dict[str, Any]:
    """``gymllm.models.make_tiny`` keyword arguments of a ``tiny-<family>`` model section (the same
    seeded weights in every process)."""
    return {
        "family": m.name[len("tiny-") :],
        "seed": m.seed,
        "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size,
        "intermediate_size": m.intermediate_size,
        "num_layers": m.num_layers,
        "num_heads": m.num_heads,
        "num_kv_heads": m.num_kv_heads,
    }


def replica_spec(cfg: TrainConfig, version: int = 0) -> Any:
    """The :class:`~gymllm.inference.replica.ReplicaSpec` of one engine replica: the run's model
    (loaded on the replica's host) with the run's ``engine`` config, starting at ``version``
    (a resumed run pushes its weights right after)."""
    from gymllm.inference.replica import ReplicaSpec

    kw: dict[str, Any] = {
        "config": engine_config(cfg),
        "warmup": cfg.run.warmup,
        "version": int(version),
    }
    if cfg.model.is_tiny:
        return ReplicaSpec.jax(tiny=tiny_kwargs(cfg.model), **kw)
    return ReplicaSpec.jax(cfg.model.name, **kw)


class RayComponents:
    """:class:`~gymllm.train.components.Components` on Ray (see the module docstring). Connects on creation
    (joins ``cluster.address``, or starts a local Ray on 127.0.0.1) and disconnects on ``close`` if it
    connected."""

    def __init__(self, cluster: ClusterSection):
        self.cluster = cluster
        self.ray, self.connected_here = connect(cluster)
        self.pool: Any = None  # the EnginePool once built
        self.learner_group: LearnerGroup | None = None
        self.gather = False

    # ------------------------------------------------------------------ learner
    def make_learner(self, cfg: TrainConfig, lm: Any) -> Any:
        if self.cluster.learner_hosts == 0:
            from gymllm.train.components import LocalComponents

            local = LocalComponents()
            learner = local.make_learner(cfg, lm)
            self.gather = local.gather
            return learner
        self.learner_group = LearnerGroup.start(self.ray, cfg)
        return self.learner_group

    def make_checkpointer(self, cfg: TrainConfig, learner: Any) -> Any:
        if self.learner_group is None:
            from gymllm.algos.checkpoint import Checkpointer

            return Checkpointer(
                pathlib.Path(cfg.run.run_dir) / "checkpoints", max_to_keep=cfg.run.keep_checkpoints
            )
        return GroupCheckpointer(self.learner_group)

    # ------------------------------------------------------------------ engine
    def make_engine(self, cfg: TrainConfig, lm: Any, version: int) -> Any:
        from gymllm.inference.pool import EnginePool

        c = self.cluster
        self.pool = EnginePool.from_ray(
            replica_spec(cfg, version),
            num_replicas=c.engine_replicas,
            ray_options=actor_options(c.engine_num_cpus, c.engine_resources, c.engine_num_gpus),
        )
        return self.pool

    def make_pusher(self, cfg: TrainConfig, engine: Any, lm: Any, learner: Any) -> Any:
        return PoolPusher(engine, lm.config, gather=self.gather)

    # ------------------------------------------------------------------ envs
    def make_mixture(self, cfg: TrainConfig) -> Any:
        return mixture_on_ray(cfg, self.cluster)

    def make_envs(self, cfg: TrainConfig) -> Any:
        import gymllm

        return gymllm.make_vec(
            cfg.env.id,
            cfg.env.num_envs,
            backend="ray",
            ray_options=env_ray_options(self.cluster),
            **cfg.env.kwargs,
        )

    def close(self) -> None:
        """Stop the learner hosts; disconnect from Ray if this object connected."""
        if self.learner_group is not None:
            self.learner_group.shutdown()
            self.learner_group = None
        if self.connected_here and self.ray.is_initialized():
            self.ray.shutdown()


def mixture_on_ray(cfg: TrainConfig, cluster: ClusterSection) -> Any:
    """The env side of ``--env.suite`` on Ray: a :class:`~gymllm.suites.training.MixtureEnvs` over
    ``env.num_envs`` :class:`~gymllm.suites.training.SuiteSlotEnv` sub-envs in the env workers."""
    from gymllm.suites import load_suite
    from gymllm.suites.training import MixtureEnvs, mixture_vec

    suite = load_suite(cfg.env.suite)
    vec = mixture_vec(suite, cfg.env.num_envs, backend="ray", ray_options=env_ray_options(cluster))
    return MixtureEnvs(
        suite, num_envs=cfg.env.num_envs, seed=cfg.run.seed, curriculum=cfg.env.curriculum, vec=vec
    )


class SuiteOnRay:
    """Where ``gymllm eval suite --eval.suite S --cluster.backend ray`` runs its parts (see the module docstring):
    :meth:`engine` (a policy's :class:`~gymllm.inference.pool.EnginePool` of ``engine_replicas``
    replica actors, each built from ``spec`` on its host) and :meth:`make_vec` (an env's vector env,
    its sub-envs in ``env_workers`` Ray actors), the two hooks of
    :func:`gymllm.suites.runner.run_suite` (``PolicySpec.make_engine`` and ``make_vec``).

    ``num_envs``: the suite's envs (each runs its own env actors; a local Ray, ``address=None``, is
    sized for all of them). The learner options (``learner_hosts``) have no place in an evaluation."""

    def __init__(self, cluster: ClusterSection, *, num_envs: int = 1):
        require(
            cluster.backend == "ray" and not cluster.learner_hosts,
            "gymllm eval suite --cluster",
            expected="backend='ray' and learner_hosts=0 (an "
            "evaluation has engines and envs, no learner)",
            received={"backend": cluster.backend, "learner_hosts": cluster.learner_hosts},
            fix="pass --cluster.backend ray and drop --cluster.learner-hosts",
        )
        self.cluster = cluster
        self.ray, self.connected_here = connect(cluster, env_groups=num_envs)

    def engine(self, spec: Any) -> Any:
        """``engine_replicas`` replica actors of ``spec`` (a ReplicaSpec) behind one EnginePool."""
        from gymllm.inference.pool import EnginePool

        c = self.cluster
        return EnginePool.from_ray(
            spec,
            num_replicas=c.engine_replicas,
            ray_options=actor_options(c.engine_num_cpus, c.engine_resources, c.engine_num_gpus),
        )

    def make_vec(self, env: Any, num_envs: int) -> Any:
        """The vector env of ``num_envs`` sub-envs of suite env ``env`` (a SuiteEnv) on the env workers:
        built there from the suite table's id (a ``module:EnvId-v0``'s module is imported there) or factory."""
        import gymllm
        from gymllm.suites.resolve import make_env_for

        target = env.target if callable(env.target) else env.id
        options = {
            **env_ray_options(self.cluster),
            "num_workers": min(self.cluster.env_workers, int(num_envs)),
        }
        return gymllm.make_vec(
            functools.partial(make_env_for, target, dict(env.kwargs), max_turns=env.max_turns),
            int(num_envs),
            backend="ray",
            ray_options=options,
        )

    def close(self) -> None:
        """Disconnect from Ray if this object connected."""
        if self.connected_here and self.ray.is_initialized():
            self.ray.shutdown()


def _on_fresh_loop(coro: Any) -> Any:
    """Run ``coro`` to completion on a new event loop in a helper thread (callable from any thread,
    the run's event loop thread included)."""
    import asyncio
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gymllm-push-check") as ex:
        return ex.submit(asyncio.run, coro).result()


class PoolPusher:
    """The weight push to an :class:`~gymllm.inference.pool.EnginePool`: one ``update_weights`` (put
    once in the object store, fetched by every replica), then a wait until every live replica reports
    the new version (``replica_versions``), so the groups the new version admits are sampled by it on
    every replica (``eta = 0`` stays exact; a replica's calls need not run in submission order). A
    replica that dies meanwhile is left to the pool, which recreates it at the latest weights;
    ``landed_timeout_s`` bounds the wait (then the push counts as done, ``unconfirmed`` counts it)."""

    def __init__(
        self, pool: Any, model_config: Any, *, gather: bool = False, landed_timeout_s: float = 60.0
    ):
        from gymllm.algos.weight_sync import WeightPusher

        self.pool = pool
        self.weights = WeightPusher(pool, model_config, gather=gather)
        self.landed_timeout_s = landed_timeout_s
        self.unconfirmed = 0

    @property
    def pushes(self) -> int:
        return self.weights.pushes

    def push(self, flat: dict[str, Any], version: int) -> float:
        import time

        t = time.perf_counter()
        self.weights.push(flat, version)
        self.wait_landed(version)
        return time.perf_counter() - t

    def wait_landed(self, version: int) -> dict[str, int]:
        """Block until every live replica is at ``version`` (or the timeout); their versions."""
        import time

        deadline = time.monotonic() + self.landed_timeout_s
        versions: dict[str, int] = {}
        while time.monotonic() < deadline:
            try:
                versions = _on_fresh_loop(self.pool.replica_versions())
            except Exception as exc:  # noqa: BLE001 - classified: a lost replica is the pool's to recreate
                from gymllm.inference.pool import failure_kind

                if failure_kind(exc) != "death":
                    raise
                self.unconfirmed += (
                    1  # the pool recreates it at the latest weights; the others swapped
                )
                return {}
            if versions and all(v >= version for v in versions.values()):
                return versions
            time.sleep(0.01)
        self.unconfirmed += 1
        return versions


# ---------------------------------------------------------------------------------- learner hosts


class LearnerHost:
    """One learner process of a multi-host learner (a Ray actor; a plain class until made remote).

    Life: ``coordinator_address()`` (host 0 only) -> ``join(address)`` on every host at once (the
    ``jax.distributed`` rendezvous, before any other JAX call) -> ``build(cfg)`` -> ``submit`` /
    ``policy_params`` / ``save`` / ``restore_latest`` called on every host together (collectives)."""

    def __init__(self, index: int, num_hosts: int, local_devices: int = 0):
        self.index, self.num_hosts, self.local_devices = index, num_hosts, local_devices
        self.learner: Any = None
        self.ckpt: Any = None

    def coordinator_address(self) -> str:
        """``ip:port`` free on this actor's node (host 0's), for every host to join."""
        from gymllm.algos.multihost import free_coordinator_address
        from gymllm.ray_support import require_ray

        return free_coordinator_address(require_ray().util.get_node_ip_address())

    def join(self, address: str) -> dict[str, int]:
        """``jax.distributed.initialize`` as process ``index`` of ``num_hosts``; returns what JAX sees."""
        import jax

        from gymllm.algos.multihost import initialize_distributed

        initialize_distributed(
            address, self.num_hosts, self.index, local_devices=self.local_devices
        )
        return {
            "process_index": jax.process_index(),
            "process_count": jax.process_count(),
            "devices": len(jax.devices()),
            "local_devices": len(jax.local_devices()),
        }

    def build(self, cfg: TrainConfig) -> None:
        """The learner over every host's devices (``cfg.sharding``; default: data-parallel over all)."""
        import dataclasses

        import jax

        from gymllm.algos.checkpoint import Checkpointer
        from gymllm.train.wiring import learner_kwargs
        from gymllm.algos.learner import StreamingLearner
        from gymllm.train.components import load_model
        from gymllm.algos.sharding import make_mesh

        lm = load_model(cfg.model)
        sharding = cfg.sharding
        if (
            make_mesh(sharding) is None
        ):  # one device per the config: spread the batch over every host's devices
            sharding = dataclasses.replace(sharding, data=len(jax.devices()))
        self.learner = StreamingLearner(
            lm.config,
            lm.model.flat_params(),
            lora=cfg.lora,
            mesh=make_mesh(sharding),
            pad_id=int(lm.tokenizer.pad_token_id or 0),
            **learner_kwargs(cfg),
        )
        self.ckpt = Checkpointer(
            pathlib.Path(cfg.run.run_dir) / "checkpoints", max_to_keep=cfg.run.keep_checkpoints
        )

    def status(self) -> dict[str, Any]:
        """The bookkeeping the driver mirrors: version, consumed group ids, counts, groups in the step."""
        le = self.learner
        return {
            "version": le.version,
            "consumed_groups": sorted(le.consumed_groups),
            "counts": dict(le.counts),
            "groups_in_step": le.groups_in_step,
        }

    def submit(self, groups: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        reports = self.learner.submit(groups)
        return reports, self.status()

    def warmup(self, group_size: int | None = None) -> None:
        self.learner.warmup(group_size=group_size)

    def policy_params(self) -> dict[str, Any] | None:
        """The full policy weights as NumPy arrays on host 0 (gathered across hosts; None elsewhere)."""
        from gymllm.algos.multihost import gather

        flat = gather(self.learner.policy_params())
        return flat if self.index == 0 else None

    def save(self, step: int, extra: dict[str, Any]) -> None:
        self.ckpt.save(step, self.learner, extra=extra)

    def restore_latest(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        meta = self.ckpt.restore_latest(self.learner)
        return meta, self.status()

    def latest_step(self) -> int | None:
        return self.ckpt.latest_step()

    def close(self) -> None:
        if self.ckpt is not None:
            self.ckpt.close()


def join_learner_hosts(
    ray: Any, hosts: list[Any], timeout_s: float = 120.0
) -> list[dict[str, int]]:
    """The coordinator hand-off: host 0 picks ``ip:port`` on its node, every host joins it (together:
    ``jax.distributed.initialize`` waits for all). Returns each host's view (process index and count)."""
    address = ray.get(hosts[0].coordinator_address.remote(), timeout=timeout_s)
    return ray.get([h.join.remote(address) for h in hosts], timeout=timeout_s)


class LearnerGroup:
    """The run's learner when it lives on ``cluster.learner_hosts`` :class:`LearnerHost` actors: the
    :class:`~gymllm.algos.learner.StreamingLearner` interface the run uses, every call sent to every
    host (the same groups everywhere), host 0's answers returned and its bookkeeping mirrored here."""

    def __init__(self, ray: Any, hosts: list[Any], timeout_s: float = 600.0):
        self.ray, self.hosts, self.timeout_s = ray, hosts, timeout_s
        self.version = 0
        self.consumed_groups: set[str] = set()
        self.counts: collections.Counter = collections.Counter()
        self.groups_in_step = 0

    @classmethod
    def start(cls, ray: Any, cfg: TrainConfig) -> "LearnerGroup":
        """Start one host actor per node (``STRICT_SPREAD``), hand off the coordinator, build the learners."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        c = cfg.cluster
        opts = actor_options(c.learner_num_cpus, c.learner_resources, c.learner_num_gpus)
        bundle = {
            "CPU": opts["num_cpus"],
            **({"GPU": opts["num_gpus"]} if "num_gpus" in opts else {}),
            **opts.get("resources", {}),
        }
        pg = placement_group(
            [dict(bundle) for _ in range(c.learner_hosts)], strategy="STRICT_SPREAD"
        )
        try:
            ray.get(pg.ready(), timeout=120)
        except Exception as exc:
            ray.util.remove_placement_group(pg)
            raise ConfigError(
                explain(
                    "cluster.learner_hosts",
                    expected=f"{c.learner_hosts} nodes with {bundle} free "
                    "each (one learner host per node)",
                    received=f"{len(ray.nodes())} nodes",
                    fix="lower --cluster.learner-hosts or add hosts (ray start --address=...)",
                )
            ) from exc
        actor = ray.remote(LearnerHost)
        hosts = [
            actor.options(
                **opts,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=i
                ),
            ).remote(i, c.learner_hosts, c.learner_local_devices)
            for i in range(c.learner_hosts)
        ]
        group = cls(ray, hosts)
        group.placement_group = pg
        join_learner_hosts(ray, hosts)
        group.all("build", cfg)
        return group

    def all(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every host at once; their answers in host order."""
        return self.ray.get(
            [getattr(h, method).remote(*args) for h in self.hosts], timeout=self.timeout_s
        )

    def mirror(self, status: dict[str, Any]) -> None:
        self.version = int(status["version"])
        self.consumed_groups = set(status["consumed_groups"])
        self.counts = collections.Counter(status["counts"])
        self.groups_in_step = int(status["groups_in_step"])

    @property
    def step(self) -> int:
        return self.version

    def submit(self, groups: Any) -> list[Any]:
        groups = list(groups)
        resume_skipped = self.counts.get("resume_skipped", 0)  # counted by the run, here only
        reports, status = self.all("submit", groups)[0]
        self.mirror(status)
        self.counts["resume_skipped"] = resume_skipped
        return reports

    def warmup(self, group_size: int | None = None) -> None:
        self.all("warmup", group_size)

    def policy_params(self) -> dict[str, Any]:
        return self.all("policy_params")[0]

    def shutdown(self) -> None:
        try:
            self.all("close")
        finally:
            for h in self.hosts:
                self.ray.kill(h)
            pg = getattr(self, "placement_group", None)
            if pg is not None:
                self.ray.util.remove_placement_group(pg)


class GroupCheckpointer:
    """The run's checkpointer for a :class:`LearnerGroup`: every host saves and restores its own
    shards into the run directory's ``checkpoints/`` (Orbax multi-process), together."""

    def __init__(self, group: LearnerGroup):
        self.group = group

    def save(self, step: int, learner: Any, *, extra: dict[str, Any] | None = None) -> None:
        self.group.all("save", step, dict(extra or {}))

    def restore_latest(self, learner: Any) -> dict[str, Any] | None:
        meta, status = self.group.all("restore_latest")[0]
        self.group.mirror(status)
        return meta

    def latest_step(self) -> int | None:
        return self.group.all("latest_step")[0]

    def close(self) -> None:
        pass
