"""The vector env's Ray backend: sub-envs live in Ray actors, one env or a shard of envs per actor.

    vec = gymllm.make_vec("gymllm/Latency-v0", 64, backend="ray")     # placed to fit the cluster
    vec = gymllm.make_vec("gymllm/Latency-v0", 64, backend="ray",
                          ray_options={"num_workers": 8, "num_cpus": 1, "resources": {"sandbox": 1}})

Placement: what ``ray_options`` leaves unset is fitted to the cluster found at build time
(:func:`plan_placement`): with no options, one actor per sub-env holding an equal share of the
free CPUs (at most 1 each), so 6 sub-envs start on a 3-CPU cluster (0.5 CPU each) as Ray's own
actors would; past ``ACTORS_PER_CPU`` actors per cluster CPU, several sub-envs share an actor.
Explicit ``num_workers`` / ``envs_per_actor`` / ``num_cpus`` / ``resources`` are kept as given; a
demand beyond the cluster's total resources is refused at once with a :class:`ConfigError`.

Every contract of the in-process vector env holds (:mod:`gymllm.vector.vector_env`): the three
autoreset modes (SAME_STEP's reset runs inside the actor), per-env seeds, the async twins,
``step_timeout``, ``on_error``. :class:`RayRunner` is the sub-env runner:

- ``send`` makes one actor call per sub-env op; an actor is threaded (``max_concurrency``), so
  the sub-envs of one shard run concurrently and a slow one holds back none of its neighbours
  (they share the actor's process, so CPU-bound Python envs share its GIL). Each call's object
  ref hands its result to the vector env's ledger as soon as it completes
  (``ObjectRef.future()``: the core worker's completion callback, the mechanism under
  ``ray.wait``), so ``recv(min_ready)`` returns the first envs to finish and nothing waits for
  the slowest env or actor, on any host.
- A dead actor (killed process, lost node: ``RayActorError``) is a failure of each sub-env it
  hosts, and of no other: with one sub-env per actor (the default while the cluster holds that
  many actors) a crash takes down exactly that env; in a shard it takes down every env of the
  shard. Their in-flight ops come back as :class:`~gymllm.errors.EnvError` in ``infos["error"]``
  (obs None, truncated True), the shard's idle envs report the loss on their next step, the
  other actors keep running, and the first reset of one of its envs recreates the actor (its
  other envs are reset onto it by their own next reset).
- ``step_timeout`` abandons a stuck op: a single-env actor is killed and recreated on the next
  reset; in a larger shard the env is rebuilt inside the actor on its next reset (the stuck
  call keeps one of the actor's spare threads until it returns).
- Env factories travel to the actors pickled (cloudpickle): env ids with kwargs (what
  ``gymllm.make_vec`` builds) always do; a factory that does not pickle is refused with a
  :class:`~gymllm.errors.ConfigError` naming it.

:class:`EnvShard` is the actor's plain-Python twin (the same logic, testable without Ray);
the actor class is ``ray.remote(EnvShard)``, made on first use so that importing this module
needs no Ray. Ray is started (or joined) through :func:`gymllm.ray_support.init_ray` when this
process is not connected yet: ``ray_options["address"]`` (None: a local Ray on 127.0.0.1).

``benchmarks/ray_env_overhead.py`` measures this backend's per-env-step overhead.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gymllm.errors import ConfigError, EnvError, explain
from gymllm.ray_support import init_ray, require_ray
from gymllm.vector.autoreset import run_op
from gymllm.vector.config import RayOptions, VectorEnvConfig
from gymllm.vector.ledger import Ledger, Op, Result, Slot, error_result, failure_result
from gymllm.vector.process import picklable_error
from gymllm.vector.runners import (
    SubEnvRunner,
    action_validator,
    close_quietly,
    creation_error,
    step_function,
)

__all__ = ["EnvShard", "RayRunner", "RayEnvHandle", "Placement", "plan_placement", "ACTORS_PER_CPU"]

#: The most env actors (worker processes) a fitted placement makes per CPU of the cluster.
ACTORS_PER_CPU = 4


@dataclasses.dataclass(frozen=True)
class Placement:
    """How a Ray vector env lays out its sub-envs: ``envs_per_actor`` contiguous sub-envs in each of
    ``num_actors`` actors, each reserving ``num_cpus`` CPUs (and the options' ``resources``)."""

    envs_per_actor: int
    num_actors: int
    num_cpus: float


def plan_placement(
    num_envs: int,
    options: RayOptions,
    total: Mapping[str, float],
    available: Mapping[str, float],
    nodes: int = 1,
) -> Placement:
    """The placement of ``num_envs`` sub-envs on a cluster with ``total`` / ``available`` resources
    (``ray.cluster_resources()`` / ``ray.available_resources()``).

    What ``options`` sets is kept. When it sets neither ``num_workers`` nor ``envs_per_actor``, each
    sub-env gets its own actor (per-env failure isolation) unless that is more actors than the
    cluster can hold: at most ``ACTORS_PER_CPU`` per cluster CPU, at most ``available / num_cpus``
    with explicit ``num_cpus``, at most as many as each custom resource in ``resources`` allows;
    then the sub-envs are split into the fewest equal shards that fit. When ``num_cpus`` is None,
    each actor reserves an equal share of the available CPUs, at most 1 (rounded down to Ray's
    1e-4 granularity; 0 when none is free), made small enough to fit whatever the free CPUs' split
    over ``nodes`` hosts: each host wastes less than one share, so ``available / (actors + nodes - 1)``
    fits every actor. A demand that cannot fit at all is left for
    :meth:`RayRunner.check_fits` to refuse.
    """
    size = options.shard_size(num_envs)
    if size is None:
        cap = max(1, math.floor(total.get("CPU", 0.0) * ACTORS_PER_CPU + 1e-9))
        if options.num_cpus:
            cap = min(cap, max(1, math.floor(available.get("CPU", 0.0) / options.num_cpus + 1e-9)))
        for name, amount in options.resources.items():
            fits = [math.floor(have.get(name, 0.0) / amount + 1e-9) for have in (available, total)]
            cap = min(cap, max(1, fits[0] or fits[1]))  # none free now: one actor waits for one
        size = -(-num_envs // min(cap, num_envs))
    actors = -(-num_envs // size)
    cpus = options.num_cpus
    if cpus is None:
        share = max(available.get("CPU", 0.0), 0.0) / (actors + max(1, nodes) - 1)
        cpus = min(1.0, math.floor(share * 1e4) / 1e4)
    return Placement(envs_per_actor=size, num_actors=actors, num_cpus=float(cpus))


# One actor call's work item: (index in the shard, op, action, seed, options, rebuild).
ShardOp = tuple[int, str, Any, Any, Any, bool]


class EnvShard:
    """A shard of sub-envs (the Ray actor's logic, as plain Python).

    Args:
        env_fns: the shard's env factories (picklable zero-argument callables).
        first_env_id: the vector env id of ``env_fns[0]`` (for error messages).

    Envs are built by :meth:`start` or lazily by the first op that needs them; :meth:`run` executes
    a list of ops and returns one outcome per op: ``("ok", (obs, reward, terminated, truncated,
    info))`` or ``("err", exception)`` (never raises for an env's failure).
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], first_env_id: int = 0):
        self.env_fns = list(env_fns)
        self.first_env_id = first_env_id
        self.envs: list[Any] = [None] * len(self.env_fns)
        self.steps: list[Callable[[Any], tuple] | None] = [None] * len(self.env_fns)

    def build(self, j: int) -> Any:
        old, self.envs[j] = self.envs[j], None
        if old is not None:
            close_quietly([old])
        env = self.env_fns[j]()
        self.envs[j], self.steps[j] = env, step_function(env)
        return env

    def start(self) -> tuple[str, Any]:
        """Build every env: ``("ok", [(observation_space, action_space, metadata), ...])`` or
        ``("err", (env_id, exception))`` for the first factory that raised."""
        for j in range(len(self.env_fns)):
            try:
                self.build(j)
            except Exception as e:  # noqa: BLE001 - reported to the driver, which names the env
                return "err", (self.first_env_id + j, picklable_error(e))
        return "ok", [
            (env.observation_space, env.action_space, dict(getattr(env, "metadata", {}) or {}))
            for env in self.envs
        ]

    def run(self, ops: Sequence[ShardOp]) -> list[tuple[str, Any]]:
        """Run each op in order; one ``("ok", 5-tuple)`` / ``("err", exception)`` per op."""
        out = []
        for j, op, action, seed, options, rebuild in ops:
            try:
                env = self.build(j) if rebuild or self.envs[j] is None else self.envs[j]
                if op == "step":
                    out.append(("ok", tuple(self.steps[j](action))))
                else:
                    out.append(("ok", run_op(env, op, action, seed, options, self.steps[j])))
            except Exception as e:  # noqa: BLE001 - the env's failure, reported per env
                out.append(("err", picklable_error(e)))
        return out

    def where(self) -> dict[str, Any]:
        """``{"node_id": Ray node id hex or None, "pid": process id}`` of the process hosting the shard."""
        node_id = None
        try:
            ray = require_ray()
            if ray.is_initialized():
                node_id = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - outside Ray the twin has no node
            pass
        return {"node_id": node_id, "pid": os.getpid()}

    def close(self) -> None:
        close_quietly(self.envs)
        self.envs = [None] * len(self.envs)


@functools.cache
def _actor_class() -> Any:
    return require_ray().remote(EnvShard)


@dataclasses.dataclass(eq=False)
class RayEnvHandle:
    """What ``vec.envs[i]`` is with the Ray backend: the sub-env's spaces and where it lives."""

    env_id: int
    shard: int
    observation_space: Any
    action_space: Any
    metadata: dict

    @property
    def unwrapped(self) -> "RayEnvHandle":
        return self


@dataclasses.dataclass(eq=False)
class _Shard:
    index: int
    env_ids: list[int]
    actor: Any = None
    epoch: int = 0  # bumped each time the actor is (re)created
    dead: bool = False
    unplaced: bool = False  # the recreated actor was not placed within ready_timeout_s


_DEATHS: tuple[type, ...] | None = None


def _death_types() -> tuple[type, ...]:
    global _DEATHS
    if _DEATHS is None:
        ex = require_ray().exceptions
        _DEATHS = (ex.RayActorError, ex.WorkerCrashedError, ex.NodeDiedError, ex.ObjectLostError)
    return _DEATHS


class RayRunner(SubEnvRunner):
    """``backend="ray"``: shards of sub-envs in Ray actors (see the module docstring)."""

    def __init__(self, config: VectorEnvConfig, ledger: Ledger):
        super().__init__(config, ledger)
        self.options: RayOptions = config.ray_options or RayOptions()
        self.ray = require_ray()
        if not self.ray.is_initialized():
            init_ray(self.options.address)
        n = len(ledger.slots)
        hosts = sum(
            1
            for node in self.ray.nodes()
            if node.get("Alive") and node.get("Resources", {}).get("CPU")
        )
        self.placement = plan_placement(
            n,
            self.options,
            self.ray.cluster_resources(),
            self.ray.available_resources(),
            nodes=hosts,
        )
        size = self.placement.envs_per_actor
        self.shards = [
            _Shard(k, list(range(lo, min(lo + size, n)))) for k, lo in enumerate(range(0, n, size))
        ]
        self.shard_of = [sh for sh in self.shards for _ in sh.env_ids]
        self.env_epoch = [0] * n  # the shard's epoch when the env was last reset
        self.lock = threading.Lock()  # guards shard.actor / epoch / dead
        self.factories: list[Callable[[], Any]] = []

    # ------------------------------------------------------------------ building
    def build(self) -> None:
        slots = self.ledger.slots
        self.factories = [s.make for s in slots]
        self.check_picklable()
        self.check_fits()
        for sh in self.shards:
            sh.actor = self.new_actor(sh)
        refs = [sh.actor.start.remote() for sh in self.shards]
        timeout = self.options.ready_timeout_s
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(ready) < len(refs):
            self.kill_all()
            raise ConfigError(
                explain(
                    "VectorEnv(backend='ray')",
                    expected=f"{len(refs)} env actors placed and built "
                    f"within ready_timeout_s={timeout}",
                    received=f"{len(ready)} ready",
                    fix="check that the cluster has the actors' num_cpus / resources free "
                    f"({self.actor_demand()}), or raise ray_options['ready_timeout_s']",
                )
            )
        try:
            answers = self.ray.get(refs)
        except Exception as e:
            self.kill_all()
            raise EnvError(
                f"VectorEnv(backend='ray'): an env actor failed to start: {type(e).__name__}: {e}. Fix: "
                "check the env factories on their own",
                cause=e,
            ) from e
        for sh, (status, payload) in zip(self.shards, answers):
            if status == "err":
                self.kill_all()
                env_id, exc = payload
                raise creation_error(env_id, exc) from exc
            for env_id, (obs_space, act_space, meta) in zip(sh.env_ids, payload):
                slot = slots[env_id]
                slot.env = RayEnvHandle(env_id, sh.index, obs_space, act_space, meta)
                slot.kind = "ray"
                slot.check = action_validator(act_space)

    def check_picklable(self) -> None:
        dumps = self.ray.cloudpickle.dumps
        for i, fn in enumerate(self.factories):
            try:
                dumps(fn)
            except Exception as e:  # noqa: BLE001 - named in the error below
                raise ConfigError(
                    explain(
                        f"VectorEnv(backend='ray') env factory {i}",
                        expected="a picklable env factory (it runs in a Ray actor)",
                        received=f"{fn!r}: {type(e).__name__}: {e}",
                        fix="pass env ids and kwargs to gymllm.make_vec, or a module-level class / "
                        "functools.partial of one",
                    )
                ) from e

    def actor_demand(self) -> dict[str, float]:
        return {"CPU": self.placement.num_cpus, **self.options.resources}

    def check_fits(self) -> None:
        """Refuse at once an actor that no cluster could place (more than the cluster holds in total)."""
        total = self.ray.cluster_resources()
        need = {k: v * len(self.shards) for k, v in self.actor_demand().items() if v > 0}
        short = {k: (v, total.get(k, 0.0)) for k, v in need.items() if v > total.get(k, 0.0) + 1e-9}
        if short:
            raise ConfigError(
                explain(
                    "VectorEnv(backend='ray')",
                    expected=f"{len(self.shards)} env actors of "
                    f"{self.actor_demand()} each on this cluster",
                    received={k: f"need {v}, cluster has {h}" for k, (v, h) in short.items()},
                    fix="lower ray_options['num_cpus'] (or leave it unset: fitted to the cluster), "
                    "use fewer actors (num_workers / envs_per_actor) or add nodes with those "
                    "resources",
                )
            )

    def new_actor(self, sh: _Shard) -> Any:
        # one thread per env, as many spares for ops abandoned past step_timeout, one for where/close
        opts: dict[str, Any] = {
            "num_cpus": self.placement.num_cpus,
            "max_concurrency": 2 * len(sh.env_ids) + 1,
        }
        if self.options.resources:
            opts["resources"] = dict(self.options.resources)
        if self.options.name_prefix is not None:
            opts["name"] = f"{self.options.name_prefix}{sh.index}-{sh.epoch}"
        fns = [self.factories[i] for i in sh.env_ids]
        return _actor_class().options(**opts).remote(fns, sh.env_ids[0])

    # ------------------------------------------------------------------ running
    def dispatch(self, ops: list[Op], caller_loop: Any = None) -> None:
        groups: dict[int, list[Op]] = {}
        failed: list[tuple[Slot, int, str, Result]] = []
        for item in ops:
            groups.setdefault(self.shard_of[item.slot.env_id].index, []).append(item)
        for k, items in groups.items():
            sh = self.shards[k]
            with self.lock:
                fresh = sh.dead and any(it.op == "reset" for it in items)
                if fresh:
                    self.recreate(sh)
                epoch, actor, dead = sh.epoch, sh.actor, sh.dead
            if fresh and self.config.step_timeout is not None:
                self.allow_placement(items)
            for it in items:  # one call per op: each env's result comes back on its own
                env_id = it.slot.env_id
                if it.op == "reset":
                    self.env_epoch[env_id] = epoch
                elif dead or self.env_epoch[env_id] != epoch:
                    failed.append(
                        (
                            it.slot,
                            it.gen,
                            it.op,
                            failure_result(env_id, self.lost_error(env_id, dead)),
                        )
                    )
                    continue
                try:
                    j = env_id - sh.env_ids[0]
                    ref = actor.run.remote([(j, it.op, it.action, it.seed, it.options, it.rebuild)])
                except Exception as e:  # noqa: BLE001 - e.g. an action or option that does not pickle
                    failed.append((it.slot, it.gen, it.op, error_result(env_id, it.op, e)))
                    continue
                ref.future().add_done_callback(functools.partial(self.on_done, sh, epoch, [it]))
        if failed:
            self.ledger.finish_many(failed)

    def allow_placement(self, items: list[Op]) -> None:
        """Ops on a just-recreated actor get ``ready_timeout_s`` more than ``step_timeout`` (a new
        worker process must start and build the envs first)."""
        with self.ledger.cond:
            for it in items:
                if it.slot.gen == it.gen and it.slot.pending:
                    it.slot.deadline += self.options.ready_timeout_s

    def on_done(self, sh: _Shard, epoch: int, calls: list[Op], fut: Any) -> None:
        """An actor call completed (on Ray's callback thread): hand its results to the ledger."""
        try:
            outs = fut.result()
        except BaseException as e:  # noqa: BLE001 - the actor died, or the call failed as a whole
            death = isinstance(e, _death_types())
            if death:
                with self.lock:
                    if sh.epoch == epoch:
                        sh.dead = True
            done = []
            for it in calls:
                if death and sh.unplaced and sh.epoch == epoch:
                    err = EnvError(
                        explain(
                            f"sub-env {it.slot.env_id}",
                            expected="its recreated Ray actor placed "
                            f"within ready_timeout_s={self.options.ready_timeout_s}",
                            received=f"no node with {self.actor_demand()} free",
                            fix="add a node with those resources (a lost host?); the env is tried "
                            "again on its next reset",
                        ),
                        env_id=it.slot.env_id,
                        cause=e,
                    )
                    done.append((it.slot, it.gen, it.op, failure_result(it.slot.env_id, err)))
                elif death:
                    err = EnvError(
                        f"sub-env {it.slot.env_id}: its Ray actor died ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}). Fix: nothing to do; the actor is "
                        "recreated and the env reset on its next reset (autoreset: its next send)",
                        env_id=it.slot.env_id,
                        cause=e,
                    )
                    done.append((it.slot, it.gen, it.op, failure_result(it.slot.env_id, err)))
                else:
                    done.append((it.slot, it.gen, it.op, error_result(it.slot.env_id, it.op, e)))
            self.ledger.finish_many(done)
            return
        done = []
        for it, (status, payload) in zip(calls, outs):
            env_id = it.slot.env_id
            res = (
                Result(env_id, *payload) if status == "ok" else error_result(env_id, it.op, payload)
            )
            done.append((it.slot, it.gen, it.op, res))
        self.ledger.finish_many(done)

    def lost_error(self, env_id: int, dead: bool) -> EnvError:
        what = (
            "its Ray actor died"
            if dead
            else "its Ray actor was recreated since this env's last reset"
        )
        return EnvError(
            f"sub-env {env_id}: {what}, so its episode is gone. Fix: reset it (autoreset: its next send "
            "resets it)",
            env_id=env_id,
        )

    def recreate(self, sh: _Shard) -> None:
        """A fresh actor for a dead shard (``self.lock`` held); its envs are built on first use."""
        old = sh.actor
        sh.epoch += 1
        sh.actor = self.new_actor(sh)
        sh.dead = sh.unplaced = False
        if old is not None:
            self.kill_later([old])
        self.watch_placement(sh, sh.epoch, sh.actor.where.remote())

    def watch_placement(self, sh: _Shard, epoch: int, probe: Any) -> None:
        """Kill a recreated actor that is not up within ``ready_timeout_s`` (no node has its resources
        any more: a lost host), so that its queued ops fail instead of waiting forever."""

        def check() -> None:
            ready, _ = self.ray.wait([probe], timeout=0)
            if ready:
                return
            with self.lock:
                if sh.epoch != epoch:
                    return
                sh.unplaced = True
                actor = sh.actor
            self.kill_later([actor])

        timer = threading.Timer(self.options.ready_timeout_s, check)
        timer.daemon = True
        timer.start()

    def abandon(self, slot: Slot) -> None:
        sh = self.shard_of[slot.env_id]
        if len(sh.env_ids) == 1:  # free its CPU: the actor is recreated on the next reset
            with self.lock:
                sh.dead = True
                actor = sh.actor
            self.kill_later([actor])
        # in a larger shard the stuck env is rebuilt in the actor on its next reset (slot.lost)

    def kill_later(self, actors: list[Any]) -> None:
        """``ray.kill`` each actor from a helper thread (never under the ledger's lock)."""

        def kill() -> None:
            for a in actors:
                try:
                    self.ray.kill(a, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass

        threading.Thread(target=kill, daemon=True, name="gymllm-ray-kill").start()

    def kill_all(self) -> None:
        for sh in self.shards:
            if sh.actor is not None:
                try:
                    self.ray.kill(sh.actor, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass

    # ------------------------------------------------------------------ inspecting and closing
    def actor_for(self, env_id: int) -> Any:
        """The Ray actor handle that hosts sub-env ``env_id`` now."""
        return self.shard_of[env_id].actor

    def where(self, env_id: int, timeout: float = 10.0) -> dict[str, Any]:
        """``{"node_id", "pid"}`` of the actor hosting sub-env ``env_id``."""
        return self.ray.get(self.actor_for(env_id).where.remote(), timeout=timeout)

    def describe(self, slot: Slot) -> dict[str, Any]:
        sh = self.shard_of[slot.env_id]
        return {
            "backend": "ray",
            "kind": slot.kind,
            "shard": sh.index,
            "epoch": sh.epoch,
            "dead": sh.dead,
        }

    def close(self, idle: list[Slot], busy: list[Slot]) -> None:
        alive = [sh.actor for sh in self.shards if sh.actor is not None and not sh.dead]
        try:
            refs = [a.close.remote() for a in alive]
            self.ray.wait(refs, num_returns=len(refs), timeout=2.0)
        except Exception:  # noqa: BLE001 - close() must always return
            pass
        self.kill_all()
