"""Prefill call cost: the generic cached forward (gather whole rows, carry them through the layer scan,
scatter back: the engine's prefill before ``gymllm.models.prefill``) against ``prefill_and_write`` (read
only the rows' cached prefix, write only the real tokens), side by side in one process.

Cases: the tiny random model (float32, the rollout benchmark's engine: 4 rows x bucket 64) at
``max_len`` 384, and SmolLM2-135M-Instruct (bf16 compute, uint16-packed weights and cache, as the
engine stores them: 4 rows x bucket 16) at ``max_len`` 96 and 384. Each case runs a fresh prompt
(start 0: the new path reads nothing) and a next turn (start ~ max_len / 3, read length the smallest
halving bucket covering it). Every timing is the best of ``--repeats`` rounds of ``--iters`` calls,
both paths interleaved (the machine may be shared). Ends with ``RESULT {json}``: per case, ms per
call for each path and the speedup.

    python benchmarks/prefill.py [--skip-smollm2]
"""

from __future__ import annotations

import argparse
import functools
import json
import time

from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from gymllm.inference.slot_table import halving_buckets, pick_bucket  # noqa: E402
from gymllm.models import KVCache  # noqa: E402
from gymllm.models.cache import init_cache  # noqa: E402
from gymllm.models.prefill import prefill_and_write  # noqa: E402
from gymllm.models.transformer import forward  # noqa: E402
from gymllm.models.blocks import pack_bf16  # noqa: E402


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(5,))
def old_prefill(cfg, params, tokens, positions, rows, cache, last):
    """The engine's prefill before the fast path: whole rows gathered, run through the cached forward, scattered back."""
    part = KVCache(*(jnp.take(c, rows, axis=1, mode="clip") for c in cache))
    logits, part = forward(cfg, params, tokens, positions, None, part, last)
    cache = KVCache(*(c.at[:, rows].set(p, mode="drop") for c, p in zip(cache, part)))
    return logits[:, 0], cache


new_prefill = jax.jit(prefill_and_write, static_argnums=(0, 6), donate_argnums=(5,))


def _inputs(cfg, rows: int, bucket: int, start: int, max_len: int, slots: int):
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (rows, bucket)), jnp.int32)
    positions = jnp.asarray(
        np.minimum(start + np.arange(bucket), max_len - 1)[None].repeat(rows, 0), jnp.int32
    )
    row_ids = jnp.asarray(np.arange(rows) * (slots // rows), jnp.int32)
    last = jnp.full(rows, min(bucket - 1, max_len - 2 - start), jnp.int32)
    return tokens, positions, row_ids, last


def _time(fn, cache, iters: int):
    t = time.perf_counter()
    for _ in range(iters):
        logits, cache = fn(cache)
    logits.block_until_ready()
    return (time.perf_counter() - t) / iters * 1e3, cache


def bench_case(
    cfg,
    params,
    cache_dtype,
    *,
    rows: int,
    bucket: int,
    max_len: int,
    slots: int,
    start: int,
    iters: int,
    repeats: int,
) -> dict:
    cache = init_cache(
        cfg.num_layers, slots, max_len, cfg.num_kv_heads, cfg.resolved_head_dim, cache_dtype
    )
    tokens, positions, row_ids, last = _inputs(cfg, rows, bucket, start, max_len, slots)
    length = 0 if start == 0 else pick_bucket(start, halving_buckets(max_len, 4))
    old = lambda c: old_prefill(cfg, params, tokens, positions, row_ids, c, last)  # noqa: E731
    new = lambda c: new_prefill(cfg, params, tokens, positions, row_ids, c, length, last)  # noqa: E731
    la, cache = old(cache)
    lb, cache = new(cache)  # compile both; same logits
    diff = float(jnp.abs(la - lb).max() / jnp.abs(la).max())
    best = {"old": float("inf"), "new": float("inf")}
    for _ in range(repeats):
        for name, fn in (("old", old), ("new", new)):
            ms, cache = _time(fn, cache, iters)
            best[name] = min(best[name], ms)
    out = {
        "old_ms": round(best["old"], 2),
        "new_ms": round(best["new"], 2),
        "speedup": round(best["old"] / best["new"], 2),
        "read_length": length,
        "rel_logit_diff": round(diff, 5),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-smollm2", action="store_true")
    args = ap.parse_args()
    results = {}
    from gymllm.models.tiny import make_tiny

    tiny = make_tiny("llama", seed=0)
    cases = [("tiny", tiny.config, tiny.model.flat_params(), jnp.float32, 4, 64, 384, 128)]
    if not args.skip_smollm2:
        from gymllm.models import load

        lm = load("smollm2-135m-instruct")
        packed = pack_bf16(lm.model.flat_params())
        cases += [("smollm2", lm.config, packed, jnp.uint16, 4, 16, n, 32) for n in (96, 384)]
    for name, cfg, params, dtype, rows, bucket, max_len, slots in cases:
        for start in (0, max_len // 3):
            key = f"{name}_len{max_len}_start{start}"
            results[key] = bench_case(
                cfg,
                params,
                dtype,
                rows=rows,
                bucket=bucket,
                max_len=max_len,
                slots=slots,
                start=start,
                iters=args.iters,
                repeats=args.repeats,
            )
            print(key, json.dumps(results[key]), flush=True)
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("prefill", results)


if __name__ == "__main__":
    main()
