"""Supervised fine-tuning: chat JSONL (loss on assistant tokens) or a run's best trajectories.

    from gymllm.algos.sft import SFTConfig, SFTSection, run_sft
    result = run_sft(SFTConfig(data="demos.jsonl", model=ModelSection(name="smollm2-135m-instruct"),
                               sft=SFTSection(num_steps=50, batch_size=8), run_dir="runs/sft"))
    print(result.summary())          # then: gymllm train ... --model.checkpoint runs/sft

Rows come from :mod:`gymllm.algos.sft_data` (rendered as a rollout renders them, or token-exact
from ``RUN/trajectories.jsonl`` with ``from_run`` and ``min_reward``); updates from
:class:`gymllm.algos.sft_step.SFTLearner` (the GRPO learner's buckets, optimizer, mixed precision,
LoRA, sharding). The run directory has the layout of a ``gymllm train`` run: ``config.json`` (with
its ``model`` and ``lora`` sections), ``checkpoints/<step>/`` (Orbax, ``state["trainable"]``),
``metrics.jsonl``, ``tensorboard/`` and ``trace.json``; so ``gymllm train --model.checkpoint DIR``
and ``gymllm eval env ENV --model.checkpoint DIR`` read it. A run with ``resume`` continues from its latest
checkpoint at the saved step.

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

from gymllm.validation import check_range
from gymllm.models.lora import LoRAConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.algos.sharding import ShardingConfig
from gymllm.algos.train_config import ModelSection
from gymllm.errors import ConfigError, explain

__all__ = ["SFTSection", "SFTConfig", "SFTResult", "run_sft", "load_rows", "step_indices"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTSection:
    """num_steps: optimizer updates (0 = ``epochs`` passes over the rows); batch_size: rows per update;
    micro_batch_size: rows per compiled micro-batch; max_len / min_bucket / buckets_per_octave: the
    learner's length buckets (a longer row is an error naming its line); compute_dtype: None,
    "bfloat16" / "float16" (mixed precision, float32 master weights) or "auto" (bfloat16 where bf16
    matmuls are native, else float32: :func:`gymllm.utils.host.resolve_compute_dtype`); fast_compile: XLA's cheap CPU
    compile settings (tiny models, tests); system_prompt: the agent's system prompt, added as a run
    with ``env.system_prompt`` adds it (to conversations without a system message)."""

    num_steps: int = 0
    epochs: int = 1
    batch_size: int = 8
    micro_batch_size: int = 8
    max_len: int = 512
    min_bucket: int = 32
    buckets_per_octave: int = 1
    compute_dtype: str | None = None
    fast_compile: bool = False
    system_prompt: str = ""

    def __post_init__(self) -> None:
        check_range("SFTSection", "num_steps", self.num_steps, lo=0)
        for f in ("epochs", "batch_size", "micro_batch_size", "max_len", "min_bucket", "buckets_per_octave"):
            check_range("SFTSection", f, getattr(self, f), lo=1)
        if self.compute_dtype not in (None, "auto", "bfloat16", "float16", "float32"):
            raise ConfigError(explain("sft.compute_dtype", expected='None, "auto", "bfloat16", "float16" or "float32"',
                                      received=self.compute_dtype, fix='use "bfloat16" for mixed precision'))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """One SFT run. data: a chat JSONL file; or from_run: a run directory whose logged trajectories
    with reward >= min_reward are the data (exactly one of the two). model: the model (``checkpoint``
    warm-starts it); optimizer / lora / sharding: as in ``gymllm train``; sft: the training section;
    run_dir: the output directory; checkpoint_every: steps between checkpoints (0 = only at the
    end); resume: continue from run_dir's latest checkpoint; seed: the data order; console: live line;
    compile_cache: where compiled programs are kept for the next run (as ``RunSection.compile_cache``)."""

    data: str = ""  # chat JSONL: one {"messages": [...], "tools": [...]} object a line (e.g. from `gymllm demos`)
    from_run: str = ""  # train on this run directory's logged trajectories instead (token-exact)
    min_reward: float = 1.0  # with from_run: keep trajectories with reward >= this
    model: ModelSection = dataclasses.field(default_factory=lambda: ModelSection(name="smollm2-135m-instruct"))
    optimizer: OptimizerConfig = dataclasses.field(default_factory=lambda: OptimizerConfig(learning_rate=2e-5))
    lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)
    sharding: ShardingConfig = dataclasses.field(default_factory=ShardingConfig)
    sft: SFTSection = dataclasses.field(default_factory=SFTSection)
    run_dir: str = "runs/sft"  # the output run directory
    checkpoint_every: int = 0  # steps between checkpoints (0: only at the end)
    keep_checkpoints: int = 2  # checkpoints kept (the newest)
    resume: bool = True  # continue from the run directory's latest checkpoint
    seed: int = 0  # the data order's seed
    console: bool = True  # live progress line
    compile_cache: str = "auto"  # compiled programs kept for the next run: auto, off or a directory

    def __post_init__(self) -> None:
        from gymllm.utils.compile_cache import check_setting

        check_setting(self.compile_cache, "SFTConfig.compile_cache")
        if bool(self.data) == bool(self.from_run):
            raise ConfigError(explain("SFTConfig data", expected="exactly one of data (a chat JSONL file) and "
                                      "from_run (a run directory)", received={"data": self.data, "from_run":
                                      self.from_run}, fix="gymllm sft DATA.jsonl, or gymllm sft --from-run RUN "
                                      "--min-reward R"))
        if not math.isfinite(self.min_reward):
            raise ConfigError(explain("SFTConfig.min_reward", expected="a finite number", received=self.min_reward,
                                      fix="e.g. --min-reward 1.0 (rows of trajectories with reward >= 1)"))
        check_range("SFTConfig", "checkpoint_every", self.checkpoint_every, lo=0)
        check_range("SFTConfig", "keep_checkpoints", self.keep_checkpoints, lo=1)
        if self.lora.enabled and self.model.checkpoint:
            raise ConfigError(explain("SFTConfig.lora", expected="LoRA on the model as loaded (its adapters are "
                                      "merged onto that base when the run is read back)", received={
                                      "lora.rank": self.lora.rank, "model.checkpoint": self.model.checkpoint},
                                      fix="warm-start with full fine-tuning (lora.rank 0), or drop model.checkpoint"))
        if not self.run_dir:
            raise ConfigError(explain("SFTConfig.run_dir", expected="a directory", received=self.run_dir,
                                      fix="e.g. --run-dir runs/sft"))

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
        lines = [f"SFT: {self.step} steps" + (f" (resumed at step {self.resumed_from})" if self.resumed_from else "")
                 + f" on {self.rows} rows, {self.tokens} trained tokens in {self.wall_s:.1f} s",
                 f"  loss (masked assistant-token cross-entropy): {first}{self.final_loss:.4f}",
                 f"  run dir: {self.run_dir} (checkpoints/, metrics.jsonl, tensorboard/)",
                 f"  use it: gymllm train ... --model.name {self.model_name} --model.checkpoint {self.run_dir}",
                 f"          gymllm eval env ENV --model.checkpoint {self.run_dir}"]
        return "\n".join(lines)


def load_rows(cfg: SFTConfig, tokenizer: Any) -> list[Any]:
    """The run's :class:`~gymllm.algos.sft_data.SFTRow` list (from ``data`` or ``from_run``)."""
    from gymllm.algos import sft_data

    if cfg.from_run:
        return sft_data.rows_from_run(cfg.from_run, cfg.min_reward, max_len=cfg.sft.max_len)
    return sft_data.rows_from_jsonl(cfg.data, tokenizer, max_len=cfg.sft.max_len,
                                    system_prompt=cfg.sft.system_prompt or None)


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
    return cfg.sft.num_steps or math.ceil(cfg.sft.epochs * num_rows / cfg.sft.batch_size)


