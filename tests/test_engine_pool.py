"""EnginePool over JaxEngine replicas on a real tiny model: in process (the plain twin), then as Ray actors
on a real 2-node loopback cluster (gymllm.ray_support.LocalCluster).

In process every replica is a JaxEngine with tests/test_engine.py's shapes, over one tiny model, so
the compiled steps are shared. Routing is checked with the engines held by ``JaxEngine.paused()``:
nothing finishes while requests are placed, so the loads the pool routes by are exact, not a race.
The Ray part starts one cluster for the module (head: 2 CPUs, worker: 1 CPU), two replica actors of
the tiny model spread over the two nodes, and removes the worker node while requests run there. The
Ray replicas are held the same way (``ReplicaHost.hold``, an actor call) while requests are placed,
so routing is asserted by the pool's record (session homes, loads), never by which requests
overlapped; every wait is a watchdog on a condition that fails naming what stalled, not a sleep; and
the cluster's health check declares a removed node dead in seconds but never a live, CPU-starved one.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time

import numpy as np
import pytest
from flax import nnx

import gymllm.ray_support  # noqa: F401 - before ray: every Ray node of this module binds 127.0.0.1
from gymllm.errors import ConfigError, EngineError
from gymllm.inference import (
    Engine,
    EngineConfig,
    EnginePool,
    JaxEngine,
    PoolConfig,
    ReplicaSpec,
    SamplingParams,
)
from gymllm.inference.request import RequestFailed
from gymllm.inference.pool import failure_kind
from gymllm.models.lora import LoRAConfig, adapter_keys, init_adapters, merge
from gymllm.inference.lora_receiver import receiver_of
from gymllm.algos.weight_sync import WeightPusher
from gymllm.models import make_tiny
from gymllm.models.transformer import Transformer

CFG = EngineConfig(num_slots=12, max_len=64, min_bucket=64, max_prefill_batch=2, decode_lengths=2)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def lm():
    return make_tiny("llama")


@pytest.fixture(scope="module")
def reference(lm):
    eng = JaxEngine.from_loaded(lm, config=CFG, stop_token_ids=())
    yield eng
    eng.shutdown()


def engines(lm, n: int) -> list[JaxEngine]:
    return [JaxEngine.from_loaded(lm, config=CFG, stop_token_ids=()) for _ in range(n)]


def prompt(n: int, seed: int = 0) -> list[int]:
    return list(map(int, np.random.default_rng(seed).integers(3, 500, size=n)))


def run(coro):
    return asyncio.run(coro)


async def until(pred, timeout: float = 30.0, what: str = "the condition", about=None) -> None:
    """Wait (yielding to the loop) until ``pred()``. A watchdog, not a pace: it returns as soon as the
    condition holds, and only a stall fails, after ``timeout`` seconds, naming ``what`` never happened
    (with ``about()``, e.g. the pool's stats, when given)."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= end:
            pytest.fail(f"stalled: {what} did not happen within {timeout:.0f} s" + _about(about))
        await asyncio.sleep(0.005)


async def finished(tasks: dict, timeout: float, what: str, about=None) -> dict:
    """The results of ``tasks`` (name -> task); a watchdog: fails naming the tasks that have not
    finished after ``timeout`` seconds, and ``what`` they were waiting for."""
    await asyncio.wait(list(tasks.values()), timeout=timeout)
    stalled = [name for name, t in tasks.items() if not t.done()]
    if stalled:
        for t in tasks.values():
            t.cancel()
        pytest.fail(
            f"stalled: {stalled} not finished within {timeout:.0f} s ({what})" + _about(about)
        )
    return {name: t.result() for name, t in tasks.items()}


def _about(about) -> str:
    return "" if about is None else f"; {about()}"


def inflight(pool: EnginePool) -> int:
    return sum(s["inflight"] for s in pool.stats())


LORA = LoRAConfig(rank=2, alpha=4.0, targets=("wq", "wv"))


def lora_weights(lm, seed: int):
    """LoRA-merged weights of ``lm`` (they remember their adapters, as the learner's do) with random B."""
    base = lm.model.flat_params()
    rng = np.random.default_rng(seed)
    adapters = {
        k: (v + rng.standard_normal(v.shape).astype(np.float32) if k.endswith("lora_b") else v)
        for k, v in init_adapters(LORA, base).items()
    }
    return merge(LORA, base, adapters)


def full_state(lm, merged):
    return nnx.state(Transformer(lm.config, params=dict(merged)))


class DyingEngine:
    """Stand-in for a replica that dies mid-request (its process or connection lost): forwards to a real
    JaxEngine until ``die`` is set; then every request in flight or new raises ConnectionResetError, as
    the HTTP client's or Ray's transport does for a lost peer. ``mode="step"`` raises RequestFailed
    instead (an engine step failed on a live replica)."""

    def __init__(self, engine: JaxEngine, mode: str = "death"):
        self.engine, self.mode = engine, mode
        self.die = asyncio.Event()
        self.max_len = engine.max_len

    @property
    def version(self) -> int:
        return self.engine.version

    def error(self) -> Exception:
        return (
            ConnectionResetError("replica lost")
            if self.mode == "death"
            else RequestFailed("a device step raised")
        )

    async def generate(self, prompt_ids, params, *, session_id=None):
        if self.die.is_set():
            raise self.error()
        task = asyncio.ensure_future(
            self.engine.generate(prompt_ids, params, session_id=session_id)
        )
        dead = asyncio.ensure_future(self.die.wait())
        await asyncio.wait([task, dead], return_when=asyncio.FIRST_COMPLETED)
        dead.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise self.error()

    def update_weights(self, state, version):
        self.engine.update_weights(state, version)

    def end_session(self, session_id):
        self.engine.end_session(session_id)

    async def close(self):
        await self.engine.close()


# ------------------------------------------------------------------ config and classification
def test_pool_config_is_validated_and_the_pool_is_an_engine(lm):
    with pytest.raises(ConfigError, match="max_retries"):
        PoolConfig(max_retries=-1)
    with pytest.raises(ConfigError, match="request_timeout_s"):
        PoolConfig(request_timeout_s=0)
    with pytest.raises(ConfigError, match="EnginePool"):
        EnginePool([])
    with pytest.raises(ConfigError, match="exactly one of model= or tiny="):
        ReplicaSpec.jax()
    with pytest.raises(ConfigError, match="base_url"):
        ReplicaSpec.openai("localhost:8000", "m")
    assert isinstance(EnginePool(engines(lm, 1)), Engine)
    if importlib.util.find_spec("ray") is not None:
        from gymllm.inference.replica import RayReplica

        with pytest.raises(
            ConfigError, match="max_restarts"
        ):  # the pool, not Ray, recreates replicas
            RayReplica("r0", ReplicaSpec.jax(tiny={}), {"max_restarts": 3})
    assert failure_kind(ConnectionRefusedError()) == "death"
    assert failure_kind(RequestFailed("x")) == "request"
    assert failure_kind(EngineError("bad prompt")) == "input"
    wrapped = EngineError("request failed")
    wrapped.__cause__ = ConnectionRefusedError()
    assert failure_kind(wrapped) == "death"  # the HTTP client's "connection refused"


# ------------------------------------------------------------------ routing
def test_sessions_stick_and_new_sessions_go_to_the_least_loaded(lm):
    a, b = engines(lm, 2)
    pool = EnginePool([a, b])

    async def main():
        p1 = prompt(30, 1)
        with a.paused(), b.paused():  # nothing finishes: the loads below are exact
            tasks = {}
            # (session, prompt length): loads are prompt + max_tokens (8)
            for sid, n, home in [
                ("s1", 30, "r0"),
                ("s2", 5, "r1"),
                ("s3", 5, "r1"),
                ("s4", 5, "r1"),
                ("s5", 5, "r0"),
            ]:
                tasks[sid] = asyncio.ensure_future(
                    pool.generate(
                        p1 if sid == "s1" else prompt(n, hash(sid) % 97), GREEDY, session_id=sid
                    )
                )
                await until(lambda k=len(tasks): inflight(pool) == k)
                assert pool.home_of(sid) == home, (sid, pool.stats())
            loads = {s["name"]: s["load_tokens"] for s in pool.stats()}
            assert loads == {"r0": 38 + 13, "r1": 3 * 13}
        done = {sid: await t for sid, t in tasks.items()}
        assert {sid: c.replica for sid, c in done.items()} == {
            "s1": "r0",
            "s2": "r1",
            "s3": "r1",
            "s4": "r1",
            "s5": "r0",
        }
        assert not any(c.retried for c in done.values())
        # s1's next turn goes home although r0 is the busier replica, and reuses its cached prefix there
        turn2 = p1 + [int(t) for t in done["s1"].token_ids] + prompt(4, 9)
        with a.paused(), b.paused():
            big = asyncio.ensure_future(pool.generate(prompt(40, 3), GREEDY, session_id="s6"))
            await until(lambda: inflight(pool) == 1)
            assert pool.home_of("s6") == "r0"  # a tie: the first replica
            nxt = asyncio.ensure_future(pool.generate(turn2, GREEDY, session_id="s1"))
            await until(lambda: inflight(pool) == 2)
            assert pool.stats()[0]["load_tokens"] > pool.stats()[1]["load_tokens"]
        c2 = await nxt
        await big
        assert c2.replica == "r0" and c2.cached_prompt_len >= len(p1)
        pool.end_session("s1")
        assert pool.home_of("s1") is None
        await pool.close()

    run(main())


def test_greedy_outputs_equal_a_single_engines(lm, reference):
    pool = EnginePool(engines(lm, 3))

    async def main():
        ps = [prompt(3 + 5 * i, i) for i in range(6)]
        got = await asyncio.gather(
            *(pool.generate(p, GREEDY, session_id=f"t{i}") for i, p in enumerate(ps))
        )
        want = await asyncio.gather(*(reference.generate(p, GREEDY) for p in ps))
        assert {c.replica for c in got} == {"r0", "r1", "r2"}
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.token_ids, w.token_ids)
            np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
        n = await pool.generate_n(ps[0], SamplingParams(temperature=1.0, max_tokens=4, n=3, seed=5))
        assert len(n) == 3 and len({c.replica for c in n}) == 1
        await pool.close()

    run(main())


