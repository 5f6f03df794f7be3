"""Benchmark the JaxEngine: continuous batching vs static batching vs one request at a time.

One process, one workload per model, three schedules over the same compiled steps:

* continuous: every request is submitted when it arrives and joins the running batch between decode
  steps (``num_slots`` = 32 concurrent);
* static: requests run in waves of ``num_slots``; a wave starts when all its requests have arrived
  and the previous wave has finished (so every wave waits for its longest member). As a static
  batching server does, a wave's rows stay where they were placed until they finish (an engine with
  ``EngineConfig.compact_rows=False``): its steps keep the width of its highest unfinished row.
  ``static_compacted`` runs the same waves on the continuous engine, whose row compaction moves a
  wave's long tail into the narrowest width (``continuous_vs_static_compacted``);
* sequential: one request at a time on a 1-slot engine (batch 1, the best one-at-a-time setup),
  measured on an evenly spaced subset of the same requests (tokens/s is a rate).

The 32-slot engine lets SmolLM2's prompts of the smallest prefill bucket ride along decode steps
(``--piggyback-tokens``, ``EngineConfig.piggyback_tokens``; off for the tiny model, see WORKLOADS) and packs its
active rows into the narrowest decode width before each step (``EngineConfig.compact_rows``).

Each schedule runs under every compute dtype in ``--dtypes`` (``EngineConfig.compute_dtype``: float32,
and bfloat16 with float32 accumulation, which is faster for many rows on AMX CPUs and slower for one),
and the headline compares each schedule in its own fastest dtype: ``continuous_vs_sequential`` is
the continuous rate over the one-at-a-time rate, each the mean over rounds in the dtype with the
better mean, so neither side is handicapped.
Per-dtype figures are under ``models[name]["by_dtype"]``.

Every run gets a fresh engine (a new ``JaxEngine`` per mode and per round, warmed up: the compiled
programs are shared, the slot table and prefix cache are not), so no schedule reuses the k/v of the
same prompts an earlier mode or round left cached. The machine is shared and noisy, so the schedules
(under every dtype) run interleaved for a few rounds, the order rotating each round; each reports
its mean tokens/s and spread over the rounds, and each ratio is the ratio of the means with the
spread of the per-round ratios (``spread``: min, max, std, every round). The CPU and the load average
are printed and in the RESULT (figures depend on the CPU's bf16 path).

The workload is heavy-tailed (most completions short, a few long; lengths fixed by ``max_tokens``
with stop ids disabled) and requests arrive over time (exponential gaps spread over about a quarter
of the continuous run, so a queue builds and throughput is the engine's, not the arrival rate's),
so requests arrive while others decode. TTFT is reported under that load
(``ttft_ms_p50``: it includes waiting for a free slot) and on an idle engine (``ttft_ms_idle``). Models: the tiny test model
(``make_tiny("llama")``) and the real ``smollm2-135m-instruct`` (skipped with a note when it
cannot be loaded). Ends with ``RESULT {json}``: ``continuous_vs_static``,
``continuous_vs_sequential`` (at 32 concurrent) and ``ttft_ms_p50`` (continuous) for the real model
when it loaded, else for the tiny one; per-model figures are under ``models``.

    python benchmarks/engine.py --quick

``--shapes`` runs instead the program-set comparison of :mod:`engine_shapes` (the Quickstart's engine with
bucketed shapes vs the fixed set: programs compiled, compile seconds, tokens/s on a GRPO-like burst),
recorded as ``engine_shapes``:

    python benchmarks/engine.py --shapes --quick --budgets 128,256
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time

from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device

import numpy as np  # noqa: E402

from gymllm.inference import EngineConfig, JaxEngine, SamplingParams  # noqa: E402
from gymllm.utils.host import describe_cpu, loadavg  # noqa: E402


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    num_requests: int
    prompt_len: tuple[int, int]  # uniform [lo, hi)
    short_len: tuple[int, int]  # uniform [lo, hi) completion lengths for most requests
    long_len: int  # completion length of the tail
    p_long: float
    max_len: int
    min_bucket: int
    decode_lengths: int = 2  # decode cache-length buckets (EngineConfig.decode_lengths)
    piggyback: bool = True  # prompts of the smallest prefill bucket ride along decode steps
    slots: int = 32
    seq_every: int = 4  # sequential runs every k-th request
    rounds: int = (
        3  # modes run interleaved this many times (fresh engines); mean and spread over rounds
    )

    def requests(self, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
        rng = np.random.default_rng(seed)
        out = []
        for i in range(self.num_requests):
            prompt = rng.integers(3, vocab, size=int(rng.integers(*self.prompt_len))).tolist()
            n = self.long_len if rng.random() < self.p_long else int(rng.integers(*self.short_len))
            out.append((prompt, n))
        longs = [i for i, (_, n) in enumerate(out) if n == self.long_len]
        if not longs:  # keep the tail present whatever the seed
            out[0] = (out[0][0], self.long_len)
        return out


WORKLOADS = {
    # piggybacking pays where a step costs mostly reading the weights (SmolLM2 on this CPU: a 4 x 16 prompt
    # riding along a 32-row step adds ~30% to it, alone it costs ~120%); the tiny model's steps are compute
    # bound, and a riding batch padded to 4 x 64 tokens costs more than it saves (continuous 7600 tok/s
    # without, 6000-6300 with)
    ("tiny", True): Workload(
        num_requests=256,
        prompt_len=(8, 48),
        short_len=(4, 12),
        long_len=128,
        p_long=0.08,
        max_len=192,
        min_bucket=64,
        rounds=4,
        piggyback=False,
    ),
    ("tiny", False): Workload(
        num_requests=256,
        prompt_len=(8, 48),
        short_len=(4, 24),
        long_len=128,
        p_long=0.1,
        max_len=192,
        min_bucket=64,
        piggyback=False,
    ),
    ("smollm2", True): Workload(
        num_requests=128,
        prompt_len=(4, 16),
        short_len=(4, 12),
        long_len=64,
        p_long=0.1,
        max_len=96,
        min_bucket=16,
        seq_every=8,
        rounds=2,
    ),
    ("smollm2", False): Workload(
        num_requests=128,
        prompt_len=(8, 48),
        short_len=(4, 16),
        long_len=64,
        p_long=0.12,
        max_len=128,
        min_bucket=64,
        seq_every=4,
        rounds=2,
    ),
}


def params(n: int, i: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_tokens=n, seed=i)


async def continuous(engine, reqs, arrivals) -> dict:
    t0 = time.perf_counter()

    async def one(i, prompt, n):
        await asyncio.sleep(max(0.0, arrivals[i] - (time.perf_counter() - t0)))
        return await engine.generate(prompt, params(n, i))

    comps = await asyncio.gather(*(one(i, p, n) for i, (p, n) in enumerate(reqs)))
    wall = time.perf_counter() - t0
    return {
        "tokens": sum(c.num_tokens for c in comps),
        "wall_s": wall,
        "ttft_s": [c.ttft_s for c in comps],
    }


async def static(engine, reqs, arrivals, batch: int) -> dict:
    t0 = time.perf_counter()
    tokens = 0
    for start in range(0, len(reqs), batch):
        wave = list(range(start, min(start + batch, len(reqs))))
        await asyncio.sleep(max(0.0, max(arrivals[i] for i in wave) - (time.perf_counter() - t0)))
        comps = await asyncio.gather(
            *(engine.generate(reqs[i][0], params(reqs[i][1], i)) for i in wave)
        )
        tokens += sum(c.num_tokens for c in comps)
    return {"tokens": tokens, "wall_s": time.perf_counter() - t0}


async def sequential(engine, reqs, every: int) -> dict:
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(reqs), every):
        tokens += (await engine.generate(reqs[i][0], params(reqs[i][1], i))).num_tokens
    return {"tokens": tokens, "wall_s": time.perf_counter() - t0}


MODES = ("continuous", "static", "static_compacted", "sequential")


def engine_config(wl: Workload, dtype: str, piggyback: int) -> EngineConfig:
    return EngineConfig(
        num_slots=wl.slots,
        max_len=wl.max_len,
        min_bucket=wl.min_bucket,
        max_prefill_batch=4,
        decode_lengths=wl.decode_lengths,
        compute_dtype=dtype,
        piggyback_tokens=piggyback,
    )


def fresh_engine(
    lm,
    wl: Workload,
    mode: str,
    dtype: str,
    max_prompt: int,
    decode_chunk: int = 1,
    piggyback: int = 0,
) -> JaxEngine:
    """A new engine for one mode's run, warmed up: an empty slot table and prefix cache, so no run
    inherits the cached prefixes of the same prompts from an earlier mode or round (the compiled
    programs are shared by engines of one model graph: only the first engine of a shape compiles).
    ``continuous`` / ``static_compacted``: ``num_slots`` rows with row compaction; ``static``: the
    same without compaction (a wave's rows stay put); ``sequential``: one row (batch 1). Every engine
    runs up to ``decode_chunk`` decode steps per device call and lets prompts of up to ``piggyback``
    tokens ride along decode steps (the one-row engine never has a decode step to ride along)."""
    cfg = engine_config(wl, dtype, piggyback)
    if mode == "static":
        cfg = dataclasses.replace(cfg, compact_rows=False)
    elif mode == "sequential":
        cfg = dataclasses.replace(cfg, num_slots=1, max_prefill_batch=1)
    engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=(), decode_chunk=decode_chunk)
    engine.warmup(max_prompt)
    return engine


async def run_mode(engine, mode: str, wl: Workload, reqs, arrivals) -> dict:
    if mode == "continuous":
        return await continuous(engine, reqs, arrivals)
    if mode in ("static", "static_compacted"):
        return await static(engine, reqs, arrivals, wl.slots)
    return await sequential(engine, reqs, wl.seq_every)


async def run_all(
    lm, wl: Workload, reqs, dtypes: list[str], decode_chunk: int = 1, piggyback: int = 0
) -> dict[str, dict]:
    """Every schedule under every dtype for ``wl.rounds`` rounds, each run on a fresh engine
    (:func:`fresh_engine`); the modes are interleaved and their order rotates from round to round
    (the machine's load drifts: no mode or dtype always gets the first or the quiet minutes).
    Per mode: the mean tokens/s over rounds and its spread (every round's rate is kept)."""
    max_prompt = max(len(p) for p, _ in reqs)
    calib: dict[str, dict] = {}
    for dt in (
        dtypes
    ):  # compile every shape once (timed), calibrate a decode step, TTFT on an idle engine
        t = time.perf_counter()
        for mode in ("continuous", "static", "sequential"):
            e = fresh_engine(lm, wl, mode, dt, max_prompt, decode_chunk, piggyback)
            if mode == "continuous":
                probe = await e.generate(reqs[0][0], params(8, 0))
                idle = [
                    (await e.generate(reqs[i][0], params(1, i))).ttft_s for i in range(1, 6)
                ]  # no queue
                calib[dt] = {"step_s": probe.latency_s / 8, "idle": idle}
            await e.close()
        calib[dt]["compile_s"] = time.perf_counter() - t
        print(f"  {dt}: compiled and calibrated in {calib[dt]['compile_s']:.1f} s", flush=True)
    total = sum(n for _, n in reqs)
    step_s = min(c["step_s"] for c in calib.values())
    span = (
        0.25 * (total / wl.slots + wl.long_len) * step_s
    )  # arrivals outpace service: a queue builds
    gaps = np.random.default_rng(1).exponential(1.0, size=len(reqs))
    arrivals = np.cumsum(gaps) / gaps.sum() * span
    arrivals -= arrivals[0]
    order = [(dt, m) for dt in dtypes for m in MODES]
    runs: dict[str, dict[str, list]] = {dt: {m: [] for m in MODES} for dt in dtypes}
    for r in range(wl.rounds):
        k = r % len(order)
        for dt, mode in order[k:] + order[:k]:
            engine = fresh_engine(lm, wl, mode, dt, max_prompt, decode_chunk, piggyback)
            try:
                out = await run_mode(engine, mode, wl, reqs, arrivals)
            finally:
                await engine.close()
            out["round"] = r
            runs[dt][mode].append(out)
        print(
            f"  round {r + 1}/{wl.rounds}: "
            + ", ".join(
                f"{dt} {m} {runs[dt][m][-1]['tokens'] / runs[dt][m][-1]['wall_s']:.0f}"
                for dt, m in order
            )
            + " tok/s",
            flush=True,
        )
    result = {}
    for dt in dtypes:
        rates = {
            m: [x["tokens"] / x["wall_s"] for x in sorted(v, key=lambda x: x["round"])]
            for m, v in runs[dt].items()
        }
        result[dt] = {
            "runs": runs[dt],
            "rates": rates,
            **calib[dt],
            "tps": {m: float(np.mean(v)) for m, v in rates.items()},
            "tps_std": {m: float(np.std(v)) for m, v in rates.items()},
        }
    return result


def ratio_figures(a: list[float], b: list[float]) -> dict:
    """``a`` over ``b`` (per-round rates of two modes, paired by round): the ratio of the means, and
    the spread of the per-round ratios (min, max, std)."""
    per = [x / y for x, y in zip(a, b)]
    return {
        "mean": round(float(np.mean(a) / np.mean(b)), 2),
        "min": round(min(per), 2),
        "max": round(max(per), 2),
        "std": round(float(np.std(per)), 3),
        "rounds": [round(x, 2) for x in per],
    }


def summarize(raw: dict) -> dict:
    tps, rates = raw["tps"], raw["rates"]
    ttft = [t for x in raw["runs"]["continuous"] for t in x["ttft_s"]]
    return {
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "tokens_per_s_std": {k: round(v, 1) for k, v in raw["tps_std"].items()},
        "continuous_vs_static": ratio_figures(rates["continuous"], rates["static"])["mean"],
        "continuous_vs_static_compacted": ratio_figures(
            rates["continuous"], rates["static_compacted"]
        )["mean"],
        "continuous_vs_sequential": ratio_figures(rates["continuous"], rates["sequential"])["mean"],
        "ttft_ms_p50": round(1000 * float(np.median(ttft)), 1),
        "ttft_ms_p90": round(1000 * float(np.quantile(ttft, 0.9)), 1),
        "ttft_ms_idle": round(1000 * float(np.median(raw["idle"])), 1),
        "decode_step_ms": round(1000 * raw["step_s"], 2),
        "compile_s": round(raw["compile_s"], 1),
    }


def bench_model(
    name: str, lm, wl: Workload, dtypes: list[str], decode_chunk: int = 1, piggyback: int = -1
) -> dict:
    reqs = wl.requests(lm.config.vocab_size)
    piggyback = (wl.min_bucket if wl.piggyback else 0) if piggyback < 0 else piggyback
    raw = asyncio.run(run_all(lm, wl, reqs, dtypes, decode_chunk, piggyback))
    by_dtype = {dt: summarize(r) for dt, r in raw.items()}
    for dt, fig in by_dtype.items():
        print(f"[{name} {dt}] " + json.dumps(fig), flush=True)
    # each schedule runs in its own fastest dtype (by its mean over rounds), so neither side is handicapped
    fastest = {k: max(dtypes, key=lambda dt: raw[dt]["tps"][k]) for k in MODES}
    head = by_dtype[fastest["continuous"]]
    rates = {k: raw[dt]["rates"][k] for k, dt in fastest.items()}
    ratios = {
        f"continuous_vs_{k}": ratio_figures(rates["continuous"], rates[k])
        for k in ("static", "static_compacted", "sequential")
    }
    out = {
        "requests": len(reqs),
        "slots": wl.slots,
        "generated_tokens": raw[dtypes[0]]["runs"]["continuous"][0]["tokens"],
        "long_len": wl.long_len,
        "p_long": wl.p_long,
        "rounds": wl.rounds,
        "decode_chunk": decode_chunk,
        "piggyback_tokens": piggyback,
        "fresh_engine_per_run": True,
        "tokens_per_s": {k: round(raw[dt]["tps"][k], 1) for k, dt in fastest.items()},
        "tokens_per_s_std": {k: round(raw[dt]["tps_std"][k], 1) for k, dt in fastest.items()},
        "fastest_dtype": fastest,
        **{k: v["mean"] for k, v in ratios.items()},
        "spread": ratios,
        "ttft_ms_p50": head["ttft_ms_p50"],
        "ttft_ms_p90": head["ttft_ms_p90"],
        "ttft_ms_idle": head["ttft_ms_idle"],
        "by_dtype": by_dtype,
    }
    print(f"[{name}] {'mode':17s} {'tok/s mean':>10s} {'std':>7s}  dtype", flush=True)
    for k in MODES:
        print(
            f"[{name}] {k:17s} {out['tokens_per_s'][k]:10.1f} {out['tokens_per_s_std'][k]:7.1f}  {fastest[k]}"
        )
    for k, v in ratios.items():
        print(
            f"[{name}] {k:32s} {v['mean']:6.2f}x  (rounds {v['min']:.2f}-{v['max']:.2f}, std {v['std']:.3f})"
        )
    print(f"[{name}] " + json.dumps({k: v for k, v in out.items() if k != "by_dtype"}), flush=True)
    return out


def load_real(name: str):
    try:
        from gymllm.models import load

        return load(name), None
    except Exception as exc:  # no weights here: report, keep the tiny figures
        return None, f"{type(exc).__name__}: {exc}"


def workload(name: str, args: argparse.Namespace) -> Workload:
    wl = WORKLOADS[(name, args.quick)]
    return dataclasses.replace(wl, num_requests=args.requests) if args.requests else wl


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="smaller workloads (about two minutes here)"
    )
    ap.add_argument("--skip-real", action="store_true", help="only the tiny model")
    ap.add_argument("--skip-tiny", action="store_true", help="only the real model (when it loads)")
    ap.add_argument(
        "--dtypes",
        default="float32,bfloat16",
        help="compute dtypes to run every schedule under (comma-separated; the fastest counts)",
    )
    ap.add_argument(
        "--decode-chunk",
        type=int,
        default=1,
        help="decode steps per device call for every engine, continuous and one-at-a-time alike "
        "(JaxEngine(decode_chunk=...); the trainer's default is 8)",
    )
    ap.add_argument(
        "--requests", type=int, default=0, help="requests per model (0: the workload's own)"
    )
    ap.add_argument(
        "--piggyback-tokens",
        type=int,
        default=-1,
        help="EngineConfig.piggyback_tokens: prompts up to this bucket ride along decode steps "
        "(-1: the workload's choice: SmolLM2 its smallest prefill bucket, tiny off; 0: off)",
    )
    ap.add_argument(
        "--shapes",
        action="store_true",
        help="compare the engine's program sets instead (EngineConfig.shapes: buckets vs fixed) on the "
        "Quickstart's engine: programs, compile seconds, tokens/s on a GRPO-like burst",
    )
    ap.add_argument(
        "--budgets",
        default="128",
        help="with --shapes: the fixed sets' prefill token budgets, comma-separated (128/32: with a 32-token program)",
    )
    args = ap.parse_args(argv)
    if args.shapes:
        import engine_shapes  # emits its own RESULT (record "engine_shapes")

        return engine_shapes.main(
            args.quick, [b.strip() for b in args.budgets.split(",") if b.strip()]
        )
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    from gymllm.models import make_tiny

    cpu, load0 = describe_cpu(), loadavg()
    print(f"CPU: {cpu}; load average {load0}", flush=True)

    models: dict[str, dict] = {}
    if not args.skip_tiny:
        models["tiny"] = bench_model(
            "tiny",
            make_tiny("llama"),
            workload("tiny", args),
            dtypes,
            args.decode_chunk,
            args.piggyback_tokens,
        )
    note = "skipped by --skip-real"
    if not args.skip_real:
        real, note = load_real("smollm2-135m-instruct")
        if real is not None:
            models["smollm2-135m-instruct"] = bench_model(
                "smollm2",
                real,
                workload("smollm2", args),
                dtypes,
                args.decode_chunk,
                args.piggyback_tokens,
            )
        else:
            print(f"[smollm2] skipped: {note}", file=sys.stderr)
    if not models:  # --skip-tiny and no real model: the tiny figures after all
        models["tiny"] = bench_model(
            "tiny",
            make_tiny("llama"),
            workload("tiny", args),
            dtypes,
            args.decode_chunk,
            args.piggyback_tokens,
        )
    head_name = "smollm2-135m-instruct" if "smollm2-135m-instruct" in models else "tiny"
    head = models[head_name]
    result = {
        "continuous_vs_static": head["continuous_vs_static"],
        "continuous_vs_sequential": head["continuous_vs_sequential"],
        "ttft_ms_p50": head["ttft_ms_p50"],
        "continuous_vs_static_compacted": head["continuous_vs_static_compacted"],
        "headline_model": head_name,
        "concurrent": head["slots"],
        "quick": args.quick,
        "dtypes": dtypes,
        "fastest_dtype": head["fastest_dtype"],
        "decode_chunk": args.decode_chunk,
        "spread": head["spread"],
        "rounds": head["rounds"],
        "fresh_engine_per_run": True,
        "cpu": cpu,
        "loadavg": {"start": load0, "end": loadavg()},
        "models": models,
    }
    if head_name == "tiny":
        result["real_model_note"] = note
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("engine", result)
    return result


if __name__ == "__main__":
    main()
