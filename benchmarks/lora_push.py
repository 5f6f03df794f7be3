"""Benchmark a LoRA weight push: merged full weights vs adapters only.

The learner's arrays live on a 2-device (fsdp) mesh of host CPU devices, as in a sharded trainer
run, and the engine (a real :class:`JaxEngine`) on device 0, so a push really moves its bytes.
Side by side in one process, best of ``reps``:

* ``merged``: what the trainer pushed before adapter-only pushes: the learner merges
  ``W + s A @ B`` and the full weights are gathered to the engine's device and handed over;
* ``adapters``: :class:`~gymllm.algos.lora_push.AdapterPusher`: only the adapter arrays are
  gathered; the engine merges them on its device (jitted) and swaps;
* ``trainer_adapters``: what the trainer does now (``WeightPusher.push(learner.policy_params())``
  with the adapter hook): as ``adapters`` plus the learner-side merge that ``policy_params()`` still
  computes (the 3-line trainer change in the report would drop it);
* ``host_copy_*``: serializing each payload to bytes on the host, the floor of a push to another
  process (before any network).

Every push is timed until the engine's new arrays are ready. Model: SmolLM2-135M's shape
(30 layers, d 576, random weights) or, with ``--quick``, 8 of its layers and a 8k vocabulary;
LoRA rank 8 on wq and wv. Ends with ``RESULT {json}``: ``adapter_bytes``, ``merged_bytes``,
``push_s_adapters``, ``push_s_merged`` (+ the others above).

    python benchmarks/lora_push.py [--quick] [--rank 8] [--targets wq,wv]
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from gymllm.models.lora import LoRAConfig, init_adapters, merge, nbytes  # noqa: E402
from gymllm.algos.lora_push import AdapterPusher  # noqa: E402
from gymllm.algos.sharding import ShardingConfig, make_mesh, shard_params  # noqa: E402
from gymllm.algos.weight_sync import WeightPusher  # noqa: E402
from gymllm.inference import JaxEngine  # noqa: E402
from gymllm.inference.config import EngineConfig  # noqa: E402
from gymllm.models import make_tiny  # noqa: E402

SMOLLM2 = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
)


class ReadyEngine(JaxEngine):
    """A JaxEngine whose update_weights returns once the handed-over arrays are computed."""

    def update_weights(self, state, version):
        jax.block_until_ready(state)
        super().update_weights(state, version)


def best(fn, reps: int) -> float:
    fn()  # compile / first transfer
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def to_wire(flat: dict) -> int:
    """Serialize every array to bytes (device -> host copy), as a push to another process must."""
    return sum(len(np.asarray(v).tobytes()) for v in flat.values())


def trained(adapters: dict, rng: np.random.Generator) -> dict:
    return {
        k: (v + 0.01 * rng.standard_normal(v.shape).astype(np.float32)) for k, v in adapters.items()
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 layers, 8k vocabulary, 3 repetitions")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--targets", default="wq,wv")
    args = ap.parse_args(argv)
    sizes = dict(SMOLLM2, num_layers=8, vocab_size=8192) if args.quick else SMOLLM2
    reps = 3 if args.quick else 7
    lm = make_tiny("llama", **sizes)
    lora = LoRAConfig(rank=args.rank, targets=tuple(args.targets.split(",")))
    mesh = make_mesh(ShardingConfig(fsdp=2))
    base = lm.model.flat_params()
    frozen = shard_params(mesh, base)
    adapters = shard_params(mesh, trained(init_adapters(lora, base), np.random.default_rng(0)))
    engine = ReadyEngine(
        lm.model, None, config=EngineConfig(num_slots=2, max_len=32, min_bucket=32)
    )
    version = iter(range(1, 10_000))
    try:
        full = WeightPusher(engine, lm.config, gather=True)
        merged_s = best(lambda: full.push(dict(merge(lora, frozen, adapters)), next(version)), reps)
        ad = AdapterPusher(engine, lm.config, base, lora)
        adapters_s = best(lambda: ad.push(adapters, next(version)), reps)
        trainer_s = best(lambda: full.push(merge(lora, frozen, adapters), next(version)), reps)
    finally:
        engine.shutdown()
    merged_flat = merge(lora, frozen, adapters)
    host_merged = best(lambda: to_wire(merged_flat), reps)
    host_adapters = best(lambda: to_wire(adapters), reps)
    result = {
        "adapter_bytes": nbytes(adapters),
        "merged_bytes": nbytes(merged_flat),
        "push_s_adapters": round(adapters_s, 5),
        "push_s_merged": round(merged_s, 5),
        "merged_over_adapters_s": round(merged_s / adapters_s, 2),
        "push_s_trainer_adapters": round(trainer_s, 5),
        "host_copy_s_adapters": round(host_adapters, 5),
        "host_copy_s_merged": round(host_merged, 5),
        "model": "smollm2-135m shape (random)" + (", 8 layers, 8k vocab" if args.quick else ""),
        "params": int(sum(np.prod(v.shape) for v in base.values())),
        "rank": lora.rank,
        "targets": list(lora.targets),
        "reps": reps,
        "quick": args.quick,
    }
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("lora_push", result)
    return result


if __name__ == "__main__":
    main()
