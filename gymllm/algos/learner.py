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

The learner coordinates (submit, steps, warm-up, checkpoint state); its parts are
:class:`~gymllm.algos.learner_layout.RowLayout` (rows, their order, a micro-batch's host arrays),
:class:`~gymllm.algos.learner_scoring.GroupScorer` (shaped rewards, filter, advantages, KL penalty),
:class:`~gymllm.algos.learner_step.StepTally` (an unfinished step's rows and figures) and the jitted
programs of :mod:`gymllm.algos.learner_programs`.
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

from gymllm.models import lora as lora_mod
from gymllm.algos.batching import (
    Row,
    dropped_sampled_tokens,
    empty_packed,
    make_micro_batch,
    packed_row_counts,
)
from gymllm.algos.config import LossConfig, async_agentic
from gymllm.algos.learner_config import (
    HEAD_SHARE_AUTO,
    SHARED_PREFIX_AUTO,
    LearnerConfig,
    head_flops_share,
)
from gymllm.algos.learner_layout import LOSS_KEYS, RowLayout, chunks
from gymllm.algos.learner_programs import programs
from gymllm.algos.learner_scoring import GroupScorer
from gymllm.algos.learner_step import StepTally
from gymllm.algos.loss import step_denominator
from gymllm.algos.optim import OptimizerConfig, make_schedule
from gymllm.algos.sharding import shard_batch, shard_params
from gymllm.telemetry import counter, increment, span
from gymllm.types import Group
from gymllm.utils.host import resolve_compute_dtype
from gymllm.validation import check_range, require


warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


@dataclasses.dataclass
class StepReport:
    """What one optimizer update did (all floats; ``sample_ids`` are the trained trajectory ids)."""

    step: int
    metrics: dict[str, float]
    sample_ids: list[str]


class StreamingLearner:
    """Barrier-free GRPO learner over flat transformer parameters (see the module docstring)."""

    def __init__(
        self,
        model_config: Any,
        params: dict[str, jax.Array],
        *,
        loss: LossConfig | None = None,
        optimizer: OptimizerConfig | None = None,
        config: LearnerConfig | None = None,
        lora: lora_mod.LoRAConfig | None = None,
        mesh: Any = None,
        pad_id: int = 0,
        version: int = 0,
        temperature: float = 1.0,
        sample_budget: int = 0,
        context_len: int = 0,
        default_staleness: int | None = None,
    ):
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
            loss = dataclasses.replace(
                loss, shaping=dataclasses.replace(loss.shaping, overlong_max_len=sample_budget)
            )
        self.loss = loss
        self.optimizer_config = optimizer or OptimizerConfig()
        cfg = config or LearnerConfig()
        cfg = dataclasses.replace(
            cfg,
            max_len=max(cfg.max_len, context_len),
            max_response_len=cfg.max_response_len or sample_budget,
            max_staleness=cfg.max_staleness if cfg.max_staleness is not None else default_staleness,
        )
        if cfg.compute_dtype == "auto":  # resolved where the learner runs
            cfg = dataclasses.replace(cfg, compute_dtype=resolve_compute_dtype("auto"))
        if cfg.loss_positions_only is None:
            cfg = dataclasses.replace(
                cfg, loss_positions_only=head_flops_share(model_config) >= HEAD_SHARE_AUTO
            )
        if cfg.shared_prefix is None:
            cfg = dataclasses.replace(cfg, shared_prefix=SHARED_PREFIX_AUTO)
        self.config = cfg
        self.lora = lora if lora is not None and lora.enabled else None
        self.mesh = mesh
        self.pad_id = pad_id
        self.counts: collections.Counter = (
            collections.Counter()
        )  # restore() updates it in place (shared)
        self.devices = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
        self.layout = layout = RowLayout(
            cfg, pad_id=pad_id, devices=self.devices, counts=self.counts
        )
        # the layout's figures, read by the benchmarks and tests
        self.buckets, self.prefix_table, self.pack_quantum = (
            layout.buckets,
            layout.prefix_table,
            layout.pack_quantum,
        )
        self.prefix_len, self.prefix_slots = layout.prefix_len, layout.prefix_slots
        self._warm_thread: threading.Thread | None = None
        self._warm_error: BaseException | None = None
        base = {k: jnp.asarray(v) for k, v in params.items()}
        if self.lora is not None:
            self.frozen = shard_params(mesh, base)
            self.trainable = shard_params(mesh, lora_mod.init_adapters(self.lora, base))
        else:
            self.frozen = None
            self.trainable = shard_params(mesh, base)
        # beta == 0: no reference parameters at all
        self.ref_params = shard_params(mesh, dict(base)) if self.loss.kl.needs_reference else None
        self._grad, self._apply, self._ref_logp, self.tx = programs(
            model_config, self.loss, cfg, self.lora, self.optimizer_config, self.temperature
        )
        self.scorer = GroupScorer(
            self.loss,
            layout,
            ref_logp=self._ref_logp,
            ref_params=self.ref_params,
            mesh=mesh,
            before_program=self._await_warmup,
        )
        self.role_baselines: dict[str, float] = {}  # role_ema's EMA per role (checkpointed)
        self.schedule = make_schedule(self.optimizer_config, cfg.num_steps)
        self.opt_state = self.tx.init(self.trainable)
        self.version = version  # == optimizer updates applied
        self.consumed_groups: set[str] = set()  # trained + filtered + stale (rollout bookkeeping)
        self._groups_added = (
            0  # rows' group_index: micro-batches keep a group's rows together (shared_prefix)
        )
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
        return self.tally.groups

    def program_shapes(self) -> list[tuple[str, dict[str, tuple[tuple[int, ...], str]] | None]]:
        """The programs taking the model's weights that this learner runs (``fixed_shapes``), each as
        ``(name, {array: (shape, dtype)})`` of the micro-batch arrays it is compiled for (None: the update,
        whose inputs are the weights, optimizer state and accumulator): ``grad``, ``apply``, and ``ref_logp``
        where a reward-placement KL needs it. :meth:`warmup` compiles exactly these (and the advantage
        program, which takes no weights)."""
        require(
            bool(self.config.fixed_shapes),
            "StreamingLearner.program_shapes",
            expected="LearnerConfig(fixed_shapes=True)",
            received="fixed_shapes=False (shapes follow the rollouts)",
            fix="build the learner with fixed_shapes=True",
        )
        ((_, host),) = self.layout.fixed_hosts([])
        arrays = {k: (tuple(v.shape), str(v.dtype)) for k, v in sorted(host.items())}
        out: list = [("grad", arrays), ("apply", None)]
        if self.scorer.reward_kl:
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
            self._warm_thread = threading.Thread(
                target=self._warm_in_thread,
                args=(group_size,),
                daemon=True,
                name="gymllm-learner-warmup",
            )
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
            if group_size and self.scorer.program is not None:
                step_global = self.scorer.step_global
                for n in (
                    (1, self.config.groups_per_step) if step_global else (1,)
                ):  # rewards [n, G]
                    jax.block_until_ready(
                        self.scorer.advantages(np.zeros((n, group_size), np.float32))
                    )

    def _compile_fixed(self) -> None:
        """Compile :meth:`program_shapes` ahead of time (nothing runs; the inputs only lend their shapes)."""
        ((_, host),) = self.layout.fixed_hosts([])
        a = shard_batch(self.mesh, host)
        self._grad.lower(self._acc, self.trainable, self.frozen, a, self.ref_params).compile()
        if self.scorer.reward_kl:
            self._ref_logp.lower(self.ref_params, a).compile()
        self._apply.lower(self.trainable, self.opt_state, self._acc, jnp.float32(1.0)).compile()

    def _warm_buckets(self) -> None:
        for length in self.buckets:
            mb = make_micro_batch([], self.config.micro_batch_size, length, self.pad_id)
            a = shard_batch(self.mesh, self.layout.on_loss_positions(mb.arrays(), mb.mask))
            acc = jax.tree.map(
                jnp.zeros_like, self.trainable
            )  # donated: not the step's accumulator
            jax.block_until_ready(self._grad(acc, self.trainable, self.frozen, a, self.ref_params))
            for p in (
                packed_row_counts(self.config.micro_batch_size, self.pack_quantum)
                if self.config.packing
                else ()
            ):
                host = {
                    **{k: v for k, v in mb.arrays().items() if k in LOSS_KEYS},
                    **empty_packed(p, self.config.micro_batch_size, length, self.pad_id),
                }
                host = self.layout.on_loss_positions(host, mb.mask, host["gather"])
                acc = jax.tree.map(jnp.zeros_like, self.trainable)
                jax.block_until_ready(
                    self._grad(
                        acc,
                        self.trainable,
                        self.frozen,
                        shard_batch(self.mesh, host),
                        self.ref_params,
                    )
                )
            if self.scorer.reward_kl:
                jax.block_until_ready(
                    self._ref_logp(
                        self.ref_params, shard_batch(self.mesh, self.layout.ref_arrays(mb))
                    )
                )
        acc = jax.tree.map(jnp.zeros_like, self.trainable)
        jax.block_until_ready(self._apply(self.trainable, self.opt_state, acc, jnp.float32(1.0)))

    # ------------------------------------------------------------------ consumption
    def _reset_step(self, zeros: Any = None) -> None:
        """Start a new step; ``zeros``: the zeroed accumulator the apply program returned (else made here)."""
        self._acc = zeros if zeros is not None else jax.tree.map(jnp.zeros_like, self.trainable)
        self.tally = StepTally()

    def _consume(self, group: Group) -> StepReport | None:
        self.counts["groups_in"] += 1
        gid = group.group_id
        lag = self.version - group.min_version
        if self.config.max_staleness is not None and lag > self.config.max_staleness:
            self.counts["stale_groups"] += 1
            self.consumed_groups.add(gid)
            counter("stale_groups", self.counts["stale_groups"], track="trainer")
            return None
        rewards = self.scorer.shaped_rewards(group)
        if self.scorer.filtered(group, rewards):
            self.counts["filtered_groups"] += 1
            self.consumed_groups.add(gid)
            counter("filtered_groups", self.counts["filtered_groups"], track="trainer")
            return None
        self.consumed_groups.add(gid)
        self.tally.add_group(group)
        if self.scorer.step_global:
            self.tally.deferred.append((group, rewards))
        elif self.scorer.stateful:
            adv, self.role_baselines = self.scorer.role_advantages(
                group, rewards, self.role_baselines
            )
            self._add_rows(group, adv)
        else:
            self._add_rows(group, np.asarray(self.scorer.advantages(rewards[None]))[0])
        if self.tally.groups < self.config.groups_per_step:
            return None
        return self._finish_step()

    def _add_rows(self, group: Group, advantages: np.ndarray) -> None:
        tokens = float(sum(t.num_sampled for t in group.trajectories))
        for t, a in zip(group.trajectories, advantages):
            sid = t.trajectory_id or f"{group.group_id}/{len(self.tally.rows)}"
            r = self.layout.row(
                t,
                advantage=float(a),
                group_tokens=tokens,
                sample_id=sid,
                group_index=self._groups_added,
            )
            if (
                len(t.token_ids) - 1 > r.length
            ):  # a truncated episode's last observation ran past max_len: cut
                increment("rows_truncated", 1, track="trainer")
                increment(
                    "sampled_tokens_truncated", dropped_sampled_tokens(t, r.length), track="trainer"
                )
            self.tally.pending.append(r)
            self.tally.rows.append(r)
        self._groups_added += 1
        while len(self.tally.pending) >= self.config.micro_batch_size:
            chunk = self.layout.ordered(self.tally.pending)[: self.config.micro_batch_size]
            ids = {id(r) for r in chunk}
            self.tally.pending = [r for r in self.tally.pending if id(r) not in ids]
            self._run_micro_batch(chunk)

    def _run_micro_batch(self, rows: list[Row]) -> None:
        self._await_warmup()
        mb = self.layout.micro_batch(rows)
        t = time.perf_counter()
        valid = mb.mask > 0
        lag = (self.version - mb.versions)[valid]
        lags, counts = np.unique(lag, return_counts=True)
        with span(
            "micro_batch",
            track="trainer",
            rows=len(rows),
            length=mb.shape[1],
            step=self.version + 1,
        ) as tags:
            if self.config.fixed_shapes:
                hosts = [h for _, h in self.layout.fixed_hosts(rows)]
                key = "shared_prefix_passes" if self.config.shared_prefix else "fixed_micro_batches"
                self.counts[key] += len(hosts)
                if self.config.shared_prefix:
                    self.layout.check_passes(rows, len(hosts))
                tags["passes"] = len(hosts)
            else:
                hosts = [self.layout.arrays(rows, mb, tags)]
            tags["head_positions"] = hosts[0]["mask"].shape[1]  # per row
            for host in hosts:
                arrays = shard_batch(self.mesh, host)
                self._acc, sums = self._grad(
                    self._acc, self.trainable, self.frozen, arrays, self.ref_params
                )
                for k, v in jax.device_get(
                    sums
                ).items():  # one device->host copy (and wait) per pass
                    self.tally.sums[k] += float(v)
            tags["tokens"] = int(valid.sum())
            tags["staleness"] = {int(a): int(c) for a, c in zip(lags, counts)}
        self.tally.busy_s += time.perf_counter() - t
        self.tally.sums["staleness_sum"] += float(lag.sum())
        self.tally.sums["staleness_max"] = max(
            self.tally.sums["staleness_max"], float(lag.max()) if lag.size else 0.0
        )
        self.tally.micro_batches += 1

    def _finish_step(self) -> StepReport:
        self._await_warmup()
        t = time.perf_counter()
        with span("train_step", track="trainer", step=self.version + 1, groups=self.tally.groups):
            if self.tally.deferred:
                all_r = np.stack([r for _, r in self.tally.deferred])
                adv = np.asarray(self.scorer.advantages(all_r))
                for (g, _), a in zip(self.tally.deferred, adv):
                    self._add_rows(g, a)
            if self.tally.pending:
                for mb_rows in chunks(
                    self.layout.ordered(self.tally.pending), self.config.micro_batch_size
                ):
                    self._run_micro_batch(mb_rows)
                self.tally.pending = []
            stats = self.tally.stats(self.config.max_response_len or self.config.max_len)
            denom = float(step_denominator(self.loss, stats))
            lr = float(self.schedule(self.version))
            self.trainable, self.opt_state, gnorm, zeros = self._apply(
                self.trainable, self.opt_state, self._acc, jnp.float32(denom)
            )
            gnorm = float(gnorm)
        self.tally.busy_s += time.perf_counter() - t
        self.version += 1
        self.counts["steps"] += 1
        self.counts["groups_trained"] += self.tally.groups
        self.counts["rows_trained"] += len(self.tally.rows)
        report = StepReport(
            step=self.version,
            metrics=self.tally.metrics(stats, denom, gnorm, lr, self.counts),
            sample_ids=[r.sample_id for r in self.tally.rows],
        )
        counter("policy_version", self.version, track="trainer")
        self._reset_step(zeros)
        return report

    # ------------------------------------------------------------------ checkpoint state
    def state(self) -> dict[str, Any]:
        """Everything a checkpoint needs to resume exactly (arrays + JSON-able bookkeeping)."""
        return {"trainable": self.trainable, "opt_state": self.opt_state}

    def bookkeeping(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "counts": dict(self.counts),
            "consumed_groups": sorted(self.consumed_groups),
            "role_baselines": dict(self.role_baselines),
        }

    def restore(self, state: dict[str, Any], bookkeeping: dict[str, Any]) -> None:
        self.trainable = shard_params(self.mesh, state["trainable"])
        self.opt_state = state["opt_state"]
        self.version = int(bookkeeping["version"])
        counts = dict(bookkeeping.get("counts", {}))
        self.counts.clear()  # in place: the layout tallies into the same counter
        self.counts.update(counts)
        self.consumed_groups = set(bookkeeping.get("consumed_groups", []))
        self.role_baselines = {
            str(k): float(v) for k, v in bookkeeping.get("role_baselines", {}).items()
        }
        self._reset_step()
