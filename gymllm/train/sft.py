"""Supervised fine-tuning: chat JSONL (loss on assistant tokens) or a run's best trajectories.

    from gymllm.train.sft import SFTConfig, SFTSection, run_sft
    result = run_sft(SFTConfig(data="demos.jsonl", model=ModelSection(name="smollm2-135m-instruct"),
                               learner=LearnerConfig(num_steps=50), sft=SFTSection(epochs=0, batch_size=8),
                               run=RunSection(run_dir="runs/sft")))
    print(result.summary())          # then: gymllm train ... --model.checkpoint runs/sft

Rows come from :mod:`gymllm.train.sft_data` (rendered as a rollout renders them, or token-exact
from ``RUN/trajectories.jsonl`` with ``from_run`` and ``min_reward``); updates from
:class:`gymllm.train.sft_step.SFTLearner` (the GRPO learner's buckets, optimizer, mixed precision,
LoRA, sharding). The run directory has the layout of a ``gymllm train`` run: ``config.json`` (with
its ``model`` and ``lora`` sections), ``checkpoints/<step>/`` (Orbax, ``state["trainable"]``),
``metrics.jsonl``, ``tensorboard/`` and ``trace.json``; so ``gymllm train --model.checkpoint DIR``
and ``gymllm eval env ENV --model.checkpoint DIR`` read it. A run with ``resume`` continues from its latest
checkpoint at the saved step. The config holds ``gymllm train``'s own sections (model, optimizer, lora,
sharding, learner, run) rather than repeating their fields; the SFT section adds epochs, rows per update
and the system prompt.

Data order: step ``k`` trains rows ``k * batch_size ... (k + 1) * batch_size - 1`` of an endless
stream of epochs, epoch ``e`` being a permutation drawn from ``numpy.random.default_rng([seed, e])``;
so the order depends only on the seed and a resumed run trains exactly the rows it would have.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time
from typing import Any

import numpy as np

from gymllm.errors import ConfigError, explain
from gymllm.validation import check_range, require
from gymllm.models.lora import LoRAConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.algos.sharding import ShardingConfig
from gymllm.algos.learner_config import LearnerConfig
from gymllm.train.train_config import ModelSection, RunSection

__all__ = [
    "SFTSection",
    "SFTConfig",
    "LEARNER_FIELDS",
    "RUN_FIELDS",
    "SFTResult",
    "run_sft",
    "load_rows",
    "step_indices",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTSection:
    """What SFT adds to the learner's and the run's sections."""

    epochs: int = 1
    """Passes over the rows (0: ``learner.num_steps`` updates instead)."""
    batch_size: int = 8
    """Rows per update."""
    system_prompt: str = ""
    """The agent's system prompt, added as a run with ``env.system_prompt`` adds it (to conversations without a
    system message)."""

    def __post_init__(self) -> None:
        check_range("SFTSection", "epochs", self.epochs, lo=0)
        check_range("SFTSection", "batch_size", self.batch_size, lo=1)


#: the sections' fields an SFT run reads (the others are the RL run's and are ignored here)
LEARNER_FIELDS = (
    "num_steps",
    "micro_batch_size",
    "max_len",
    "min_bucket",
    "buckets_per_octave",
    "compute_dtype",
    "fast_compile",
)
RUN_FIELDS = (
    "run_dir",
    "seed",
    "checkpoint_every",
    "keep_checkpoints",
    "resume",
    "console",
    "compile_cache",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """One SFT run: exactly one of ``data`` and ``from_run``; the model, optimizer, LoRA, sharding, learner and
    run sections of ``gymllm train`` (the learner's :data:`LEARNER_FIELDS` and the run's :data:`RUN_FIELDS` are
    read; ``run.seed`` orders the data); and the SFT section."""

    data: str = ""  # chat JSONL: one {"messages": [...], "tools": [...]} object a line (e.g. from `gymllm demos`)
    from_run: str = ""  # train on this run directory's logged trajectories instead (token-exact)
    min_reward: float = 1.0  # with from_run: keep trajectories with reward >= this
    model: ModelSection = dataclasses.field(
        default_factory=lambda: ModelSection(name="smollm2-135m-instruct")
    )
    """The model to fine-tune (``checkpoint`` warm-starts it)."""
    optimizer: OptimizerConfig = dataclasses.field(
        default_factory=lambda: OptimizerConfig(learning_rate=2e-5)
    )
    """The optimizer and its learning-rate schedule."""
    lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)
    """LoRA adapters (rank 0: full fine-tuning)."""
    sharding: ShardingConfig = dataclasses.field(default_factory=ShardingConfig)
    """The learner's device mesh (data x fsdp)."""
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    """The learner's steps (with ``sft.epochs`` 0), micro-batches, length buckets (a longer row is an error naming
    its line), compute dtype and compile settings."""
    sft: SFTSection = dataclasses.field(default_factory=SFTSection)
    """Epochs, rows per update and the system prompt."""
    run: RunSection = dataclasses.field(default_factory=lambda: RunSection(run_dir="runs/sft"))
    """The run directory, the data order's seed, checkpoints, resume, the console line and the compile cache."""

    def __post_init__(self) -> None:
        require(
            bool(self.data) != bool(self.from_run),
            "SFTConfig data",
            expected="exactly one of data (a chat JSONL file) and from_run (a run directory)",
            received={"data": self.data, "from_run": self.from_run},
            fix="gymllm sft DATA.jsonl, or gymllm sft --from-run RUN --min-reward R",
        )
        require(
            math.isfinite(self.min_reward),
            "SFTConfig.min_reward",
            expected="a finite number",
            received=self.min_reward,
            fix="e.g. --min-reward 1.0 (rows of trajectories with reward >= 1)",
        )
        require(
            not self.lora.enabled or not self.model.checkpoint,
            "SFTConfig.lora",
            expected="LoRA on the model as loaded (its adapters are "
            "merged onto that base when the run is read back)",
            received={
                "lora.rank": self.lora.rank,
                "model.checkpoint": self.model.checkpoint,
            },
            fix="warm-start with full fine-tuning (lora.rank 0), or drop model.checkpoint",
        )
        require(
            bool(self.run.run_dir),
            "SFTConfig.run.run_dir",
            expected="a directory",
            received=self.run.run_dir,
            fix="e.g. --run.run-dir runs/sft",
        )

    def to_json(self) -> str:
        return json.dumps({"kind": "sft", **dataclasses.asdict(self)}, indent=2, default=str)


