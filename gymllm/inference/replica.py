"""Engine replicas: one engine built from a picklable :class:`ReplicaSpec`, hosted by a :class:`ReplicaHost`.

    spec = ReplicaSpec.jax("smollm2-135m-instruct", config=EngineConfig(num_slots=32))
    spec = ReplicaSpec.jax(tiny={"family": "llama", "seed": 0}, config=EngineConfig(num_slots=8, max_len=64))
    spec = ReplicaSpec.vllm("Qwen/Qwen2.5-0.5B-Instruct", gpu_memory_utilization=0.5)
    spec = ReplicaSpec.openai("http://10.0.0.7:8000", "policy")      # a remote OpenAI-compatible server
    spec = ReplicaSpec(factory=my_module.build_engine)                # any picklable zero-argument callable

    host = ReplicaHost(spec, name="r0")          # the plain-Python host: builds and serves one engine
    actor = remote_host_class(ray).options(num_cpus=1).remote(spec, "r0")   # the same class as a Ray actor

A spec is data (frozen, keyword-only, validated, picklable): it travels to a Ray actor, which builds
its engine there, on its own host and device. :class:`ReplicaHost` is one class with two lives: in
process (the pool's plain twin, what tests drive without Ray) and as a Ray actor (``ray.remote`` of the
same class, made only when needed, as RLlib makes its env runners remote). Its methods are the
Engine protocol plus ``info`` (name, node, pid, version, max_len) for the pool.

Weight updates arrive as ``update_weights(update, version)`` where ``update`` is

* the new state (an ``nnx.State`` for a JaxEngine, Hugging Face named tensors for a VllmEngine,
  ``None`` for an OpenAI-compatible server whose weights are pushed out of band), handed to the
  engine's own ``update_weights``; on Ray the pool puts it once into the object store and passes
  the ObjectRef to every actor, which Ray resolves on the actor's node (one fetch per node);
* or an object with ``apply_to(engine, version)`` (a :class:`WeightUpdate`): e.g. a LoRA push
  that hands only the adapters to the ``LoraReceiver`` the spec's ``setup`` attached
  (``gymllm.inference.lora_receiver``; this layer cannot import it, the update object brings the code).

``setup(engine, loaded)``: a picklable callable run once after the engine is built (``loaded``: the
``gymllm.models`` LoadedModel for a JAX spec, else None); the place to attach a LoRA receiver.
A host built with ``update`` and ``version`` applies that update right after setup: how a recreated
replica rejoins at the pool's current weight version.

The pool drives replicas through two handles with one interface (``generate``, ``generate_n``,
``end_session``, ``push``, ``restart``, ``info``, ``close``): :class:`LocalReplica` (an engine object in
this process, or a host built here from a spec, which can be rebuilt) and :class:`RayReplica` (a host
actor; recreated by the pool when it dies, on whatever node its ``ray_options`` allow).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams
from gymllm.validation import field_error, require, require_instance

KINDS = ("jax", "vllm", "openai", "factory")


@runtime_checkable
class WeightUpdate(Protocol):
    """A weight update that knows how to land on one replica's engine (e.g. LoRA adapters only:
    ``gymllm.inference.lora_receiver.LoraUpdate``). ``model``: the model the replica built its engine
    from (its weights are the frozen base of a LoRA run), or None for an engine handed in as an object."""

    def apply_to(self, engine: Any, version: int, model: Any = None) -> None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicaSpec:
    """How to build one replica's engine (see the module docstring; use the class methods).

    kind            "jax" (JaxEngine), "vllm" (VllmEngine), "openai" (OpenAIClientEngine) or "factory".
    model           jax: a ``gymllm.models.load`` name or path; vllm: a Hugging Face checkpoint; openai:
                    the served model name.
    tiny            jax: ``gymllm.models.make_tiny`` keyword arguments, instead of ``model``.
    config          jax: the EngineConfig (None: the engine's default).
    engine_kwargs   more keyword arguments of the engine's constructor (jax: stop_token_ids,
                    decode_chunk, ...; vllm: engine args; openai: api_key, timeout, ...).
    base_url        openai: the server's address.
    factory         factory: a picklable zero-argument callable returning an Engine.
    setup           a picklable ``setup(engine, loaded)`` run once after the build (None: nothing).
    warmup          jax: compile every engine shape before serving (``JaxEngine.warmup``).
    """

    kind: str = "factory"
    model: str | None = None
    tiny: Mapping[str, Any] | None = None
    config: Any = None
    engine_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    base_url: str | None = None
    factory: Callable[[], Any] | None = None
    setup: Callable[[Any, Any], None] | None = None
    warmup: bool = False

    def __post_init__(self) -> None:
        def need(ok: bool, field: str, expected: str, fix: str) -> None:
            if not ok:
                raise field_error(self, field, expected, fix, what=f"ReplicaSpec.{field}")

        need(
            self.kind in KINDS,
            "kind",
            f"one of {KINDS}",
            "build specs with ReplicaSpec.jax/.vllm/.openai(...)",
        )
        need(
            isinstance(self.engine_kwargs, Mapping),
            "engine_kwargs",
            "a mapping of constructor keyword arguments",
            "pass e.g. engine_kwargs={'stop_token_ids': ()}",
        )
        need(
            self.setup is None or callable(self.setup),
            "setup",
            "None or a callable(engine, loaded)",
            "pass a module-level function (it must pickle)",
        )
        if self.kind == "jax":
            need(
                (self.model is None) != (self.tiny is None),
                "model",
                "exactly one of model= or tiny=",
                "pass ReplicaSpec.jax('smollm2-135m-instruct') or ReplicaSpec.jax(tiny={'family': 'llama'})",
            )
            need(
                self.tiny is None or isinstance(self.tiny, Mapping),
                "tiny",
                "None or make_tiny keyword arguments",
                "pass e.g. tiny={'family': 'llama', 'seed': 0}",
            )
        elif self.kind == "vllm":
            need(
                isinstance(self.model, str) and bool(self.model),
                "model",
                "a checkpoint path or hub id",
                "pass ReplicaSpec.vllm('Qwen/Qwen2.5-0.5B-Instruct')",
            )
        elif self.kind == "openai":
            need(
                isinstance(self.base_url, str)
                and self.base_url.startswith(("http://", "https://")),
                "base_url",
                "an http(s) URL",
                "pass ReplicaSpec.openai('http://127.0.0.1:8000', 'policy')",
            )
            need(
                isinstance(self.model, str) and bool(self.model),
                "model",
                "the served model name",
                "pass the name the server lists on /v1/models",
            )
        else:
            need(
                callable(self.factory),
                "factory",
                "a zero-argument callable returning an Engine",
                "pass ReplicaSpec(factory=build_engine) or use ReplicaSpec.jax/.vllm/.openai",
            )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def jax(
        cls,
        model: str | None = None,
        *,
        tiny: Mapping[str, Any] | None = None,
        config: Any = None,
        setup: Callable[[Any, Any], None] | None = None,
        warmup: bool = False,
        **engine_kwargs: Any,
    ) -> "ReplicaSpec":
        """A JaxEngine over ``gymllm.models.load(model)`` or ``make_tiny(**tiny)``."""
        return cls(
            kind="jax",
            model=model,
            tiny=None if tiny is None else dict(tiny),
            config=config,
            setup=setup,
            warmup=warmup,
            engine_kwargs=engine_kwargs,
        )

    @classmethod
    def vllm(
        cls, model: str, *, setup: Callable[[Any, Any], None] | None = None, **engine_args: Any
    ) -> "ReplicaSpec":
        """A VllmEngine over ``model`` (optional extra ``gymllm[vllm]``, on the replica's host)."""
        return cls(kind="vllm", model=model, setup=setup, engine_kwargs=engine_args)

    @classmethod
    def openai(cls, base_url: str, model: str, **client_kwargs: Any) -> "ReplicaSpec":
        """An OpenAIClientEngine to a running OpenAI-compatible server."""
        return cls(kind="openai", base_url=base_url, model=model, engine_kwargs=client_kwargs)

    # ------------------------------------------------------------------ building
    def build(self) -> tuple[Any, Any]:
        """Build the engine here; returns ``(engine, loaded)`` (``loaded``: the LoadedModel of a JAX spec)."""
        loaded = None
        if self.kind == "jax":
            from gymllm.inference.jax_engine import JaxEngine
            from gymllm.models import load, make_tiny

            loaded = make_tiny(**dict(self.tiny)) if self.tiny is not None else load(self.model)
            engine = JaxEngine.from_loaded(loaded, config=self.config, **dict(self.engine_kwargs))
            if self.warmup:
                engine.warmup()
        elif self.kind == "vllm":
            from gymllm.inference.vllm_engine import VllmEngine

            engine = VllmEngine(self.model, **dict(self.engine_kwargs))
        elif self.kind == "openai":
            from gymllm.inference.client import OpenAIClientEngine

            engine = OpenAIClientEngine(self.base_url, self.model, **dict(self.engine_kwargs))
        else:
            engine = self.factory()
        if self.setup is not None:
            self.setup(engine, loaded)
        return engine, loaded


def apply_update(engine: Any, update: Any, version: int, model: Any = None) -> None:
    """Land one weight update on ``engine``: ``update.apply_to(engine, version, model)`` when it has one,
    else the engine's own ``update_weights(update, version)``."""
    if isinstance(update, WeightUpdate):
        update.apply_to(engine, int(version), model)
    else:
        engine.update_weights(update, int(version))


class EngineCalls:
    """The request calls a replica forwards to the engine it holds (``self.engine``)."""

    engine: Any

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, session_id: str | None = None
    ) -> Completion:
        return await self.engine.generate(prompt_ids, params, session_id=session_id)

    async def generate_n(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        return list(await self.engine.generate_n(prompt_ids, params))

    def end_session(self, session_id: str) -> None:
        end = getattr(self.engine, "end_session", None)
        if end is not None:
            end(session_id)


class ReplicaHost(EngineCalls):
    """Hosts one engine built from a :class:`ReplicaSpec`: in process, or as a Ray actor (same class).

    ``update`` at ``version`` (when ``version`` is not None) is applied after the build: a recreated
    replica rejoins at the pool's current version (on Ray ``update`` is passed as an ObjectRef, a
    top-level argument, which Ray resolves on the actor's node).
    """

    def __init__(
        self, spec: ReplicaSpec, name: str, update: Any = None, version: int | None = None
    ):
        require_instance(
            spec,
            ReplicaSpec,
            "ReplicaHost(spec)",
            expected="a ReplicaSpec",
            fix="pass ReplicaSpec.jax(...), .vllm(...), .openai(...) or ReplicaSpec(factory=...)",
        )
        self.name = name
        self.spec = spec
        self.engine, self.loaded = spec.build()
        self._holds = contextlib.ExitStack()
        self.model = getattr(
            self.loaded, "model", None
        )  # what the engine was built from (a LoRA base)
        if version is not None:
            apply_update(self.engine, update, version, self.model)

    @property
    def version(self) -> int:
        return int(self.engine.version)

    def update_weights(self, update: Any, version: int) -> int:
        """Apply ``update`` at ``version`` (queued by the engine between decode steps); returns the
        engine's version afterwards."""
        apply_update(self.engine, update, version, self.model)
        return self.version

    def hold(self) -> bool:
        """Hold the engine between two steps (``JaxEngine.paused``): requests queue, nothing is sampled
        until :meth:`release`; for an operator draining a host, and tests that force an interleaving.
        False (and nothing held) for an engine without ``paused``."""
        paused = getattr(self.engine, "paused", None)
        if paused is None:
            return False
        self._holds.enter_context(paused())
        return True

    def release(self) -> None:
        """End every :meth:`hold`."""
        self._holds.close()

    def info(self) -> dict[str, Any]:
        """Where and what this replica is: name, pid, Ray node id (None in process), version, max_len."""
        node = None
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:  # pragma: no cover - in-process hosts without ray
            pass
        max_len = getattr(self.engine, "max_len", None)
        return {
            "name": self.name,
            "pid": os.getpid(),
            "node_id": node,
            "version": self.version,
            "max_len": max_len if isinstance(max_len, int) else None,
        }

    async def close(self) -> None:
        self.release()
        await self.engine.close()


class LocalReplica(EngineCalls):
    """An in-process replica: ``engine`` (any Engine object; not rebuilt after a failure) or a
    :class:`ReplicaHost` built here from ``spec`` (rebuilt by :meth:`restart`)."""

    kind = "local"

    def __init__(self, name: str, engine: Any = None, *, spec: ReplicaSpec | None = None):
        require(
            (engine is None) != (spec is None),
            "LocalReplica",
            expected="exactly one of engine= or spec=",
            received={"engine": type(engine).__name__, "spec": spec},
            fix="pass an engine object or a ReplicaSpec",
        )
        self.name = name
        self.spec = spec
        self.engine, self.model = (engine, None) if engine is not None else self._build(None, None)

    def _build(self, update: Any, version: int | None) -> tuple[Any, Any]:
        host = ReplicaHost(self.spec, self.name, update, version)
        return host.engine, host.model

    @property
    def can_restart(self) -> bool:
        return self.spec is not None

    def push(self, update: Any, version: int) -> None:
        apply_update(self.engine, update, version, self.model)

    async def settle(self) -> None:
        """Pushes land synchronously in process: nothing to wait for."""

    async def restart(self, update: Any, version: int | None) -> dict[str, Any]:
        """Rebuild the engine from the spec (off the event loop: it may compile), at ``version``."""
        import asyncio

        old = self.engine
        try:
            await asyncio.wait_for(old.close(), 30.0)
        except Exception:  # noqa: BLE001 - the old engine failed already; its close may fail too
            pass
        self.engine, self.model = await asyncio.to_thread(self._build, update, version)
        return await self.info()

    async def info(self) -> dict[str, Any]:
        max_len = getattr(self.engine, "max_len", None)
        return {
            "name": self.name,
            "pid": os.getpid(),
            "node_id": None,
            "version": int(self.engine.version),
            "max_len": max_len if isinstance(max_len, int) else None,
        }

    async def close(self) -> None:
        await self.engine.close()


class RayReplica:
    """A :class:`ReplicaHost` actor (``ray_options``: ``.options(...)`` of the actor: num_cpus, num_gpus,
    resources, scheduling_strategy, runtime_env...). Ray does not restart it (``max_restarts=0``): the
    pool recreates it with the current weights, so it rejoins at the pool's version."""

    kind = "ray"
    can_restart = True

    def __init__(
        self,
        name: str,
        spec: ReplicaSpec,
        ray_options: Mapping[str, Any] | None = None,
        *,
        update: Any = None,
        version: int | None = None,
    ):
        from gymllm.ray_support import require_ray

        self.ray = require_ray()
        self.name = name
        self.spec = spec
        require(
            dict(ray_options or {}).get("max_restarts", 0) == 0,
            "RayReplica(ray_options)",
            expected="no max_restarts (the pool recreates a "
            "dead replica with the current weights; Ray would restart it with the first ones)",
            received=dict(ray_options or {}),
            fix="drop max_restarts from ray_options",
        )
        self.options = {"max_restarts": 0, "max_task_retries": 0, **dict(ray_options or {})}
        self.pending: list[Any] = []  # ObjectRefs of pushes not yet awaited
        self.actor = self._spawn(update, version)

    def _spawn(self, update: Any, version: int | None) -> Any:
        cls = remote_host_class(self.ray).options(**self.options)
        return cls.remote(self.spec, self.name, update, version)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, session_id: str | None
    ) -> Completion:
        return await self._await(
            self.actor.generate.remote(list(map(int, prompt_ids)), params, session_id)
        )

    async def generate_n(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        return await self._await(self.actor.generate_n.remote(list(map(int, prompt_ids)), params))

    async def _await(self, ref: Any) -> Any:
        import asyncio

        try:
            return await ref
        except (
            asyncio.CancelledError
        ):  # the caller gave up (or the pool's watchdog): abort it there too
            try:
                self.ray.cancel(ref)
            except Exception:  # noqa: BLE001 - the actor is gone already
                pass
            raise

    def end_session(self, session_id: str) -> None:
        self.actor.end_session.remote(
            session_id
        )  # fire and forget: a dead actor has no prefix to free

    def push(self, update: Any, version: int) -> None:
        """``update``: an ObjectRef (put once by the pool); the actor fetches it on its node. An async
        actor may run a later call first (while it fetches): :meth:`settle` waits for the pushes."""
        if (
            len(self.pending) > 4
        ):  # forget the pushes that landed already (a push's error shows in settle)
            _, self.pending = self.ray.wait(self.pending, num_returns=len(self.pending), timeout=0)
        self.pending.append(self.actor.update_weights.remote(update, version))

    async def settle(self) -> None:
        """Wait until every push sent so far has landed (the engine queued the swap); raises a push's error."""
        pending, self.pending = self.pending, []
        for ref in pending:
            await ref

    async def restart(self, update: Any, version: int | None) -> dict[str, Any]:
        try:
            self.ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead (its node is gone)
            pass
        self.pending = []
        self.actor = self._spawn(update, version)
        return await self.info()

    async def info(self) -> dict[str, Any]:
        return await self.actor.info.remote()

    async def close(self) -> None:
        import asyncio

        try:
            await asyncio.wait_for(self.actor.close.remote(), 30.0)
        except Exception:  # noqa: BLE001 - a dead or hung actor: killed below
            pass
        try:
            self.ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass


def remote_host_class(ray: Any) -> Any:
    """``ray.remote(ReplicaHost)``: the Ray actor class of the host (made once per process)."""
    global _REMOTE
    if _REMOTE is None:
        _REMOTE = ray.remote(ReplicaHost)
    return _REMOTE


_REMOTE: Any = None
