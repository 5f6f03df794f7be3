"""The SFT loss and learner: masked next-token cross-entropy on the GRPO learner's machinery.

* :func:`masked_nll` / :func:`sft_loss`: pure, Optax-style (``logits [B, T, V]``, ``targets [B, T]``,
  ``mask [B, T]`` -> a scalar): the mean token cross-entropy over the masked (assistant) tokens only.
* :class:`SFTLearner`: rows -> fixed-shape micro-batches (the learner's length buckets,
  :func:`gymllm.algos.batching.make_micro_batch`); each micro-batch's gradient of the *summed*
  token loss is accumulated, then divided by the step's trained-token count and applied with the
  learner's Optax optimizer (:func:`gymllm.algos.optim.make_optimizer`), so an update does not depend
  on how the step was cut into micro-batches. Mixed precision (``forward(compute_dtype=...)``, float32
  log-softmax and master weights), LoRA (only adapters train; :func:`gymllm.models.lora.merge`) and
  sharding (:mod:`gymllm.algos.sharding`) are the learner's. Its checkpoint state has the
  :class:`~gymllm.algos.learner.StreamingLearner`'s layout (``{"trainable", "opt_state"}``), so
  :class:`~gymllm.algos.checkpoint.Checkpointer` saves / resumes it and
  :func:`~gymllm.models.trained.apply_trained` reads an SFT run directory like a GRPO one.
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gymllm.models import lora as lora_mod
from gymllm.algos.batching import Row, buckets, make_micro_batch, pick_bucket
from gymllm.algos.learner_programs import FAST_COMPILE
from gymllm.algos.optim import OptimizerConfig, make_optimizer, make_schedule
from gymllm.algos.sharding import shard_batch, shard_params
from gymllm.telemetry import counter, span
from gymllm.utils.host import resolve_compute_dtype

__all__ = ["masked_nll", "sft_loss", "sft_row", "SFTLearner"]


def masked_nll(logp: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``logp [B, T]`` (log-probabilities of the targets), ``mask [B, T]`` -> (sum of ``-logp`` over the
    masked tokens, number of masked tokens), both float32 scalars."""
    m = mask.astype(jnp.float32)
    return -jnp.sum(logp.astype(jnp.float32) * m), jnp.sum(m)


