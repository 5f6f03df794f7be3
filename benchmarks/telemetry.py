"""Benchmark: the cost of always-on tracing, side by side with tracing off, in one process.

A representative rollout step: ``groups x group_size`` trajectories of the real
``gymllm/Arithmetic-v0`` env run as asyncio tasks against the real ``JaxEngine`` serving a small
random Llama (CPU here): reset, chat prompt, generate, env step, reward; every phase traced the
way the orchestrator traces it, plus the engine's own prefill/decode spans (one per decode step,
the hottest span site of the system), queue-depth counters and the trainer's micro-batch spans.
Measured A/B: the same step (same seeds, prompts and sampled tokens) on the same engine, with the
process-wide tracer switched on and off (``Tracer.enabled``: one tracer, toggled, so every span
site, the engine's included, sees the switch), interleaved over rounds: each round runs one step
of each, the order alternating (ABBA), so a drift in the machine's load hits both sides alike.

Figures (RESULT keys):
- ``overhead_fraction``: the measured overhead, the median over rounds of the paired relative
  difference (step wall traced - untraced) / untraced; ``overhead_fraction_spread``: its mean, std,
  standard error, min and max over rounds (on a shared machine the spread is often wider than the
  tracer's sub-percent cost: read the figure with it); ``overhead_fraction_cpu``: the same on the
  process's CPU time (less disturbed by other processes), with ``overhead_fraction_cpu_spread``;
- ``overhead_fraction_modelled`` (secondary): events recorded per step x measured cost per event /
  step time, from precise micro-timings (``overhead_fraction_ab`` / ``_ab_cpu``: the medians'
  difference, kept for comparison with earlier runs);
- ``span_cost_us`` / ``span_cost_disabled_us`` / ``counter_cost_us``: CPU time per call (thread
  time, so other processes on a shared machine do not inflate it), the empty loop's cost removed;
- ``events_per_step``, ``step_s_traced``, ``step_s_untraced``;
- ``bytes_per_event``: memory held per buffered span (tracemalloc), so the default 1M-event
  ring buffer bounds memory at ``bytes_per_event`` MB;
- ``export_us_per_event``: Chrome-trace export time per event.

Usage: python benchmarks/telemetry.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import tracemalloc

from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import gymllm  # noqa: E402
from gymllm.telemetry import Tracer, get_tracer, set_tracer, span  # noqa: E402
from gymllm.utils.host import describe_cpu, loadavg  # noqa: E402


def spread(xs: list[float]) -> dict[str, float]:
    """Mean, std, standard error of the mean, min and max of per-round figures."""
    m = statistics.fmean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {
        "mean": m,
        "std": sd,
        "sem": sd / len(xs) ** 0.5,
        "min": min(xs),
        "max": max(xs),
        "rounds": len(xs),
    }


def per_call_us(fn, n: int) -> float:
    """Median over 5 runs of the per-call time of ``fn`` (n calls), minus an empty loop's."""

    def run(
        f,
    ) -> float:  # CPU time of this thread: other processes on a shared machine do not count
        t = time.thread_time()
        for i in range(n):
            f(i)
        return time.thread_time() - t

    empty = statistics.median(run(lambda i: None) for _ in range(5))
    full = statistics.median(run(fn) for _ in range(5))
    return max(0.0, (full - empty) / n * 1e6)


def micro_costs(n: int) -> dict[str, float]:
    on, off = Tracer(capacity=4 * n), Tracer(enabled=False)

    def traced(tr):
        def f(i):
            with tr.span("decode", track="engine", active=i):
                pass

        return f

    out = {
        "span_cost_us": per_call_us(traced(on), n),
        "span_cost_disabled_us": per_call_us(traced(off), n),
    }
    out["counter_cost_us"] = per_call_us(lambda i: on.counter("queue_depth", i, track="rollout"), n)
    return out


def memory_per_event(n: int) -> float:
    tr = Tracer(capacity=n + 1)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        with tr.span("env_step", track="env/3", trajectory=i, step=7):
            pass
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n