def test_weight_update_reaches_every_replica_with_versions_per_token(lm):
    a, b = engines(lm, 2)
    pool = EnginePool([a, b])
    new = nnx.state(make_tiny("llama", seed=1).model)
    params = SamplingParams(temperature=0.0, max_tokens=8)

    async def main():
        with a.paused(), b.paused():
            t1 = asyncio.ensure_future(pool.generate(prompt(10, 1), params, session_id="x"))
            t2 = asyncio.ensure_future(pool.generate(prompt(10, 2), params, session_id="y"))
            await until(lambda: inflight(pool) == 2)
            await asyncio.gather(
                asyncio.to_thread(a.run_iterations, 1), asyncio.to_thread(b.run_iterations, 1)
            )
            pool.update_weights(new, 1)  # lands between two decode steps; nothing is drained
            assert pool.version == 1
        for c in await asyncio.gather(t1, t2):
            v = c.versions.tolist()
            k = v.count(0)
            assert 1 <= k < len(v) and v == [0] * k + [1] * (len(v) - k), v
        assert await pool.replica_versions() == {"r0": 1, "r1": 1}
        c = await pool.generate(prompt(6, 4), params, session_id="z")
        assert set(c.versions.tolist()) == {1}
        await pool.close()

    run(main())


def test_the_trainers_lora_push_sends_adapters_only_to_every_replica(lm):
    a, b = engines(lm, 2)
    pool = EnginePool([a, b])
    (ref,) = engines(lm, 1)
    merged = lora_weights(lm, 0)

    async def main():
        WeightPusher(pool, lm.config).push(
            merged, 1
        )  # what the trainer calls after an optimizer step
        for eng in (a, b):
            rec = receiver_of(eng)
            assert rec is not None and [h["keys"] for h in rec.history] == [
                sorted(adapter_keys(LORA))
            ]
        ref.update_weights(full_state(lm, merged), 1)
        ps = [prompt(5 + 3 * i, 20 + i) for i in range(4)]
        got = await asyncio.gather(
            *(pool.generate(p, GREEDY, session_id=f"l{i}") for i, p in enumerate(ps))
        )
        want = await asyncio.gather(*(ref.generate(p, GREEDY) for p in ps))
        assert {c.replica for c in got} == {"r0", "r1"}
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.token_ids, w.token_ids)
            assert set(g.versions.tolist()) == {1}
        await pool.close()
        await ref.close()

    run(main())