def sft_loss(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean token cross-entropy of ``targets [B, T]`` under ``logits [B, T, V]`` over ``mask [B, T]``
    (0 where nothing is masked)."""
    from gymllm.models.logprobs import token_logprobs

    total, count = masked_nll(token_logprobs(logits, targets, 1.0), mask)
    return total / jnp.maximum(count, 1.0)


def sft_row(token_ids: np.ndarray, loss_mask: np.ndarray, sample_id: str = "") -> Row:
    """A learner row (next-token shifted: inputs ``ids[:-1]``, targets and mask ``[1:]``) of an SFT row."""
    ids = np.asarray(token_ids, np.int32)
    n = len(ids) - 1
    return Row(
        inputs=ids[:-1],
        targets=ids[1:],
        mask=np.asarray(loss_mask[1:], np.float32),
        mu=np.zeros(n, np.float32),
        versions=np.zeros(n, np.int32),
        advantage=0.0,
        group_tokens=1.0,
        sample_id=sample_id,
    )


@functools.lru_cache(maxsize=16)
def _programs(
    model_config: Any,
    lora: Any,
    opt: OptimizerConfig,
    num_steps: int,
    compute_dtype: str | None,
    fast_compile: bool,
):
    from gymllm.models.logprobs import token_logprobs
    from gymllm.models.transformer import forward

    tx = make_optimizer(opt, num_steps)

    def loss_fn(trainable, frozen, a):
        params = lora_mod.merge(lora, frozen, trainable) if lora is not None else trainable
        logits, _ = forward(
            model_config, params, a["tokens"], a["positions"], compute_dtype=compute_dtype
        )
        total, count = masked_nll(token_logprobs(logits, a["targets"], 1.0), a["mask"])
        correct = jnp.sum((jnp.argmax(logits, axis=-1) == a["targets"]) * a["mask"])
        return total, {"tokens": count, "correct": correct}

    def grad(acc, trainable, frozen, arrays):
        (total, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(trainable, frozen, arrays)
        return jax.tree.map(jnp.add, acc, g), {"loss_sum": total, **aux}

    def apply(trainable, opt_state, acc, denom):
        g = jax.tree.map(lambda x: x / denom, acc)
        updates, opt_state = tx.update(g, opt_state, trainable)
        return (
            optax.apply_updates(trainable, updates),
            opt_state,
            optax.global_norm(g),
            jax.tree.map(jnp.zeros_like, acc),
        )

    jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE if fast_compile else None)
    return jit(grad, donate_argnums=(0,)), jit(apply, donate_argnums=(2,)), tx


class SFTLearner:
    """Masked cross-entropy updates over flat transformer parameters (see the module docstring).

    ``step_rows(rows)`` runs one optimizer update on a step's rows and returns its metrics;
    ``state()`` / ``bookkeeping()`` / ``restore()`` are what :class:`~gymllm.algos.checkpoint.Checkpointer`
    needs; ``policy_params()`` gives the full (LoRA-merged) weights."""

    def __init__(
        self,
        model_config: Any,
        params: dict[str, jax.Array],
        *,
        optimizer: OptimizerConfig,
        num_steps: int,
        micro_batch_size: int = 8,
        max_len: int = 512,
        min_bucket: int = 32,
        buckets_per_octave: int = 1,
        compute_dtype: str | None = None,
        fast_compile: bool = False,
        lora: lora_mod.LoRAConfig | None = None,
        mesh: Any = None,
        pad_id: int = 0,
    ):
        self.model_config, self.mesh, self.pad_id = model_config, mesh, pad_id
        self.micro_batch_size = micro_batch_size
        self.lora = lora if lora is not None and lora.enabled else None
        self.buckets = buckets(min(min_bucket, max_len), max_len, buckets_per_octave)
        base = {k: jnp.asarray(v) for k, v in params.items()}
        if self.lora is not None:
            self.frozen = shard_params(mesh, base)
            self.trainable = shard_params(mesh, lora_mod.init_adapters(self.lora, base))
        else:
            self.frozen, self.trainable = None, shard_params(mesh, base)
        self.compute_dtype = resolve_compute_dtype(
            compute_dtype
        )  # "auto": resolved where the learner runs
        self._grad, self._apply, self.tx = _programs(
            model_config, self.lora, optimizer, num_steps, self.compute_dtype, fast_compile
        )
        self.schedule = make_schedule(optimizer, num_steps)
        self.opt_state = self.tx.init(self.trainable)
        self.version = 0
        self.counts: collections.Counter = collections.Counter()

    def policy_params(self) -> dict[str, jax.Array]:
        return (
            lora_mod.merge(self.lora, self.frozen, self.trainable)
            if self.lora is not None
            else self.trainable
        )

    def step_rows(self, rows: Sequence[Row]) -> dict[str, float]:
        """One optimizer update on ``rows`` (micro-batches of ``micro_batch_size`` rows, shortest first)."""
        t0 = time.perf_counter()
        acc = jax.tree.map(jnp.zeros_like, self.trainable)
        sums: collections.Counter = collections.Counter()
        ordered = sorted(rows, key=lambda r: r.length)
        n_mb = 0
        with span("sft_step", track="trainer", step=self.version + 1, rows=len(rows)):
            for i in range(0, len(ordered), self.micro_batch_size):
                chunk = ordered[i : i + self.micro_batch_size]
                length = pick_bucket(max(r.length for r in chunk), self.buckets)
                mb = make_micro_batch(chunk, self.micro_batch_size, length, self.pad_id)
                with span(
                    "micro_batch",
                    track="trainer",
                    rows=len(chunk),
                    length=length,
                    step=self.version + 1,
                ):
                    a = shard_batch(
                        self.mesh,
                        {
                            k: v
                            for k, v in mb.arrays().items()
                            if k in ("tokens", "positions", "targets", "mask")
                        },
                    )
                    acc, out = self._grad(acc, self.trainable, self.frozen, a)
                    for k, v in jax.device_get(out).items():
                        sums[k] += float(v)
                n_mb += 1
            tokens = max(sums["tokens"], 1.0)
            lr = float(self.schedule(self.version))
            self.trainable, self.opt_state, gnorm, _ = self._apply(
                self.trainable, self.opt_state, acc, jnp.float32(tokens)
            )
            gnorm = float(gnorm)
        self.version += 1
        self.counts["steps"] += 1
        self.counts["rows_trained"] += len(rows)
        self.counts["tokens_trained"] += int(sums["tokens"])
        counter("policy_version", self.version, track="trainer")
        wall = time.perf_counter() - t0
        return {
            "loss": sums["loss_sum"] / tokens,
            "token_accuracy": sums["correct"] / tokens,
            "grad_norm": gnorm,
            "learning_rate": lr,
            "tokens": sums["tokens"],
            "sequences": float(len(rows)),
            "micro_batches": float(n_mb),
            "step_wall_s": wall,
            "tokens_per_s": sums["tokens"] / max(wall, 1e-9),
        }

    # ------------------------------------------------------------------ checkpoint state
    def state(self) -> dict[str, Any]:
        return {"trainable": self.trainable, "opt_state": self.opt_state}

    def bookkeeping(self) -> dict[str, Any]:
        return {"version": self.version, "counts": dict(self.counts), "consumed_groups": []}

    def restore(self, state: dict[str, Any], bookkeeping: dict[str, Any]) -> None:
        self.trainable = shard_params(self.mesh, state["trainable"])
        self.opt_state = state["opt_state"]
        self.version = int(bookkeeping["version"])
        self.counts = collections.Counter(bookkeeping.get("counts", {}))
