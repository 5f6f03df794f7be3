"""Benchmark the real small model (SmolLM2-135M-Instruct) forward, decode and training step.

Side by side in one process, for float32 and bfloat16 weights (and, for the training step only,
float32 master weights computing in bfloat16: ``mixed``):

* ``prefill_tok_s``: tokens/s of a cached prefill of 16 x 128 tokens (last-token logits);
* ``decode_tok_s_b16``: tokens/s of greedy decoding at batch 16 (one jitted step, donated cache);
* ``fwd_bwd_s``: seconds for one forward + backward (mean token log-prob) over 8 x 128 tokens;
* ``forward_vs_roofline``: the full forward's achieved GFLOP/s over a large jitted matmul's
  GFLOP/s measured in the same run (1.0 = matmul speed); per dtype against that dtype's matmul,
  top level the best forward over the fastest matmul.

Speed against the physical limits (issue #21 part 4; ratios measured in the same run, since absolute
times move between machines; the CPU is printed, ``describe_cpu``):

* ``decode_vs_bandwidth``: one greedy decode step at batch 16 with bf16 weights (the engine's
  one-token path, ``gymllm.models.decode``; median of blocked steps) over its physical limit, the
  larger of (a) ``stream_s``: copying as many bytes as the weights once (a jitted ``x + 1`` over a
  uint32 buffer of the weights' byte size, best of several) and (b) ``flops_s``: the step's matmul
  FLOPs at the bf16 matmul rate measured in this run. Goal: <= 1.5 (1.0 = at the limit).
* ``fwd_bwd_vs_roofline``: the learner's loss gradient (``gymllm.algos.learner_programs.build_loss_fn``, the
  async-agentic loss with entropy, as the learner runs it) over 8 x 128 tokens: its achieved
  FLOP/s (3 x the forward's matmul FLOPs) over the same-dtype (bf16) matmul rate. Top level: the
  better of bf16 weights and ``mixed`` (float32 master, bf16 compute), both computing in bf16.
  Goal: >= 0.5. Per dtype also against that dtype's own matmul (fp32 against fp32).

The issue's bar (a plain JAX SmolLM2 on 2 cores, bf16): prefill ~315 tok/s, decode ~100 tok/s at
batch 16, fwd+bwd ~9 s; ``vs_issue`` gives our figure over the bar (> 1 is better, for fwd_bwd the
bar over ours). The top-level figures are the better of the two dtypes. Ends with one line
``RESULT {json}``.

    python benchmarks/models.py [--quick] [--model smollm2-135m-instruct] [--dtypes fp32,bf16,mixed]
"""

from __future__ import annotations

import argparse
import json
import time

from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device

import jax  # noqa: E402
import jax.numpy as jnp
import numpy as np

from gymllm.algos.config import async_agentic
from gymllm.algos.learner_config import LearnerConfig
from gymllm.algos.learner_programs import build_loss_fn
from gymllm.models import load, token_logprobs
from gymllm.models.decode import decode_forward, write_new_kv
from gymllm.models.transformer import forward
from gymllm.utils.host import describe_cpu

ISSUE_BAR = {"prefill_tok_s": 315.0, "decode_tok_s_b16": 100.0, "fwd_bwd_s": 9.0}
DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "mixed": jnp.float32}
# "mixed": float32 master weights with bfloat16 compute (forward(compute_dtype=...)), the trainer's
# mixed-precision setting; only its forward + backward is measured (an engine stores bf16 weights).
COMPUTE = {"mixed": "bfloat16"}
COMPUTE_RATE = {"mixed": "bf16"}  # the matmul rate a compute dtype is measured against