# ------------------------------------------------------------------ failures
def test_a_dead_replicas_requests_are_retried_elsewhere_and_marked(lm, reference):
    dying = DyingEngine(engines(lm, 1)[0])
    (other,) = engines(lm, 1)
    pool = EnginePool([dying, other], config=PoolConfig(revive_after_s=3600.0))

    async def main():
        p1, p2 = prompt(12, 1), prompt(8, 2)
        with dying.engine.paused(), other.paused():
            t1 = asyncio.ensure_future(pool.generate(p1, GREEDY, session_id="s1"))
            await until(lambda: inflight(pool) == 1)
            t2 = asyncio.ensure_future(pool.generate(p2, GREEDY, session_id="s2"))
            await until(lambda: inflight(pool) == 2)
            assert (pool.home_of("s1"), pool.home_of("s2")) == ("r0", "r1")
            dying.die.set()  # r0 is lost with s1's request in flight
            await until(lambda: pool.stats()[0]["down"])
        c1, c2 = await t1, await t2
        assert (c1.replica, c1.retried) == ("r1", True)
        assert (c2.replica, c2.retried) == ("r1", False)
        want = await reference.generate(p1, GREEDY)
        np.testing.assert_array_equal(
            c1.token_ids, want.token_ids
        )  # sampled once more, the same way
        assert pool.home_of("s1") == "r1"  # re-homed
        s = pool.stats()
        assert s[0]["down"] and s[0]["failures"] == 1 and "replica lost" in s[0]["last_error"]
        c3 = await pool.generate(prompt(5, 3), GREEDY, session_id="s3")
        assert c3.replica == "r1" and pool.retries == 1
        with pytest.raises(
            EngineError, match="at least one token"
        ):  # bad input: raised, not retried
            await pool.generate([], GREEDY)
        assert pool.stats()[1]["failures"] == 0
        await pool.close()

    run(main())


