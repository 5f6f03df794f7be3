"""Run directories for the viewer tests, written with the project's own writers: metrics with
:class:`~gymllm.telemetry.sinks.MetricsLogger`, episodes of a real env (``gymllm/ArithmeticTool-v0``,
with a calculator tool call) with :class:`~gymllm.wrappers.TrajectoryLogger` and its token arrays,
plus a suite ``summary.json`` (the shape issue 31 specifies) and a ``gymllm eval env --out`` table."""

from __future__ import annotations

import json
import pathlib

import gymllm
from gymllm.models.tiny import tiny_tokenizer
from gymllm.telemetry.sinks import MetricsLogger
from gymllm.wrappers import TrajectoryLogger

TOOL_ACTION = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "52 - 56"}}\n</tool_call>'
)


def metrics_record(step: int) -> dict:
    """The metrics of one step of the synthetic run (a step's worth of the names the trainer logs)."""
    return {
        "rollout_reward_mean": 0.1 * step,
        "reward_mean": 0.15 * step,
        "loss": 1.0 / step,
        "kl": 0.01 * step,
        "staleness_mean": 0.5,
        "trainer_idle_fraction": 0.3,
        "engine_busy_fraction": 0.9,
        "tool_calls_per_episode": 1.0,
        "eval/gymllm/ArithmeticTool-v0/pass@1": 0.2 * step,
    }


def write_episode_run(root: pathlib.Path, *, episodes: int = 3, steps: int = 3) -> pathlib.Path:
    """A run directory: config.json (tiny model), metrics.jsonl, and a TrajectoryLogger log under
    ``trajectories/`` whose episodes each make a tool call then answer; every action's tokens are
    recorded with logprobs ``-0.25 * (i % 12)``, policy version = episode number, and an advantage note."""
    run = root / "episodes-run"
    run.mkdir(parents=True)
    (run / "config.json").write_text(
        json.dumps(
            {
                "model": {"name": "tiny-qwen3", "vocab_size": 512},
                "env": {"id": "gymllm/ArithmeticTool-v0"},
                "loss": {"advantage": {"estimator": "grpo"}},
            }
        )
    )
    logger = MetricsLogger(run, console=False, tensorboard=False, pipeline=False, trace=False)
    for step in range(1, steps + 1):
        logger.log(step, metrics_record(step))
    logger.close()
    tok = tiny_tokenizer(512)
    env = TrajectoryLogger(
        gymllm.make("gymllm/ArithmeticTool-v0"), run / "trajectories", name="env-000"
    )
    for k in range(episodes):
        obs, info = env.reset(seed=k)
        prompt = tok.encode(obs[-1]["content"])
        for action in (TOOL_ACTION, "The answer is \\boxed{%s}" % info["answer"]):
            obs, reward, terminated, truncated, step_info = env.step(action)
            ids = tok.encode(action)
            env.record_tokens(
                token_ids=prompt + ids,
                loss_mask=[0] * len(prompt) + [1] * len(ids),
                logprobs=[0.0] * len(prompt) + [-0.25 * (i % 12) for i in range(len(ids))],
                versions=[-1] * len(prompt) + [k] * len(ids),
            )
            env.annotate(policy_version=k, advantage=0.75 * (k - 1))
            prompt = []
            if terminated or truncated:
                break
    env.close()
    return run


def write_suite(root: pathlib.Path) -> pathlib.Path:
    """A suite evaluation's ``summary.json``: two policies on two envs, pass@k, reward intervals and
    one paired comparison per env."""
    d = root / "suite-eval"
    d.mkdir(parents=True)
    results = []
    for policy, base in (("base", 0.3), ("trained", 0.6)):
        for env, shift in (("gymllm/Arithmetic-v0", 0.0), ("gymllm/Countdown-v0", -0.2)):
            m = base + shift
            results.append(
                {
                    "policy": policy,
                    "env": env,
                    "n": 32,
                    "pass_at": {"1": m, "4": min(1.0, m + 0.2)},
                    "mean_reward_ci": {"mean": m, "lo": m - 0.1, "hi": m + 0.1},
                }
            )
    comparisons = [
        {"env": env, "a": "trained", "b": "base", "diff": 0.3, "ci": [0.15, 0.45], "p_value": 0.01}
        for env in ("gymllm/Arithmetic-v0", "gymllm/Countdown-v0")
    ]
    (d / "summary.json").write_text(
        json.dumps(
            {
                "suite": "smoke",
                "policies": ["base", "trained"],
                "results": results,
                "comparisons": comparisons,
            }
        )
    )
    return d


def write_eval_rows(root: pathlib.Path) -> pathlib.Path:
    """What ``gymllm eval ... --out eval.json`` writes: a list of rows, one per env."""
    p = root / "eval.json"
    p.write_text(
        json.dumps(
            [
                {
                    "env": "gymllm/Arithmetic-v0",
                    "mean_reward": 0.4,
                    "pass@1": 0.4,
                    "pass@4": 0.7,
                    "episodes": 64,
                },
                {
                    "env": "gymllm/Countdown-v0",
                    "mean_reward": 0.1,
                    "pass@1": 0.1,
                    "pass@4": 0.25,
                    "episodes": 64,
                },
            ],
            indent=2,
        )
    )
    return p
