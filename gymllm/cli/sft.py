"""``gymllm sft``: supervised fine-tuning on chat JSONL, or on a run's best trajectories.

    gymllm sft demos.jsonl --model.name smollm2-135m-instruct --run-dir runs/sft --sft.num-steps 50
    gymllm sft --from-run runs/default --min-reward 1 --run-dir runs/rft
    gymllm train calc_math --model.checkpoint runs/sft          # then RL from the SFT weights

Parsed by tyro from :class:`SFTArguments` (a malformed argument exits with tyro's usage error, status
2); the run itself is :func:`gymllm.algos.sft.run_sft`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional, Sequence

import tyro

PROG = "gymllm sft"


def _arguments() -> type:
    """The command line as one frozen dataclass (built here so the heavy config imports stay lazy)."""
    from gymllm.algos.lora import LoRAConfig
    from gymllm.algos.optim import OptimizerConfig
    from gymllm.algos.sft import SFTSection
    from gymllm.algos.sharding import ShardingConfig
    from gymllm.algos.train_config import ModelSection

    fields = [
        ("data", Annotated[Optional[str], tyro.conf.Positional, tyro.conf.arg(
            metavar="DATA.jsonl", help="chat JSONL: one {\"messages\": [...], \"tools\": [...]} object a line "
                                       "(e.g. from `gymllm demos`)")], None),
        ("from_run", Annotated[Optional[str], tyro.conf.arg(
            help="train on this run directory's logged trajectories instead (token-exact)")], None),
        ("min_reward", Annotated[float, tyro.conf.arg(help="with --from-run: keep trajectories with reward >= this")],
         1.0),
        ("run_dir", Annotated[str, tyro.conf.arg(help="the output run directory")], "runs/sft"),
        ("checkpoint_every", Annotated[int, tyro.conf.arg(help="steps between checkpoints (0: only at the end)")], 0),
        ("resume", Annotated[bool, tyro.conf.arg(help="continue from the run directory's latest checkpoint")], True),
        ("seed", Annotated[int, tyro.conf.arg(help="the data order's seed")], 0),
        ("console", Annotated[bool, tyro.conf.arg(help="live progress line")], True),
        ("model", ModelSection, dataclasses.field(default_factory=lambda: ModelSection(name="smollm2-135m-instruct"))),
        ("optimizer", OptimizerConfig, dataclasses.field(default_factory=lambda: OptimizerConfig(learning_rate=2e-5))),
        ("lora", LoRAConfig, dataclasses.field(default_factory=LoRAConfig)),
        ("sharding", ShardingConfig, dataclasses.field(default_factory=ShardingConfig)),
        ("sft", SFTSection, dataclasses.field(default_factory=SFTSection)),
    ]
    cls = dataclasses.make_dataclass("SFTArguments", fields, frozen=True, kw_only=True)
    cls.__doc__ = "Arguments of `gymllm sft`."
    return cls


def sft(args: Sequence[str] = ()) -> int:
    """Supervised fine-tuning on chat JSONL (loss on assistant tokens), or on a run's best trajectories.

    The loss is the mean cross-entropy of the assistant tokens only (rendered exactly as a rollout
    renders the conversation, end-of-turn token included). With --from-run RUN --min-reward R the rows
    are RUN's logged trajectories with reward >= R, token for token (rejection-sampling fine-tuning).
    The run directory (checkpoints, metrics.jsonl, TensorBoard) warm-starts RL with
    `gymllm train ... --model.checkpoint DIR` and is evaluated with `gymllm eval ENV --checkpoint DIR`.
    """
    from gymllm.algos.sft import SFTConfig, run_sft

    a = tyro.cli(_arguments(), prog=PROG, description=sft.__doc__, args=list(args))
    cfg = SFTConfig(data=a.data or "", from_run=a.from_run or "", min_reward=a.min_reward, model=a.model,
                    optimizer=a.optimizer, lora=a.lora, sharding=a.sharding, sft=a.sft, run_dir=a.run_dir,
                    checkpoint_every=a.checkpoint_every, resume=a.resume, seed=a.seed, console=a.console)
    result = run_sft(cfg)
    print(result.summary())
    return 0


sft.takes_argv = True  # type: ignore[attr-defined]  # parsed by tyro inside (nested config sections)
