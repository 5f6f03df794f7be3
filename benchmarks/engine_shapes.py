"""The engine's compiled program sets side by side: bucketed shapes vs the fixed set (``EngineConfig.shapes``).

Run through ``python benchmarks/engine.py --shapes [--quick]`` (or this file directly). One process, the
Quickstart's engine (``gymllm train``'s "default" preset: SmolLM2-135M-Instruct, 12 rows, a 160-token
context, decode chunks of 8, ``compute_dtype="auto"``), under each program set:

* ``buckets``: the preset's engine as it was (prefill batch sizes {1, 2, 4} x length buckets
  {64, 128, 160} x cached lengths {0, 20, 40, 80, 160}; decode widths {8, 12} x 4 cache lengths; copies);
* ``fixed``: ``shapes="fixed"``, ``decode_lengths=1`` and each ``--budgets`` token budget
  (``prefill_tokens``; ``128/32``: with ``prefill_tokens_small=32``).

Per set: the programs compiled (JAX's backend-compile events of the weight install and ``warmup()``,
every compiled program dropped before them so each set compiles its whole set, and during the runs, by
program name) and their compile seconds (the events' durations; ``warmup_s``: the wall time of
``warmup()``, tracing and lowering included), then tokens/s on a GRPO-like burst over fresh engines
(the compiled programs are shared): 12 rows (2 groups of 6 identical ~100-token prompts, as the
Quickstart's ArithmeticTool groups) sample 10 tokens each (its answers take ~9), and each row's second
turn (its prompt, its completion and an 8-token observation: ~18 new tokens, as the Quickstart's second
turns; the prefix reused), sent as soon as that row's first turn ends (as a rollout does), samples 24 more (the 160-token
context ends some). Stop ids are off, so every
run generates the same number of tokens. The sets run interleaved for a few rounds, the order rotating
(the machine's load drifts); the mean and spread per set are reported. Real weights when the model
loads, else random weights of its shape (``random_weights: true``). Ends with ``RESULT {json}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device

import jax  # noqa: E402
import numpy as np  # noqa: E402

from gymllm.inference import EngineConfig, JaxEngine, SamplingParams  # noqa: E402
from gymllm.utils.host import describe_cpu, loadavg  # noqa: E402

# the "default" preset's engine before the fixed set (gymllm/train/train_config.py)
QUICKSTART = EngineConfig(
    num_slots=12,
    max_len=160,
    min_bucket=64,
    idle_wait_s=0.002,
    decode_chunk=8,
    compute_dtype="auto",
)
# the Quickstart's trajectories (runs/default/trajectories.jsonl): ~100-token prompts, answers of ~9 tokens,
# second-turn pieces (the answer's end and the observation) of ~17 tokens, replies of at most 24 tokens
GROUPS, GROUP_SIZE, PROMPT_LEN, FIRST_TOKENS, OBS_LEN, MAX_TOKENS = 2, 6, 100, 10, 8, 24


def configs(budgets: list[int]) -> dict[str, EngineConfig]:
    out = {"buckets": QUICKSTART}
    for b in budgets:  # "128" or "128/32" (prefill_tokens / prefill_tokens_small)
        full, _, small = str(b).partition("/")
        out[f"fixed_{full}" + (f"_{small}" if small else "")] = dataclasses.replace(
            QUICKSTART,
            shapes="fixed",
            decode_lengths=1,
            prefill_tokens=int(full),
            prefill_tokens_small=int(small or 0),
        )
    return out


class CompileLog:
    """JAX's backend-compile events (program name, seconds) while installed."""

    def __init__(self):
        self.events: list[tuple[str, float]] = []

    def __call__(self, event: str, duration: float, **kw) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.events.append((str(kw.get("fun_name")), float(duration)))

    def take(self) -> list[tuple[str, float]]:
        out, self.events = self.events, []
        return out


