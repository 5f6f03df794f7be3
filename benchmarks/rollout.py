"""Rollout throughput: the async orchestrator vs the synchronous baseline vs the zero-latency ceiling.

Workload (issue 5; the same for every run of one model): rollout batches of ``--trajectories``
trajectories (64: the trajectories one optimizer step trains on), groups of ``--group-size``, each
``--turns`` turns of at most ``--max-tokens`` sampled tokens, over a barrier-free vector env
(``gymllm/AsyncLatency-v0``) whose every step waits a seeded heavy-tailed lognormal latency (median
``--median-ms``, 99th percentile ``--p99-ms``), standing in for a tool call. ``--batches``
consecutive rollout batches are measured, as a trainer runs many (a single batch is reported too).

* sync     the synchronous baseline as a synchronous trainer runs it: the whole rollout batch at
           once (all its trajectories in the engine together), step all envs, repeat; batch after
           batch (the next batch needs the new weights, so batches never overlap);
* async    RolloutOrchestrator streaming groups as a trainer consumes them, ``--concurrency``
           trajectories in flight (default 2 x trajectories: what the AReaL staleness bound eta = 1
           admits with 64-trajectory steps; no learner here, so no staleness gate), timed in steady
           state: from the moment the first rollout batch has been consumed to the moment
           ``batches x trajectories`` more have been (the next step's trajectories are already
           running at both ends, as in training; the ones in flight at the end are not counted);
* ceiling  the async run with zero env latency: the generation-bound upper limit (same timing);
* narrow   the async run with only ``--trajectories`` in flight (the sync batch's width): separates
           hiding tool latency from running wider engine batches (``async_narrow_vs_sync``);
* drained  the async orchestrator admitting exactly ``batches x trajectories`` and timed from the
           start to the last one (``async_drained_vs_sync``): the end of a training run, when the
           last heavy-tailed trajectories finish with nothing left to admit behind them;
* one-batch  the async orchestrator on a single batch (``--trajectories`` trajectories, as many in
           flight) against the sync time of one batch. A single batch's makespan is at least its
           slowest trajectory's, so even at zero generation cost this ratio is at most ~1.95x here
           (simulated: E[sum over 4 turns of the max of 64 latencies] = 4.6 s against E[max over 64
           trajectories of their 4 summed latencies] = 2.3 s); a 3x needs the stream of batches.

Reading the figures: ``async_vs_sync`` <= ``ceiling_vs_sync`` = (sync generation + latency barriers)
/ (generation at the async batch width), which shrinks as generation slows (a loaded CPU, a bigger
model): on a machine where one 64-trajectory turn generates in about the max tool latency (~1 s), no
schedule reaches 3x. The per-run "lifetime shares" (generation / env / other, Little's law) show
where trajectories spend their time; "other" in the sync run is waiting at the barriers.
``async_vs_ceiling`` near 1 needs the async run's device work per token to match the ceiling's: with
~40% of the in-flight trajectories waiting on their env, their rows stay pinned (their k/v are reused
next turn), and the engine's row compaction swaps them out of the way so each decode step runs only
about as wide as the rows that decode (measured idle: async decode/prefill device time 1.10x the
ceiling's for the same trajectories; 1.33x when steps stayed as wide as the highest pinned row).

Where a turn's generation goes (tiny model, 64 trajectories, measured on a loaded 2-core CPU): the
sync turn makes ~16 prefill calls (4 rows of ~50 new tokens each: the previous sampled token and the
observation delta, bucket 64) and ~15 decode steps 64 rows wide. A prefill call
(``gymllm.models.prefill``) reads only its rows' reused prefix, in a length bucket (0, ``max_len / 2``
or ``max_len`` here): 4 x 64 at max_len 384 ~1.4 ms without a prefix, ~3.2 ms over 192 cached slots
(``benchmarks/prefill.py``, loaded machine; the generic cached forward it replaced carried the whole
context rows through the layers: ~6-8 ms at max_len 384, ~11 ms at 768, when device time split about
evenly between prefill and decode); a decode step over 64 rows costs ~4 ms over 192 cache slots, ~6 ms
over 384; over 128 rows ~6 / ~11 ms. Per 64 trajectories x 4 turns the process spends ~0.7 CPU-s in
XLA, ~0.13 s in the engine thread's Python, ~0.12-0.29 s on the event loop (token buffer: two
template renders and one delta encode, ~0.3 ms per trajectory-turn) and ~0.1 s in the env threads;
the 128-wide async runs use about the same CPU per trajectory as the sync baseline.

Every run gets a fresh JaxEngine of one config (same slots, buckets, dtype and ``--decode-chunk`` on
every side; the compiled programs are shared, so only the first compiles): a reused engine would
hand a run the previous run's cached prefixes and scatter the sync batch over all the rows (see
``_engine``). ``--engine-slots`` defaults to the async concurrency (every in-flight trajectory keeps
its KV row between turns, as a paged-cache server would; the sync baseline's batch fits in it whole).
Figures: trajectories/s and engine-busy fraction (time with >= 1 request in flight / wall) per run;
runs are repeated ``--repeats`` times, interleaved, and the best of each is kept (the machine may be
shared). ``--compile-cache DIR`` keeps JAX's compiled programs on disk between invocations (the tiny
model's ~20 shapes take minutes to compile on a loaded 2-core machine, seconds from the cache).

Models: the tiny random model and SmolLM2-135M-Instruct (``--models tiny,smollm2``, the default
without ``--quick``). SmolLM2 on a 2-core CPU generates ~100x slower than the tiny model, so its
workload is scaled down (``--smollm2-trajectories`` 16 per batch, ``--smollm2-batches`` 2,
``--smollm2-max-tokens`` 8, ``--smollm2-max-len`` 192, bf16 compute, one repeat; about four minutes
on an idle 2-core machine, ten on a loaded one). Ends with one
line ``RESULT {json}``: ``async_vs_sync``, ``async_vs_ceiling`` (trajectories/s ratios) and
``engine_busy_fraction`` (async run) for the first model, plus per-model figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time

from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# flag -> (default, default under --quick); --quick never overrides a flag given explicitly
_DEFAULTS = {"models": ("tiny,smollm2", "tiny"), "repeats": (2, 1)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """One model's workload (see the module docstring)."""

    trajectories: int  # per rollout batch (= the sync baseline's batch)
    batches: int
    turns: int
    max_tokens: int
    group_size: int
    concurrency: int  # async trajectories in flight
    engine_slots: int
    median_ms: float
    p99_ms: float
    max_len: int  # engine context per slot
    min_bucket: int  # the smallest prefill length bucket (a turn's new tokens fit in it)
    prefill_batch: int  # the engine's max_prefill_batch
    decode_lengths: int  # cache-length buckets of the decode step
    decode_chunk: int  # the engine's decode steps per device call while no request waits
    compute_dtype: str | None  # the engine's compute dtype (None: the model's)
    piggyback_tokens: int  # turns whose new tokens fit this bucket ride along decode steps (0: off)
    repeats: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.trajectories % self.group_size:
            raise SystemExit(
                f"--trajectories: expected a multiple of --group-size {self.group_size}, "
                f"received {self.trajectories}. Fix: pass e.g. {self.group_size * 16}."
            )
        if self.engine_slots < self.trajectories:
            raise SystemExit(
                f"--engine-slots: expected >= --trajectories {self.trajectories} (the sync batch "
                f"runs whole), received {self.engine_slots}."
            )

    @property
    def total(self) -> int:
        return self.trajectories * self.batches


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="tiny model, one repeat (same workload), a few minutes"
    )
    p.add_argument(
        "--models",
        default=None,
        help="comma list of tiny,smollm2 (default tiny,smollm2; --quick: tiny)",
    )
    p.add_argument(
        "--trajectories", type=int, default=64, help="trajectories per rollout batch (= sync batch)"
    )
    p.add_argument("--batches", type=int, default=4, help="consecutive rollout batches measured")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="async trajectories in flight (2 x trajectories)",
    )
    p.add_argument(
        "--engine-slots", type=int, default=None, help="the engine's KV rows (default: concurrency)"
    )
    p.add_argument("--median-ms", type=float, default=100.0)
    p.add_argument("--p99-ms", type=float, default=1000.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-len", type=int, default=384, help="engine context per slot (tiny)")
    p.add_argument(
        "--min-bucket", type=int, default=64, help="smallest prefill length bucket (tiny)"
    )
    p.add_argument(
        "--prefill-batch", type=int, default=4, help="the engine's max_prefill_batch (tiny)"
    )
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="sys.setswitchinterval for the run "
        "(default: Python's 5 ms): the engine thread waits up to this long for the GIL after each "
        "device call while the event loop runs Python",
    )
    p.add_argument(
        "--piggyback-tokens",
        type=int,
        default=-1,
        help="EngineConfig.piggyback_tokens: a turn's new "
        "tokens up to this bucket ride along decode steps (-1: SmolLM2 its smallest prefill bucket, tiny off "
        "(its steps are compute bound: riding costs as much as prefilling alone); 0: off)",
    )
    p.add_argument(
        "--compile-cache", default=None, help="directory for JAX's persistent compilation cache"
    )
    p.add_argument(
        "--decode-chunk",
        type=int,
        default=1,
        help="the engine's decode steps per device call "
        "while no request waits to join (JaxEngine(decode_chunk=K); 1: one step per call)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="interleaved repeats per mode; the best is kept (2)",
    )
    p.add_argument("--smollm2-trajectories", type=int, default=16)
    p.add_argument("--smollm2-batches", type=int, default=2)
    p.add_argument("--smollm2-max-tokens", type=int, default=8)
    p.add_argument("--smollm2-repeats", type=int, default=1)
    p.add_argument("--smollm2-max-len", type=int, default=192)
    p.add_argument("--smollm2-prefill-batch", type=int, default=2)
    p.add_argument(
        "--smollm2-compute-dtype",
        default="bfloat16",
        help="engine compute dtype for SmolLM2: "
        "'bfloat16' (bf16 matmuls, f32 accumulation; measured idle: 1.9x the trajectories/s of float32 "
        "at 32 in flight on this AMX CPU) or 'none' (float32)",
    )
    a = p.parse_args(argv)
    for flag, (full, quick) in _DEFAULTS.items():
        if getattr(a, flag) is None:
            setattr(a, flag, quick if a.quick else full)
    a.models = a.models.split(",")
    return a


