"""Rollout throughput: the async orchestrator vs the synchronous baseline vs the zero-latency ceiling.

Workload (the same for the three runs): ``--trajectories`` trajectories in groups of ``--group-size``,
each ``--turns`` turns of at most ``--max-tokens`` sampled tokens, over a barrier-free vector env
(``gymllm/AsyncLatency-v0``) whose every step waits a seeded heavy-tailed lognormal latency
(median ``--median-ms``, 99th percentile ``--p99-ms``), standing in for a tool call. One JaxEngine
(continuous batching, ``--engine-slots`` decode rows) serves all three runs, compiled up front.

* async    RolloutOrchestrator, ``max_concurrency = --concurrency`` (no staleness bound: no learner);
* sync     generate a whole batch (``--sync-batch`` trajectories, default ``--concurrency``), step all
           envs, repeat;
* ceiling  the async run with zero env latency: the generation-bound upper limit.

Figures: trajectories/s and engine-busy fraction (time with >= 1 request in flight / wall) per
run; the three runs are repeated ``--repeats`` times, interleaved, and the best of each is kept
(the machine may be shared). Models: the tiny random model (always) and SmolLM2-135M-Instruct from
the model registry (full mode, or ``--models tiny,smollm2``; skipped with a note when it cannot be
loaded; on a shared 2-core CPU it takes tens of minutes: meant for an accelerator or an idle
machine). Ends with one line ``RESULT {json}``:
``async_vs_sync`` and ``async_vs_ceiling`` (trajectories/s ratios) and ``engine_busy_fraction``
(async run) for the first model, plus per-model figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small, about two minutes")
    p.add_argument("--models", default=None, help="comma list: tiny,smollm2 (default: tiny; +smollm2 unless --quick)")
    p.add_argument("--trajectories", type=int, default=64)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=64, help="trajectories in flight (async)")
    p.add_argument("--engine-slots", type=int, default=16, help="the engine's decode batch (KV-cache rows)")
    p.add_argument("--sync-batch", type=int, default=None, help="trajectories per sync batch (default: concurrency)")
    p.add_argument("--median-ms", type=float, default=100.0)
    p.add_argument("--p99-ms", type=float, default=1000.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-len", type=int, default=384, help="engine context per slot")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats per mode; the best is kept")
    a = p.parse_args(argv)
    if a.quick:
        a.trajectories = min(a.trajectories, 32)
        a.concurrency = min(a.concurrency, 32)
        a.engine_slots = min(a.engine_slots, 8)
        a.turns = min(a.turns, 3)
    a.models = (a.models or ("tiny" if a.quick else "tiny,smollm2")).split(",")
    a.sync_batch = a.sync_batch or a.concurrency
    return a


def load_model(name: str):
    """The tiny random model, or SmolLM2-135M-Instruct through the model registry (None if unavailable)."""
    if name == "tiny":
        from gymllm.models.tiny import make_tiny

        return make_tiny("llama", seed=0)
    if name == "smollm2":
        from gymllm.errors import ModelLoadError
        from gymllm.models import load

        try:
            return load("smollm2-135m-instruct")
        except ModelLoadError as e:
            print(f"[smollm2] skipped: {e}", flush=True)
            return None
    raise SystemExit(f"--models: expected tiny or smollm2, received {name!r}")


def make_envs(a, n: int, latency: bool):
    import gymllm

    med, p99 = (a.median_ms / 1e3, a.p99_ms / 1e3) if latency else (0.0, 0.0)
    return gymllm.make_vec("gymllm/AsyncLatency-v0", num_envs=n, median_s=med, p99_s=p99, episode_length=a.turns)


async def run_async(a, lm, engine, *, latency: bool, n_traj: int) -> dict:
    from gymllm.inference.params import SamplingParams
    from gymllm.rollout import ModelAgent, RolloutConfig, RolloutOrchestrator

    vec = make_envs(a, a.concurrency, latency)
    cfg = RolloutConfig(group_size=a.group_size, max_concurrency=a.concurrency, num_groups=n_traj // a.group_size,
                        max_staleness=None, seed=a.seed, max_model_calls=a.turns + 1, queue_size=64)
    orch = RolloutOrchestrator(vec, engine, ModelAgent(lm.tokenizer),
                               sampling=SamplingParams(temperature=1.0, max_tokens=a.max_tokens), config=cfg)
    t0 = time.perf_counter()
    n = 0
    try:
        async with orch:
            async for g in orch.groups():
                n += len(g.trajectories)
            wall = time.perf_counter() - t0
            stats = orch.stats()
            if stats.get("groups_failed"):
                print(f"  warning: {stats['groups_failed']} groups failed: {stats['errors'][:2]}", flush=True)
    finally:
        vec.close()
    return {"trajectories": n, "wall_s": wall, "traj_per_s": n / wall,
            "engine_busy_fraction": stats["engine_busy_fraction"], "loop_lag_p99_ms": stats["loop_lag_p99_ms"]}


async def run_sync(a, lm, engine, *, n_traj: int) -> dict:
    from gymllm.inference.params import SamplingParams
    from gymllm.rollout import ModelAgent, MeteredEngine, RolloutConfig, sync_rollout

    vec = make_envs(a, a.sync_batch, True)
    eng = MeteredEngine(engine)
    cfg = RolloutConfig(group_size=a.group_size, num_groups=n_traj // a.group_size,
                        groups_per_step=a.sync_batch // a.group_size, max_staleness=0, seed=a.seed,
                        max_model_calls=a.turns + 1)
    t0 = time.perf_counter()
    eng.reset_clock()
    try:
        groups = await sync_rollout(vec, eng, ModelAgent(lm.tokenizer), config=cfg,
                                    sampling=SamplingParams(temperature=1.0, max_tokens=a.max_tokens))
    finally:
        vec.close()
    wall = time.perf_counter() - t0
    n = sum(len(g.trajectories) for g in groups)
    return {"trajectories": n, "wall_s": wall, "traj_per_s": n / wall, "engine_busy_fraction": eng.busy_fraction()}


def bench_model(a, name: str) -> dict | None:
    from gymllm.inference.config import EngineConfig
    from gymllm.inference.jax_engine import JaxEngine

    lm = load_model(name)
    if lm is None:
        return None
    # one prefill length bucket (= max_len) and two prefill batch sizes: three compiled shapes in all,
    # compiled before any timed run (a compile inside a timed run would swamp the comparison)
    engine = JaxEngine(lm.model, lm.tokenizer, config=EngineConfig(
        num_slots=a.engine_slots, max_len=a.max_len, min_bucket=a.max_len, max_prefill_batch=2, idle_wait_s=0.001))
    try:
        t = time.perf_counter()
        engine.warmup()
        print(f"[{name}] warm-up (compile) {time.perf_counter() - t:.1f} s, shapes {engine.trace_counts}", flush=True)
        asyncio.run(run_async(a, lm, engine, latency=False, n_traj=a.group_size * 2))  # warm the Python side
        runs = {
            "ceiling": lambda: asyncio.run(run_async(a, lm, engine, latency=False, n_traj=a.trajectories)),
            "async": lambda: asyncio.run(run_async(a, lm, engine, latency=True, n_traj=a.trajectories)),
            "sync": lambda: asyncio.run(run_sync(a, lm, engine, n_traj=a.trajectories)),
        }
        res: dict[str, dict] = {}
        for _ in range(a.repeats):  # interleaved repeats; the best of each mode (the machine is shared)
            for mode, run in runs.items():
                out = run()
                if mode not in res or out["traj_per_s"] > res[mode]["traj_per_s"]:
                    res[mode] = out
    finally:
        engine.shutdown()
    for k, v in res.items():
        print(f"[{name}] {k:8s} {v['trajectories']:4d} traj in {v['wall_s']:7.2f} s = {v['traj_per_s']:7.2f} traj/s, "
              f"engine busy {v['engine_busy_fraction']:.2f}", flush=True)
    return {
        "async_traj_per_s": res["async"]["traj_per_s"], "sync_traj_per_s": res["sync"]["traj_per_s"],
        "ceiling_traj_per_s": res["ceiling"]["traj_per_s"],
        "async_vs_sync": res["async"]["traj_per_s"] / res["sync"]["traj_per_s"],
        "async_vs_ceiling": res["async"]["traj_per_s"] / res["ceiling"]["traj_per_s"],
        "engine_busy_fraction": res["async"]["engine_busy_fraction"],
        "sync_engine_busy_fraction": res["sync"]["engine_busy_fraction"],
        "ceiling_engine_busy_fraction": res["ceiling"]["engine_busy_fraction"],
        "loop_lag_p99_ms": res["async"]["loop_lag_p99_ms"],
    }


def main(argv=None) -> None:
    a = parse_args(argv)
    print(f"rollout benchmark: {a.trajectories} trajectories (G={a.group_size}), {a.turns} turns, "
          f"<= {a.max_tokens} tokens/turn, concurrency {a.concurrency}, engine slots {a.engine_slots}, "
          f"env latency lognormal "
          f"median {a.median_ms:.0f} ms p99 {a.p99_ms:.0f} ms", flush=True)
    per_model = {}
    for name in a.models:
        out = bench_model(a, name)
        if out is not None:
            per_model[name] = out
    if not per_model:
        sys.exit("no model could be benchmarked")
    first = per_model[next(iter(per_model))]
    result = {k: round(first[k], 4) for k in ("async_vs_sync", "async_vs_ceiling", "engine_busy_fraction")}
    result["models"] = {m: {k: round(v, 4) for k, v in r.items()} for m, r in per_model.items()}
    result["config"] = {"trajectories": a.trajectories, "group_size": a.group_size, "turns": a.turns,
                        "max_tokens": a.max_tokens, "concurrency": a.concurrency, "engine_slots": a.engine_slots, "sync_batch": a.sync_batch,
                        "median_ms": a.median_ms, "p99_ms": a.p99_ms, "repeats": a.repeats, "quick": a.quick}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
