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
the continuous rate over the one-at-a-time rate, each in the dtype with the better median round (then
its best round), so neither side is handicapped, nor favoured by the best of twice as many noisy rounds.
Per-dtype figures are under ``models[name]["by_dtype"]``.

The machine is shared and noisy, so the three schedules (under every dtype) run interleaved for a
few rounds and each reports its best round.

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
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from gymllm.inference import EngineConfig, JaxEngine, SamplingParams  # noqa: E402


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
    rounds: int = 3  # modes run interleaved this many times; each mode's best round counts (noisy CPU)

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
    ("tiny", True): Workload(num_requests=256, prompt_len=(8, 48), short_len=(4, 12), long_len=128, p_long=0.08,
                             max_len=192, min_bucket=64, rounds=4, piggyback=False),
    ("tiny", False): Workload(num_requests=256, prompt_len=(8, 48), short_len=(4, 24), long_len=128, p_long=0.1,
                              max_len=192, min_bucket=64, piggyback=False),
    ("smollm2", True): Workload(num_requests=128, prompt_len=(4, 16), short_len=(4, 12), long_len=64, p_long=0.1,
                                max_len=96, min_bucket=16, seq_every=8, rounds=1),
    ("smollm2", False): Workload(num_requests=128, prompt_len=(8, 48), short_len=(4, 16), long_len=64, p_long=0.12,
                                 max_len=128, min_bucket=64, seq_every=4, rounds=2),
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
    return {"tokens": sum(c.num_tokens for c in comps), "wall_s": wall, "ttft_s": [c.ttft_s for c in comps]}


async def static(engine, reqs, arrivals, batch: int) -> dict:
    t0 = time.perf_counter()
    tokens = 0
    for start in range(0, len(reqs), batch):
        wave = list(range(start, min(start + batch, len(reqs))))
        await asyncio.sleep(max(0.0, max(arrivals[i] for i in wave) - (time.perf_counter() - t0)))
        comps = await asyncio.gather(*(engine.generate(reqs[i][0], params(reqs[i][1], i)) for i in wave))
        tokens += sum(c.num_tokens for c in comps)
    return {"tokens": tokens, "wall_s": time.perf_counter() - t0}


async def sequential(engine, reqs, every: int) -> dict:
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(reqs), every):
        tokens += (await engine.generate(reqs[i][0], params(reqs[i][1], i))).num_tokens
    return {"tokens": tokens, "wall_s": time.perf_counter() - t0}


def build(lm, wl: Workload, reqs, dtype: str, decode_chunk: int = 1, piggyback: int = 0) -> dict:
    """A 32-slot and a 1-slot engine under one compute dtype, warmed up (compile time measured); both
    run up to ``decode_chunk`` decode steps per device call (``JaxEngine(decode_chunk=...)``) and let
    prompts of up to ``piggyback`` tokens ride along decode steps (``EngineConfig.piggyback_tokens``;
    the one-at-a-time engine never has a decode step to ride along)."""
    cfg = EngineConfig(num_slots=wl.slots, max_len=wl.max_len, min_bucket=wl.min_bucket, max_prefill_batch=4,
                       decode_lengths=wl.decode_lengths, compute_dtype=dtype, piggyback_tokens=piggyback)
    t = time.perf_counter()
    engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=(), decode_chunk=decode_chunk)
    fixed = JaxEngine.from_loaded(lm, config=dataclasses.replace(cfg, compact_rows=False), stop_token_ids=(),
                                  decode_chunk=decode_chunk)  # static batching: rows stay put
    solo = JaxEngine.from_loaded(lm, config=dataclasses.replace(cfg, num_slots=1, max_prefill_batch=1),
                                 stop_token_ids=(), decode_chunk=decode_chunk)
    max_prompt = max(len(p) for p, _ in reqs)
    for e in (engine, fixed, solo):
        e.warmup(max_prompt)
    return {"engine": engine, "fixed": fixed, "solo": solo, "compile_s": time.perf_counter() - t}


