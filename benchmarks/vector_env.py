"""Benchmark the barrier-free vector env against Gymnasium's vector envs, side by side.

64 sub-envs of ``gymllm/Latency-v0`` (Echo plus a seeded per-step delay), two settings:

* heavy-tailed latency: lognormal per-step delay, median 20 ms, p99 500 ms. Env-steps/s of
  - ``recv(min_ready=k)`` consumption (each received env is re-sent at once; barrier-free),
  - our synchronous ``step()`` (send to all + receive all: waits for the slowest),
  - ``gymnasium.vector.AsyncVectorEnv(shared_memory=False)`` (one process per sub-env; its step
    waits for the slowest, like every synchronous vector step);
* zero latency: per-step time of our ``step()`` vs ``gymnasium.vector.SyncVectorEnv`` on the same
  envs (pure overhead), plus ``recv(min_ready=k)`` throughput and ``AsyncVectorEnv`` for reference.

The machine is shared and noisy: zero-latency timings interleave our step and Gymnasium's in
rounds; ``overhead_vs_gym_sync`` is the median over rounds of the paired ratio. Gymnasium's AsyncVectorEnv runs first (it forks 64 processes; forking
before our worker threads exist keeps it safe).

RESULT keys: ``barrier_free_vs_gym_async`` (env-steps/s ratio, heavy-tailed latency), beside it
``barrier_free_vs_ours_step`` (the like-for-like figure: ``recv(min_ready=k)`` against our own
synchronous ``step()`` on the same 64 threads, so it isolates the barrier from Gymnasium's
process-per-env transport; ``ours_step_vs_gym_async`` is the transport part), and
``overhead_vs_gym_sync`` (our per-step time / SyncVectorEnv's, zero latency; below 1 is better).
The CPU (``gymllm.utils.host.describe_cpu``) and the load average are printed and in the RESULT.

    python benchmarks/vector_env.py --quick
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import gymnasium as gym

from gymllm.envs.basic import LatencyEnv
from gymllm.utils.host import describe_cpu, loadavg
from gymllm.vector import VectorEnv

NUM_ENVS = 64


def env_fns(median_s: float, p99_s: float, n: int = NUM_ENVS) -> list:
    return [
        functools.partial(LatencyEnv, median_s=median_s, p99_s=p99_s, episode_length=50)
        for _ in range(n)
    ]


def actions(n: int) -> list[str]:
    return [f"act {i} ✓" for i in range(n)]


def steps_per_s_sync(vec, steps: int, seed: int = 0) -> float:
    """Env-steps/s of a synchronous ``step()`` loop (Gymnasium's or ours)."""
    vec.reset(seed=seed)
    acts = actions(vec.num_envs)
    t0 = time.perf_counter()
    for _ in range(steps):
        vec.step(acts)
    return steps * vec.num_envs / (time.perf_counter() - t0)


def steps_per_s_recv(vec: VectorEnv, env_steps: int, min_ready: int, seed: int = 0) -> float:
    """Env-steps/s of barrier-free consumption: recv(min_ready=k), re-send those envs at once."""
    vec.reset(seed=seed)
    acts = actions(vec.num_envs)
    vec.send(acts)
    done = 0
    t0 = time.perf_counter()
    while done < env_steps:
        ids = vec.recv(min_ready=min_ready)[5]
        done += len(ids)
        vec.send([acts[i] for i in ids], env_ids=ids)
    dt = time.perf_counter() - t0
    while vec.in_flight:
        vec.recv(min_ready=len(vec.in_flight))
    return done / dt


def per_step_s(vec, steps: int) -> float:
    acts = actions(vec.num_envs)
    t0 = time.perf_counter()
    for _ in range(steps):
        vec.step(acts)
    return (time.perf_counter() - t0) / steps


def heavy_tailed(steps: int, min_ready: int) -> dict:
    fns = env_fns(0.02, 0.5)
    t0 = time.perf_counter()
    gym_async = gym.vector.AsyncVectorEnv(fns, shared_memory=False)
    startup = time.perf_counter() - t0
    gym_rate = steps_per_s_sync(gym_async, steps)
    gym_async.close()
    ours = VectorEnv(fns)
    sync_rate = steps_per_s_sync(ours, steps)
    recv_rate = steps_per_s_recv(ours, steps * NUM_ENVS, min_ready)
    ours.close()
    return {
        "gym_async_env_steps_per_s": gym_rate,
        "ours_step_env_steps_per_s": sync_rate,
        "ours_recv_env_steps_per_s": recv_rate,
        "gym_async_startup_s": startup,
        "barrier_free_vs_gym_async": recv_rate / gym_rate,
        "ours_step_vs_gym_async": sync_rate / gym_rate,
        "barrier_free_vs_ours_step": recv_rate / sync_rate,
    }


def zero_latency(rounds: int, steps: int, min_ready: int) -> dict:
    fns = env_fns(0.0, 0.0)
    gym_async = gym.vector.AsyncVectorEnv(fns, shared_memory=False)
    gym_async_rate = steps_per_s_sync(gym_async, max(steps // 4, 5))
    gym_async.close()
    gym_sync = gym.vector.SyncVectorEnv(fns)
    ours = VectorEnv(fns)
    gym_sync.reset(seed=0)
    ours.reset(seed=0)
    per_step_s(gym_sync, steps)  # warm-up (ours also learns which sub-envs to run inline)
    per_step_s(ours, steps)
    ours_t, gym_t = [], []
    for _ in range(rounds):
        ours_t.append(per_step_s(ours, steps))
        gym_t.append(per_step_s(gym_sync, steps))
    recv_rate = steps_per_s_recv(ours, steps * NUM_ENVS, min_ready)
    gym_sync.close()
    ours.close()
    ours_med, gym_med = statistics.median(ours_t), statistics.median(gym_t)
    paired = statistics.median(
        o / g for o, g in zip(ours_t, gym_t)
    )  # adjacent rounds see the same load
    return {
        "ours_step_ms": ours_med * 1e3,
        "gym_sync_step_ms": gym_med * 1e3,
        "ours_step_ms_best": min(ours_t) * 1e3,
        "gym_sync_step_ms_best": min(gym_t) * 1e3,
        "overhead_vs_gym_sync": paired,
        "best_round_ratio": min(ours_t) / min(gym_t),
        "ours_recv_env_steps_per_s": recv_rate,
        "gym_async_env_steps_per_s": gym_async_rate,
        "ours_step_env_steps_per_s": NUM_ENVS / ours_med,
        "gym_sync_env_steps_per_s": NUM_ENVS / gym_med,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps (about two minutes here)")
    parser.add_argument("--min-ready", type=int, default=8, help="k in recv(min_ready=k)")
    args = parser.parse_args()
    heavy_steps, rounds, zero_steps = (15, 21, 50) if args.quick else (60, 41, 100)
    cpu, load0 = describe_cpu(), loadavg()
    print(f"CPU: {cpu}; load average {load0}", flush=True)
    heavy = heavy_tailed(heavy_steps, args.min_ready)
    print(
        "heavy-tailed latency (median 20 ms, p99 500 ms), 64 envs:",
        json.dumps(heavy, indent=1),
        flush=True,
    )
    zero = zero_latency(rounds, zero_steps, args.min_ready)
    print("zero latency, 64 envs:", json.dumps(zero, indent=1), flush=True)
    result = {
        "barrier_free_vs_gym_async": round(heavy["barrier_free_vs_gym_async"], 3),
        "barrier_free_vs_ours_step": round(heavy["barrier_free_vs_ours_step"], 3),
        "ours_step_vs_gym_async": round(heavy["ours_step_vs_gym_async"], 3),
        "overhead_vs_gym_sync": round(zero["overhead_vs_gym_sync"], 3),
        "num_envs": NUM_ENVS,
        "min_ready": args.min_ready,
        "quick": args.quick,
        "heavy_tailed": {k: round(v, 3) for k, v in heavy.items()},
        "zero_latency": {k: round(v, 3) for k, v in zero.items()},
        "cpu": cpu,
        "loadavg": {"start": load0, "end": loadavg()},
    }
    print(f"{'figure':28s} {'value':>8s}")
    for k in (
        "barrier_free_vs_gym_async",
        "barrier_free_vs_ours_step",
        "ours_step_vs_gym_async",
        "overhead_vs_gym_sync",
    ):
        print(f"{k:28s} {result[k]:8.3f}")
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("vector_env", result)


if __name__ == "__main__":
    main()