def workload(a, model: str) -> Workload:
    small = model == "smollm2"
    n = a.smollm2_trajectories if small else a.trajectories
    conc = a.concurrency or 2 * n
    return Workload(
        trajectories=n,
        batches=a.smollm2_batches if small else a.batches,
        turns=a.turns,
        max_tokens=a.smollm2_max_tokens if small else a.max_tokens,
        group_size=a.group_size,
        concurrency=conc,
        engine_slots=a.engine_slots or conc,
        median_ms=a.median_ms,
        p99_ms=a.p99_ms,
        max_len=a.smollm2_max_len if small else a.max_len,
        min_bucket=a.min_bucket,
        prefill_batch=a.smollm2_prefill_batch if small else a.prefill_batch,
        decode_lengths=2,
        decode_chunk=a.decode_chunk,
        repeats=a.smollm2_repeats if small else a.repeats,
        seed=a.seed,
        compute_dtype=(None if a.smollm2_compute_dtype == "none" else a.smollm2_compute_dtype)
        if small
        else None,
        piggyback_tokens=(min(a.min_bucket, a.smollm2_max_len) if small else 0)
        if a.piggyback_tokens < 0
        else a.piggyback_tokens,
    )


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


def make_envs(w: Workload, n: int, latency: bool):
    import gymllm

    med, p99 = (w.median_ms / 1e3, w.p99_ms / 1e3) if latency else (0.0, 0.0)
    return gymllm.make_vec(
        "gymllm/AsyncLatency-v0", num_envs=n, median_s=med, p99_s=p99, episode_length=w.turns
    )


