"""``gymllm demos``: solved episodes of an env as chat JSONL (:mod:`gymllm.envs.demos`), the input of ``gymllm sft``.

gymllm demos gymllm/TicTacToe-v0 --n 500 --out ttt.jsonl
gymllm demos gymllm/CalcMath-v0 --n 500 --out calc.jsonl --env-kwargs '{"digits": 1, "simple": true}'
gymllm demos gymllm/FrozenLake-v0 --n 100 --out lake.jsonl --env-kwargs '{"is_slippery": false}'
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Annotated, Literal

import tyro

from gymllm.cli.json_args import json_object


def _env_kwargs(text: str) -> dict:
    return json_object(text) if text.strip() else {}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoPrompt:
    """How the records are rendered for the run that will train on them (``--env.*``, as ``gymllm train``)."""

    system_prompt: str = ""
    """The rollout's system prompt (env.system_prompt of the run that will train on it)."""
    agent: Literal["tool", "model"] = "tool"
    """tool: records carry the env's tool schemas (a ToolAgent run); model: no schemas (ModelAgent)."""


def demos(
    env_id: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="ENV")],
    /,
    n: int = 100,
    out: str = "demos.jsonl",
    seed: int = 0,
    env_kwargs: str = "",
    demo_policy: Literal["solver", "uniform", "first"] = "solver",
    env: DemoPrompt = DemoPrompt(),
) -> int:
    """Write solved episodes of an env (search, shortest path, the tool call) as chat JSONL for `gymllm sft`.

    Episodes use seeds SEED .. SEED+N-1 (below 1,000,000, where held-out evaluation starts) and are
    played through the real env; kept: wins and draws (games) or solved episodes (the rest).

    Args:
        env_id: an env with a solver (gymllm/TicTacToe-v0, ConnectFour-v0, FrozenLake-v0, FrozenLake8x8-v0,
            Arithmetic-v0, ArithmeticTool-v0, CalcMath-v0).
        n: episodes to play.
        out: the JSONL file to write.
        seed: the first seed.
        env_kwargs: env constructor arguments as a JSON object, e.g. '{"is_slippery": false}'.
        demo_policy: solver: the env's solver plays (kept: wins and draws, or solved episodes); uniform: uniformly
            random legal moves of a game seat, every episode kept (teaches the move syntax, not a strategy); first:
            the first legal move every time, every episode kept (the syntax and a state-blind strategy).
        env: the system prompt and agent kind of the run that will train on the records (--env.system-prompt,
            --env.agent, as train's).
    """
    from gymllm.envs.demos import demonstrations, full_id, solver_for, write_demos

    records = demonstrations(
        env_id,
        n=n,
        seed=seed,
        env_kwargs=_env_kwargs(env_kwargs),
        system_prompt=env.system_prompt,
        agent=env.agent,
        policy=demo_policy,
    )
    path = write_demos(out, records)
    full = full_id(env_id)
    kept = solver_for(full, demo_policy).kept
    if not records:
        print(
            f"error: no episode of {full} was solved on seeds {seed}..{seed + n - 1} ({kept} are kept); "
            f"{path} is empty.",
            file=sys.stderr,
        )
        print(
            "hint: check --env-kwargs (e.g. a FrozenLake map whose goal can be reached)",
            file=sys.stderr,
        )
        return 1
    mean = sum(r["reward"] for r in records) / len(records)
    turns = sum(sum(m["role"] == "assistant" for m in r["messages"]) for r in records) / len(
        records
    )
    print(
        f"wrote {len(records)} of {n} episodes of {full} (seeds {seed}..{seed + n - 1}; kept: {kept}) to {path}"
    )
    print(f"mean reward {mean:.3f}; {turns:.1f} assistant turns per episode")
    run = "runs/sft-" + re.sub(r"[^A-Za-z0-9]+", "-", full.split("/")[-1]).strip("-").lower()
    print(f"next: gymllm sft {path} --run.run-dir {run}")
    return 0