def test_a_failed_step_is_retried_without_taking_the_replica_down(lm):
    flaky = DyingEngine(engines(lm, 1)[0], mode="step")
    (other,) = engines(lm, 1)
    pool = EnginePool([flaky, other])

    async def main():
        flaky.die.set()
        c = await pool.generate(prompt(5, 1), GREEDY, session_id="s")
        assert (c.replica, c.retried) == ("r1", True)
        assert not pool.stats()[0]["down"] and pool.stats()[0]["failures"] == 1
        await pool.close()

    run(main())


def test_an_in_process_host_is_rebuilt_at_the_latest_version(lm):
    built: list = []

    def factory():  # the first replica built dies later; every rebuild is healthy
        eng = JaxEngine.from_loaded(lm, config=CFG, stop_token_ids=())
        built.append(DyingEngine(eng) if not built else eng)
        return built[-1]

    pool = EnginePool.from_specs([ReplicaSpec(factory=factory), ReplicaSpec(factory=factory)])
    new = nnx.state(make_tiny("llama", seed=1).model)

    async def main():
        dying = built[0]
        pool.update_weights(new, 3)
        with dying.engine.paused():
            t = asyncio.ensure_future(pool.generate(prompt(6, 1), GREEDY, session_id="s"))
            await until(lambda: inflight(pool) == 1)
            assert pool.home_of("s") == "r0"
            dying.die.set()  # r0 dies: its request goes to r1; r0 is rebuilt from its spec
            c = await t
        assert (c.replica, c.retried) == ("r1", True) and set(c.versions.tolist()) == {3}
        await until(
            lambda: pool.stats()[0]["restarts"] == 1 and not pool.stats()[0]["down"], timeout=120
        )
        assert len(built) == 3
        assert await pool.replica_versions() == {"r0": 3, "r1": 3}  # rejoined at the latest version
        c = await pool.generate(prompt(40, 2), GREEDY, session_id="new")
        assert c.replica == "r0" and set(c.versions.tolist()) == {3}
        await pool.close()
        await dying.close()

    run(main())


