"""Per-env-step overhead of the vector env's Ray backend over the in-process one (zero-latency envs).

``num_envs`` sub-envs of ``gymllm/Latency-v0`` with zero latency, driven barrier-free
(``send`` / ``recv(min_ready=1)``, each ready env re-sent at once) on the thread backend and on the
Ray backend (one actor per env, and shards of ``--envs-per-actor``), rounds interleaved; the
figure is the median over rounds of (Ray wall time - thread wall time) / env steps, in ms.
Ray runs as a real 2-node cluster on 127.0.0.1 (``gymllm.ray_support.LocalCluster``) unless
``--address`` joins a running one.

RESULT keys: ``ray_env_step_overhead_ms`` (one actor per env; goal <= 2 ms) and
``ray_env_step_overhead_ms_sharded`` (``--envs-per-actor`` envs per actor).

    python benchmarks/ray_env_overhead.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import gymllm.ray_support as ray_support  # before ray: loopback nodes, no usage stats
from gymllm.registration import make_vec


def measure_env_step_overhead(
    num_envs: int = 32,
    steps: int = 200,
    *,
    envs_per_actor: int | None = None,
    num_cpus: float = 0.0,
    rounds: int = 3,
) -> dict[str, Any]:
    """Per-env-step overhead of the Ray backend over the in-process one, on zero-latency envs.

    ``num_envs`` sub-envs of ``gymllm/Latency-v0`` with zero latency (pure overhead): ``steps``
    steps through barrier-free ``send``/``recv(min_ready=1)`` (each ready env re-sent at once) on
    each backend, ``rounds`` rounds interleaved; the figure is the median over rounds of
    ``(ray wall time - thread wall time) / env steps``. Connects to Ray through
    :func:`gymllm.ray_support.init_ray` when not connected yet.
    """

    def run(vec: Any) -> float:
        vec.reset(seed=0)
        total, left = num_envs * steps, [steps] * num_envs
        t0 = time.perf_counter()
        vec.send(["a"] * num_envs)
        got = 0
        while got < total:
            *_, ids = vec.recv(min_ready=1)
            got += len(ids)
            again = []
            for i in ids:
                left[i] -= 1
                if left[i] > 0:
                    again.append(int(i))
            if again:
                vec.send(["a"] * len(again), env_ids=again)
        return time.perf_counter() - t0

    kw = {"median_s": 0.0, "p99_s": 0.0, "episode_length": 10**9}
    opts: dict[str, Any] = {"num_cpus": num_cpus}
    if envs_per_actor is not None:
        opts["envs_per_actor"] = envs_per_actor
    local = make_vec("gymllm/Latency-v0", num_envs, **kw)
    t_build = time.perf_counter()
    remote = make_vec("gymllm/Latency-v0", num_envs, backend="ray", ray_options=opts, **kw)
    build_s = time.perf_counter() - t_build
    try:
        run(remote)  # warm-up: worker imports, first calls
        per_round = []
        for _ in range(rounds):
            t_local, t_ray = run(local), run(remote)
            per_round.append(((t_ray - t_local) / (num_envs * steps) * 1e3, t_local, t_ray))
    finally:
        local.close()
        remote.close()
    overhead = statistics.median(r[0] for r in per_round)
    return {
        "ray_env_step_overhead_ms": round(overhead, 4),
        "num_envs": num_envs,
        "steps": steps,
        "envs_per_actor": envs_per_actor or 1,
        "rounds": rounds,
        "build_s": round(build_s, 3),
        "thread_env_steps_per_s": round(
            num_envs * steps / statistics.median(r[1] for r in per_round), 1
        ),
        "ray_env_steps_per_s": round(
            num_envs * steps / statistics.median(r[2] for r in per_round), 1
        ),
    }


def measure(
    num_envs: int = 32,
    steps: int = 200,
    envs_per_actor: int = 8,
    rounds: int = 3,
    address: str | None = None,
) -> dict[str, Any]:
    """Both figures on one cluster (started here unless ``address`` is given)."""
    cluster = None
    if address is None:
        cluster = ray_support.LocalCluster([{"num_cpus": 2}, {"num_cpus": 2}])
    else:
        ray_support.init_ray(address)
    try:
        one = measure_env_step_overhead(num_envs, steps, num_cpus=0.01, rounds=rounds)
        shard = measure_env_step_overhead(
            num_envs, steps, num_cpus=0.01, rounds=rounds, envs_per_actor=envs_per_actor
        )
    finally:
        if cluster is not None:
            cluster.shutdown()
        else:
            ray_support.require_ray().shutdown()
    return {
        "ray_env_step_overhead_ms": one["ray_env_step_overhead_ms"],
        "ray_env_step_overhead_ms_sharded": shard["ray_env_step_overhead_ms"],
        "goal_ms": 2.0,
        "one_env_per_actor": one,
        "sharded": shard,
    }


measure_ray_env_step_overhead = measure  # the name benchmarks/scale.py may import


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="16 envs, 100 steps each, 3 rounds")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--envs-per-actor", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--address", default=None, help="join a running cluster ('auto' or host:port)")
    a = p.parse_args(argv)
    if a.quick:
        a.num_envs, a.steps = 16, 100
    result = measure(a.num_envs, a.steps, a.envs_per_actor, a.rounds, a.address)
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("ray_env_overhead", result)
    return result


if __name__ == "__main__":
    main()