def run_sft(cfg: SFTConfig) -> SFTResult:
    """Train (or resume) the run ``cfg`` describes; returns its :class:`SFTResult`."""
    from gymllm.utils.compile_cache import persistent_compile_cache

    with persistent_compile_cache(cfg.compile_cache):  # a rerun loads its compiled programs
        return _run_sft(cfg)


def _run_sft(cfg: SFTConfig) -> SFTResult:
    from gymllm.algos.checkpoint import Checkpointer
    from gymllm.algos.components import load_model
    from gymllm.algos.sft_step import SFTLearner, sft_row
    from gymllm.algos.sharding import make_mesh
    from gymllm.telemetry.run_log import rewind_jsonl
    from gymllm.telemetry.sinks import MetricsLogger

    t_start = time.perf_counter()
    run_dir = pathlib.Path(cfg.run_dir)
    lm = load_model(cfg.model)
    rows = load_rows(cfg, lm.tokenizer)
    vocab = int(lm.config.vocab_size)
    bad = next((r for r in rows if int(r.token_ids.max()) >= vocab or int(r.token_ids.min()) < 0), None)
    if bad is not None:
        raise ConfigError(explain(f"SFT row {bad.source}", expected=f"token ids of this model (< {vocab})",
                                  received=f"id {int(bad.token_ids.max())}", fix="train the model the run was made "
                                  "with (--model.name of the run's config.json)"))
    num_steps = _num_steps(cfg, len(rows))
    learner_rows = [sft_row(r.token_ids, r.loss_mask, r.source) for r in rows]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.to_json())
    learner = SFTLearner(lm.config, lm.model.flat_params(), optimizer=cfg.optimizer, num_steps=num_steps,
                         micro_batch_size=cfg.sft.micro_batch_size, max_len=cfg.sft.max_len,
                         min_bucket=cfg.sft.min_bucket, buckets_per_octave=cfg.sft.buckets_per_octave,
                         compute_dtype=cfg.sft.compute_dtype, fast_compile=cfg.sft.fast_compile, lora=cfg.lora,
                         mesh=make_mesh(cfg.sharding), pad_id=int(lm.tokenizer.pad_token_id or 0))
    ckpt = Checkpointer(run_dir / "checkpoints", max_to_keep=cfg.keep_checkpoints)
    resumed = None
    try:
        if not cfg.resume and ckpt.latest_step() is not None:
            raise ConfigError(explain("SFTConfig.resume", expected=f"a fresh run_dir with resume=False (or resume="
                                      f"True to continue {run_dir})", received=f"checkpoints up to step "
                                      f"{ckpt.latest_step()} there", fix="pass a new --run-dir, or drop --no-resume"))
        if cfg.resume and ckpt.restore_latest(learner) is not None:
            resumed = learner.version
        if cfg.resume:
            rewind_jsonl(run_dir / "metrics.jsonl", step=resumed or 0)
        logger = MetricsLogger(run_dir, total_steps=num_steps, console=cfg.console)
        history, tokens = [], 0
        try:
            while learner.version < num_steps:
                idx = step_indices(len(rows), cfg.sft.batch_size, learner.version, cfg.seed)
                m = learner.step_rows([learner_rows[i] for i in idx])
                m["epoch"] = (learner.version * cfg.sft.batch_size) / len(rows)
                tokens += int(m["tokens"])
                history.append({"step": learner.version, **m})
                logger.log(learner.version, m)
                if cfg.checkpoint_every and learner.version % cfg.checkpoint_every == 0:
                    ckpt.save(learner.version, learner, extra={"kind": "sft", "seed": cfg.seed})
            if ckpt.latest_step() != learner.version:
                ckpt.save(learner.version, learner, extra={"kind": "sft", "seed": cfg.seed})
        finally:
            logger.close()
    finally:
        ckpt.close()
    return SFTResult(losses=[h["loss"] for h in history], history=history, step=learner.version, tokens=tokens,
                     rows=len(rows), run_dir=str(run_dir), resumed_from=resumed, model_name=cfg.model.name,
                     wall_s=time.perf_counter() - t_start)