@dataclasses.dataclass
class SFTResult:
    """What :func:`run_sft` did: ``losses`` of this call's steps (per step), ``history`` (their metrics
    records), ``step`` (the run's step count now), ``tokens`` (trained tokens this call), ``rows``
    (dataset rows), ``resumed_from`` (the step a resumed run started at, else None), ``run_dir``."""

    losses: list[float]
    history: list[dict[str, Any]]
    step: int
    tokens: int
    rows: int
    run_dir: str
    resumed_from: int | None = None
    model_name: str = ""
    wall_s: float = 0.0

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")

    def summary(self) -> str:
        first = f"{self.losses[0]:.4f} -> " if len(self.losses) > 1 else ""
        lines = [
            f"SFT: {self.step} steps"
            + (f" (resumed at step {self.resumed_from})" if self.resumed_from else "")
            + f" on {self.rows} rows, {self.tokens} trained tokens in {self.wall_s:.1f} s",
            f"  loss (masked assistant-token cross-entropy): {first}{self.final_loss:.4f}",
            f"  run dir: {self.run_dir} (checkpoints/, metrics.jsonl, tensorboard/)",
            f"  use it: gymllm train ... --model.name {self.model_name} --model.checkpoint {self.run_dir}",
            f"          gymllm eval env ENV --model.checkpoint {self.run_dir}",
        ]
        return "\n".join(lines)


def load_rows(cfg: SFTConfig, tokenizer: Any) -> list[Any]:
    """The run's :class:`~gymllm.train.sft_data.SFTRow` list (from ``data`` or ``from_run``)."""
    from gymllm.train import sft_data

    if cfg.from_run:
        return sft_data.rows_from_run(cfg.from_run, cfg.min_reward, max_len=cfg.learner.max_len)
    return sft_data.rows_from_jsonl(
        cfg.data,
        tokenizer,
        max_len=cfg.learner.max_len,
        system_prompt=cfg.sft.system_prompt or None,
    )


def step_indices(num_rows: int, batch_size: int, step: int, seed: int) -> list[int]:
    """The row indices step ``step`` (0-based) trains (see the module docstring)."""
    out, cache = [], {}
    for p in range(step * batch_size, (step + 1) * batch_size):
        e = p // num_rows
        if e not in cache:
            cache[e] = np.random.default_rng([seed, e]).permutation(num_rows)
        out.append(int(cache[e][p % num_rows]))
    return out