async def run_all(wl: Workload, reqs, setups: dict[str, dict]) -> dict[str, dict]:
    """Every schedule under every dtype, interleaved for ``wl.rounds`` rounds (the machine's load drifts:
    side by side, no dtype or schedule gets the quiet minutes); each keeps its best round."""
    for st in setups.values():
        probe = await st["engine"].generate(reqs[0][0], params(8, 0))  # calibrate one decode step
        st["step_s"] = probe.latency_s / 8
        st["idle"] = [(await st["engine"].generate(reqs[i][0], params(1, i))).ttft_s for i in range(5)]  # no queue
    total = sum(n for _, n in reqs)
    step_s = min(st["step_s"] for st in setups.values())
    span = 0.25 * (total / wl.slots + wl.long_len) * step_s  # arrivals outpace service: a queue builds
    gaps = np.random.default_rng(1).exponential(1.0, size=len(reqs))
    arrivals = np.cumsum(gaps) / gaps.sum() * span
    arrivals -= arrivals[0]
    runs = {dt: {"continuous": [], "static": [], "static_compacted": [], "sequential": []} for dt in setups}
    for _ in range(wl.rounds):
        for dt, st in setups.items():
            runs[dt]["continuous"].append(await continuous(st["engine"], reqs, arrivals))
            runs[dt]["static"].append(await static(st["fixed"], reqs, arrivals, wl.slots))
            runs[dt]["static_compacted"].append(await static(st["engine"], reqs, arrivals, wl.slots))
            runs[dt]["sequential"].append(await sequential(st["solo"], reqs, wl.seq_every))
    out = {}
    for dt, st in setups.items():
        for e in ("engine", "fixed", "solo"):
            await st[e].close()
        best = {k: max(v, key=lambda r: r["tokens"] / r["wall_s"]) for k, v in runs[dt].items()}
        out[dt] = {"runs": best, "step_s": st["step_s"], "idle": st["idle"], "compile_s": st["compile_s"],
                   "tps": {k: r["tokens"] / r["wall_s"] for k, r in best.items()},
                   "median_tps": {k: float(np.median([r["tokens"] / r["wall_s"] for r in v]))
                                  for k, v in runs[dt].items()}}
    return out


def summarize(raw: dict) -> dict:
    cont, tps = raw["runs"]["continuous"], raw["tps"]
    return {
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "continuous_vs_static": round(tps["continuous"] / tps["static"], 2),
        "continuous_vs_static_compacted": round(tps["continuous"] / tps["static_compacted"], 2),
        "continuous_vs_sequential": round(tps["continuous"] / tps["sequential"], 2),
        "ttft_ms_p50": round(1000 * float(np.median(cont["ttft_s"])), 1),
        "ttft_ms_p90": round(1000 * float(np.quantile(cont["ttft_s"], 0.9)), 1),
        "ttft_ms_idle": round(1000 * float(np.median(raw["idle"])), 1),
        "decode_step_ms": round(1000 * raw["step_s"], 2), "compile_s": round(raw["compile_s"], 1),
    }


