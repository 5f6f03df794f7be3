"""The learner's jitted programs: the gradient-accumulate step, the optimizer update, the reference
log-prob forward and the per-group advantages, for :class:`gymllm.algos.learner.StreamingLearner`.

Programs are built once per configuration and shared by every learner with equal configs (so a
program compiled for one shape is compiled once per process). :data:`TRACES` counts how often JAX
traced each program: a trace is a new input shape (or a first call), and with
``LearnerConfig.fixed_shapes`` a test can assert that nothing is traced after
:meth:`~gymllm.algos.learner.StreamingLearner.warmup`.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from gymllm.algos import advantages as adv_mod
from gymllm.algos.config import LossConfig
from gymllm.algos.learner_logprobs import build_logprobs
from gymllm.algos.loss import LossBatch, micro_batch_loss
from gymllm.algos.optim import OptimizerConfig, make_optimizer
from gymllm.models import lora as lora_mod

__all__ = ["FAST_COMPILE", "TRACES", "advantage_program", "build_loss_fn", "programs"]

# XLA CPU options that cut compile time ~3x at a small cost in run time (tiny models, tests).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
TRACES: collections.Counter = (
    collections.Counter()
)  # "grad" / "apply" / "ref_logp" -> traces so far


def build_loss_fn(
    model_config: Any,
    loss: LossConfig,
    lcfg: Any,
    lora: lora_mod.LoRAConfig | None,
    temperature: float = 1.0,
):
    """``f(trainable, frozen, arrays, ref_params) -> (loss_sum, metric sums)``: pure, jit-able (arrays:
    see :func:`gymllm.algos.learner_logprobs.build_logprobs`; ``lcfg``: a
    :class:`~gymllm.algos.learner_config.LearnerConfig`)."""
    logprobs = build_logprobs(model_config, lcfg, temperature)

    def params_of(trainable, frozen):
        return (
            lora_mod.merge(lora, frozen, trainable)
            if lora is not None and lora.enabled
            else trainable
        )

    def f(trainable, frozen, a, ref_params):
        logp, ent = logprobs(
            params_of(trainable, frozen), a, lcfg.compute_entropy
        )  # [B, T] float32
        ref = None
        if ref_params is not None and loss.kl.placement == "loss":
            ref = jax.lax.stop_gradient(logprobs(ref_params, a, False)[0])
        batch = LossBatch(
            mask=a["mask"],
            behaviour_logp=a["mu"],
            advantages=a["advantages"],
            group_tokens=a["group_tokens"],
            ref_logp=ref,
        )
        return micro_batch_loss(loss, logp, batch, ent)

    return f


def programs(
    model_config: Any,
    loss: LossConfig,
    lcfg: Any,
    lora: Any,
    opt: OptimizerConfig,
    temperature: float = 1.0,
):
    """The jitted ``(grad, apply, ref_logp)`` programs and the Optax transform of one configuration
    (``lcfg``: a :class:`~gymllm.algos.learner_config.LearnerConfig`; only the fields the programs read key
    the cache). ``grad(acc, trainable, frozen, arrays, ref_params) -> (acc + gradient, sums)`` (the
    accumulator donated); ``apply(trainable, opt_state, acc, denom) -> (trainable, opt_state, grad norm,
    zeroed accumulator)`` (the accumulator donated; weights are not: the engine may hold them);
    ``ref_logp(ref_params, arrays) -> logp``."""
    key = (temperature, lcfg.compute_entropy, lcfg.num_steps, lcfg.fast_compile, lcfg.compute_dtype)
    return _cached_programs(model_config, loss, type(lcfg), key, lora, opt)


@functools.lru_cache(maxsize=32)
def _cached_programs(
    model_config: Any,
    loss: LossConfig,
    config_type: type,
    key: tuple,
    lora: Any,
    opt: OptimizerConfig,
):
    temperature, compute_entropy, num_steps, fast_compile, compute_dtype = key
    lcfg = config_type(
        compute_entropy=compute_entropy,
        num_steps=num_steps,
        fast_compile=fast_compile,
        compute_dtype=compute_dtype,
    )
    logprobs = build_logprobs(model_config, lcfg, temperature)
    loss_fn = build_loss_fn(model_config, loss, lcfg, lora, temperature)
    tx = make_optimizer(opt, lcfg.num_steps)

    def grad(acc, trainable, frozen, arrays, ref_params):
        TRACES["grad"] += 1  # runs when JAX traces, not per call
        (total, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            trainable, frozen, arrays, ref_params
        )
        return jax.tree.map(jnp.add, acc, grads), {"loss_sum": total, **metrics}

    def apply(trainable, opt_state, acc, denom):
        TRACES["apply"] += 1
        g = jax.tree.map(lambda x: x / denom, acc)
        updates, opt_state = tx.update(g, opt_state, trainable)
        zeros = jax.tree.map(jnp.zeros_like, acc)
        return optax.apply_updates(trainable, updates), opt_state, optax.global_norm(g), zeros

    def ref_logp(ref_params, arrays):
        TRACES["ref_logp"] += 1
        return logprobs(ref_params, arrays, False)[0]

    jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE if lcfg.fast_compile else None)
    return jit(grad, donate_argnums=(0,)), jit(apply, donate_argnums=(2,)), jit(ref_logp), tx


@functools.lru_cache(maxsize=32)
def advantage_program(estimator: str, ddof: int, eps: float, eps_placement: str):
    """One jitted call per group instead of a dozen eager ops (``rewards [N, G] -> advantages [N, G]``)."""
    fn = adv_mod.ESTIMATORS[estimator]
    return jax.jit(lambda r: fn(r, ddof=ddof, eps=eps, eps_placement=eps_placement))