def _num_steps(cfg: SFTConfig, num_rows: int) -> int:
    if not cfg.sft.epochs:
        return cfg.learner.num_steps
    return math.ceil(cfg.sft.epochs * num_rows / cfg.sft.batch_size)


def run_sft(cfg: SFTConfig) -> SFTResult:
    """Train (or resume) the run ``cfg`` describes; returns its :class:`SFTResult`."""
    from gymllm.utils.compile_cache import persistent_compile_cache

    with persistent_compile_cache(cfg.run.compile_cache):  # a rerun loads its compiled programs
        return _run_sft(cfg)


def _run_sft(cfg: SFTConfig) -> SFTResult:
    from gymllm.algos.checkpoint import Checkpointer
    from gymllm.train.components import load_model
    from gymllm.train.sft_step import SFTLearner, sft_row
    from gymllm.algos.sharding import make_mesh
    from gymllm.telemetry.run_log import rewind_jsonl
    from gymllm.telemetry.sinks import MetricsLogger

    t_start = time.perf_counter()
    run_dir = pathlib.Path(cfg.run.run_dir)
    lm = load_model(cfg.model)
    rows = load_rows(cfg, lm.tokenizer)
    vocab = int(lm.config.vocab_size)
    bad = next(
        (r for r in rows if int(r.token_ids.max()) >= vocab or int(r.token_ids.min()) < 0), None
    )
    if bad is not None:
        raise ConfigError(
            explain(
                f"SFT row {bad.source}",
                expected=f"token ids of this model (< {vocab})",
                received=f"id {int(bad.token_ids.max())}",
                fix="train the model the run was made with (--model.name of the run's config.json)",
            )
        )
    num_steps = _num_steps(cfg, len(rows))
    learner_rows = [sft_row(r.token_ids, r.loss_mask, r.source) for r in rows]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.to_json())
    learner = SFTLearner(
        lm.config,
        lm.model.flat_params(),
        optimizer=cfg.optimizer,
        num_steps=num_steps,
        micro_batch_size=cfg.learner.micro_batch_size,
        max_len=cfg.learner.max_len,
        min_bucket=cfg.learner.min_bucket,
        buckets_per_octave=cfg.learner.buckets_per_octave,
        compute_dtype=cfg.learner.compute_dtype,
        fast_compile=cfg.learner.fast_compile,
        lora=cfg.lora,
        mesh=make_mesh(cfg.sharding),
        pad_id=int(lm.tokenizer.pad_token_id or 0),
    )
    ckpt = Checkpointer(run_dir / "checkpoints", max_to_keep=cfg.run.keep_checkpoints)
    resumed = None
    try:
        if not cfg.run.resume and ckpt.latest_step() is not None:
            raise ConfigError(
                explain(
                    "SFTConfig.run.resume",
                    expected=f"a fresh run_dir with resume=False (or resume="
                    f"True to continue {run_dir})",
                    received=f"checkpoints up to step {ckpt.latest_step()} there",
                    fix="pass a new --run.run-dir, or drop --run.no-resume",
                )
            )
        if cfg.run.resume and ckpt.restore_latest(learner) is not None:
            resumed = learner.version
        if cfg.run.resume:
            rewind_jsonl(run_dir / "metrics.jsonl", step=resumed or 0)
        logger = MetricsLogger(run_dir, total_steps=num_steps, console=cfg.run.console)
        history, tokens = [], 0
        try:
            while learner.version < num_steps:
                idx = step_indices(len(rows), cfg.sft.batch_size, learner.version, cfg.run.seed)
                m = learner.step_rows([learner_rows[i] for i in idx])
                m["epoch"] = (learner.version * cfg.sft.batch_size) / len(rows)
                tokens += int(m["tokens"])
                history.append({"step": learner.version, **m})
                logger.log(learner.version, m)
                if cfg.run.checkpoint_every and learner.version % cfg.run.checkpoint_every == 0:
                    ckpt.save(learner.version, learner, extra={"kind": "sft", "seed": cfg.run.seed})
            if ckpt.latest_step() != learner.version:
                ckpt.save(learner.version, learner, extra={"kind": "sft", "seed": cfg.run.seed})
        finally:
            logger.close()
    finally:
        ckpt.close()
    return SFTResult(
        losses=[h["loss"] for h in history],
        history=history,
        step=learner.version,
        tokens=tokens,
        rows=len(rows),
        run_dir=str(run_dir),
        resumed_from=resumed,
        model_name=cfg.model.name,
        wall_s=time.perf_counter() - t_start,
    )
