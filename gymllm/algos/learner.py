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
* With ``fixed_shapes`` the programs are fixed when the learner is built (:meth:`StreamingLearner.program_shapes`:
  one gradient program, the update, a reference forward only for a reward-placement KL) and
  :meth:`StreamingLearner.warmup` compiles exactly those ahead of time (in a thread with ``background=True``).
* With LoRA only the adapters are trained (and held in the optimizer state); :meth:`policy_params`
  gives the merged weights for the engine.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import warnings
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from gymllm.algos import advantages as adv_mod
from gymllm.algos import aggregation as agg
from gymllm.models import lora as lora_mod
from gymllm.algos.batching import (Row, buckets, cap_sampled, dropped_sampled_tokens, empty_packed,
                                   fixed_prefix_arrays, fixed_prefix_rows, fixed_prefix_slots, loss_positions,
                                   make_micro_batch, on_loss_positions, pack_rows, packed_row_counts, pick_bucket,
                                   row_from_trajectory, shared_prefix_layout, shared_prefix_table)
from gymllm.algos.config import LossConfig, async_agentic
from gymllm.algos.kl import kl_reward_penalty
from gymllm.algos.learner_config import (HEAD_SHARE_AUTO, SHARED_PREFIX_AUTO, LearnerConfig,
                                         head_flops_share)
from gymllm.algos.learner_programs import advantage_program, programs
from gymllm.algos.loss import step_denominator
from gymllm.algos.optim import OptimizerConfig, make_schedule
from gymllm.algos.shaping import overlong_penalty
from gymllm.algos.sharding import shard_batch, shard_params
from gymllm.errors import ConfigError, explain
from gymllm.multiagent.baseline import role_ema_advantages
from gymllm.telemetry import counter, increment, span
from gymllm.types import Group
from gymllm.utils.host import resolve_compute_dtype
from gymllm.validation import check_range


warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


@dataclasses.dataclass
class StepReport:
    """What one optimizer update did (all floats; ``sample_ids`` are the trained trajectory ids)."""

    step: int
    metrics: dict[str, float]
    sample_ids: list[str]


