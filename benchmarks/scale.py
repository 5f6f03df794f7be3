"""Scale-out figures of the engine pool: its per-request overhead, and rollout scaling with replicas.

(a) ``pool_request_overhead_ms``: the same requests (tiny model, greedy, 8-token prompts, 4 sampled
    tokens, one at a time) side by side, rounds interleaved: the JaxEngine called directly in this
    process, an in-process ``EnginePool`` over that engine (``inproc_pool_request_overhead_ms``), and
    an ``EnginePool.from_ray`` of one replica actor (same spec, its own process on a local Ray node on
    127.0.0.1). Overhead = median(pool latency) - median(direct latency). The same with an engine
    stand-in that answers at once (``InstantEngine``: no compute, so the figure is routing + Ray's
    round trip alone): ``pool_request_overhead_null_ms``.

(b) Scaling by simulation: this machine has 2 cores, so N real engines cannot run side by side.
    ``SimReplica`` is an engine replica stand-in: it serves up to ``rows`` requests at once with one
    decode step every ``step_ms`` whatever the batch width (an ``asyncio.sleep``: it models
    accelerator time and costs no host CPU), one token per request per step. The rest is real: the
    ``RolloutOrchestrator`` (token buffer, chat template, groups), ``EnginePool`` routing (sticky
    sessions, least loaded), a barrier-free vector env of ``gymllm/AsyncLatency-v0`` envs with a
    heavy-tailed lognormal step latency, and ``ModelAgent`` on the tiny tokenizer. With N replicas
    the run gets N x ``rows`` env workers (max_concurrency) and the same workload per trajectory;
    trajectories/s are measured in steady state (after a warm-up of 2 x N x rows trajectories, over
    the next ``--per-replica`` x N, at least ``--min-trajectories``: the one-replica base sets every
    efficiency, so it gets enough heavy-tailed trajectories too). ``scaling_efficiency_N`` = throughput(N) / (N x throughput(1)).
    In-process asyncio stand-ins are the honest choice on 2 cores (N Ray actors would share the same
    2 cores and measure the machine, not the pool); Ray's own overhead is measured in (a). What the
    figure can show: whether the one event loop that runs the orchestrator, the pool and every env
    coroutine keeps N replicas fed (its CPU per trajectory turn is the limit). Per run: mean trajectory
    lifetime, worker occupancy (Little's law: throughput x lifetime / workers), host CPU per trajectory
    and the share of a core used: on a loaded machine a late event loop stretches the simulated decode
    steps (``decode_steps_per_replica_per_s`` below 1000 / ``step_ms``), which lowers the efficiency.

(c) If ``benchmarks/ray_env_overhead.py`` is present, its ``ray_env_step_overhead_ms`` (the vector
    env's Ray backend over the in-process one, per env step) is measured too and reported here.

    python benchmarks/scale.py --quick      # about two minutes; the last line is RESULT {json}
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device

import gymllm.ray_support as ray_support  # noqa: E402 - before ray: loopback nodes, no usage stats
import numpy as np  # noqa: E402

from gymllm.inference import (
    Completion,
    EngineConfig,
    EnginePool,
    JaxEngine,
    PoolConfig,
    ReplicaSpec,
    SamplingParams,
)  # noqa: E402

CFG = EngineConfig(
    num_slots=8,
    max_len=64,
    min_bucket=64,
    max_prefill_batch=1,
    decode_lengths=1,
    compact_rows=False,
)
REQ = SamplingParams(temperature=0.0, max_tokens=4)


def cpu_model() -> str:
    from gymllm.utils.host import describe_cpu

    return describe_cpu()


class InstantEngine:
    """Engine stand-in that answers every request at once with ``max_tokens`` zeros (no compute): what is
    left of a pooled request's latency is the pool's routing and, on Ray, the actor round trip."""

    version = 0
    max_len = 64

    async def generate(self, prompt_ids, params, *, session_id=None) -> Completion:
        n = params.max_tokens
        return Completion(
            token_ids=np.zeros(n, np.int32),
            logprobs=np.zeros(n, np.float32),
            finish_reason="length",
            versions=np.zeros(n, np.int32),
            prompt_len=len(prompt_ids),
        )

    def update_weights(self, state, version) -> None:
        self.version = version

    async def close(self) -> None:
        pass


# ------------------------------------------------------------------ (a) per-request overhead
async def _latencies(
    targets: dict[str, Any], rounds: int, prompt: list[int]
) -> dict[str, list[float]]:
    """Each target serves one request per round, the targets interleaved in a fresh order each round (no
    target always follows the same one)."""
    out: dict[str, list[float]] = {k: [] for k in targets}
    rng = np.random.default_rng(0)
    names = list(targets)
    for i in range(rounds):
        for j in rng.permutation(len(names)):
            name, eng = names[j], targets[names[j]]
            t = time.perf_counter()
            await eng.generate(prompt, REQ, session_id=None)
            out[name].append(time.perf_counter() - t)
    return out


def measure_overhead(rounds: int) -> dict[str, Any]:
    """(a) on the Ray this process is connected to."""
    from gymllm.models import make_tiny

    spec = ReplicaSpec.jax(tiny={"family": "llama"}, config=CFG, stop_token_ids=(), warmup=True)
    direct = JaxEngine.from_loaded(make_tiny("llama"), config=CFG, stop_token_ids=())
    direct.warmup()
    instant = InstantEngine()
    try:
        ray_pool = EnginePool.from_ray(spec, num_replicas=1, ray_options={"num_cpus": 1})
        ray_null = EnginePool.from_ray(
            ReplicaSpec(factory=InstantEngine),
            num_replicas=1,
            ray_options={"num_cpus": 0.01},
            names=["null"],
        )
        targets = {
            "direct": direct,
            "inproc_pool": EnginePool([direct]),
            "ray_pool": ray_pool,
            "null_direct": instant,
            "null_inproc_pool": EnginePool([instant]),
            "null_ray_pool": ray_null,
        }
        prompt = list(range(3, 11))

        async def main():
            await _latencies(targets, 5, prompt)  # warm: first calls, connections
            lat = await _latencies(targets, rounds, prompt)
            await ray_pool.close()
            await ray_null.close()
            return lat

        lat = asyncio.run(main())
    finally:
        direct.shutdown()
    med = {k: statistics.median(v) * 1e3 for k, v in lat.items()}
    return {
        "pool_request_overhead_ms": med["ray_pool"] - med["direct"],
        "inproc_pool_request_overhead_ms": med["inproc_pool"] - med["direct"],
        "pool_request_overhead_null_ms": med["null_ray_pool"] - med["null_direct"],
        "inproc_pool_request_overhead_null_ms": med["null_inproc_pool"] - med["null_direct"],
        "median_latency_ms": med,
        "rounds": rounds,
    }


# ------------------------------------------------------------------ (b) scaling by simulation
class SimReplica:
    """Engine replica stand-in (see the module docstring): ``rows`` requests decode together, one token
    each per step of ``step_s`` seconds (an asyncio sleep: accelerator time, no host CPU), whatever the
    batch width; requests beyond ``rows`` queue. Sampled ids are ``token_id`` repeated (a short word in
    the tiny tokenizer, never a stop token)."""

    def __init__(self, *, rows: int, step_s: float, token_id: int):
        self.rows, self.step_s, self.token_id = rows, step_s, token_id
        self.version = 0
        self.max_len = None
        self._queue: list[
            tuple[int, int, asyncio.Future]
        ] = []  # (prompt len, tokens wanted, future)
        self._active: list[list] = []  # [tokens left, prompt len, tokens wanted, future]
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.steps = 0
        self.busy_steps = 0

    async def generate(self, prompt_ids, params, *, session_id=None) -> Completion:
        if self._task is None:
            self._task = asyncio.create_task(self._loop())
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((len(prompt_ids), params.max_tokens, fut))
        self._wake.set()
        return await fut

    async def _loop(self) -> None:
        while True:
            while len(self._active) < self.rows and self._queue:
                n_prompt, n, fut = self._queue.pop(0)
                self._active.append([n, n_prompt, n, fut])
            if not self._active:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(
                self.step_s
            )  # one decode step of the whole batch (accelerator time)
            self.steps += 1
            still = []
            for row in self._active:
                row[0] -= 1
                if row[0] > 0:
                    still.append(row)
                elif not row[3].done():
                    n = row[2]
                    row[3].set_result(
                        Completion(
                            token_ids=np.full(n, self.token_id, np.int32),
                            logprobs=np.full(n, -1.0, np.float32),
                            finish_reason="length",
                            versions=np.full(n, self.version, np.int32),
                            prompt_len=row[1],
                        )
                    )
            self._active = still

    def update_weights(self, state, version) -> None:
        self.version = int(version)

    def end_session(self, session_id) -> None:
        pass

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def _sim_run(n: int, a: argparse.Namespace, tok: Any) -> dict[str, Any]:
    import gymllm
    from gymllm.rollout import ModelAgent, RolloutConfig, RolloutOrchestrator

    token_id = tok.encode("a")[0]
    replicas = [
        SimReplica(rows=a.rows, step_s=a.step_ms / 1e3, token_id=token_id) for _ in range(n)
    ]
    pool = EnginePool(replicas, config=PoolConfig(request_timeout_s=120.0))
    workers = n * a.rows
    vec = gymllm.make_vec(
        "gymllm/AsyncLatency-v0",
        num_envs=workers,
        median_s=a.median_ms / 1e3,
        p99_s=a.p99_ms / 1e3,
        episode_length=a.turns,
    )
    cfg = RolloutConfig(
        group_size=a.group_size,
        max_concurrency=workers,
        num_groups=None,
        max_staleness=None,
        seed=n,
        max_model_calls=a.turns + 1,
        queue_size=max(8, 4 * workers // a.group_size),
    )
    orch = RolloutOrchestrator(
        vec,
        pool,
        ModelAgent(tok),
        sampling=SamplingParams(temperature=1.0, max_tokens=a.max_tokens),
        config=cfg,
    )
    warm, count = 2 * workers, max(a.per_replica * n, a.min_trajectories)
    done, base, t0, lifetimes = 0, None, time.perf_counter(), []
    try:
        async with orch:
            async for g in orch.groups():
                done += len(g.trajectories)
                if base is not None:
                    lifetimes += [t.timings["total_s"] for t in g.trajectories]
                if base is None and done >= warm:  # steady state from here
                    t0, base, steps0 = time.perf_counter(), done, sum(r.steps for r in replicas)
                    cpu0 = time.process_time()
                if base is not None and done >= base + count:
                    break
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            stats = orch.stats()
    finally:
        vec.close()
        await pool.close()
    traj = done - base
    steps = sum(r.steps for r in replicas) - steps0
    life = statistics.mean(lifetimes)
    # Little's law: trajectories in flight on average = throughput x mean lifetime; / workers = how busy
    # the env workers were kept (1.0: the orchestrator and pool never left a worker idle)
    return {
        "replicas": n,
        "env_workers": workers,
        "trajectories": traj,
        "wall_s": wall,
        "traj_per_s": traj / wall,
        "mean_lifetime_s": life,
        "worker_occupancy": traj / wall * life / workers,
        "host_cpu_ms_per_trajectory": cpu
        / traj
        * 1e3,  # this process, all threads: the one-core ceiling
        "host_cpu_share": cpu / wall,
        "decode_steps_per_replica_per_s": steps / n / max(wall, 1e-9),
        "loop_lag_p99_ms": stats.get("loop_lag_p99_ms"),
        "groups_failed": stats.get("groups_failed", 0),
        "retries": pool.retries,
    }


def measure_scaling(a: argparse.Namespace) -> dict[str, Any]:
    from gymllm.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer(512)
    runs = {}
    for n in a.replicas:
        r = asyncio.run(_sim_run(n, a, tok))
        runs[n] = r
        print(
            f"  sim replicas={n:2d} env_workers={r['env_workers']:3d} traj/s={r['traj_per_s']:7.2f} "
            f"wall={r['wall_s']:5.1f}s lifetime={r['mean_lifetime_s']:.2f}s occupancy={r['worker_occupancy']:.2f} "
            f"cpu/traj={r['host_cpu_ms_per_trajectory']:.1f}ms cpu_share={r['host_cpu_share']:.2f} "
            f"loop_lag_p99={r['loop_lag_p99_ms']:.0f}ms",
            flush=True,
        )
    base = runs[a.replicas[0]]["traj_per_s"] / a.replicas[0]
    eff = {f"scaling_efficiency_{n}": runs[n]["traj_per_s"] / (n * base) for n in a.replicas}
    return {
        **eff,
        "runs": list(runs.values()),
        "sim": {
            "rows": a.rows,
            "step_ms": a.step_ms,
            "max_tokens": a.max_tokens,
            "turns": a.turns,
            "env_median_ms": a.median_ms,
            "env_p99_ms": a.p99_ms,
            "group_size": a.group_size,
        },
    }


# ------------------------------------------------------------------ (c) the env workers' figure
def measure_env_overhead(quick: bool, address: str | None) -> dict[str, Any]:
    """benchmarks/ray_env_overhead.py's figure, on the cluster at ``address`` (it disconnects at the end)."""
    path = Path(__file__).with_name("ray_env_overhead.py")
    if not path.exists():
        return {
            "ray_env_step_overhead_ms": None,
            "note": "benchmarks/ray_env_overhead.py not present",
        }
    sys.path.insert(0, str(path.parent))
    import ray_env_overhead

    num_envs, steps = (16, 100) if quick else (64, 200)
    out = ray_env_overhead.measure_ray_env_step_overhead(num_envs, steps, address=address)
    return {
        "ray_env_step_overhead_ms": out["ray_env_step_overhead_ms"],
        "ray_env_step_overhead_ms_sharded": out.get("ray_env_step_overhead_ms_sharded"),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick", action="store_true", help="fewer rounds and trajectories (about two minutes)"
    )
    p.add_argument("--rounds", type=int, default=200, help="(a) requests per target")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument(
        "--rows", type=int, default=8, help="(b) rows (concurrent requests) per simulated replica"
    )
    p.add_argument(
        "--step-ms", type=float, default=40.0, help="(b) one decode step of a simulated replica"
    )
    p.add_argument("--max-tokens", type=int, default=12, help="(b) tokens per model call")
    p.add_argument("--turns", type=int, default=3, help="(b) env steps per trajectory")
    p.add_argument(
        "--median-ms", type=float, default=150.0, help="(b) env step latency: lognormal median"
    )
    p.add_argument(
        "--p99-ms", type=float, default=1000.0, help="(b) env step latency: 99th percentile"
    )
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--per-replica", type=int, default=48, help="(b) trajectories timed per replica")
    p.add_argument(
        "--min-trajectories", type=int, default=128, help="(b) at least this many timed per run"
    )
    p.add_argument(
        "--compile-cache",
        default=None,
        help="JAX compilation cache dir (default: a fresh temp dir; off)",
    )
    p.add_argument("--skip", nargs="*", default=[], choices=["overhead", "scaling", "env"])
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.per_replica, a.min_trajectories = 60, 24, 96
    return a