def _sampling(w: Workload):
    from gymllm.inference.params import SamplingParams

    return SamplingParams(temperature=1.0, max_tokens=w.max_tokens)


def _trajectory_figures(trajs: list, wall: float) -> dict:
    """Little's law: mean trajectories in flight = sum of lifetimes / wall; the share of a lifetime
    spent neither in the engine nor in the env is the rollout's own overhead (loop, scheduling)."""
    life = sum(t.timings["total_s"] for t in trajs)
    gen = sum(t.timings["generation_s"] for t in trajs)
    env = sum(t.timings["env_s"] for t in trajs)
    return {
        "mean_in_flight": life / wall,
        "generation_share": gen / life,
        "env_share": env / life,
        "overhead_share": max(0.0, 1.0 - (gen + env) / life),
    }


async def run_async(
    w: Workload, lm, engine, *, latency: bool, n_traj: int, concurrency: int, stream: bool = True
) -> dict:
    """The orchestrator until ``n_traj`` trajectories are consumed.

    ``stream`` (how a trainer runs it): groups are admitted without end, so the next step's rollouts
    run while this step's finish, and the figures are steady-state: the clock starts when the first
    rollout batch (``w.trajectories``) has been consumed and stops at the ``n_traj``-th trajectory
    after it (those in flight at either end are neither counted nor drained). Else exactly ``n_traj``
    are admitted, timed from the start, and the run drains to the last one."""
    from gymllm.rollout import ModelAgent, RolloutConfig, RolloutOrchestrator

    vec = make_envs(w, concurrency, latency)
    cfg = RolloutConfig(
        group_size=w.group_size,
        max_concurrency=concurrency,
        num_groups=None if stream else n_traj // w.group_size,
        max_staleness=None,
        seed=w.seed,
        max_model_calls=w.turns + 1,
        queue_size=n_traj // w.group_size,
    )
    orch = RolloutOrchestrator(
        vec, engine, ModelAgent(lm.tokenizer), sampling=_sampling(w), config=cfg
    )
    skip = w.trajectories if stream else 0
    trajs: list = []
    t0 = time.perf_counter()
    try:
        async with orch:
            async for g in orch.groups():
                trajs.extend(g.trajectories)
                if (
                    len(trajs) == skip
                ):  # steady state from here (a batch is a whole number of groups)
                    t0 = time.perf_counter()
                    orch.engine.reset_clock()
                if len(trajs) >= skip + n_traj:
                    break
            wall = time.perf_counter() - t0
            stats = orch.stats()
            if stats.get("groups_failed"):
                print(
                    f"  warning: {stats['groups_failed']} groups failed: {stats['errors'][:2]}",
                    flush=True,
                )
    finally:
        vec.close()
    trajs = trajs[skip:]
    return {
        "trajectories": len(trajs),
        "wall_s": wall,
        "traj_per_s": len(trajs) / wall,
        "engine_busy_fraction": stats["engine_busy_fraction"],
        "loop_lag_p99_ms": stats["loop_lag_p99_ms"],
        **_trajectory_figures(trajs, wall),
    }


