"""Where one engine program's compile time goes (issue 41: a prefill program took 9-15 s to compile on
a TPU v5e, the learner's gradient about 6 s, and nobody knew why).

On SmolLM2-135M's exact shape (random weights; compile time does not depend on the values), each
program is compiled alone (no persistent cache, caches cleared before each) and its compile is split
into JAX's own phases from ``jax.monitoring`` events: the jaxpr trace, the lowering to MLIR, and XLA's
backend compile. The variants tell the parts apart:

* ``prefill``: the engine's prefill program (P=4 prompts x T=64 tokens, no cached prefix), with
  sampling, exactly as the engine calls it; ``prefill_read``: the same reading 160 cached slots;
* ``decode``: one decode step over 12 rows attending over 160 slots;
* ``prefill_no_sample``: the prefill forward and cache write alone (``models.prefill.prefill_step``);
* ``sample``: the sampler alone on [4, vocab] logits; ``sample_sort``: the same with the top-k / top-p
  filter of commit be7f557 (a descending sort and a cumulative sum over the vocabulary), the filter that
  ``sample`` replaced with a bisection over the values; ``sample_no_filter``: the sampler without any
  filter (what is left: the inverse-CDF draw, greedy argmax, log-probabilities);
* ``prefill_2_layers``: the engine's prefill on a 2-layer model of the same width (how much is per
  layer: the layer loop is one scanned body, so the depth should not matter);
* ``prefill_effort_low``: ``prefill`` with ``jax_exec_time_optimization_effort = -1`` (XLA's cheapest
  optimisation effort);
* ``grad``: a plain learner gradient (value_and_grad of the mean token log-prob over 6 rows x 160
  tokens, bf16 compute on float32 masters), the shape of the Quickstart's micro-batch.

Runs on whatever device JAX finds (never pinned); the device is named in the RESULT.

    python benchmarks/compile_anatomy.py            # every variant
    python benchmarks/compile_anatomy.py --quick    # the same (each variant is one compile)
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

SMOLLM2 = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
)
PHASES = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "backend_s",
}


class Phases:
    """Sums JAX's compile-phase events while ``active`` (one listener for the process)."""

    def __init__(self) -> None:
        import jax

        self.active = False
        self.sums: collections.Counter = collections.Counter()
        self.names: list[str] = []
        jax.monitoring.register_event_duration_secs_listener(self.on)

    def on(self, event: str, duration: float, fun_name: str = "", **_) -> None:
        if self.active and event in PHASES:
            self.sums[PHASES[event]] += duration
            if event.endswith("backend_compile_duration"):
                self.names.append(f"{fun_name}:{duration:.2f}")

    def measure(self, fn) -> dict:
        import jax

        jax.clear_caches()
        self.sums.clear()
        self.names = []
        self.active = True
        t0 = time.perf_counter()
        try:
            fn()
        finally:
            self.active = False
        out = {k: round(self.sums[k], 3) for k in PHASES.values()}
        out["wall_s"] = round(time.perf_counter() - t0, 3)
        out["programs"] = list(self.names)
        return out