def _timed(fn, reps: int) -> float:
    """Median seconds of ``reps`` calls after one warm-up (compile) call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def matmul_gflops(n: int, dtype, reps: int) -> float:
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    # f32 accumulation: the form the model's matmuls take (a bf16 -> bf16 dot is upcast by XLA:CPU)
    f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    return 2 * n**3 / _timed(lambda: f(a, b), reps) / 1e9


def forward_flops(cfg, batch: int, t: int) -> float:
    """Matmul FLOPs of a full forward: projections, MLP, attention scores/values, lm head."""
    e, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.resolved_head_dim
    h, k = cfg.num_heads, cfg.num_kv_heads
    per_token_layer = 2 * e * (h * d + 2 * k * d) + 2 * h * d * e + 3 * 2 * e * f
    attn = 2 * 2 * h * d * t / 2  # causal: on average t/2 keys
    return batch * t * (cfg.num_layers * (per_token_layer + attn) + 2 * e * cfg.vocab_size)


def decode_flops(cfg, batch: int, cache_len: int) -> float:
    """Matmul FLOPs of one decode step: one token per row attending over ``cache_len`` cache slots."""
    e, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.resolved_head_dim
    h, k = cfg.num_heads, cfg.num_kv_heads
    per_token_layer = 2 * e * (h * d + 2 * k * d) + 2 * h * d * e + 3 * 2 * e * f
    attn = 2 * 2 * h * d * cache_len
    return batch * (cfg.num_layers * (per_token_layer + attn) + 2 * e * cfg.vocab_size)


def weight_bytes(params) -> int:
    """Bytes of the distinct weight buffers (a tied embedding / lm head counts once)."""
    seen, total = set(), 0
    for v in params.values():
        if id(v) not in seen:
            seen.add(id(v))
            total += v.size * v.dtype.itemsize
    return int(total)


def stream_seconds(nbytes: int, reps: int) -> float:
    """Best seconds of a jitted ``x + 1`` over a buffer of ``nbytes``: streaming as many bytes as the
    weights once (each byte read once; the same again written). uint32, not bf16: on CPUs without
    native bf16 arithmetic a bf16 add converts every element, which would time the ALU, not memory."""
    x = jnp.ones((nbytes // 4,), jnp.uint32)
    f = jax.jit(lambda x: x + jnp.asarray(1, x.dtype))
    jax.block_until_ready(f(x))
    best = float("inf")
    for _ in range(max(5, 3 * reps)):
        t = time.perf_counter()
        jax.block_until_ready(f(x))
        best = min(best, time.perf_counter() - t)
    return best


def learner_grad_seconds(cfg, params, toks, pos, reps: int, compute_dtype=None) -> float:
    """The learner's loss gradient (async-agentic loss, entropy on, as ``StreamingLearner`` runs it)
    over 8 x 128 tokens: median seconds of one jitted value-and-grad."""
    lcfg = LearnerConfig(compute_dtype=compute_dtype)
    loss_fn = build_loss_fn(cfg, async_agentic(), lcfg, None)
    b, t = 8, toks.shape[1]
    rng = np.random.default_rng(1)
    arrays = {
        "tokens": toks[:b],
        "positions": pos[:b],
        "targets": jnp.roll(toks[:b], -1, axis=1),
        "mask": jnp.asarray(
            np.r_[np.zeros(t // 4), np.ones(t - t // 4)][None].repeat(b, 0), jnp.float32
        ),
        "mu": jnp.asarray(-rng.random((b, t)) * 3, jnp.float32),
        "advantages": jnp.asarray(rng.normal(size=b), jnp.float32),
        "group_tokens": jnp.full((b,), float(t), jnp.float32),
    }
    grad = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, None, arrays, None), has_aux=True))
    return _timed(lambda: grad(params), max(1, reps // 2))


def decode_step_seconds(step, params, tok, t0: int, cache, steps: int):
    """Median seconds of ``steps`` blocked decode steps (each waits for its tokens, as an engine does);
    returns (median, mean, last tokens, cache)."""
    times = []
    b = tok.shape[0]
    for i in range(steps):
        t = time.perf_counter()
        tok, cache = step(params, tok, jnp.full((b,), t0 + i, jnp.int32), cache)
        jax.block_until_ready(tok)
        times.append(time.perf_counter() - t)
    return float(np.median(times)), float(np.mean(times)), tok, cache


def fwd_bwd_seconds(cfg, params, toks, pos, reps: int, compute_dtype=None) -> float:
    """One forward + backward (mean token log-prob) over 8 x 128 tokens."""
    tb = toks[:8]

    def loss(p):
        logits, _ = forward(cfg, p, tb[:, :-1], pos[:8, :-1], compute_dtype=compute_dtype)
        return -jnp.mean(token_logprobs(logits, tb[:, 1:]))

    grad = jax.jit(jax.value_and_grad(loss))
    return _timed(lambda: grad(params), max(1, reps // 2))


def bench_dtype(name: str, dtype, args) -> dict:
    lm = load(args.model, dtype=dtype)
    cfg, params = lm.config, lm.model.flat_params()
    rng = np.random.default_rng(0)
    b, t = 16, 128
    toks = jnp.asarray(rng.integers(100, cfg.vocab_size, (b, t)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    grad_flops = 3 * forward_flops(cfg, 8, t)  # forward + backward (twice the forward's matmuls)
    if name in COMPUTE:
        grad_s = learner_grad_seconds(cfg, params, toks, pos, args.reps, COMPUTE[name])
        rate = args.rates[COMPUTE_RATE[name]]
        out = {
            "fwd_bwd_s": fwd_bwd_seconds(cfg, params, toks, pos, args.reps, COMPUTE[name]),
            "learner_grad_s": grad_s,
            "fwd_bwd_gflops": grad_flops / grad_s / 1e9,
            "fwd_bwd_vs_roofline": grad_flops / grad_s / 1e9 / rate,
        }
        print(name, json.dumps({k: round(v, 3) for k, v in out.items()}), flush=True)
        return out
    max_len = t + 2 * args.decode_steps + 1

    # prefill into a cache
    cache0 = lm.model.init_cache(b, max_len)
    last = jnp.full((b,), t - 1, jnp.int32)  # an engine's prefill needs the last logits only
    prefill_s = _timed(lambda: forward(cfg, params, toks, pos, None, cache0, last), args.reps)

    # full forward (no cache), for the roofline ratio
    fwd = jax.jit(lambda p, x, y: forward(cfg, p, x, y)[0])
    fwd_s = _timed(lambda: fwd(params, toks, pos), args.reps)
    gflops = forward_flops(cfg, b, t) / fwd_s / 1e9

    # greedy decode at batch 16 on the engine's one-token path (gymllm.models.decode), cache donated
    def step_fn(p, tok, positions, cache):  # tok/positions [B]
        logits, k_new, v_new = decode_forward(cfg, p, tok, positions, cache)
        return jnp.argmax(logits, -1).astype(jnp.int32), write_new_kv(
            cache, k_new, v_new, positions
        )

    step = jax.jit(step_fn, donate_argnums=(3,))
    _, cache = forward(cfg, params, toks, pos, None, lm.model.init_cache(b, max_len))
    tok = toks[:, -1]
    tok, cache = step(params, tok, jnp.full((b,), t, jnp.int32), cache)  # compile
    jax.block_until_ready(tok)
    start = time.perf_counter()
    for i in range(1, args.decode_steps):
        tok, cache = step(params, tok, jnp.full((b,), t + i, jnp.int32), cache)
    jax.block_until_ready(tok)
    decode_tok_s = b * (args.decode_steps - 1) / (time.perf_counter() - start)
    step_s, _, tok, cache = decode_step_seconds(
        step, params, tok, t + args.decode_steps, cache, args.decode_steps
    )

    fwd_bwd_s = fwd_bwd_seconds(cfg, params, toks, pos, args.reps)
    grad_s = learner_grad_seconds(cfg, params, toks, pos, args.reps)
    roof = args.rates[name]
    stream_s = stream_seconds(weight_bytes(params), args.reps)
    flops_s = decode_flops(cfg, b, max_len) / (roof * 1e9)
    out = {
        "decode_step_ms_b16": 1000 * step_s,
        "stream_ms": 1000 * stream_s,
        "flops_ms": 1000 * flops_s,
        "weight_mb": weight_bytes(params) / 1e6,
        "decode_vs_bandwidth": step_s / max(stream_s, flops_s),
        "learner_grad_s": grad_s,
        "fwd_bwd_gflops": grad_flops / grad_s / 1e9,
        "fwd_bwd_vs_roofline": grad_flops / grad_s / 1e9 / roof,
        "prefill_tok_s": b * t / prefill_s,
        "decode_tok_s_b16": decode_tok_s,
        "fwd_bwd_s": fwd_bwd_s,
        "forward_gflops": gflops,
        "matmul_gflops": roof,
        "forward_vs_roofline": gflops / roof,
    }
    print(name, json.dumps({k: round(v, 3) for k, v in out.items()}), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="fewer repetitions and decode steps (~2 min)"
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtypes", default="fp32,bf16,mixed")
    args = ap.parse_args()
    args.reps = 1 if args.quick else 3
    args.decode_steps = 12 if args.quick else 48
    args.matmul_n = 1024 if args.quick else 2048
    names = args.dtypes.split(",")
    cpu = describe_cpu()
    print("cpu", cpu, flush=True)
    # the same-dtype matmul rates (GFLOP/s), measured once in this run
    args.rates = {
        r: matmul_gflops(args.matmul_n, DTYPES[r], args.reps)
        for r in sorted({COMPUTE_RATE.get(n, n) for n in names})
    }
    print("matmul_gflops", json.dumps({k: round(v, 1) for k, v in args.rates.items()}), flush=True)
    per = {name: bench_dtype(name, DTYPES[name], args) for name in names}
    full = [v for v in per.values() if "prefill_tok_s" in v]
    best = {
        "prefill_tok_s": max(v["prefill_tok_s"] for v in full),
        "decode_tok_s_b16": max(v["decode_tok_s_b16"] for v in full),
        "fwd_bwd_s": min(v["fwd_bwd_s"] for v in per.values()),
        # the machine's roofline is its fastest matmul, whatever the dtype (bf16 GEMMs are slow on
        # CPUs without native bf16, which would flatter a bf16 forward measured against them)
        "forward_vs_roofline": max(v["forward_gflops"] for v in full)
        / max(v["matmul_gflops"] for v in full),
    }
    # the limits' ratios on the bf16 path (the engine's bf16 weights; the learner computing in bf16:
    # bf16 weights or float32 master weights, the better of the two)
    if "bf16" in per:
        best["decode_vs_bandwidth"] = per["bf16"]["decode_vs_bandwidth"]
    bf16_grads = [n for n in ("bf16", "mixed") if n in per]
    if bf16_grads:
        best["fwd_bwd_vs_roofline"] = max(per[n]["fwd_bwd_vs_roofline"] for n in bf16_grads)
    vs_issue = {
        "prefill_tok_s": best["prefill_tok_s"] / ISSUE_BAR["prefill_tok_s"],
        "decode_tok_s_b16": best["decode_tok_s_b16"] / ISSUE_BAR["decode_tok_s_b16"],
        "fwd_bwd_s": ISSUE_BAR["fwd_bwd_s"] / best["fwd_bwd_s"],
    }
    rnd = lambda d: {k: round(v, 4) for k, v in d.items()}  # noqa: E731
    result = {
        **rnd(best),
        **{name: rnd(v) for name, v in per.items()},
        "vs_issue": rnd(vs_issue),
        "issue_bar": ISSUE_BAR,
        "model": args.model,
        "quick": args.quick,
        "cpu": cpu,
        "goals": {"decode_vs_bandwidth": "<= 1.5", "fwd_bwd_vs_roofline": ">= 0.5"},
        "load_avg": open("/proc/loadavg").read().split()[:3],
    }
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("models", result)


if __name__ == "__main__":
    main()