# ------------------------------------------------------------------ Ray: replica actors on a 2-node cluster
RAY_CFG = EngineConfig(
    num_slots=8,
    max_len=64,
    min_bucket=64,
    max_prefill_batch=1,
    decode_lengths=1,
    compact_rows=False,
)  # few compiled shapes: each actor process compiles its own
#: The test cluster's Ray settings (``_system_config``, given to the head, holds for every node).
#: Health: Ray's GCS asks each node's raylet "alive?" every ``health_check_period_ms`` and declares the
#: node dead after ``health_check_failure_threshold`` failed checks in a row. A removed node's raylet is
#: gone: each check is refused at once, so the node is declared dead after about 5 x 1 s. A live raylet
#: starved of CPU (the 2-core CI machine loaded by other work) may answer late: it gets 60 s per check,
#: so no live node is declared dead (300 ms per check, the earlier setting here, killed live nodes).
#: ``worker_niceness``: Ray runs its workers (here the replica actors) at nice 15 by default, behind
#: every process at nice 0; on a machine loaded by other work they got a few percent of a core and a
#: compile took minutes. At 0 they share the CPU evenly with that work.
RAY_SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 60_000,
    "health_check_failure_threshold": 5,
    "worker_niceness": 0,
}
#: the watchdog on what Ray reports by itself (a lost node's actors dead, a replica recreated elsewhere)
RAY_WATCHDOG_S = 180.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head (2 CPUs) and one worker node (1 CPU). The replica processes share a JAX compilation cache
    directory (a recreated replica loads its programs instead of compiling them again)."""
    pytest.importorskip("ray")
    from gymllm.ray_support import LocalCluster

    env = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax-cache")),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # inherited by the nodes' processes started below
    try:
        c = LocalCluster([{"num_cpus": 2, "_system_config": RAY_SYSTEM_CONFIG}, {"num_cpus": 1}])
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def ray_pool(cluster):
    """r0 on the head, r1 on the worker node (soft affinity: a recreated replica may go anywhere).
    Generous timeouts: they are watchdogs for a hung replica (a loaded machine compiles slowly); a lost
    replica is reported by Ray itself."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    spec = ReplicaSpec.jax(tiny={"family": "llama"}, config=RAY_CFG, stop_token_ids=())
    opts = [
        {
            "num_cpus": 1,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(cluster.node_id(n), soft=True),
        }
        for n in cluster.nodes[:2]
    ]
    pool = EnginePool.from_ray(
        spec,
        num_replicas=2,
        ray_options=opts,
        config=PoolConfig(request_timeout_s=300.0, start_timeout_s=300.0),
    )
    yield pool
    run(pool.close())


@pytest.fixture(scope="module")
def ray_reference(lm):
    eng = JaxEngine.from_loaded(lm, config=RAY_CFG, stop_token_ids=())
    yield eng
    eng.shutdown()


async def hold(pool: EnginePool, *names: str) -> None:
    """Hold Ray replicas ``names`` (``ReplicaHost.hold``): they sample nothing until :func:`release`,
    so requests sent there wait in their engine and the loads the pool routes by are exact."""
    held = await asyncio.gather(*(pool.replica(n).actor.hold.remote() for n in names))
    assert all(held), dict(zip(names, held))


