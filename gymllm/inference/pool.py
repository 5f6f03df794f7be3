"""EnginePool: the Engine protocol over N engine replicas (in process, Ray actors or remote servers).

    pool = EnginePool([engine_a, engine_b])                                   # in-process engines
    pool = EnginePool.from_ray(ReplicaSpec.jax("smollm2-135m-instruct", config=cfg), num_replicas=4,
                               ray_options={"num_gpus": 1})                   # one JaxEngine actor per GPU
    pool = EnginePool.from_urls(["http://10.0.0.7:8000", "http://10.0.0.8:8000"], model="policy")
    completion = await pool.generate(prompt_ids, params, session_id="traj-7")
    completion.replica, completion.retried                                   # who served it; a retry?
    pool.update_weights(state, version=3)                                     # every replica, no drain

Routing: a session's turns (same ``session_id``) stay on the replica that served its first turn
(that replica holds its cached prefix); a new session, or a request without one, goes to the
least-loaded live replica: the fewest queued plus running tokens (prompt + max_tokens of each
request the pool has in flight there; ties: fewer requests in flight, then replica order).

Failures: an attempt that fails because its replica died (a Ray actor or node lost, a connection
refused or reset, no answer within ``request_timeout_s``) or failed inside it (an engine step
raised: an EngineError subclass such as ``RequestFailed``) is retried on another live replica, up to
``max_retries`` times; the Completion says so (``retried=True``, ``replica`` = the one that served
it), so the caller can tell a trajectory's turn was sampled again rather than twice: the failed
attempt never returned, nothing of it reached the env. Bad input (ConfigError, a plain EngineError
from validation, TypeError, ValueError) is raised at once. A dead replica leaves the routing: its
sessions are re-homed (their next turn goes to the least-loaded replica, which prefills it anew),
and it is recreated (a Ray actor, or an in-process host built from a spec) with the pool's current
weights, so it rejoins at the latest version; a bare engine object (no spec to rebuild it from) is
tried again after ``revive_after_s``.

Weights: ``update_weights(state, version)`` hands in-process replicas the state itself (no copy);
for Ray replicas it puts the state once into the object store (``ray.put``, arrays on the host) and
passes the ObjectRef to every actor, each fetching it on its node. Replicas swap between decode
steps (no drain); every token keeps the version of the forward that sampled it
(``Completion.versions``). ``state`` may also be a :class:`~gymllm.inference.replica.WeightUpdate`
(``apply_to(engine, version)``): e.g. LoRA adapters only, applied by the ``LoraReceiver`` that the
replica spec's ``setup`` attached. The pool keeps the latest update for recreated replicas.

Telemetry: span "generate" per attempt and "restart" per recreation on track ``engine/<replica>``,
counter "load_tokens" there; span "weight_push" on track ``engine/pool``.

Parts, one job each: :class:`EnginePool` (the Engine protocol: attempts, retries, inspection),
:class:`~gymllm.inference.pool_routing.Router` (which replica serves a request; the session homes;
:mod:`gymllm.inference.pool_routing`, with :class:`~gymllm.inference.pool_routing.PoolConfig`) and
:class:`Supervisor` (the replicas kept serving at the latest weights: pushes, failures, restarts,
closing).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Mapping, Sequence

from gymllm.errors import ConfigError, EngineError, explain
from gymllm.validation import require
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams
from gymllm.inference.pool_routing import PoolConfig, ReplicaSlot, Router
from gymllm.inference.replica import LocalReplica, RayReplica, ReplicaSpec, WeightUpdate
from gymllm.telemetry import counter, span

__all__ = ["EnginePool", "ReplicaDied", "failure_kind"]


class ReplicaDied(EngineError):
    """A replica is gone (its process, node or server); the pool retries its requests elsewhere."""


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, the cause a Ray task error carries, and their ``raise ... from`` causes."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is o for o in out):
            continue
        out.append(e)
        cause = getattr(e, "cause", None)  # a Ray task error's original exception
        todo += [cause if isinstance(cause, BaseException) else None, e.__cause__]
    return out


def failure_kind(exc: BaseException) -> str:
    """ "death" (the replica is gone: retry elsewhere and recreate it), "request" (it failed this request:
    retry elsewhere) or "input" (the caller's mistake: raise)."""
    ray_exc = sys.modules.get("ray.exceptions")
    httpx = sys.modules.get("httpx")
    dead: tuple[type, ...] = (ReplicaDied, OSError, asyncio.TimeoutError)
    if ray_exc is not None:
        dead += tuple(
            getattr(ray_exc, n)
            for n in (
                "RayActorError",
                "WorkerCrashedError",
                "NodeDiedError",
                "ObjectLostError",
                "OwnerDiedError",
                "RaySystemError",
            )
            if hasattr(ray_exc, n)
        )
    if httpx is not None:
        dead += (httpx.TransportError,)
    links = _chain(exc)
    if any(isinstance(e, dead) for e in links):
        return "death"
    task_error = getattr(ray_exc, "RayTaskError", ()) if ray_exc is not None else ()
    if any(
        isinstance(e, EngineError) and type(e) is not EngineError and not isinstance(e, task_error)
        for e in links
    ):  # e.g. RequestFailed: an engine step raised while serving it
        return "request"
    return "input"


class Supervisor:
    """Keeps a pool's replicas serving at the latest weights: pushes each weight update to every replica
    (and remembers it for recreated ones), takes a replica that died out of the routing (its sessions
    re-homed) and recreates it when it can be rebuilt, and waits for a restart while every replica is
    down. Closing it stops the restarts and closes the replicas."""

    def __init__(
        self, slots: list[ReplicaSlot], router: Router, config: PoolConfig, version: int = 0
    ):
        self.slots, self.router, self.config = slots, router, config
        self.latest: tuple[Any, Any, int] | None = (
            None  # the newest (update, its ObjectRef or None, version)
        )
        self.version = version
        self.closed = False

    def push(self, state: Any, version: int) -> None:
        """``EnginePool.update_weights``: ``state`` at ``version`` to every replica not being rebuilt."""
        rays = [s for s in self.slots if isinstance(s.replica, RayReplica)]
        with span("weight_push", track="engine/pool", version=version, replicas=len(self.slots)):
            ref = None
            if rays:
                ref = rays[0].replica.ray.put(
                    _host_arrays(state)
                )  # put once; every actor fetches it
            for s in self.slots:
                if s.restarting is not None:
                    continue  # it rejoins with the latest update when built
                try:
                    s.replica.push(ref if isinstance(s.replica, RayReplica) else state, version)
                except Exception as exc:  # noqa: BLE001 - a failed replica is recreated at the latest version
                    if failure_kind(exc) == "input":
                        raise
                    s.last_error = f"weight push: {type(exc).__name__}: {exc}"
            self.latest = (state, ref, version)
            self.version = version

    async def settle(self) -> None:
        """``EnginePool.settle``: every push sent so far reached every live replica."""
        live = [s for s in self.slots if not s.down]
        for s, r in zip(
            live, await asyncio.gather(*(s.replica.settle() for s in live), return_exceptions=True)
        ):
            if isinstance(r, BaseException):
                s.last_error = f"weight push: {type(r).__name__}: {str(r)[:300]}"

    async def pick(self, session_id: str | None, tried: list[int]) -> ReplicaSlot:
        """The router's choice; while every replica is down, wait for a restart (``start_timeout_s``)."""
        deadline = time.monotonic() + self.config.start_timeout_s
        while (slot := self.router.choose(session_id, tried)) is None:
            pending = [s.restarting for s in self.slots if s.restarting is not None]
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                raise ReplicaDied(
                    explain(
                        "EnginePool",
                        expected="a live replica",
                        received=[f"{s.name}: {s.last_error}" for s in self.slots],
                        fix="restart the replicas' hosts or servers",
                    )
                )
            await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        return slot

    def failed(self, slot: ReplicaSlot, exc: BaseException, kind: str) -> None:
        """Record an attempt's failure on ``slot``; a death takes it out of the routing and restarts it."""
        slot.failures += 1
        slot.last_error = f"{type(exc).__name__}: {str(exc)[:300]}"
        if kind != "death" or slot.down:
            return
        slot.down, slot.down_since = True, time.monotonic()
        self.router.evict(slot)  # its sessions are re-homed on their next turn
        if self.config.restart and slot.replica.can_restart and not self.closed:
            slot.restarting = asyncio.get_running_loop().create_task(
                self.restart(slot), name=f"restart-{slot.name}"
            )

    async def restart(self, slot: ReplicaSlot) -> None:
        """Recreate ``slot``'s replica at the latest weights; it rejoins the routing when built."""
        try:
            while not self.closed:
                latest = self.latest
                update, version = _update_for(slot, latest)
                try:
                    with span("restart", track=slot.track, version=version):
                        info = await asyncio.wait_for(
                            slot.replica.restart(update, version), self.config.start_timeout_s
                        )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the replacement failed too: try again
                    slot.last_error = f"restart: {type(exc).__name__}: {str(exc)[:300]}"
                    await asyncio.sleep(1.0)
                    continue
                if self.latest is not latest:  # a push landed while it was being built
                    slot.replica.push(*_update_for(slot, self.latest))
                slot.max_len = info.get("max_len", slot.max_len)
                slot.restarts += 1
                slot.down = False
                return
        finally:
            slot.restarting = None

    async def close(self) -> None:
        """Stop pending restarts and close every replica. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for s in self.slots:
            if s.restarting is not None:
                s.restarting.cancel()
        await asyncio.gather(*(s.replica.close() for s in self.slots), return_exceptions=True)


class EnginePool:
    """Implements the :class:`~gymllm.inference.Engine` protocol over replicas (module docstring): the
    request path (routing, attempts, retries) and inspection; its :class:`Supervisor` (``pool.supervisor``)
    keeps the replicas serving at the latest weights."""

    #: ``update_weights`` takes :class:`WeightUpdate` objects (the trainer's LoRA push sends adapters only)
    takes_weight_updates = True

    def __init__(
        self,
        engines: Sequence[Any],
        *,
        config: PoolConfig | None = None,
        names: Sequence[str] | None = None,
    ):
        """``engines``: Engine objects in this process, or replica handles (``LocalReplica`` /
        ``RayReplica``; what the ``from_*`` constructors pass)."""
        self.config = config or PoolConfig()
        engines = list(engines)
        require(
            bool(engines),
            "EnginePool(engines)",
            expected="at least one engine or replica",
            received=[],
            fix="pass [engine] or use EnginePool.from_ray(spec, num_replicas=N)",
        )
        names = (
            list(names)
            if names is not None
            else [getattr(e, "name", None) or f"r{i}" for i, e in enumerate(engines)]
        )
        require(
            len(names) == len(engines) and len(set(names)) == len(names),
            "EnginePool(names)",
            expected=f"{len(engines)} distinct names",
            received=names,
            fix="pass one distinct name per replica or none",
        )
        self._slots = [
            ReplicaSlot(i, e if isinstance(e, (LocalReplica, RayReplica)) else LocalReplica(n, e))
            for i, (e, n) in enumerate(zip(engines, names))
        ]
        self.router = Router(self._slots, self.config)
        self.supervisor = Supervisor(
            self._slots,
            self.router,
            self.config,
            version=max(
                (
                    int(getattr(s.replica.engine, "version", 0))
                    for s in self._slots
                    if isinstance(s.replica, LocalReplica)
                ),
                default=0,
            ),
        )
        self.retries = 0
        for s in self._slots:
            if isinstance(s.replica, LocalReplica):
                m = getattr(s.replica.engine, "max_len", None)
                s.max_len = m if isinstance(m, int) else None

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_ray(
        cls,
        spec: ReplicaSpec | Sequence[ReplicaSpec],
        *,
        num_replicas: int | None = None,
        ray_options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        config: PoolConfig | None = None,
        names: Sequence[str] | None = None,
    ) -> "EnginePool":
        """``num_replicas`` host actors built from ``spec`` (or one per spec), each with ``ray_options``
        (one mapping for all, or one per replica). Connects to Ray first if needed (``init_ray``).
        Blocks until every replica is built (``config.start_timeout_s``)."""
        from gymllm.ray_support import init_ray

        specs = [spec] * (num_replicas or 1) if isinstance(spec, ReplicaSpec) else list(spec)
        require(
            bool((num_replicas is None or len(specs) == num_replicas) and specs),
            "EnginePool.from_ray",
            expected="one spec and num_replicas >= 1, or a list of specs",
            received={"specs": len(specs), "num_replicas": num_replicas},
            fix="pass EnginePool.from_ray(spec, num_replicas=2)",
        )
        opts = (
            [dict(ray_options or {})] * len(specs)
            if not isinstance(ray_options, Sequence)
            else list(ray_options)
        )
        names = list(names) if names is not None else [f"r{i}" for i in range(len(specs))]
        require(
            len(opts) == len(specs) and len(names) == len(specs),
            "EnginePool.from_ray(ray_options / names)",
            expected=f"{len(specs)} entries",
            received={"ray_options": len(opts), "names": len(names)},
            fix="pass one mapping for every replica, or one per replica",
        )
        ray = init_ray()
        pool = cls([RayReplica(n, s, o) for n, s, o in zip(names, specs, opts)], config=config)
        infos = ray.get(
            [s.replica.actor.info.remote() for s in pool._slots],
            timeout=pool.config.start_timeout_s,
        )
        for s, info in zip(pool._slots, infos):
            s.max_len = info["max_len"]
        pool.supervisor.version = max(int(i["version"]) for i in infos)
        return pool

    @classmethod
    def from_specs(
        cls,
        specs: Sequence[ReplicaSpec],
        *,
        config: PoolConfig | None = None,
        names: Sequence[str] | None = None,
    ) -> "EnginePool":
        """In-process hosts built from ``specs`` here (the plain twin of :meth:`from_ray`; rebuilt when they fail)."""
        names = list(names) if names is not None else [f"r{i}" for i in range(len(specs))]
        return cls([LocalReplica(n, spec=s) for n, s in zip(names, specs)], config=config)

    @classmethod
    def from_urls(
        cls,
        urls: Sequence[str],
        *,
        model: str,
        config: PoolConfig | None = None,
        **client_kwargs: Any,
    ) -> "EnginePool":
        """One OpenAIClientEngine per OpenAI-compatible server (weights are pushed to them out of band)."""
        from gymllm.inference.client import OpenAIClientEngine

        return cls([OpenAIClientEngine(u, model, **client_kwargs) for u in urls], config=config)

    # ------------------------------------------------------------------ the Engine protocol
    @property
    def version(self) -> int:
        """The newest version pushed (tokens sampled from now on carry it once each replica swapped)."""
        return self.supervisor.version

    @property
    def max_len(self) -> int | None:
        """The smallest context length among the replicas that report one (None: none does)."""
        known = [s.max_len for s in self._slots if s.max_len is not None]
        return min(known) if known else None

    @property
    def names(self) -> list[str]:
        return [s.name for s in self._slots]

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        session_id: str | None = None,
    ) -> Completion:
        """One completion from the session's replica (or the least-loaded one), retried elsewhere if
        its replica fails; ``Completion.replica`` / ``.retried`` say where and whether."""
        params = params or SamplingParams()
        cost = len(prompt_ids) + params.max_tokens

        async def call(slot: ReplicaSlot) -> Completion:
            return await slot.replica.generate(prompt_ids, params, session_id)

        out = await self._attempts(call, cost, session_id)
        return out

    async def generate_n(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        """``params.n`` completions of one prompt on one replica (the least-loaded), retried as one."""
        cost = (len(prompt_ids) + params.max_tokens) * params.n

        async def call(slot: ReplicaSlot) -> list[Completion]:
            return await slot.replica.generate_n(prompt_ids, params)

        return await self._attempts(call, cost, None)

    def end_session(self, session_id: str) -> None:
        """Forget a session's home and unpin its cached prefix there."""
        slot = self.router.forget(session_id)
        if slot is not None and not slot.down:
            try:
                slot.replica.end_session(session_id)
            except Exception:  # noqa: BLE001 - freeing a cache is best effort; a dead replica has none
                pass

    def update_weights(self, state: Any, version: int) -> None:
        """Push ``state`` at ``version`` to every replica (module docstring); returns without draining.
        Thread-safe with respect to the replicas (each engine queues the swap)."""
        self.supervisor.push(state, int(version))

    async def close(self) -> None:
        """Close every replica and stop pending restarts. Idempotent."""
        await self.supervisor.close()

    # ------------------------------------------------------------------ inspection
    async def settle(self) -> None:
        """Wait until every weight push sent so far has reached every live replica (their engines queued
        the swap, applied between two decode steps); a replica's push error is recorded there."""
        await self.supervisor.settle()

    async def replica_versions(self) -> dict[str, int]:
        """Each live replica's engine version once the pushes sent so far landed (a queued swap counts)."""
        await self.settle()
        live = [s for s in self._slots if not s.down]
        infos = await asyncio.gather(*(s.replica.info() for s in live))
        return {s.name: int(i["version"]) for s, i in zip(live, infos)}

    async def replica_info(self) -> dict[str, dict[str, Any]]:
        """``info()`` of each live replica: name, pid, Ray node id, version, max_len."""
        live = [s for s in self._slots if not s.down]
        return {
            s.name: i for s, i in zip(live, await asyncio.gather(*(s.replica.info() for s in live)))
        }

    def stats(self) -> list[dict[str, Any]]:
        """Per replica: load, requests in flight and served, failures, restarts, whether it is down."""
        homes = self.router.homes()
        return [
            {
                "name": s.name,
                "kind": s.replica.kind,
                "down": s.down,
                "load_tokens": s.load_tokens,
                "inflight": s.inflight,
                "served": s.served,
                "failures": s.failures,
                "restarts": s.restarts,
                "sessions": homes[s.index],
                "last_error": s.last_error,
            }
            for s in self._slots
        ]

    def replica(self, name: str) -> Any:
        """The handle of replica ``name`` (``LocalReplica``: ``.engine``; ``RayReplica``: ``.actor``)."""
        for s in self._slots:
            if s.name == name:
                return s.replica
        raise ConfigError(
            explain(
                "EnginePool.replica",
                expected=f"one of {self.names}",
                received=name,
                fix="use a name from pool.names",
            )
        )

    def home_of(self, session_id: str) -> str | None:
        """The replica a session's turns go to (None: no home yet, or re-homed after a failure)."""
        slot = self.router.home_of(session_id)
        return None if slot is None else slot.name

    # ------------------------------------------------------------------ routing and recovery
    async def _attempts(self, call: Any, cost: int, session_id: str | None) -> Any:
        if self.supervisor.closed:
            raise EngineError(
                "generate: expected an open pool, received a closed one. Fix: build a new EnginePool."
            )
        tried: list[int] = []
        errors: list[str] = []
        for attempt in range(self.config.max_retries + 1):
            slot = await self.supervisor.pick(session_id, tried)
            slot.load_tokens += cost
            slot.inflight += 1
            counter("load_tokens", slot.load_tokens, track=slot.track)
            try:
                with span(
                    "generate", track=slot.track, session=session_id, attempt=attempt, cost=cost
                ):
                    out = await asyncio.wait_for(call(slot), self.config.request_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                kind = failure_kind(exc)
                if kind == "input":
                    raise
                errors.append(f"{slot.name}: {type(exc).__name__}: {str(exc)[:200]}")
                self.supervisor.failed(slot, exc, kind)
                tried.append(slot.index)
                continue
            finally:
                slot.load_tokens -= cost
                slot.inflight -= 1
            slot.served += 1
            for c in out if isinstance(out, list) else [out]:
                c.replica, c.retried = slot.name, attempt > 0
            if attempt:
                self.retries += 1
            return out
        raise ReplicaDied(
            explain(
                "EnginePool.generate",
                expected="a replica that serves the request",
                received=errors,
                fix="check the replicas' logs; raise PoolConfig.max_retries or add replicas",
            )
        )


def _host_arrays(state: Any) -> Any:
    """``state`` with JAX arrays brought to host numpy (what the object store holds zero-copy);
    a :class:`WeightUpdate` or a non-JAX state as it is."""
    jax = sys.modules.get("jax")
    if state is None or isinstance(state, WeightUpdate) or jax is None:
        return state
    return jax.device_get(state)


def _update_for(slot: ReplicaSlot, latest: tuple[Any, Any, int] | None) -> tuple[Any, int | None]:
    """What a replica is handed of the latest push: the ObjectRef on Ray, the state in process."""
    if latest is None:
        return None, None
    state, ref, version = latest
    return (ref if isinstance(slot.replica, RayReplica) else state), version
