"""The streaming learner: complete groups in, one Optax update every ``groups_per_step`` groups.

    learner = StreamingLearner(model_config, flat_params, loss=async_agentic(), optimizer=OptimizerConfig(),
                               config=LearnerConfig(groups_per_step=4, micro_batch_size=8))
    for group in stream:                       # complete groups, in any order
        for report in learner.submit([group]):  # a StepReport after each optimizer update
            engine.update_weights(...)

Rules (see ``grpo-reference.md``):

* Groups are consumed as they arrive, oldest policy version first among those submitted together.
  A group older than ``max_staleness`` versions is dropped and counted (``stale_groups``); a group
  with all-equal rewards is dropped and counted (``filtered_groups``) when the loss asks for it, and
  does not count towards the step (DAPO dynamic sampling). Nothing is dropped silently.
* Rows become fixed-shape micro-batches (``micro_batch_size`` rows, length buckets) as soon as
  enough are ready; each micro-batch's gradient of the *un-normalized* loss sum is added to an
  accumulator. At ``groups_per_step`` groups the step's counts (tokens, sequences, groups) are known:
  the accumulated gradient is divided by the aggregation's denominator and Optax applies the
  update. The update therefore does not depend on how the step was cut into micro-batches (or
  devices), and no update ever waits for a whole rollout batch.
* Log-probabilities are recomputed in float32 with :func:`gymllm.models.token_logprobs` at the
  sampling temperature, by default only where the loss reads them (``loss_positions_only``: the
  transformer runs on every position, the vocab projection and log-softmax on the sampled ones).
  ``kl.beta == 0`` means no reference parameters are kept or run.
* Rows that share a prompt (a GRPO group's samples) run it once (``shared_prefix``,
  :mod:`gymllm.models.shared_prefix`), for the policy and the reference forward alike.
* With LoRA only the adapters are trained (and held in the optimizer state); :meth:`policy_params`
  gives the merged weights for the engine.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
import warnings
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gymllm.algos import advantages as adv_mod
from gymllm.algos import aggregation as agg
from gymllm.models import lora as lora_mod
from gymllm.algos.batching import (Row, buckets, dropped_sampled_tokens, empty_packed, loss_positions,
                                   make_micro_batch, on_loss_positions, pack, pack_rows, packed_row_counts,
                                   pick_bucket, row_from_trajectory, shared_prefix_layout, shared_prefix_table)
from gymllm.algos.config import LossConfig, async_agentic, check_range
from gymllm.algos.kl import kl_reward_penalty
from gymllm.algos.learner_logprobs import build_logprobs, entropy_from_logits  # noqa: F401 (re-exported)
from gymllm.algos.loss import LossBatch, micro_batch_loss, step_denominator
from gymllm.algos.optim import OptimizerConfig, make_optimizer, make_schedule
from gymllm.algos.shaping import nonzero_variance, overlong_penalty
from gymllm.algos.sharding import shard_batch, shard_params
from gymllm.errors import ConfigError, explain
from gymllm.telemetry import counter, increment, span
from gymllm.types import Group
from gymllm.utils.host import resolve_compute_dtype


# XLA CPU options that cut compile time ~3x at a small cost in run time (tiny models, tests).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    """groups_per_step: B groups per optimizer update; micro_batch_size: rows per compiled micro-batch;
    num_steps: optimizer updates of a run; max_len / min_bucket: the length buckets of micro-batches
    (powers of two, each octave cut into ``buckets_per_octave`` steps: less padding, more compiles);
    max_staleness: drop groups more than this many versions old (None = no bound);
    temperature: the sampling temperature (logprobs are of the same tempered distribution);
    compute_entropy: report the policy entropy (costs one pass over the logits);
    fast_compile: compile with XLA's cheap CPU settings (about 3x faster compiles, for tiny models,
    tests and CPU runs; off for real models, where the optimized code matters);
    max_response_len: L_max of the "constant" aggregation (Dr. GRPO), the sampling budget of a
    trajectory (0 = max_len); the trainer sets it to max_tokens * max_turns;
    compute_dtype: None (compute in the weights' dtype) or "bfloat16" / "float16": mixed precision,
    float32 master weights and optimizer state, low-precision matmuls with float32 accumulation
    (``forward(compute_dtype=...)``); log-softmax stays float32. "auto": bfloat16 where bf16 matmuls
    are native, else float32 (:func:`gymllm.utils.host.resolve_compute_dtype`, resolved by the learner);
    packing: run the model on each micro-batch's rows packed end to end into fewer rows of the same
    bucket length (segment ids, positions restarting per sequence; :func:`gymllm.algos.batching.pack_rows`),
    so padding costs no FLOPs; the loss is computed on the padded layout, so the update is the same up to
    float32 summation order; a micro-batch that would not pack into fewer rows runs padded. pack_row_steps:
    the packed row count is rounded up to a multiple of ``ceil(micro_batch_size / pack_row_steps)``, so a
    bucket has at most ``pack_row_steps - 1`` more compiled shapes
    (:meth:`gymllm.algos.learner.StreamingLearner.warmup` compiles them all: about as many more compiles as
    that times the buckets; fewer steps compile less and pad more);
    loss_positions_only: run the LM head (vocab projection, log-softmax, entropy) of the policy and
    reference forwards only on the positions the loss reads, ``min(max_response_len, bucket)`` per row
    (every policy-sampled target, then fillers: :func:`gymllm.algos.batching.loss_positions`), not on
    prompt or observation positions; the hidden states are computed for all positions as before, so
    the loss and gradients are those of the full projection (up to float32 summation order). A
    micro-batch with a row of more sampled tokens than ``max_response_len`` (or a learner with
    ``max_response_len`` 0, or a bucket no longer than it) projects every position (counted:
    ``full_head_micro_batches`` when rows outgrew the budget). None (default): on when the LM head is at
    least :data:`HEAD_SHARE_AUTO` of a position's weight-matmul FLOPs (:func:`head_flops_share`: SmolLM2-135M
    0.21, Qwen2.5-0.5B 0.28; the peers' medium config, vocab 512 at d 128, 0.10, where skipping it measured
    no faster: the gather costs what the smaller projection saves), resolved by the learner;
    shared_prefix: run each micro-batch's rows that share a prompt (the same token ids before the first
    sampled token: single-turn GRPO groups, and multi-turn ones up to their first reply) as one prompt
    forward and S continuations attending to its keys/values
    (:func:`gymllm.models.shared_prefix.shared_prefix_hidden`; the same loss and gradients up to float32
    summation order), when that runs fewer positions than the padded micro-batch (counted:
    ``shared_prefix_micro_batches``); micro-batches then take whole groups, shortest longest-row first, so
    a group's rows stay together (a group split over two micro-batches is a smaller group in each). Padded layout only:
    with ``packing`` too, the layout running fewer positions wins. Its shapes (prompts, samples, prompt
    and continuation lengths rounded up to :func:`gymllm.algos.batching.shared_prefix_table`) compile at
    first use, not in :meth:`StreamingLearner.warmup` (every possible pair would be tens of compiles; a
    run's prompts usually meet one or two). None (default): :data:`SHARED_PREFIX_AUTO`, resolved by the
    learner."""

    groups_per_step: int = 4
    micro_batch_size: int = 8
    num_steps: int = 100
    max_len: int = 512
    min_bucket: int = 32
    buckets_per_octave: int = 1
    max_staleness: int | None = None
    temperature: float = 1.0
    compute_entropy: bool = True
    fast_compile: bool = False
    max_response_len: int = 0
    compute_dtype: str | None = None
    packing: bool = False
    pack_row_steps: int = 8
    loss_positions_only: bool | None = None
    shared_prefix: bool | None = None

    def __post_init__(self) -> None:
        for f in ("groups_per_step", "micro_batch_size", "num_steps", "max_len", "min_bucket", "buckets_per_octave",
                  "pack_row_steps"):
            check_range("LearnerConfig", f, getattr(self, f), lo=1)
        check_range("LearnerConfig", "max_response_len", self.max_response_len, lo=0)
        if self.max_staleness is not None:
            check_range("LearnerConfig", "max_staleness", self.max_staleness, lo=0)
        check_range("LearnerConfig", "temperature", self.temperature, lo=0.0, lo_open=True)
        if self.compute_dtype not in (None, "auto", "bfloat16", "float16", "float32"):
            raise ConfigError(explain("LearnerConfig.compute_dtype",
                                      expected='None, "auto", "bfloat16", "float16" or "float32"',
                                      received=self.compute_dtype, fix='use "bfloat16" for mixed precision'))
        if self.shared_prefix not in (None, True, False):
            raise ConfigError(explain("LearnerConfig.shared_prefix", expected="None (auto), True or False",
                                      received=self.shared_prefix, fix="pass a bool, or None for the default"))
        if self.min_bucket > self.max_len:
            raise ConfigError(explain("LearnerConfig.min_bucket", expected=f"<= max_len ({self.max_len})",
                                      received=self.min_bucket, fix="lower min_bucket or raise max_len"))


SHARED_PREFIX_AUTO = True  # shared_prefix=None: docs/learner-profile.md "The shared-prefix forward"
HEAD_SHARE_AUTO = 0.15  # loss_positions_only=None turns on at this LM-head share of a position's matmul FLOPs


def head_flops_share(model_config: Any) -> float:
    """The LM head's share of one position's weight-matmul FLOPs (attention scores left out)."""
    c = model_config
    e, hd, kd = c.hidden_size, c.num_heads * c.resolved_head_dim, c.num_kv_heads * c.resolved_head_dim
    head = e * c.vocab_size
    return head / (head + c.num_layers * (e * (hd + 2 * kd) + hd * e + 3 * e * c.intermediate_size))


@dataclasses.dataclass
class StepReport:
    """What one optimizer update did (all floats; ``sample_ids`` are the trained trajectory ids)."""

    step: int
    metrics: dict[str, float]
    sample_ids: list[str]


def build_loss_fn(model_config: Any, loss: LossConfig, lcfg: LearnerConfig, lora: lora_mod.LoRAConfig | None):
    """``f(trainable, frozen, arrays, ref_params) -> (loss_sum, metric sums)``: pure, jit-able (arrays:
    see :func:`gymllm.algos.learner_logprobs.build_logprobs`)."""
    logprobs = build_logprobs(model_config, lcfg)

    def params_of(trainable, frozen):
        return lora_mod.merge(lora, frozen, trainable) if lora is not None and lora.enabled else trainable

    def f(trainable, frozen, a, ref_params):
        logp, ent = logprobs(params_of(trainable, frozen), a, lcfg.compute_entropy)  # [B, T] float32
        ref = None
        if ref_params is not None and loss.kl.placement == "loss":
            ref = jax.lax.stop_gradient(logprobs(ref_params, a, False)[0])
        batch = LossBatch(mask=a["mask"], behaviour_logp=a["mu"], advantages=a["advantages"],
                          group_tokens=a["group_tokens"], ref_logp=ref)
        return micro_batch_loss(loss, logp, batch, ent)

    return f


def _programs(model_config: Any, loss: LossConfig, lcfg: LearnerConfig, lora: Any, opt: OptimizerConfig):
    """The jitted (grad-accumulate, apply-update, reference-logprob) programs of one configuration,
    shared by every learner with the same configs (compiled once per shape)."""
    key = LearnerConfig(temperature=lcfg.temperature, compute_entropy=lcfg.compute_entropy, num_steps=lcfg.num_steps,
                        fast_compile=lcfg.fast_compile, compute_dtype=lcfg.compute_dtype)
    return _cached_programs(model_config, loss, key, lora, opt)


@functools.lru_cache(maxsize=32)
def _cached_programs(model_config: Any, loss: LossConfig, lcfg: LearnerConfig, lora: Any, opt: OptimizerConfig):
    logprobs = build_logprobs(model_config, lcfg)
    loss_fn = build_loss_fn(model_config, loss, lcfg, lora)
    tx = make_optimizer(opt, lcfg.num_steps)

    def grad(acc, trainable, frozen, arrays, ref_params):
        # acc (donated) + this micro-batch's gradient; the loss sum and metric sums as one dict
        (total, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, frozen, arrays, ref_params)
        return jax.tree.map(jnp.add, acc, grads), {"loss_sum": total, **metrics}

    def apply(trainable, opt_state, acc, denom):
        # -> new weights, optimizer state, grad norm, and the zeroed accumulator of the next step
        g = jax.tree.map(lambda x: x / denom, acc)
        updates, opt_state = tx.update(g, opt_state, trainable)
        zeros = jax.tree.map(jnp.zeros_like, acc)
        return optax.apply_updates(trainable, updates), opt_state, optax.global_norm(g), zeros

    def ref_logp(ref_params, arrays):
        return logprobs(ref_params, arrays, False)[0]

    jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE if lcfg.fast_compile else None)
    # the accumulator is donated (updated in place); weights are not: the engine may hold them
    return jit(grad, donate_argnums=(0,)), jit(apply, donate_argnums=(2,)), jit(ref_logp), tx


@functools.lru_cache(maxsize=32)
def _advantage_program(estimator: str, ddof: int, eps: float, eps_placement: str):
    """One jitted call per group instead of a dozen eager ops (``rewards [N, G] -> advantages [N, G]``)."""
    fn = adv_mod.ESTIMATORS[estimator]
    return jax.jit(lambda r: fn(r, ddof=ddof, eps=eps, eps_placement=eps_placement))


class StreamingLearner:
    """Barrier-free GRPO learner over flat transformer parameters (see the module docstring)."""

    def __init__(self, model_config: Any, params: dict[str, jax.Array], *, loss: LossConfig | None = None,
                 optimizer: OptimizerConfig | None = None, config: LearnerConfig | None = None,
                 lora: lora_mod.LoRAConfig | None = None, mesh: Any = None, pad_id: int = 0,
                 version: int = 0):
        self.model_config = model_config
        self.loss = loss or async_agentic()
        self.optimizer_config = optimizer or OptimizerConfig()
        cfg = config or LearnerConfig()
        if cfg.compute_dtype == "auto":  # resolved where the learner runs
            cfg = dataclasses.replace(cfg, compute_dtype=resolve_compute_dtype("auto"))
        if cfg.loss_positions_only is None:
            cfg = dataclasses.replace(cfg, loss_positions_only=head_flops_share(model_config) >= HEAD_SHARE_AUTO)
        if cfg.shared_prefix is None:
            cfg = dataclasses.replace(cfg, shared_prefix=SHARED_PREFIX_AUTO)
        self.config = cfg
        self.lora = lora if lora is not None and lora.enabled else None
        self.mesh = mesh
        self.pad_id = pad_id
        self.buckets = buckets(cfg.min_bucket, cfg.max_len, cfg.buckets_per_octave)
        self.prefix_table = shared_prefix_table(cfg.max_len)
        self.devices = devices = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
        q = -(-cfg.micro_batch_size // cfg.pack_row_steps)
        self.pack_quantum = -(-q // devices) * devices  # packed rows come in multiples of this (and of the mesh)
        base = {k: jnp.asarray(v) for k, v in params.items()}
        if self.lora is not None:
            self.frozen = shard_params(mesh, base)
            self.trainable = shard_params(mesh, lora_mod.init_adapters(self.lora, base))
        else:
            self.frozen = None
            self.trainable = shard_params(mesh, base)
        # beta == 0: no reference parameters at all
        self.ref_params = shard_params(mesh, dict(base)) if self.loss.kl.needs_reference else None
        self._grad, self._apply, self._ref_logp, self.tx = _programs(model_config, self.loss, cfg, self.lora,
                                                                    self.optimizer_config)
        a = self.loss.advantage
        self._adv = (None if a.estimator in adv_mod.STATEFUL
                     else _advantage_program(a.estimator, a.ddof, a.eps, a.eps_placement))
        self.role_baselines: dict[str, float] = {}  # role_ema's EMA per role (checkpointed)
        self.schedule = make_schedule(self.optimizer_config, cfg.num_steps)
        self.opt_state = self.tx.init(self.trainable)
        self.version = version  # == optimizer updates applied
        self.counts: collections.Counter = collections.Counter()
        self.consumed_groups: set[str] = set()  # trained + filtered + stale (rollout bookkeeping)
        self._groups_added = 0  # rows' group_index: micro-batches keep a group's rows together (shared_prefix)
        self._reset_step()

    # ------------------------------------------------------------------ public API
    def policy_params(self) -> dict[str, jax.Array]:
        """The full weights of the current policy (LoRA merged) for the engine or a checkpoint."""
        if self.lora is not None:
            return lora_mod.merge(self.lora, self.frozen, self.trainable)
        return self.trainable

    def submit(self, groups: Iterable[Group]) -> list[StepReport]:
        """Consume complete groups (oldest policy version first); returns the updates they completed."""
        reports = []
        for g in sorted(groups, key=lambda g: (g.min_version, g.admitted_version)):
            rep = self._consume(g)
            if rep is not None:
                reports.append(rep)
        return reports

    @property
    def step(self) -> int:
        return self.version

    @property
    def groups_in_step(self) -> int:
        """Groups the current (unfinished) step holds so far (``groups_per_step`` complete it)."""
        return self._step_groups

    def warmup(self, group_size: int | None = None) -> None:
        """Compile every program a step runs now, so no compile lands in the middle of a run: the
        gradient program for every length bucket (an all-padding micro-batch per bucket; its gradient
        is discarded; with packing also every packed row count), the update program (its result discarded:
        weights and optimizer state stay as
        they are), the reference log-prob program when the KL is a reward penalty, and, given
        ``group_size``, the advantage program (one group, and a step's groups for step-global estimators).
        Not the shared-prefix shapes (``LearnerConfig.shared_prefix``): those compile at first use."""
        for length in self.buckets:
            mb = make_micro_batch([], self.config.micro_batch_size, length, self.pad_id)
            a = shard_batch(self.mesh, self._on_loss_positions(mb.arrays(), mb.mask))
            acc = jax.tree.map(jnp.zeros_like, self.trainable)  # donated: not the step's accumulator
            jax.block_until_ready(self._grad(acc, self.trainable, self.frozen, a, self.ref_params))
            for p in packed_row_counts(self.config.micro_batch_size, self.pack_quantum) if self.config.packing else ():
                host = {**{k: v for k, v in mb.arrays().items() if k in ("mask", "mu", "advantages", "group_tokens")},
                        **empty_packed(p, self.config.micro_batch_size, length, self.pad_id)}
                host = self._on_loss_positions(host, mb.mask, host["gather"])
                acc = jax.tree.map(jnp.zeros_like, self.trainable)
                jax.block_until_ready(self._grad(acc, self.trainable, self.frozen, shard_batch(self.mesh, host),
                                                 self.ref_params))
            if self.ref_params is not None and self.loss.kl.placement == "reward":
                jax.block_until_ready(self._ref_logp(self.ref_params, self._ref_arrays(mb)))
        acc = jax.tree.map(jnp.zeros_like, self.trainable)
        jax.block_until_ready(self._apply(self.trainable, self.opt_state, acc, jnp.float32(1.0)))
        if group_size and self._adv is not None:
            rows = (1, self.config.groups_per_step) if self.loss.advantage.estimator in adv_mod.STEP_GLOBAL else (1,)
            for n in rows:  # rewards [n, G]
                jax.block_until_ready(self._advantages(np.zeros((n, group_size), np.float32)))

    # ------------------------------------------------------------------ consumption
    def _reset_step(self, zeros: Any = None) -> None:
        """Start a new step; ``zeros``: the zeroed accumulator the apply program returned (else made here)."""
        self._acc = zeros if zeros is not None else jax.tree.map(jnp.zeros_like, self.trainable)
        self._pending: list[Row] = []
        self._deferred: list[tuple[Group, np.ndarray]] = []  # step-global advantages (batch_std)
        self._step_groups = 0
        self._step_rows: list[Row] = []
        self._step_rewards: list[float] = []
        self._step_lengths: list[int] = []
        self._sums: collections.Counter = collections.Counter()
        self._micro_batches = 0
        self._t_first: float | None = None
        self._busy_s = 0.0

    def _consume(self, group: Group) -> StepReport | None:
        self.counts["groups_in"] += 1
        gid = group.group_id
        lag = self.version - group.min_version
        if self.config.max_staleness is not None and lag > self.config.max_staleness:
            self.counts["stale_groups"] += 1
            self.consumed_groups.add(gid)
            counter("stale_groups", self.counts["stale_groups"], track="trainer")
            return None
        rewards = self._shaped_rewards(group)
        stateful = self.loss.advantage.estimator in adv_mod.STATEFUL  # equal rewards still carry R - b[role]
        if (self.loss.shaping.filter_zero_variance and not group.info.get("kept_zero_variance") and not stateful
                and not bool(nonzero_variance(rewards[None])[0])):
            self.counts["filtered_groups"] += 1
            self.consumed_groups.add(gid)
            counter("filtered_groups", self.counts["filtered_groups"], track="trainer")
            return None
        self.consumed_groups.add(gid)
        self._t_first = self._t_first or time.perf_counter()
        self._step_groups += 1
        self._step_rewards += [float(t.reward) for t in group.trajectories]
        self._step_lengths += [t.num_sampled for t in group.trajectories]
        if self.loss.advantage.estimator in adv_mod.STEP_GLOBAL:
            self._deferred.append((group, rewards))
        elif stateful:  # role_ema: R - b[role] with b read before it takes the group's mean reward (SPIRAL)
            role = str(group.info.get("role") or group.info.get("agent") or "all")
            adv = rewards - np.float32(self.role_baselines.get(role, 0.0))
            _, self.role_baselines = adv_mod.role_ema_advantages([float(rewards.mean())], [role], self.role_baselines,
                                                                 decay=self.loss.advantage.ema_decay)
            self._add_rows(group, adv)
        else:
            self._add_rows(group, np.asarray(self._advantages(rewards[None]))[0])
        if self._step_groups < self.config.groups_per_step:
            return None
        return self._finish_step()

    def _advantages(self, rewards: np.ndarray) -> jnp.ndarray:
        return self._adv(np.asarray(rewards, np.float32))

    def _shaped_rewards(self, group: Group) -> np.ndarray:
        r = group.rewards.astype(np.float32)
        sh = self.loss.shaping
        if sh.overlong_buffer and sh.overlong_max_len:
            lengths = np.array([t.num_sampled for t in group.trajectories])
            r = r + np.asarray(overlong_penalty(lengths, max_len=sh.overlong_max_len, buffer=sh.overlong_buffer))
        if self.ref_params is not None and self.loss.kl.placement == "reward":
            r = r - self._kl_penalty(group)
        return r.astype(np.float32)

    def _kl_penalty(self, group: Group) -> np.ndarray:
        rows = [row_from_trajectory(t, advantage=0.0, group_tokens=1.0, sample_id="", max_len=self.buckets[-1])
                for t in group.trajectories]
        out = []
        for i in range(0, len(rows), self.config.micro_batch_size):
            chunk = rows[i:i + self.config.micro_batch_size]
            mb = make_micro_batch(chunk, self.config.micro_batch_size,
                                  pick_bucket(max(r.length for r in chunk), self.buckets), self.pad_id)
            a = self._ref_arrays(mb, chunk)
            ref = self._ref_logp(self.ref_params, a)
            # the behaviour logprobs stand in for pi_theta's (the sampled policy's) in the k1 estimate
            pen = kl_reward_penalty(a["mu"], ref, a["mask"], beta=self.loss.kl.beta)
            out.append(np.asarray(pen)[:len(chunk)])
        return np.concatenate(out)

    def _add_rows(self, group: Group, advantages: np.ndarray) -> None:
        tokens = float(sum(t.num_sampled for t in group.trajectories))
        for t, a in zip(group.trajectories, advantages):
            sid = t.trajectory_id or f"{group.group_id}/{len(self._step_rows)}"
            r = row_from_trajectory(t, advantage=float(a), group_tokens=tokens, sample_id=sid, max_len=self.buckets[-1],
                                    group_index=self._groups_added)
            if len(t.token_ids) - 1 > r.length:  # a truncated episode's last observation ran past max_len: cut
                increment("rows_truncated", 1, track="trainer")
                increment("sampled_tokens_truncated", dropped_sampled_tokens(t, r.length), track="trainer")
            self._pending.append(r)
            self._step_rows.append(r)
        self._groups_added += 1
        while len(self._pending) >= self.config.micro_batch_size:
            chunk = self._ordered(self._pending)[: self.config.micro_batch_size]
            ids = {id(r) for r in chunk}
            self._pending = [r for r in self._pending if id(r) not in ids]
            self._run_micro_batch(chunk)

    def _ordered(self, rows: list[Row]) -> list[Row]:
        """Rows in the order micro-batches take them: shortest first (less padding); with shared prefix
        whole groups (by their longest row) so that a group's rows share a micro-batch."""
        if not self.config.shared_prefix:
            return sorted(rows, key=lambda r: r.length)
        longest: dict[int, int] = {}
        for r in rows:
            longest[r.group_index] = max(longest.get(r.group_index, 0), r.length)
        return sorted(rows, key=lambda r: (longest[r.group_index], r.group_index))

    def _on_loss_positions(self, host: dict[str, np.ndarray], mask: np.ndarray,
                           gather: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """``host`` arrays for the LM head on the loss positions only (``loss_positions_only``), or as
        they are (every position) when that saves nothing or a row outgrew the budget (counted)."""
        budget = self.config.max_response_len
        if not self.config.loss_positions_only or not budget or budget >= mask.shape[1]:
            return host
        sel = loss_positions(mask, budget, gather)
        if sel is None:
            self.counts["full_head_micro_batches"] += 1  # a row sampled more tokens than the budget
            return host
        return on_loss_positions(host, sel)

    def _ref_arrays(self, mb, rows: list[Row] = ()) -> dict[str, Any]:
        """The reward-placement reference forward's arrays (and the ``mu`` / ``mask`` its penalty reads)."""
        host = {k: getattr(mb, k) for k in ("tokens", "positions", "targets", "mask", "mu")}
        sp = self._shared_prefix(rows, mb.shape)
        if sp is not None:
            host = {"mask": host["mask"], "mu": host["mu"], **sp}
            self.counts["shared_prefix_reference_batches"] += 1
        return shard_batch(self.mesh, self._on_loss_positions(host, mb.mask, None if sp is None else sp["sp_gather"]))

    def _shared_prefix(self, rows: list[Row], shape: tuple[int, int], fewer_than: int | None = None
                       ) -> dict[str, np.ndarray] | None:
        """The shared-prefix layout of ``rows`` when on and it runs fewer positions (than ``fewer_than``), and
        its prompts split evenly over the mesh's devices (as the micro-batch's rows do)."""
        sp = (shared_prefix_layout(rows, *shape, self.prefix_table, self.pad_id, fewer_than)
              if self.config.shared_prefix and rows else None)
        return None if sp is None or sp["sp_prefix_tokens"].shape[0] % self.devices else sp

    def _run_micro_batch(self, rows: list[Row]) -> None:
        mb = make_micro_batch(rows, self.config.micro_batch_size,
                              pick_bucket(max(r.length for r in rows), self.buckets), self.pad_id)
        t = time.perf_counter()
        valid = mb.mask > 0
        lag = (self.version - mb.versions)[valid]
        lags, counts = np.unique(lag, return_counts=True)
        with span("micro_batch", track="trainer", rows=len(rows), length=mb.shape[1], step=self.version + 1) as tags:
            host = mb.arrays()
            packed = (pack_rows(rows, mb.shape[0], mb.shape[1], self.pack_quantum, self.pad_id)
                      if self.config.packing else None)
            sp = self._shared_prefix(rows, mb.shape, None if packed is None else packed["packed_tokens"].size)
            gather = None
            if sp is not None:  # each shared prompt runs once; the loss reads the padded layout
                host = {**{k: host[k] for k in ("mask", "mu", "advantages", "group_tokens")}, **sp}
                tags["shared_prefixes"] = sp["sp_prefix_tokens"].shape[0]
                self.counts["shared_prefix_micro_batches"] += 1
                gather = sp["sp_gather"]
            elif packed is not None:  # the model runs on the packed rows; the loss reads the padded layout
                host = {**{k: host[k] for k in ("mask", "mu", "advantages", "group_tokens")}, **packed}
                tags["packed_rows"] = packed["packed_tokens"].shape[0]
                self.counts["packed_micro_batches"] += 1
                gather = packed["gather"]
            host = self._on_loss_positions(host, mb.mask, gather)
            tags["head_positions"] = host["mask"].shape[1]  # per row
            arrays = shard_batch(self.mesh, host)
            self._acc, sums = self._grad(self._acc, self.trainable, self.frozen, arrays, self.ref_params)
            for k, v in jax.device_get(sums).items():  # one device->host copy (and wait) per micro-batch
                self._sums[k] += float(v)
            tags["tokens"] = int(valid.sum())
            tags["staleness"] = {int(a): int(c) for a, c in zip(lags, counts)}
        self._busy_s += time.perf_counter() - t
        self._sums["staleness_sum"] += float(lag.sum())
        self._sums["staleness_max"] = max(self._sums["staleness_max"], float(lag.max()) if lag.size else 0.0)
        self._micro_batches += 1

    def _finish_step(self) -> StepReport:
        t = time.perf_counter()
        with span("train_step", track="trainer", step=self.version + 1, groups=self._step_groups):
            if self._deferred:
                all_r = np.stack([r for _, r in self._deferred])
                adv = np.asarray(self._advantages(all_r))
                for (g, _), a in zip(self._deferred, adv):
                    self._add_rows(g, a)
            if self._pending:
                for mb_rows in _chunks(self._ordered(self._pending), self.config.micro_batch_size):
                    self._run_micro_batch(mb_rows)
                self._pending = []
            stats = agg.StepStats(num_tokens=float(sum(r.mask.sum() for r in self._step_rows)),
                                  num_seqs=float(len(self._step_rows)), num_groups=float(self._step_groups),
                                  max_len=float(self.config.max_response_len or self.config.max_len))
            denom = float(step_denominator(self.loss, stats))
            lr = float(self.schedule(self.version))
            self.trainable, self.opt_state, gnorm, zeros = self._apply(self.trainable, self.opt_state, self._acc,
                                                                       jnp.float32(denom))
            gnorm = float(gnorm)
        self._busy_s += time.perf_counter() - t
        self.version += 1
        self.counts["steps"] += 1
        self.counts["groups_trained"] += self._step_groups
        self.counts["rows_trained"] += len(self._step_rows)
        report = StepReport(step=self.version, metrics=self._metrics(stats, denom, gnorm, lr),
                            sample_ids=[r.sample_id for r in self._step_rows])
        counter("policy_version", self.version, track="trainer")
        self._reset_step(zeros)
        return report

    def _metrics(self, stats: agg.StepStats, denom: float, gnorm: float, lr: float) -> dict[str, float]:
        s, tok = self._sums, max(stats.num_tokens, 1.0)
        rewards = np.asarray(self._step_rewards, np.float64)
        lengths = np.asarray(self._step_lengths, np.float64)
        return {
            "loss": s["loss_sum"] / denom, "grad_norm": gnorm, "learning_rate": lr,
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "reward_max": float(rewards.max()), "clip_fraction": s["clipped_tokens"] / tok,
            "kl": s["kl_sum"] / tok, "entropy": s["entropy_sum"] / tok, "ratio_mean": s["ratio_sum"] / tok,
            "is_weight_mean": s["weight_sum"] / tok, "masked_token_fraction": s["zero_weight_tokens"] / tok,
            "mismatch_abs_logprob": s["mismatch_abs_sum"] / tok,
            "staleness_mean": s["staleness_sum"] / tok, "staleness_max": s["staleness_max"],
            "response_len_mean": float(lengths.mean()), "response_len_max": float(lengths.max()),
            "tokens": stats.num_tokens, "sequences": stats.num_seqs, "groups": stats.num_groups,
            "micro_batches": float(self._micro_batches), "train_busy_s": self._busy_s,
            "filtered_groups": float(self.counts["filtered_groups"]), "stale_groups": float(self.counts["stale_groups"]),
        }

    # ------------------------------------------------------------------ checkpoint state
    def state(self) -> dict[str, Any]:
        """Everything a checkpoint needs to resume exactly (arrays + JSON-able bookkeeping)."""
        return {"trainable": self.trainable, "opt_state": self.opt_state}

    def bookkeeping(self) -> dict[str, Any]:
        return {"version": self.version, "counts": dict(self.counts), "consumed_groups": sorted(self.consumed_groups),
                "role_baselines": dict(self.role_baselines)}

    def restore(self, state: dict[str, Any], bookkeeping: dict[str, Any]) -> None:
        self.trainable = shard_params(self.mesh, state["trainable"])
        self.opt_state = state["opt_state"]
        self.version = int(bookkeeping["version"])
        self.counts = collections.Counter(bookkeeping.get("counts", {}))
        self.consumed_groups = set(bookkeeping.get("consumed_groups", []))
        self.role_baselines = {str(k): float(v) for k, v in bookkeeping.get("role_baselines", {}).items()}
        self._reset_step()


def _chunks(rows: list[Row], n: int) -> list[list[Row]]:
    return [rows[i:i + n] for i in range(0, len(rows), n)]