def bench_model(name: str, lm, wl: Workload, dtypes: list[str], decode_chunk: int = 1, piggyback: int = -1) -> dict:
    reqs = wl.requests(lm.config.vocab_size)
    piggyback = (wl.min_bucket if wl.piggyback else 0) if piggyback < 0 else piggyback
    raw = asyncio.run(run_all(wl, reqs, {dt: build(lm, wl, reqs, dt, decode_chunk, piggyback) for dt in dtypes}))
    by_dtype = {dt: summarize(r) for dt, r in raw.items()}
    for dt, fig in by_dtype.items():
        print(f"[{name} {dt}] " + json.dumps(fig), flush=True)
    # each schedule's dtype is chosen by its median round, then its best round counts: choosing by the best
    # round would hand the noisier schedule (one-at-a-time, when the dtypes are equally fast, as on the tiny
    # model) the best of twice as many samples
    fastest = {k: max(dtypes, key=lambda dt: raw[dt]["median_tps"][k])
               for k in ("continuous", "static", "static_compacted", "sequential")}
    head = by_dtype[fastest["continuous"]]
    best = {k: raw[dt]["tps"][k] for k, dt in fastest.items()}
    out = {
        "requests": len(reqs), "slots": wl.slots, "generated_tokens": raw[dtypes[0]]["runs"]["continuous"]["tokens"],
        "long_len": wl.long_len, "p_long": wl.p_long, "rounds": wl.rounds, "decode_chunk": decode_chunk,
        "piggyback_tokens": piggyback,
        "tokens_per_s": {k: round(v, 1) for k, v in best.items()}, "fastest_dtype": fastest,
        "continuous_vs_static": round(best["continuous"] / best["static"], 2),
        "continuous_vs_static_compacted": round(best["continuous"] / best["static_compacted"], 2),
        "continuous_vs_sequential": round(best["continuous"] / best["sequential"], 2),
        "ttft_ms_p50": head["ttft_ms_p50"], "ttft_ms_p90": head["ttft_ms_p90"], "ttft_ms_idle": head["ttft_ms_idle"],
        "by_dtype": by_dtype,
    }
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
    ap.add_argument("--quick", action="store_true", help="smaller workloads (about two minutes here)")
    ap.add_argument("--skip-real", action="store_true", help="only the tiny model")
    ap.add_argument("--skip-tiny", action="store_true", help="only the real model (when it loads)")
    ap.add_argument("--dtypes", default="float32,bfloat16",
                    help="compute dtypes to run every schedule under (comma-separated; the fastest counts)")
    ap.add_argument("--decode-chunk", type=int, default=1,
                    help="decode steps per device call for every engine, continuous and one-at-a-time alike "
                         "(JaxEngine(decode_chunk=...); the trainer's default is 8)")
    ap.add_argument("--requests", type=int, default=0, help="requests per model (0: the workload's own)")
    ap.add_argument("--piggyback-tokens", type=int, default=-1,
                    help="EngineConfig.piggyback_tokens: prompts up to this bucket ride along decode steps "
                         "(-1: the workload's choice: SmolLM2 its smallest prefill bucket, tiny off; 0: off)")
    args = ap.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    from gymllm.models import make_tiny

    models: dict[str, dict] = {}
    if not args.skip_tiny:
        models["tiny"] = bench_model("tiny", make_tiny("llama"), workload("tiny", args), dtypes, args.decode_chunk,
                                     args.piggyback_tokens)
    note = "skipped by --skip-real"
    if not args.skip_real:
        real, note = load_real("smollm2-135m-instruct")
        if real is not None:
            models["smollm2-135m-instruct"] = bench_model("smollm2", real, workload("smollm2", args), dtypes,
                                                          args.decode_chunk, args.piggyback_tokens)
        else:
            print(f"[smollm2] skipped: {note}", file=sys.stderr)
    if not models:  # --skip-tiny and no real model: the tiny figures after all
        models["tiny"] = bench_model("tiny", make_tiny("llama"), workload("tiny", args), dtypes, args.decode_chunk,
                                     args.piggyback_tokens)
    head_name = "smollm2-135m-instruct" if "smollm2-135m-instruct" in models else "tiny"
    head = models[head_name]
    result = {
        "continuous_vs_static": head["continuous_vs_static"],
        "continuous_vs_sequential": head["continuous_vs_sequential"],
        "ttft_ms_p50": head["ttft_ms_p50"],
        "continuous_vs_static_compacted": head["continuous_vs_static_compacted"],
        "headline_model": head_name, "concurrent": head["slots"], "quick": args.quick, "dtypes": dtypes,
        "fastest_dtype": head["fastest_dtype"], "decode_chunk": args.decode_chunk, "models": models,
    }
    if head_name == "tiny":
        result["real_model_note"] = note
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