def engine_for(num_layers: int):
    from gymllm.inference import EngineConfig, JaxEngine
    from gymllm.models import make_tiny

    lm = make_tiny("llama", std=0.02, **{**SMOLLM2, "num_layers": num_layers})
    cfg = EngineConfig(
        num_slots=12, max_len=160, min_bucket=64, compute_dtype="auto", decode_chunk=1
    )
    return JaxEngine(lm.model, lm.tokenizer, config=cfg), lm


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="the same variants (each is a single compile)"
    )
    ap.add_argument(
        "--variants",
        default="prefill,prefill_read,decode,prefill_no_sample,sample,prefill_2_layers,"
        "prefill_effort_low,grad,sample_sort,sample_no_filter",
    )
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from gymllm.inference.rows import SamplingRows
    from gymllm.inference.sampling import sample, step_keys
    from gymllm.models.prefill import prefill_step

    jax.config.update("jax_enable_compilation_cache", False)
    phases = Phases()
    engine, lm = engine_for(30)
    steps = engine._steps  # noqa: SLF001  the benchmark times the engine's own programs
    p, t, s = 4, 64, 12
    pad = np.full(p, s, np.int32)

    def prefill(read: int, st=steps):
        return lambda: st.call_prefill(
            np.zeros((p, t), np.int32),
            np.zeros((p, t), np.int32),
            pad,
            np.zeros(p, np.int32),
            SamplingRows.inert(p),
            read,
        )

    def decode():
        w = 12
        steps.call_decode(
            np.zeros(w, np.int32), np.zeros(w, np.int32), SamplingRows.inert(w), 160, active=0
        )

    def no_sample():
        state = steps.weights.state
        from flax import nnx

        model = nnx.merge(steps.graphdef, state)
        out = prefill_step(
            model.config,
            model.flat_params(),
            jnp.zeros((p, t), jnp.int32),
            jnp.zeros((p, t), jnp.int32),
            jnp.asarray(pad),
            steps.cache,
            0,
            jnp.zeros(p, jnp.int32),
            compute_dtype=engine.config.compute_dtype,
        )
        steps.cache = out[1]
        jax.block_until_ready(out[0])

    def sampler():
        fn = jax.jit(lambda lg, k, st, tmp, tk, tp: sample(lg, step_keys(k, st), tmp, tk, tp))
        rows = SamplingRows.inert(p)
        keys, st, tmp, tk, tp = rows.arrays()[:5]
        jax.block_until_ready(
            fn(jnp.zeros((p, SMOLLM2["vocab_size"]), jnp.float32), keys, st, tmp, tk, tp)
        )

    small = {}

    def two_layers():
        small["engine"], _ = engine_for(2)
        prefill(0, small["engine"]._steps)()  # noqa: SLF001

    def effort_low():
        jax.config.update("jax_exec_time_optimization_effort", -1.0)
        try:
            prefill(0)()
        finally:
            jax.config.update("jax_exec_time_optimization_effort", 0.0)

    def sort_filter(
        x, top_k, top_p
    ):  # the filter before the bisection (be7f557), for the comparison
        vocab = x.shape[-1]
        srt = jnp.flip(jnp.sort(x, axis=-1), axis=-1)
        rank = jnp.arange(vocab)[None, :]
        k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)[:, None]
        s_k = jnp.where(rank < k, srt, -jnp.inf)
        probs = jax.nn.softmax(s_k, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs
        keep = ((before < top_p[:, None]) | (top_p[:, None] >= 1.0)) & (rank < k)
        threshold = jnp.min(jnp.where(keep, s_k, jnp.inf), axis=-1, keepdims=True)
        return jnp.where(x >= threshold, x, -jnp.inf)

    def sampler_with(filter_fn):
        import gymllm.inference.sampling as sampling_mod

        def run():
            saved = sampling_mod.filter_top_k_top_p
            sampling_mod.filter_top_k_top_p = filter_fn
            try:
                sampler()
            finally:
                sampling_mod.filter_top_k_top_p = saved

        return run

    def grad():
        from gymllm.models.logprobs import token_logprobs
        from gymllm.models.transformer import forward

        cfg, params = lm.config, lm.model.flat_params()

        def loss(ps, tokens):
            pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
            logits, _ = forward(cfg, ps, tokens, pos, compute_dtype="bfloat16")
            return -token_logprobs(logits[:, :-1], tokens[:, 1:]).mean()

        fn = jax.jit(jax.value_and_grad(loss))
        jax.block_until_ready(fn(params, jnp.zeros((6, 160), jnp.int32)))

    table = {
        "prefill": prefill(0),
        "prefill_read": prefill(160),
        "decode": decode,
        "prefill_no_sample": no_sample,
        "sample": sampler,
        "prefill_2_layers": two_layers,
        "prefill_effort_low": effort_low,
        "grad": grad,
        "sample_sort": sampler_with(sort_filter),
        "sample_no_filter": sampler_with(lambda x, k, p: x),
    }
    result: dict = {
        "device": jax.devices()[0].device_kind,
        "platform": jax.devices()[0].platform,
        "compute_dtype": engine.config.compute_dtype,
    }
    for name in args.variants.split(","):
        try:
            result[name] = phases.measure(table[name])
        except Exception as exc:  # a variant that fails is reported, the others still run
            result[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(name, result[name], flush=True)
    from results import emit_result

    emit_result("compile_anatomy", result)
    return result


if __name__ == "__main__":
    main()