async def trajectory(
    engine, env, tok, params_cls, seed: int, max_tokens: int, env_id: int
) -> float:
    with span("rollout", track="rollout", trajectory=seed, group=seed // 100):
        with span("env_step", track=f"env/{env_id}", kind="reset"):
            obs, info = await env.areset(seed=seed)
        prompt = tok.encode(
            tok.apply_chat_template([{"role": "user", "content": obs}], add_generation_prompt=True)
        )
        with span("generate", track="rollout", trajectory=seed):
            completion = await engine.generate(
                prompt, params_cls(temperature=1.0, max_tokens=max_tokens, seed=seed)
            )
        with span("env_step", track=f"env/{env_id}", trajectory=seed):
            _, reward, *_ = await env.astep(tok.decode(completion.token_ids))
        with span("reward", track=f"env/{env_id}", reward=float(reward)):
            pass
    return float(reward)


async def rollout_step(
    engine, envs, tok, params_cls, step: int, groups: int, group_size: int, max_tokens: int
) -> float:
    """One step's rollouts; returns (wall seconds, CPU seconds of this process: all its threads)."""
    t, c = time.perf_counter(), time.process_time()
    tasks = []
    for g in range(groups):
        for j in range(group_size):
            k = g * group_size + j
            tasks.append(
                trajectory(
                    engine, envs[k], tok, params_cls, 10_000 * step + 100 * g + j, max_tokens, k
                )
            )
    get_tracer().counter("queue_depth", 0, track="rollout")
    await asyncio.gather(*tasks)
    get_tracer().counter("queue_depth", groups, track="rollout")
    for m in range(
        4
    ):  # the trainer's spans for this step (their compute is not part of this figure)
        with span("micro_batch", track="trainer", rows=group_size, index=m):
            pass
    return time.perf_counter() - t, time.process_time() - c


async def pipeline(args) -> dict[str, float]:
    from gymllm.inference.config import EngineConfig
    from gymllm.inference.jax_engine import JaxEngine
    from gymllm.inference.params import SamplingParams
    from gymllm.models.tiny import make_tiny

    loaded = make_tiny(
        "llama",
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        vocab_size=1024,
    )
    n = args.groups * args.group_size
    engine = JaxEngine(
        loaded.model,
        loaded.tokenizer,
        config=EngineConfig(num_slots=n, max_len=256, idle_wait_s=0.001),
    )
    envs = [gymllm.make("gymllm/Arithmetic-v0") for _ in range(n)]
    tok = loaded.tokenizer
    times: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    events: list[int] = []
    previous = get_tracer()
    tr = Tracer(
        capacity=4_000_000, enabled=False
    )  # one tracer for the whole run: toggled, never swapped
    try:
        set_tracer(tr)
        # Every step replays the same seeds (same prompts, same sampled tokens), so traced and
        # untraced steps do identical work. Warm up until a step compiles nothing new; a measured
        # round in which a step still compiled (prefill batching depends on arrival timing) is discarded.
        compiles = lambda: sum(engine.trace_counts.values())  # noqa: E731

        def step():
            return rollout_step(
                engine, envs, tok, SamplingParams, 0, args.groups, args.group_size, args.max_tokens
            )

        for w in range(8):
            before = compiles()
            await step()
            if w >= 1 and compiles() == before:
                break
        rep = discarded = 0
        while rep < args.reps and discarded < 2 * args.reps:
            pair = {}
            tr.clear()
            for traced in (True, False) if rep % 2 == 0 else (False, True):
                tr.enabled = traced
                cursor = tr.cursor()
                before = compiles()
                dt, dc = await step()
                tr.enabled = False
                evs = tr.events_since(cursor) if traced else None
                pair[traced] = (dt, dc, len(evs or ()), evs, compiles() != before)
            if pair[True][4] or pair[False][4]:
                discarded += 1
                continue
            for traced, (dt, dc, n_events, evs, _) in pair.items():
                times[traced].append(dt)
                cpu[traced].append(dc)
                if traced:
                    events.append(n_events)
                    last_events = evs
            rep += 1
            tr.clear()  # every traced step starts from the same (empty) buffer
    finally:
        set_tracer(previous)
        await engine.close()
        for e in envs:
            e.close()
    from gymllm.telemetry.export import write_chrome_trace

    many = last_events * max(1, 50_000 // max(1, len(last_events)))  # a long run's worth of events
    with tempfile.TemporaryDirectory() as d:
        t = time.thread_time()
        write_chrome_trace(os.path.join(d, "trace.json"), many)
        export_us = (time.thread_time() - t) / len(many) * 1e6
    paired = [(a - b) / b for a, b in zip(times[True], times[False])]
    paired_cpu = [(a - b) / b for a, b in zip(cpu[True], cpu[False])]
    return {
        "paired": paired,
        "paired_cpu": paired_cpu,
        "discarded_rounds": discarded,
        "step_s_traced": statistics.median(times[True]),
        "step_s_untraced": statistics.median(times[False]),
        "step_cpu_s_traced": statistics.median(cpu[True]),
        "step_cpu_s_untraced": statistics.median(cpu[False]),
        "events_per_step": statistics.median(events),
        "export_us_per_event": export_us,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (about a minute)")
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--reps", type=int, default=None)
    args = p.parse_args()
    args.reps = args.reps or (12 if args.quick else 30)
    cpu_name, load0 = describe_cpu(), loadavg()
    print(f"CPU: {cpu_name}; load average {load0}", flush=True)
    micro = micro_costs(50_000 if args.quick else 200_000)
    bpe = memory_per_event(50_000)
    pipe = asyncio.run(pipeline(args))
    cost_per_event = max(micro["span_cost_us"], micro["counter_cost_us"])
    paired, paired_cpu = pipe.pop("paired"), pipe.pop("paired_cpu")
    result = {
        "overhead_fraction": statistics.median(paired),
        "overhead_fraction_cpu": statistics.median(paired_cpu),
        "overhead_fraction_modelled": pipe["events_per_step"]
        * cost_per_event
        * 1e-6
        / pipe["step_s_traced"],
        "overhead_fraction_ab": (pipe["step_s_traced"] - pipe["step_s_untraced"])
        / pipe["step_s_untraced"],
        "overhead_fraction_ab_cpu": (pipe["step_cpu_s_traced"] - pipe["step_cpu_s_untraced"])
        / pipe["step_cpu_s_untraced"],
        **micro,
        **pipe,
        "bytes_per_event": bpe,
        "trajectories_per_step": args.groups * args.group_size,
        "max_tokens": args.max_tokens,
    }
    result = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in result.items()}
    result["overhead_fraction_spread"] = {k: round(v, 6) for k, v in spread(paired).items()}
    result["overhead_fraction_cpu_spread"] = {k: round(v, 6) for k, v in spread(paired_cpu).items()}
    result["overhead_fraction_rounds"] = [round(x, 5) for x in paired]
    result["cpu"], result["loadavg"] = cpu_name, {"start": load0, "end": loadavg()}
    for k, v in result.items():
        print(f"{k:>28}: {v}")
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("telemetry", result)


if __name__ == "__main__":
    main()