async def run_sync(w: Workload, lm, engine) -> dict:
    from gymllm.rollout import MeteredEngine, ModelAgent, RolloutConfig, sync_rollout

    vec = make_envs(w, w.trajectories, True)
    eng = MeteredEngine(engine)
    cfg = RolloutConfig(
        group_size=w.group_size,
        num_groups=w.total // w.group_size,
        groups_per_step=w.trajectories // w.group_size,
        max_staleness=0,
        seed=w.seed,
        max_model_calls=w.turns + 1,
    )
    t0 = time.perf_counter()
    eng.reset_clock()
    try:
        groups = await sync_rollout(
            vec, eng, ModelAgent(lm.tokenizer), config=cfg, sampling=_sampling(w)
        )
    finally:
        vec.close()
    wall = time.perf_counter() - t0
    trajs = [t for g in groups for t in g.trajectories]
    return {
        "trajectories": len(trajs),
        "wall_s": wall,
        "traj_per_s": len(trajs) / wall,
        "engine_busy_fraction": eng.busy_fraction(),
        **_trajectory_figures(trajs, wall),
    }


def _engine(w: Workload, lm):
    """A fresh engine of the workload's one config: each run starts from an empty slot table.

    A reused engine would hand a run the cached prefixes of the previous one: the slot table
    prefers the row with the longest cached prefix, so after a 128-wide async run a 64-trajectory
    sync batch lands on rows scattered over all 128 and every decode step runs 128 wide over the
    whole context (measured: the sync run's decode time x2.3). The compiled steps are shared by
    engines over the same model graph, so only the first engine compiles."""
    from gymllm.inference.config import EngineConfig
    from gymllm.inference.jax_engine import JaxEngine

    # prefill length buckets min_bucket..max_len (a trajectory's later turns prefill only their new
    # tokens: its row keeps the k/v) x power-of-two batch sizes, and one decode step per power-of-two
    # width: compiled before any timed run (a compile inside a timed run would swamp the comparison).
    # The engine is woken by every request: the idle poll (idle_wait_s) only matters for shutdown.
    engine = JaxEngine(
        lm.model,
        lm.tokenizer,
        decode_chunk=w.decode_chunk,
        config=EngineConfig(
            num_slots=w.engine_slots,
            max_len=w.max_len,
            min_bucket=min(w.min_bucket, w.max_len),
            max_prefill_batch=w.prefill_batch,
            decode_lengths=w.decode_lengths,
            compute_dtype=w.compute_dtype,
            piggyback_tokens=w.piggyback_tokens,
        ),
    )
    engine.warmup()
    return engine


async def _with_engine(w: Workload, lm, run) -> dict:
    """``run(engine)`` on a fresh engine (see :func:`_engine`), shut down afterwards."""
    engine = _engine(w, lm)
    try:
        return await run(engine)
    finally:
        engine.shutdown()


