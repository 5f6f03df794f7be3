"""Figures against the chip's own limits (issue 42 part 3), each limit measured in the same run.

On whatever device JAX finds (a TPU or GPU; ``--dry`` rehearses it on the CPU with a tiny model):

* **Limits**: the bf16 matmul rate (an 8192^3 product, best of ``reps``; ``peak_bf16_tflops``) and the
  memory bandwidth (an elementwise pass over a 1 GiB bf16 array, bytes read + written;
  ``hbm_gb_s``).
* **Decode against the bandwidth bound**, per model shape (``smollm2`` = SmolLM2-135M, ``0p5b`` =
  Qwen2.5-0.5B; random weights in the real architecture, bf16 engine, the fixed program set): tokens/s
  with 64, 256 and 512 rows decoding together, at each of ``--decode-chunks`` (decode steps per device
  call) and ``--kv-writes`` (``EngineConfig.kv_write``), ``decode_tok_s_<shape>_<rows>_chunk<k>_<write>``;
  the best is ``decode_tok_s_<shape>_<rows>``, its way ``decode_chunk_<shape>_<rows>`` and
  ``decode_kv_write_<shape>_<rows>``: one call a token pays the host's round trip per token). The bound is what a
  decode step must read at the measured bandwidth: every weight once (the bf16 weights, the tied head
  included) plus each row's K/V for its context so far (the mean over the measured tokens), so
  ``bound tokens/s = rows * hbm_bytes_per_s / (weight bytes + rows * mean context * KV bytes a token)``;
  ``decode_vs_hbm_bound_<rows>`` is the SmolLM2 figure over that bound (``..._0p5b_<rows>`` the 0.5B's).
  ``kv_read_full_<shape>`` says how much more the engine's decode program reads when it attends over
  every slot's whole ``max_len`` (masked) rather than only the context.
* **Learner model-FLOPs utilisation**: one StreamingLearner step (bf16 mixed precision, warm programs)
  of ``groups x group_size`` trajectories of ``traj_len`` tokens; model FLOPs ``6 N T`` (N = every
  matmul weight, the tied head counted once as a matmul, the embedding lookup not) plus causal
  attention ``6 L T ctx d`` (ctx = the mean context, ``traj_len / 2``), over the step's wall, over the
  measured bf16 peak: ``learner_mfu_smollm2`` / ``learner_mfu_0p5b`` (the best of the listed batch
  shapes; each shape's figure under ``learner_runs``).

    python benchmarks/chip_limits.py             # on the chip (about 4 minutes, compiles included)
    python benchmarks/chip_limits.py --quick     # 64 and 256 rows, one learner shape
    python benchmarks/chip_limits.py --dry       # the CPU rehearsal (tiny sizes): checks the script

Ends with ``RESULT {json}`` (recorded in ``benchmarks/results/`` with the device).
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

#: the architectures measured (random weights; the 0.5B is Qwen2.5-0.5B's sizes in the qwen2 family)
SHAPES = {
    "smollm2": (
        "llama",
        dict(
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
        ),
    ),
    "0p5b": (
        "qwen2",
        dict(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_layers=24,
            num_heads=14,
            num_kv_heads=2,
            head_dim=64,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
        ),
    ),
}
DRY_SHAPE = (
    "llama",
    dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
    ),
)


def timed(fn, reps: int) -> float:
    """The best wall of ``reps`` calls of ``fn`` (each blocks until its result is ready)."""
    import jax

    jax.block_until_ready(fn())  # compile
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return best


def limits(dry: bool) -> dict:
    """The bf16 matmul rate and the memory bandwidth, measured here."""
    import jax
    import jax.numpy as jnp

    n = 512 if dry else 8192
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    mm = jax.jit(
        lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
    )
    s = timed(lambda: mm(a, b), 10)
    elems = (1 << 20) if dry else (1 << 29)  # 1 GiB of bf16 on the chip
    x = jnp.ones((elems,), jnp.bfloat16)
    bump = jax.jit(lambda v: v + jnp.bfloat16(1))
    c = timed(lambda: bump(x), 10)
    return {
        "peak_bf16_tflops": 2 * n**3 / s / 1e12,
        "hbm_gb_s": 2 * elems * 2 / c / 1e9,
        "matmul_n": n,
        "copy_bytes": elems * 2,
    }


def model(shape: str, dry: bool):
    from gymllm.models import make_tiny

    family, sizes = DRY_SHAPE if dry else SHAPES[shape]
    import jax.numpy as jnp

    return make_tiny(family, std=0.02, dtype=jnp.bfloat16, **sizes)


def param_counts(lm) -> tuple[int, int]:
    """(every parameter, the embedding table's) of ``lm``."""
    import jax

    leaves = jax.tree_util.tree_leaves_with_path(lm.model.flat_params())
    total = sum(int(v.size) for _, v in leaves)
    emb = sum(int(v.size) for p, v in leaves if "embed" in jax.tree_util.keystr(p))
    return total, emb


def decode(
    lm,
    rows: int,
    dry: bool,
    chunk: int = 1,
    kv_write: str = "scatter",
    attention: str = "auto",
    align: int = 1,
) -> dict:
    """Tokens/s with ``rows`` rows decoding together, and the mean context over the measured tokens.

    ``chunk``: the engine's ``decode_chunk`` (decode steps per device call; 1: one call a token);
    ``kv_write``: its ``kv_write`` (how a step writes the rows' new k/v); ``attention``: its
    ``decode_attention`` (how a step reads the cached slots); ``align``: the cache's slots rounded up
    to a multiple of it (on a TPU v5e the attention reads a window of whole 128-slot lanes at
    0.4-0.7 of the bandwidth and an unaligned one at about 0.2: docs/tpu.md)."""
    import numpy as np

    from gymllm.inference import EngineConfig, JaxEngine, SamplingParams

    prompt_len, tokens = (8, 4) if dry else (32, 128)
    max_len = -(-(prompt_len + tokens) // align) * align
    cfg = EngineConfig(
        num_slots=rows,
        max_len=max_len,
        min_bucket=prompt_len,
        compute_dtype="bfloat16",
        shapes="fixed",
        decode_lengths=1,
        prefill_tokens=16 if dry else 512,
        decode_chunk=chunk,
        kv_write=kv_write,
        decode_attention=attention,
    )
    engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=())
    engine.warmup(prompt_len)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, lm.config.vocab_size, prompt_len).tolist() for _ in range(rows)]

    async def run(n: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        comps = await asyncio.gather(
            *(
                engine.generate(p, SamplingParams(temperature=1.0, max_tokens=n, seed=i))
                for i, p in enumerate(prompts)
            )
        )
        end = time.perf_counter() - t0
        start = max(c.ttft_s for c in comps)  # every row has started decoding
        return end - start, sum(c.num_tokens - 1 for c in comps)

    async def main() -> tuple[float, int]:
        await run(4)
        out = await run(tokens)
        await engine.close()
        return out

    wall, toks = asyncio.run(main())
    return {"tok_s": toks / wall, "mean_ctx": prompt_len + tokens / 2, "max_len": max_len}


def kv_bytes_per_token(cfg) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2  # K and V, bf16


def learner_mfu(
    lm, groups: int, group_size: int, traj_len: int, micro: int, peak_flops: float
) -> dict:
    """One warm StreamingLearner step in bf16 mixed precision: its wall and model FLOPs utilisation."""
    import jax
    import numpy as np

    from accelerator_check import random_groups

    from gymllm.algos.learner import StreamingLearner
    from gymllm.algos.learner_config import LearnerConfig

    rng = np.random.default_rng(2)
    vocab, L = lm.config.vocab_size, traj_len

    def batch(tag: str) -> list:
        return random_groups(rng, vocab, groups, group_size, L, tag)

    learner = StreamingLearner(
        lm.config,
        lm.model.flat_params(),
        config=LearnerConfig(
            groups_per_step=groups,
            micro_batch_size=micro,
            fixed_shapes=True,
            shared_prefix=False,
            compute_dtype="bfloat16",
            max_len=max(32, 1 << (L - 1).bit_length()),
            min_bucket=32,
        ),
    )
    learner.warmup(group_size)
    learner.submit(batch("warm"))
    walls = []
    for r in range(3):
        t = time.perf_counter()
        reports = learner.submit(batch(f"timed{r}"))
        jax.block_until_ready(learner.policy_params())
        walls.append(time.perf_counter() - t)
        if len(reports) != 1:
            raise RuntimeError(
                f"learner: expected one step from {groups} groups, received {len(reports)}"
            )
    total, emb = param_counts(lm)
    cfg = lm.config
    n_matmul = (
        total - emb + cfg.vocab_size * cfg.hidden_size
    )  # the head is a matmul, the lookup is not
    T = groups * group_size * L
    flops = 6 * n_matmul * T + 6 * cfg.num_layers * T * (L / 2) * cfg.num_heads * cfg.head_dim
    wall = statistics.median(walls)
    return {
        "groups": groups,
        "group_size": group_size,
        "traj_len": L,
        "micro_batch_size": micro,
        "tokens": T,
        "step_s": wall,
        "step_s_runs": walls,
        "tokens_per_s": T / wall,
        "model_tflops": flops / wall / 1e12,
        "mfu": flops / wall / peak_flops,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 and 256 rows; one learner batch shape")
    ap.add_argument(
        "--dry", action="store_true", help="a CPU rehearsal with a tiny model and tiny sizes"
    )
    ap.add_argument("--shapes", default="smollm2,0p5b", help="comma-separated: smollm2, 0p5b")
    ap.add_argument("--parts", default="decode,learner", help="comma-separated: decode, learner")
    ap.add_argument(
        "--decode-chunks",
        default="16",
        help="comma-separated decode steps per device call, each measured (the best is the figure; "
        "on a TPU v5e 16 doubled the tokens/s of 1 at every size)",
    )
    ap.add_argument(
        "--kv-writes",
        default="scatter,select,chunk",
        help="comma-separated EngineConfig.kv_write ways, each measured with each chunk",
    )
    ap.add_argument(
        "--window-align",
        type=int,
        default=1,
        help="decode cache slots rounded up to a multiple of this (1: the 160 the run needs; 128: "
        "whole TPU lanes)",
    )
    ap.add_argument(
        "--attentions",
        default="dots,elementwise",
        help="comma-separated EngineConfig.decode_attention forms, each measured with each of the above",
    )
    a = ap.parse_args()
    if a.dry:
        import os

        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    from gymllm.utils.host import describe_cpu

    dev = jax.devices()[0]
    if dev.platform == "cpu" and not a.dry:
        raise SystemExit(
            "chip_limits: JAX found no accelerator (only the CPU). Run it on a TPU or GPU machine, "
            "or pass --dry for the CPU rehearsal"
        )
    t0 = time.perf_counter()
    out: dict = {
        "device": dev.device_kind,
        "platform": dev.platform,
        "cpu": describe_cpu(),
        "dry": a.dry,
        "quick": a.quick,
        **limits(a.dry),
    }
    print({k: out[k] for k in ("device", "peak_bf16_tflops", "hbm_gb_s")}, flush=True)
    peak, bw = out["peak_bf16_tflops"] * 1e12, out["hbm_gb_s"] * 1e9
    rows_list = (2, 4) if a.dry else ((64, 256) if a.quick else (64, 256, 512))
    learner_shapes = (
        [(1, 2, 16, 2)]
        if a.dry
        else ([(4, 8, 256, 8)] if a.quick else [(4, 8, 256, 8), (8, 8, 512, 16), (16, 8, 512, 32)])
    )
    parts = set(a.parts.split(","))
    chunks = [int(k) for k in a.decode_chunks.split(",") if k.strip()]
    writes = [w.strip() for w in a.kv_writes.split(",") if w.strip()]
    attentions = [w.strip() for w in a.attentions.split(",") if w.strip()]
    if not chunks or min(chunks) < 1:
        raise SystemExit(
            f"chip_limits --decode-chunks: expected positive integers like 1,16, received "
            f"{a.decode_chunks!r}"
        )
    for shape in a.shapes.split(","):
        lm = model(shape, a.dry)
        total, emb = param_counts(lm)
        weight_bytes = 2 * total  # bf16; the tied table is read once (as the head)
        kvt = kv_bytes_per_token(lm.config)
        out[f"params_{shape}"] = total
        if "decode" in parts:
            for rows in rows_list:
                by_way = {
                    (k, w, at): decode(lm, rows, a.dry, k, w, at, a.window_align)
                    for k in chunks
                    for w in writes
                    for at in attentions
                }
                best = max(by_way, key=lambda kw: by_way[kw]["tok_s"])
                d = by_way[best]
                need = weight_bytes + rows * d["mean_ctx"] * kvt
                bound = rows * bw / need
                for (k, w, at), r in by_way.items():
                    tail = "" if at == "dots" else f"_{at}"
                    out[f"decode_tok_s_{shape}_{rows}_chunk{k}_{w}{tail}"] = r["tok_s"]
                out[f"decode_tok_s_{shape}_{rows}"] = d["tok_s"]
                (
                    out[f"decode_chunk_{shape}_{rows}"],
                    out[f"decode_kv_write_{shape}_{rows}"],
                    out[f"decode_attention_{shape}_{rows}"],
                ) = best
                out[f"hbm_bound_tok_s_{shape}_{rows}"] = bound
                key = (
                    f"decode_vs_hbm_bound_{rows}"
                    if shape == "smollm2"
                    else f"decode_vs_hbm_bound_{shape}_{rows}"
                )
                out[key] = d["tok_s"] / bound
                out[f"kv_read_full_{shape}"] = d["max_len"] / d["mean_ctx"]
                out[f"decode_max_len_{shape}"] = d["max_len"]
                per_chunk = ", ".join(
                    f"chunk {k} {w} {at}: {r['tok_s']:.0f}" for (k, w, at), r in by_way.items()
                )
                print(
                    f"{shape} decode {rows} rows: {d['tok_s']:.0f} tok/s ({per_chunk}), bound "
                    f"{bound:.0f} ({d['tok_s'] / bound:.2f})",
                    flush=True,
                )
        if "learner" in parts:
            runs = []
            for g, m, L, micro in learner_shapes:
                try:
                    r = learner_mfu(lm, g, m, L, micro, peak)
                except Exception as e:  # e.g. out of memory at the largest shape: keep the others
                    r = {
                        "groups": g,
                        "group_size": m,
                        "traj_len": L,
                        "micro_batch_size": micro,
                        "error": f"{type(e).__name__}: {str(e)[:300]}",
                    }
                runs.append(r)
                print(
                    f"{shape} learner {g}x{m}x{L} (micro {micro}): {r.get('step_s', float('nan')):.3f} s, "
                    f"MFU {r.get('mfu', float('nan')):.3f} {r.get('error', '')}",
                    flush=True,
                )
            ok = [r for r in runs if "mfu" in r]
            out[f"learner_runs_{shape}"] = runs
            if ok:
                key = "learner_mfu_smollm2" if shape == "smollm2" else f"learner_mfu_{shape}"
                out[key] = max(r["mfu"] for r in ok)
        del lm
    out["wall_s"] = time.perf_counter() - t0
    from results import emit_result

    emit_result("chip_limits", out, record=not a.dry)


if __name__ == "__main__":
    main()
