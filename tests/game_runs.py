"""A tiny-preset tic-tac-toe run for the self-play tests, and running a ``Run`` to its end as
``gymllm.train.trainer.train`` does (setup, train, close)."""

from __future__ import annotations

import asyncio


def tictactoe_tiny_args(run_dir, *extra: str) -> list[str]:
    """``gymllm train`` flags of a 3-step tiny-preset tic-tac-toe run in ``run_dir`` (groups of 2, one
    group a step, 4-token moves), then ``extra``."""
    return [
        "--preset", "tiny", "--env.id", "tic-tac-toe", "--env-kwargs", '{"max_invalid": 1}',
        "--run-dir", str(run_dir), "--rollout.group-size", "2", "--env.num-envs", "2",
        "--rollout.max-model-calls", "5", "--sampling.max-tokens", "4",
        "--learner.groups-per-step", "1", "--learner.num-steps", "3",
        "--engine.max-len", "768", "--learner.max-len", "768", "--run.no-report",
        *extra,
    ]  # fmt: skip


def run_to_end(run) -> None:
    """Set ``run`` up, train it to its last step and close it."""

    async def go():
        run.setup()
        try:
            await run.train()
        finally:
            await run.close()

    asyncio.run(go())
