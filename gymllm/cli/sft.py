"""``gymllm sft``: supervised fine-tuning on chat JSONL, or on a run's best trajectories.

    gymllm sft demos.jsonl --model.name smollm2-135m-instruct --run.run-dir runs/sft --sft.epochs 3
    gymllm sft --from-run runs/default --min-reward 1 --run.run-dir runs/rft
    gymllm train calc_math --model.checkpoint runs/sft          # then RL from the SFT weights

Parsed by tyro over :class:`gymllm.train.sft.SFTConfig` itself: every field is a flag (``--run.run-dir``,
``--learner.num-steps`` with ``--sft.epochs 0``, ``--run.keep-checkpoints``, ``--run.compile-cache``...), and the data file may be given as
the first argument (``--data``); a malformed argument exits with tyro's usage error, status 2. The run
itself is :func:`gymllm.train.sft.run_sft`.
"""

from __future__ import annotations

from typing import Sequence

import tyro

PROG = "gymllm sft [DATA.jsonl] [--from-run RUN] [--section.field VALUE ...]"


def sft_arguments(args: Sequence[str]) -> list[str]:
    """``args`` with a leading data file (``gymllm sft demos.jsonl ...``) spelled as ``--data``."""
    args = list(args)
    return ["--data", *args] if args and not args[0].startswith("-") else args


def parse_sft_args(args: Sequence[str]) -> object:
    """The :class:`~gymllm.train.sft.SFTConfig` of a ``gymllm sft`` argv."""
    from gymllm.train.sft import SFTConfig

    return tyro.cli(SFTConfig, prog=PROG, description=sft.__doc__, args=sft_arguments(args))


def sft(args: Sequence[str] = ()) -> int:
    """Supervised fine-tuning on chat JSONL (loss on assistant tokens), or on a run's best trajectories.

    The loss is the mean cross-entropy of the assistant tokens only (rendered exactly as a rollout
    renders the conversation, end-of-turn token included). With --from-run RUN --min-reward R the rows
    are RUN's logged trajectories with reward >= R, token for token (rejection-sampling fine-tuning).
    The run directory (checkpoints, metrics.jsonl, TensorBoard) warm-starts RL with
    `gymllm train ... --model.checkpoint DIR` and is evaluated with `gymllm eval env ENV --model.checkpoint DIR`.
    """
    from gymllm.train.sft import run_sft

    result = run_sft(parse_sft_args(args))
    print(result.summary())
    return 0


sft.takes_argv = True  # type: ignore[attr-defined]  # parsed by tyro inside (nested config sections)
