"""Benchmark the JaxEngine: continuous batching vs static batching vs one request at a time.

One process, one workload per model, three schedules over the same compiled steps:

* continuous: every request is submitted when it arrives and joins the running batch between decode
  steps (``num_slots`` = 32 concurrent);
* static: requests run in waves of ``num_slots``; a wave starts when all its requests have arrived
  and the previous wave has finished (so every wave waits for its longest member);
* sequential: one request at a time on a 1-slot engine (batch 1, the best one-at-a-time setup),
  measured on an evenly spaced subset of the same requests (tokens/s is a rate).

The machine is shared and noisy, so the three schedules run interleaved for a few rounds and each
reports its best round.

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
    ("tiny", True): Workload(num_requests=256, prompt_len=(8, 48), short_len=(4, 12), long_len=128, p_long=0.08,
                             max_len=192, min_bucket=64, rounds=4),
    ("tiny", False): Workload(num_requests=256, prompt_len=(8, 48), short_len=(4, 24), long_len=128, p_long=0.1,
                              max_len=192, min_bucket=64),
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


def bench_model(name: str, lm, wl: Workload) -> dict:
    vocab = lm.config.vocab_size
    reqs = wl.requests(vocab)
    max_prompt = max(len(p) for p, _ in reqs)
    cfg = EngineConfig(num_slots=wl.slots, max_len=wl.max_len, min_bucket=wl.min_bucket, max_prefill_batch=4)
    t = time.perf_counter()
    engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=())
    solo = JaxEngine.from_loaded(lm, config=dataclasses.replace(cfg, num_slots=1, max_prefill_batch=1),
                                 stop_token_ids=())
    engine.warmup(max_prompt)
    solo.warmup(max_prompt)
    compile_s = time.perf_counter() - t

    async def main():
        probe = await engine.generate(reqs[0][0], params(8, 0))  # calibrate one decode step
        step_s = probe.latency_s / 8
        idle = [(await engine.generate(reqs[i][0], params(1, i))).ttft_s for i in range(5)]  # no queue
        total = sum(n for _, n in reqs)
        span = 0.25 * (total / wl.slots + wl.long_len) * step_s  # arrivals outpace service: a queue builds
        gaps = np.random.default_rng(1).exponential(1.0, size=len(reqs))
        arrivals = np.cumsum(gaps) / gaps.sum() * span
        arrivals -= arrivals[0]
        runs: dict[str, list[dict]] = {"continuous": [], "static": [], "sequential": []}
        for _ in range(wl.rounds):
            runs["continuous"].append(await continuous(engine, reqs, arrivals))
            runs["static"].append(await static(engine, reqs, arrivals, wl.slots))
            runs["sequential"].append(await sequential(solo, reqs, wl.seq_every))
        await engine.close()
        await solo.close()
        best = {k: max(v, key=lambda r: r["tokens"] / r["wall_s"]) for k, v in runs.items()}
        return best["continuous"], best["static"], best["sequential"], step_s, idle

    cont, stat, seq, step_s, idle = asyncio.run(main())
    tps = {k: r["tokens"] / r["wall_s"] for k, r in (("continuous", cont), ("static", stat), ("sequential", seq))}
    out = {
        "requests": len(reqs), "slots": wl.slots, "generated_tokens": cont["tokens"],
        "long_len": wl.long_len, "p_long": wl.p_long,
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "continuous_vs_static": round(tps["continuous"] / tps["static"], 2),
        "continuous_vs_sequential": round(tps["continuous"] / tps["sequential"], 2),
        "ttft_ms_p50": round(1000 * float(np.median(cont["ttft_s"])), 1),
        "ttft_ms_p90": round(1000 * float(np.quantile(cont["ttft_s"], 0.9)), 1),
        "ttft_ms_idle": round(1000 * float(np.median(idle)), 1),
        "decode_step_ms": round(1000 * step_s, 2), "compile_s": round(compile_s, 1), "rounds": wl.rounds,
    }
    print(f"[{name}] " + json.dumps(out), flush=True)
    return out


def load_real(name: str):
    try:
        from gymllm.models import load

        return load(name), None
    except Exception as exc:  # no weights here: report, keep the tiny figures
        return None, f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller workloads (about two minutes here)")
    ap.add_argument("--skip-real", action="store_true", help="only the tiny model")
    args = ap.parse_args(argv)
    from gymllm.models import make_tiny

    models: dict[str, dict] = {"tiny": bench_model("tiny", make_tiny("llama"), WORKLOADS[("tiny", args.quick)])}
    note = "skipped by --skip-real"
    if not args.skip_real:
        real, note = load_real("smollm2-135m-instruct")
        if real is not None:
            models["smollm2-135m-instruct"] = bench_model("smollm2", real, WORKLOADS[("smollm2", args.quick)])
        else:
            print(f"[smollm2] skipped: {note}", file=sys.stderr)
    head_name = "smollm2-135m-instruct" if "smollm2-135m-instruct" in models else "tiny"
    head = models[head_name]
    result = {
        "continuous_vs_static": head["continuous_vs_static"],
        "continuous_vs_sequential": head["continuous_vs_sequential"],
        "ttft_ms_p50": head["ttft_ms_p50"],
        "headline_model": head_name, "concurrent": head["slots"], "quick": args.quick, "models": models,
    }
    if head_name == "tiny":
        result["real_model_note"] = note
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