def use_compile_cache(path: str) -> None:
    """One JAX compilation cache for this process and the Ray nodes it starts (they inherit the
    environment): the replica actor loads the programs this process compiled instead of compiling them."""
    import jax

    env = {
        "JAX_COMPILATION_CACHE_DIR": path,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }
    os.environ.update(env)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def main(argv=None) -> dict[str, Any]:
    a = parse_args(argv)
    if a.compile_cache != "off":
        import tempfile

        use_compile_cache(a.compile_cache or tempfile.mkdtemp(prefix="gymllm-scale-jax-"))
    print(
        f"cpu: {cpu_model()} ({os.cpu_count()} cores), load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    result: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average_start": os.getloadavg()[0],
        "quick": a.quick,
    }
    cluster = (
        ray_support.LocalCluster([{"num_cpus": 2}]) if {"overhead", "env"} - set(a.skip) else None
    )
    try:
        t = time.perf_counter()
        if "overhead" not in a.skip:
            over = measure_overhead(a.rounds)
            print(
                f"(a) pool overhead per request: ray {over['pool_request_overhead_ms']:.3f} ms, in-process "
                f"{over['inproc_pool_request_overhead_ms']:.3f} ms; with an instant engine: ray "
                f"{over['pool_request_overhead_null_ms']:.3f} ms, in-process "
                f"{over['inproc_pool_request_overhead_null_ms']:.3f} ms ({time.perf_counter() - t:.0f} s)",
                flush=True,
            )
            result.update(over)
        t = time.perf_counter()
        if "env" not in a.skip:
            env = measure_env_overhead(a.quick, cluster.address)
            print(
                f"(c) ray env step overhead: {env.get('ray_env_step_overhead_ms')} ms "
                f"({time.perf_counter() - t:.0f} s)",
                flush=True,
            )
            result.update(env)
    finally:
        if cluster is not None:
            cluster.shutdown()
    t = time.perf_counter()
    if "scaling" not in a.skip:
        scale = measure_scaling(a)
        print(
            "(b) "
            + " ".join(
                f"{k}={v:.3f}" for k, v in scale.items() if k.startswith("scaling_efficiency")
            )
            + f" ({time.perf_counter() - t:.0f} s)",
            flush=True,
        )
        result.update(scale)
        result["goals"] = {"scaling_efficiency_8": 0.9, "scaling_efficiency_16": 0.8}
    result["load_average_end"] = os.getloadavg()[0]
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("scale", _rounded(result))
    return result


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {str(k): _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


if __name__ == "__main__":
    main()