def bench_model(a, name: str) -> dict | None:
    lm = load_model(name)
    if lm is None:
        return None
    w = workload(a, name)
    print(
        f"[{name}] {w.batches} batches x {w.trajectories} trajectories (G={w.group_size}), {w.turns} turns, "
        f"<= {w.max_tokens} tokens/turn; async concurrency {w.concurrency}, engine slots {w.engine_slots}; "
        f"env latency lognormal median {w.median_ms:.0f} ms p99 {w.p99_ms:.0f} ms",
        flush=True,
    )
    t = time.perf_counter()
    asyncio.run(
        _with_engine(
            w,
            lm,
            lambda e: run_async(  # compiles every shape once (later engines reuse
                w, lm, e, latency=False, n_traj=w.group_size * 2, concurrency=w.concurrency
            ),
        )
    )  # the programs)
    print(f"[{name}] warm-up (compile) {time.perf_counter() - t:.1f} s", flush=True)
    total, c, n = w.total, w.concurrency, w.trajectories
    runs = {
        "ceiling": lambda e: run_async(w, lm, e, latency=False, n_traj=total, concurrency=c),
        "async": lambda e: run_async(w, lm, e, latency=True, n_traj=total, concurrency=c),
        "sync": lambda e: run_sync(w, lm, e),
        "narrow": lambda e: run_async(w, lm, e, latency=True, n_traj=total, concurrency=n),
        "drained": lambda e: run_async(
            w, lm, e, latency=True, n_traj=total, concurrency=c, stream=False
        ),
        "one_batch": lambda e: run_async(
            w, lm, e, latency=True, n_traj=n, concurrency=n, stream=False
        ),
    }
    res: dict[str, dict] = {}
    for _ in range(w.repeats):  # interleaved repeats; the best of each mode (the machine is shared)
        for mode, run in runs.items():
            out = asyncio.run(_with_engine(w, lm, run))
            if mode not in res or out["traj_per_s"] > res[mode]["traj_per_s"]:
                res[mode] = out
    for k, v in res.items():
        print(
            f"[{name}] {k:9s} {v['trajectories']:4d} traj in {v['wall_s']:7.2f} s = {v['traj_per_s']:7.2f} traj/s, "
            f"engine busy {v['engine_busy_fraction']:.2f}, in flight {v['mean_in_flight']:5.1f}, lifetime shares: "
            f"gen {v['generation_share']:.2f} env {v['env_share']:.2f} other {v['overhead_share']:.2f}",
            flush=True,
        )
    sync_batch_s = res["sync"]["wall_s"] / w.batches
    return {
        "async_traj_per_s": res["async"]["traj_per_s"],
        "sync_traj_per_s": res["sync"]["traj_per_s"],
        "ceiling_traj_per_s": res["ceiling"]["traj_per_s"],
        "async_vs_sync": res["async"]["traj_per_s"] / res["sync"]["traj_per_s"],
        "async_vs_ceiling": res["async"]["traj_per_s"] / res["ceiling"]["traj_per_s"],
        "ceiling_vs_sync": res["ceiling"]["traj_per_s"] / res["sync"]["traj_per_s"],
        "async_narrow_vs_sync": res["narrow"]["traj_per_s"] / res["sync"]["traj_per_s"],
        "async_drained_vs_sync": res["drained"]["traj_per_s"] / res["sync"]["traj_per_s"],
        "engine_busy_fraction": res["async"]["engine_busy_fraction"],
        "sync_engine_busy_fraction": res["sync"]["engine_busy_fraction"],
        "ceiling_engine_busy_fraction": res["ceiling"]["engine_busy_fraction"],
        "async_overhead_share": res["async"]["overhead_share"],
        "loop_lag_p99_ms": res["async"]["loop_lag_p99_ms"],
        "one_batch_async_vs_sync": sync_batch_s / res["one_batch"]["wall_s"],
        "workload": dataclasses.asdict(w),
    }


def _rounded(x):
    if isinstance(x, float):
        return round(x, 4)
    return {k: _rounded(v) for k, v in x.items()} if isinstance(x, dict) else x


def main(argv=None) -> None:
    a = parse_args(argv)
    if a.switch_interval_ms is not None:
        sys.setswitchinterval(a.switch_interval_ms / 1e3)
    if a.compile_cache:
        import jax

        jax.config.update("jax_compilation_cache_dir", a.compile_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    per_model = {}
    for name in a.models:
        out = bench_model(a, name)
        if out is not None:
            per_model[name] = out
    if not per_model:
        sys.exit("no model could be benchmarked")
    first = per_model[next(iter(per_model))]
    result = {
        k: round(first[k], 4)
        for k in (
            "async_vs_sync",
            "async_narrow_vs_sync",
            "async_vs_ceiling",
            "engine_busy_fraction",
        )
    }  # narrow: the sync batch's width
    result["models"] = _rounded(per_model)
    result["quick"] = a.quick
    result["switch_interval_ms"] = sys.getswitchinterval() * 1e3
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("rollout", result)


if __name__ == "__main__":
    main()