async def burst(engine: JaxEngine, vocab: int, seed: int) -> tuple[int, float]:
    """One GRPO-like burst and its second turns: (tokens generated, wall seconds)."""
    rng = np.random.default_rng(seed)
    prompts = [[int(x) for x in rng.integers(3, vocab, size=PROMPT_LEN + g)] for g in range(GROUPS)]
    t0 = time.perf_counter()
    params = [
        SamplingParams(temperature=0.8, max_tokens=MAX_TOKENS, seed=seed * 100 + i)
        for i in range(GROUPS * GROUP_SIZE)
    ]
    rows = [
        (prompts[i // GROUP_SIZE], params[i], f"r{seed}-{i}") for i in range(GROUPS * GROUP_SIZE)
    ]
    short = [dataclasses.replace(q, max_tokens=FIRST_TOKENS) for q in params]
    obs = [[int(x) for x in rng.integers(3, vocab, size=OBS_LEN)] for _ in rows]

    async def row(
        p, q, s, o, q1
    ):  # a trajectory: its second turn starts when its own first turn ends
        c = await engine.generate(p, q1, session_id=s)
        return c, await engine.generate(p + list(c.token_ids) + o, q, session_id=s)

    done = await asyncio.gather(
        *(row(p, q, s, o, q1) for (p, q, s), o, q1 in zip(rows, obs, short))
    )
    wall = time.perf_counter() - t0
    return sum(len(c.token_ids) for pair in done for c in pair), wall


def run(lm, budgets: list[int], rounds: int, random_weights: bool) -> dict:
    log = CompileLog()
    jax.monitoring.register_event_duration_secs_listener(log)
    sets = configs(budgets)
    out: dict = {}
    try:
        for name in [
            *list(sets)[1:],
            "buckets",
        ]:  # each set compiles all of its own programs (caches cleared)
            cfg = sets[name]
            jax.clear_caches()
            log.take()
            t = time.perf_counter()
            engine = JaxEngine.from_loaded(
                lm, config=cfg, stop_token_ids=()
            )  # the weight install: a program
            installed = [e for e in log.take() if "convert_leaves" in e[0]]
            engine.warmup()
            warm_s = time.perf_counter() - t
            ev = installed + log.take()
            out[name] = {
                "config": {
                    k: getattr(engine.config, k)
                    for k in (
                        "shapes",
                        "prefill_tokens",
                        "decode_lengths",
                        "max_prefill_batch",
                        "compute_dtype",
                        "prefill_tokens_small",
                    )
                },
                "listed_programs": len(engine.program_shapes()),
                "warmup_programs": len(ev),
                "warmup_compile_s": round(sum(d for _, d in ev), 2),
                "warmup_s": round(warm_s, 2),
                "programs_by_name": {
                    n: sum(1 for x, _ in ev if x == n) for n in sorted({x for x, _ in ev})
                },
                "rates": [],
                "late_programs": 0,
            }
            engine.shutdown()
            print(
                f"  {name}: {len(ev)} programs, {out[name]['warmup_compile_s']} s compiling "
                f"({warm_s:.1f} s warmup)",
                flush=True,
            )
        for name, cfg in sets.items():  # compile again what the cache clears dropped (not counted)
            engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=())
            engine.warmup()
            engine.shutdown()
        log.take()
        vocab = lm.config.vocab_size
        order = list(sets)
        for r in range(rounds):
            k = r % len(order)
            for name in order[k:] + order[:k]:
                engine = JaxEngine.from_loaded(lm, config=sets[name], stop_token_ids=())

                async def go(e=engine):
                    try:
                        return await burst(e, vocab, seed=r + 1)
                    finally:
                        await e.close()

                tokens, wall = asyncio.run(go())
                out[name]["late_programs"] += len(
                    log.take()
                )  # compiled during the burst: not in warmup's set
                out[name]["rates"].append(round(tokens / wall, 1))
                out[name]["tokens"] = tokens
            print(
                f"  round {r + 1}/{rounds}: "
                + ", ".join(f"{n} {out[n]['rates'][-1]:.0f}" for n in order)
                + " tok/s",
                flush=True,
            )
    finally:
        jax.monitoring.unregister_event_duration_listener(log)
    for v in out.values():
        v["tps"] = round(float(np.mean(v["rates"])), 1)
        v["tps_std"] = round(float(np.std(v["rates"])), 1)
    head = {n: v for n, v in out.items() if n != "buckets"}
    best = max(head, key=lambda n: head[n]["tps"])
    return {
        "model": "smollm2-135m-instruct",
        "random_weights": random_weights,
        "rounds": rounds,
        "programs": {n: v["warmup_programs"] + v["late_programs"] for n, v in out.items()},
        "compile_s": {n: v["warmup_compile_s"] for n, v in out.items()},
        "tps": {n: v["tps"] for n, v in out.items()},
        "fixed_best": best,
        "fixed_vs_buckets_tps": round(out[best]["tps"] / out["buckets"]["tps"], 3),
        "sets": out,
        "cpu": describe_cpu(),
        "loadavg_end": loadavg(),
    }


def load_model():
    """SmolLM2-135M-Instruct (real weights), else random weights of its shape: (loaded, random_weights)."""
    try:
        from gymllm.models import load

        return load("smollm2-135m-instruct"), False
    except Exception as exc:  # no weights here: its shape with random weights (timing only)
        print(
            f"[smollm2] real weights unavailable ({type(exc).__name__}: {exc}); random weights",
            flush=True,
        )
        from gymllm.models import make_tiny

        return make_tiny(
            "llama",
            vocab_size=49152,
            hidden_size=576,
            num_layers=30,
            num_heads=9,
            num_kv_heads=3,
            intermediate_size=1536,
        ), True


def main(quick: bool, budgets: list[int]) -> dict:
    """The side-by-side run (``--quick``: 2 rounds, else 4), its RESULT line and record."""
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    load0 = loadavg()
    print(f"CPU: {describe_cpu()}; load average {load0}", flush=True)
    lm, random_weights = load_model()
    result = {
        **run(lm, budgets, 2 if quick else 4, random_weights),
        "quick": quick,
        "loadavg_start": load0,
    }
    emit_result("engine_shapes", result)
    return result


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="2 rounds (about five minutes on a quiet 2-core CPU)"
    )
    ap.add_argument(
        "--budgets",
        default="128",
        help="the fixed sets' prefill token budgets, comma-separated; 128/32 adds a 32-token program (prefill_tokens_small)",
    )
    a = ap.parse_args()
    main(a.quick, [b.strip() for b in a.budgets.split(",") if b.strip()])