class StreamingLearner:
    """Barrier-free GRPO learner over flat transformer parameters (see the module docstring)."""

    def __init__(self, model_config: Any, params: dict[str, jax.Array], *, loss: LossConfig | None = None,
                 optimizer: OptimizerConfig | None = None, config: LearnerConfig | None = None,
                 lora: lora_mod.LoRAConfig | None = None, mesh: Any = None, pad_id: int = 0,
                 version: int = 0, temperature: float = 1.0, sample_budget: int = 0, context_len: int = 0,
                 default_staleness: int | None = None):
        """``temperature``: the sampler's (logprobs are of the tempered distribution sampled; > 0).
        ``sample_budget``: the tokens a trajectory may sample (the sampler's ``max_tokens`` times the model
        calls): ``max_response_len`` when the config leaves it 0, and the overlong shaping's ``max_len``
        when the loss leaves it 0. ``context_len``: the engine's context; the longest bucket is at least it
        (a trajectory never outgrows it). ``default_staleness``: the bound when ``max_staleness`` is None
        (a run passes its group source's). The trainer wires them from the run's sections
        (:func:`gymllm.train.wiring.learner_kwargs`)."""
        check_range("StreamingLearner", "temperature", temperature, lo=0.0, lo_open=True)
        self.model_config = model_config
        self.temperature = float(temperature)
        loss = loss or async_agentic()
        if loss.shaping.overlong_buffer and not loss.shaping.overlong_max_len and sample_budget:
            loss = dataclasses.replace(loss, shaping=dataclasses.replace(loss.shaping, overlong_max_len=sample_budget))
        self.loss = loss
        self.optimizer_config = optimizer or OptimizerConfig()
        cfg = config or LearnerConfig()
        cfg = dataclasses.replace(cfg, max_len=max(cfg.max_len, context_len),
                                  max_response_len=cfg.max_response_len or sample_budget,
                                  max_staleness=cfg.max_staleness if cfg.max_staleness is not None else default_staleness)
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
        self.buckets = (cfg.max_len,) if cfg.fixed_shapes else buckets(cfg.min_bucket, cfg.max_len,
                                                                       cfg.buckets_per_octave)
        self.prefix_table = shared_prefix_table(cfg.max_len)
        self.devices = devices = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
        self.prefix_len = cfg.prefix_len or cfg.max_len // 2  # the fixed layout's (fixed_shapes)
        self.prefix_slots = -(-cfg.prefix_slots // devices) * devices
        self._warm_thread: threading.Thread | None = None
        self._warm_error: BaseException | None = None
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
        self._grad, self._apply, self._ref_logp, self.tx = programs(model_config, self.loss, cfg, self.lora,
                                                                   self.optimizer_config, self.temperature)
        a = self.loss.advantage
        self._adv = (None if a.estimator in adv_mod.STATEFUL
                     else advantage_program(a.estimator, a.ddof, a.eps, a.eps_placement))
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

    def program_shapes(self) -> list[tuple[str, dict[str, tuple[tuple[int, ...], str]] | None]]:
        """The programs taking the model's weights that this learner runs (``fixed_shapes``), each as
        ``(name, {array: (shape, dtype)})`` of the micro-batch arrays it is compiled for (None: the update,
        whose inputs are the weights, optimizer state and accumulator): ``grad``, ``apply``, and ``ref_logp``
        where a reward-placement KL needs it. :meth:`warmup` compiles exactly these (and the advantage
        program, which takes no weights)."""
        if not self.config.fixed_shapes:
            raise ConfigError(explain("StreamingLearner.program_shapes", expected="LearnerConfig(fixed_shapes=True)",
                                      received="fixed_shapes=False (shapes follow the rollouts)",
                                      fix="build the learner with fixed_shapes=True"))
        (_, host), = self._fixed_hosts([])
        arrays = {k: (tuple(v.shape), str(v.dtype)) for k, v in sorted(host.items())}
        out: list = [("grad", arrays), ("apply", None)]
        if self.ref_params is not None and self.loss.kl.placement == "reward":
            out.append(("ref_logp", arrays))
        return out

    def warmup(self, group_size: int | None = None, *, background: bool = False) -> None:
        """Compile every program a step runs now, so no compile lands in the middle of a run.

        With ``fixed_shapes``: exactly :meth:`program_shapes`, ahead of time (``lower().compile()``: nothing
        runs, and a later call with those shapes neither traces nor compiles again). Else: the gradient
        program for every length bucket (an all-padding micro-batch per bucket; its gradient is discarded;
        with packing also every packed row count), the update program (its result discarded: weights and
        optimizer state stay as they are), the reference log-prob program when the KL is a reward penalty
        (not the shared-prefix shapes, ``LearnerConfig.shared_prefix``: those compile at first use). Given
        ``group_size``, also the advantage program (one group, and a step's groups for step-global estimators).

        ``background=True`` compiles in a thread and returns at once (the trainer overlaps it with starting
        the envs and the first rollouts); the learner's first program call waits for it (and raises what it
        raised)."""
        if background:
            self._warm_thread = threading.Thread(target=self._warm_in_thread, args=(group_size,), daemon=True,
                                                 name="gymllm-learner-warmup")
            self._warm_thread.start()
            return
        self._warm(group_size)

    def _warm_in_thread(self, group_size: int | None) -> None:
        try:
            self._warm(group_size)
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread by _await_warmup)
            self._warm_error = e

    def _await_warmup(self) -> None:
        """Wait for a background :meth:`warmup` (raising what it raised) before running a program."""
        if self._warm_thread is not None and self._warm_thread is not threading.current_thread():
            self._warm_thread.join()
            self._warm_thread = None
            if self._warm_error is not None:
                err, self._warm_error = self._warm_error, None
                raise err

    def _warm(self, group_size: int | None) -> None:
        with span("learner_warmup", track="trainer", fixed_shapes=self.config.fixed_shapes):
            if self.config.fixed_shapes:
                self._compile_fixed()
            else:
                self._warm_buckets()
            if group_size and self._adv is not None:
                step_global = self.loss.advantage.estimator in adv_mod.STEP_GLOBAL
                for n in (1, self.config.groups_per_step) if step_global else (1,):  # rewards [n, G]
                    jax.block_until_ready(self._advantages(np.zeros((n, group_size), np.float32)))

    def _compile_fixed(self) -> None:
        """Compile :meth:`program_shapes` ahead of time (nothing runs; the inputs only lend their shapes)."""
        (_, host), = self._fixed_hosts([])
        a = shard_batch(self.mesh, host)
        self._grad.lower(self._acc, self.trainable, self.frozen, a, self.ref_params).compile()
        if self.ref_params is not None and self.loss.kl.placement == "reward":
            self._ref_logp.lower(self.ref_params, a).compile()
        self._apply.lower(self.trainable, self.opt_state, self._acc, jnp.float32(1.0)).compile()

    def _warm_buckets(self) -> None:
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
                and rewards.max() == rewards.min()):  # shaping.nonzero_variance, on the host: no compile
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
            _, self.role_baselines = role_ema_advantages([float(rewards.mean())], [role], self.role_baselines,
                                                                 decay=self.loss.advantage.ema_decay)
            self._add_rows(group, adv)
        else:
            self._add_rows(group, np.asarray(self._advantages(rewards[None]))[0])
        if self._step_groups < self.config.groups_per_step:
            return None
        return self._finish_step()

    def _advantages(self, rewards: np.ndarray) -> jnp.ndarray:
        self._await_warmup()
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
        self._await_warmup()
        rows = [self._row(t, advantage=0.0, group_tokens=1.0, sample_id="") for t in group.trajectories]
        if self.config.fixed_shapes:
            return self._fixed_kl_penalty(rows)
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

    def _fixed_kl_penalty(self, rows: list[Row]) -> np.ndarray:
        """:meth:`_kl_penalty` through the fixed reference program (``fixed_shapes``), pass by pass."""
        out = np.zeros(len(rows), np.float32)
        for i in range(0, len(rows), self.config.micro_batch_size):
            chunk = rows[i:i + self.config.micro_batch_size]
            for order, host in self._fixed_hosts(chunk):
                ref = self._ref_logp(self.ref_params, shard_batch(self.mesh, host))
                pen = kl_reward_penalty(host["mu"], ref, host["mask"], beta=self.loss.kl.beta)
                out[[i + j for j in order]] = np.asarray(pen)[:len(order)]
        return out

    def _row(self, t: Any, **kw: Any) -> Row:
        """``t`` as a training row cut to ``max_len``; with ``fixed_shapes`` and the LM head on the loss
        positions, at most ``max_response_len`` sampled targets in its loss (the rest counted)."""
        r = row_from_trajectory(t, max_len=self.buckets[-1], **kw)
        budget = self.config.max_response_len
        if self.config.fixed_shapes and self.config.loss_positions_only and 0 < budget < self.buckets[-1]:
            dropped = cap_sampled(r, budget)
            if dropped:
                self.counts["sampled_tokens_over_budget"] += dropped
                increment("sampled_tokens_over_budget", dropped, track="trainer")
        return r

    def _add_rows(self, group: Group, advantages: np.ndarray) -> None:
        tokens = float(sum(t.num_sampled for t in group.trajectories))
        for t, a in zip(group.trajectories, advantages):
            sid = t.trajectory_id or f"{group.group_id}/{len(self._step_rows)}"
            r = self._row(t, advantage=float(a), group_tokens=tokens, sample_id=sid, group_index=self._groups_added)
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

    def _layout(self, rows: list[Row], mb: Any, tags: dict) -> dict[str, np.ndarray]:
        """The host arrays of one micro-batch as the (not fixed) gradient program reads them: padded,
        packed or shared-prefix (whichever runs fewest positions), the LM head on the loss positions."""
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
        return self._on_loss_positions(host, mb.mask, gather)

    def _fixed_hosts(self, rows: list[Row]) -> list[tuple[list[int], dict[str, np.ndarray]]]:
        """``rows`` (at most ``micro_batch_size``) in the fixed program's layout (``fixed_shapes``): one
        ``(indices into rows, host arrays)`` per pass, the arrays' shapes the same whatever the rows (no
        rows: one all-padding pass). Padded rows at ``max_len``, or the fixed shared-prefix layout."""
        b, length = self.config.micro_batch_size, self.buckets[-1]
        keep = ("mask", "mu", "advantages", "group_tokens")
        if not self.config.shared_prefix:
            mb = make_micro_batch(rows, b, length, self.pad_id)
            return [(list(range(len(rows))), self._on_loss_positions(mb.arrays(), mb.mask))]
        out = []
        for slot_rows in fixed_prefix_slots(rows, b, length, self.prefix_len, self.prefix_slots):
            mb = make_micro_batch(fixed_prefix_rows(rows, slot_rows), b, length, self.pad_id)
            sp = fixed_prefix_arrays(rows, slot_rows, b, length, self.prefix_len, self.prefix_slots, self.pad_id)
            host = {**{k: getattr(mb, k) for k in keep}, **sp}
            out.append(([i for _, members in slot_rows for i in members],
                        self._on_loss_positions(host, mb.mask, sp["sp_gather"])))
        return out

    def _check_passes(self, rows: list[Row], passes: int) -> None:
        """Count (and say once) the passes beyond one per ``prefix_slots`` groups: a group whose rows did not
        fit one slot, as its common prefix is shorter than ``prefix_len``."""
        extra = passes - -(-len({r.group_index for r in rows}) // self.prefix_slots)
        if extra > 0:
            self.counts["shared_prefix_extra_passes"] += extra
            if self.counts["shared_prefix_extra_passes"] == extra:
                warnings.warn(f"LearnerConfig.prefix_len: expected at most the shortest prompt, received "
                              f"{self.prefix_len} while a group shares fewer tokens, so its rows take {extra} more "
                              f"pass(es) of the gradient program. Fix: set --learner.prefix-len to at most the "
                              f"shortest prompt's length (counted: shared_prefix_extra_passes)", stacklevel=2)

    def _run_micro_batch(self, rows: list[Row]) -> None:
        self._await_warmup()
        mb = make_micro_batch(rows, self.config.micro_batch_size,
                              pick_bucket(max(r.length for r in rows), self.buckets), self.pad_id)
        t = time.perf_counter()
        valid = mb.mask > 0
        lag = (self.version - mb.versions)[valid]
        lags, counts = np.unique(lag, return_counts=True)
        with span("micro_batch", track="trainer", rows=len(rows), length=mb.shape[1], step=self.version + 1) as tags:
            if self.config.fixed_shapes:
                hosts = [h for _, h in self._fixed_hosts(rows)]
                key = "shared_prefix_passes" if self.config.shared_prefix else "fixed_micro_batches"
                self.counts[key] += len(hosts)
                if self.config.shared_prefix:
                    self._check_passes(rows, len(hosts))
                tags["passes"] = len(hosts)
            else:
                hosts = [self._layout(rows, mb, tags)]
            tags["head_positions"] = hosts[0]["mask"].shape[1]  # per row
            for host in hosts:
                arrays = shard_batch(self.mesh, host)
                self._acc, sums = self._grad(self._acc, self.trainable, self.frozen, arrays, self.ref_params)
                for k, v in jax.device_get(sums).items():  # one device->host copy (and wait) per pass
                    self._sums[k] += float(v)
            tags["tokens"] = int(valid.sum())
            tags["staleness"] = {int(a): int(c) for a, c in zip(lags, counts)}
        self._busy_s += time.perf_counter() - t
        self._sums["staleness_sum"] += float(lag.sum())
        self._sums["staleness_max"] = max(self._sums["staleness_max"], float(lag.max()) if lag.size else 0.0)
        self._micro_batches += 1

    def _finish_step(self) -> StepReport:
        self._await_warmup()
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