async def release(pool: EnginePool, *names: str) -> None:
    await asyncio.gather(*(pool.replica(n).actor.release.remote() for n in names))


async def place(pool: EnginePool, prompts: dict, params: SamplingParams) -> dict:
    """Send one request per session (session id -> prompt), each once the pool has routed the one
    before (its load counted): with the replicas held, every routing decision sees all earlier ones."""
    tasks: dict = {}
    for sid, p in prompts.items():
        tasks[sid] = asyncio.ensure_future(pool.generate(p, params, session_id=sid))
        await until(
            lambda k=len(tasks): inflight(pool) == k,
            what=f"the pool routing {sid}",
            about=pool.stats,
        )
    return tasks


async def routed_alternately(pool: EnginePool, prompts: dict, params: SamplingParams) -> dict:
    """Send ``prompts`` (growing or equal costs) with both replicas held: least loaded, then fewer in
    flight, then r0, so they alternate r0, r1, r0, ... by the pool's own record (its session homes and
    loads), not by which requests happened to overlap. Returns the completions, checked unretried."""
    await hold(pool, "r0", "r1")
    try:
        tasks = await place(pool, prompts, params)
        homes = [pool.home_of(sid) for sid in prompts]
        assert homes == ["r0", "r1"] * (len(prompts) // 2), (homes, pool.stats())
        costs = [len(p) + params.max_tokens for p in prompts.values()]
        loads = {s["name"]: s["load_tokens"] for s in pool.stats()}
        assert loads == {"r0": sum(costs[0::2]), "r1": sum(costs[1::2])}, pool.stats()
    finally:
        await release(pool, "r0", "r1")
    done = await finished(
        tasks, RAY_WATCHDOG_S, "the released replicas serving them", about=pool.stats
    )
    assert [(c.replica, c.retried) for c in done.values()] == [(h, False) for h in homes], (
        pool.stats()
    )
    return done


def test_ray_replicas_generate_like_in_process_and_take_weights_from_the_object_store(
    lm, cluster, ray_pool, ray_reference, monkeypatch
):
    import ray

    pool = ray_pool

    async def main():
        info = await pool.replica_info()
        assert info["r0"]["node_id"] == cluster.node_id(cluster.nodes[0])
        assert info["r1"]["node_id"] == cluster.node_id(cluster.nodes[1])
        assert {i["pid"] for i in info.values()}.isdisjoint({os.getpid()}) and pool.max_len == 64
        ps = [prompt(4 + 6 * i, i) for i in range(4)]
        want = await asyncio.gather(*(ray_reference.generate(p, GREEDY) for p in ps))

        async def both_replicas_sample_like_the_reference(tag: str, version: int) -> None:
            got = await routed_alternately(pool, {f"{tag}{i}": p for i, p in enumerate(ps)}, GREEDY)
            for g, w in zip(got.values(), want):
                np.testing.assert_array_equal(g.token_ids, w.token_ids)
                assert set(g.versions.tolist()) == {version}

        await both_replicas_sample_like_the_reference("a", 0)
        puts = []
        real_put = ray.put
        monkeypatch.setattr(ray, "put", lambda v, **kw: puts.append(v) or real_put(v, **kw))
        new = nnx.state(make_tiny("llama", seed=1).model)
        pool.update_weights(new, 1)
        assert len(puts) == 1  # put once; each actor fetched the ObjectRef on its node
        assert await pool.replica_versions() == {"r0": 1, "r1": 1}
        ray_reference.update_weights(new, 1)
        want = await asyncio.gather(*(ray_reference.generate(p, GREEDY) for p in ps))
        await both_replicas_sample_like_the_reference("b", 1)
        # a LoRA push: adapters only through the object store; each actor merges onto its own base
        merged = lora_weights(lm, 1)
        WeightPusher(pool, lm.config).push(merged, 2)
        assert len(puts) == 2 and set(puts[1].adapters) == set(adapter_keys(LORA))
        assert await pool.replica_versions() == {"r0": 2, "r1": 2}
        ray_reference.update_weights(full_state(lm, merged), 2)
        want = await asyncio.gather(*(ray_reference.generate(p, GREEDY) for p in ps))
        await both_replicas_sample_like_the_reference("c", 2)
        assert all(s["failures"] == 0 and s["restarts"] == 0 for s in pool.stats()), pool.stats()

    run(main())


@pytest.mark.slow  # a drill: kills a process or a node
def test_losing_a_replicas_node_retries_its_requests_and_the_replica_rejoins_at_the_latest_version(
    cluster, ray_pool
):
    import ray

    pool = ray_pool
    params = SamplingParams(temperature=0.0, max_tokens=16)

    async def main():
        worker = cluster.nodes[1]
        assert (await pool.replica_info())["r1"]["node_id"] == cluster.node_id(worker)
        sids = [f"n{i}" for i in range(6)]
        # both replicas held: nothing finishes, so equal costs alternate r0, r1, r0, ... exactly
        await hold(pool, "r0", "r1")
        tasks = await place(pool, {sid: prompt(6, 10 + i) for i, sid in enumerate(sids)}, params)
        on_r1 = [sid for sid in sids if pool.home_of(sid) == "r1"]
        assert on_r1 == ["n1", "n3", "n5"], pool.stats()
        # runs after r1 started every generate sent before it: they are in flight there, held
        await pool.replica("r1").actor.info.remote()
        # r1's node is lost (its processes killed) with 3 requests there
        cluster.remove_node(worker)

        def failed_over() -> bool:  # r1's three attempts failed; all six wait on the held r0
            s = pool.stats()
            return s[1]["failures"] == len(on_r1) and s[0]["inflight"] == len(sids)

        await until(
            failed_over,
            RAY_WATCHDOG_S,
            what="Ray reporting r1's actor dead and the pool retrying its 3 requests on r0",
            about=pool.stats,
        )
        assert all(pool.home_of(sid) == "r0" for sid in sids), pool.stats()  # re-homed
        # Ray reported the actor lost (e.g. ActorDiedError); the pool's own watchdog did not fire
        assert "Actor" in pool.stats()[1]["last_error"].split(":")[0], pool.stats()
        await release(pool, "r0")
        done = await finished(tasks, RAY_WATCHDOG_S, "r0 serving them", about=pool.stats)
        for sid, c in done.items():
            assert c.replica == "r0" and c.retried == (sid in on_r1), (sid, c.replica, c.retried)
            assert set(c.versions.tolist()) == {2}
        c = await pool.generate(prompt(5, 99), params, session_id="after")  # the pool keeps serving
        assert c.replica == "r0" and not c.retried
        await until(
            lambda: pool.stats()[1]["restarts"] == 1 and not pool.stats()[1]["down"],
            RAY_WATCHDOG_S,
            what="the pool recreating r1 on a live node",
            about=pool.stats,
        )
        assert pool.stats()[1]["failures"] == len(on_r1)
        info = await pool.replica_info()
        assert info["r1"]["node_id"] == cluster.node_id(cluster.nodes[0])  # on a live node
        # rejoined at the latest version (LoRA)
        assert await pool.replica_versions() == {"r0": 2, "r1": 2}
        # the recreated replica samples what r0 samples
        same = await routed_alternately(pool, {f"y{i}": prompt(7, 5) for i in range(2)}, params)
        y0, y1 = same.values()
        np.testing.assert_array_equal(y0.token_ids, y1.token_ids)
        pool.update_weights(nnx.state(make_tiny("llama", seed=2).model), 3)
        assert await pool.replica_versions() == {"r0": 3, "r1": 3}
        outs = await routed_alternately(pool, {f"z{i}": prompt(5, i) for i in range(4)}, params)
        assert all(set(c.versions.tolist()) == {3} for c in outs.values())
        assert ray.is_initialized()

    run(main())
