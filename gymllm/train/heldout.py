"""Held-out evaluation inside a training run (``eval.every``): the seeds it uses, checked disjoint
from training's (:func:`check_heldout_seeds`), and :class:`HeldOutHook`, which evaluates the policy
just pushed at step 0, every ``eval.every`` steps and at the last step.
"""

from __future__ import annotations

import time
from typing import Any

from gymllm.train.wiring import eval_config
from gymllm.train.resume import filter_patience
from gymllm.train.train_config import TrainConfig
from gymllm.validation import require
from gymllm.utils.seeds import HELD_OUT_SEED_BASE

__all__ = ["HeldOutHook", "training_seed_bound", "check_heldout_seeds"]


def training_seed_bound(cfg: TrainConfig) -> int:
    """How many env seeds (``run.seed`` upwards) training reaches unless groups go stale or fail:
    ``num_steps * groups_per_step`` trained groups, up to ``patience - 1`` zero-variance groups filtered
    before each kept one (:func:`~gymllm.train.resume.make_group_filter` keeps the ``patience``-th), plus the groups still open
    (:attr:`~gymllm.rollout.config.RolloutConfig.open_group_limit`, ``max_open_groups`` included) or queued
    when the run stops. Stale-dropped and failed groups have no static bound: the run checks
    each group's seed as it completes (:class:`~gymllm.train.step_log.RolloutTally`)."""
    gps = cfg.learner.groups_per_step
    patience = filter_patience(gps) if cfg.loss.shaping.filter_zero_variance else 1
    return cfg.learner.num_steps * gps * patience + cfg.rollout.open_group_limit + max(8, 2 * gps)


def check_heldout_seeds(cfg: TrainConfig) -> range | None:
    """The held-out seeds (``eval.seed_base ..``), after checking that they cannot meet a training seed
    (:func:`training_seed_bound`); None when evaluation is off. Raises :class:`ConfigError`."""
    e = cfg.eval
    if not e.every:
        return None
    require(
        cfg.rollout.mode != "proxy",
        "eval.every",
        expected="0 with rollout.mode='proxy' (the agent program picks its own "
        "tasks, so held-out seeds cannot be checked)",
        received=e.every,
        fix="evaluate the run directory afterwards: gymllm eval env ENV --model.checkpoint RUN_DIR",
    )
    heldout = range(e.seed_base, e.seed_base + e.seeds)
    train = range(cfg.run.seed, cfg.run.seed + training_seed_bound(cfg))
    require(
        heldout.start >= train.stop or train.start >= heldout.stop,
        "eval.seed_base",
        expected=f"held-out seeds disjoint from the training seeds "
        f"{train.start}..{train.stop - 1} (run.seed + up to {len(train)} groups)",
        received=f"seeds {heldout.start}..{heldout.stop - 1}",
        fix=f"--eval.seed-base "
        f"{max(HELD_OUT_SEED_BASE, train.stop)} (or fewer steps / a lower run.seed)",
    )
    return heldout


class HeldOutHook:
    """The run's held-out evaluation: inactive unless ``eval.every``. ``open(agent, tok)`` builds the
    :class:`~gymllm.rollout.evaluation.HeldOutEvaluator`; ``evals``: every row so far (step, env,
    pass@1, mean_reward, seeds, ...)."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.evaluator: Any = None
        self.evals: list[dict[str, Any]] = []
        self.last_rows: list[dict[str, Any]] = []  # the rows of the latest evaluation

    @property
    def active(self) -> bool:
        return self.evaluator is not None

    def open(self, agent: Any, tok: Any) -> None:
        """The evaluator of ``cfg.eval``: the training env (its kwargs and the run's ``agent``) unless
        ``eval.envs`` names others (each with the agent its reset asks for), or ``eval.suite`` (else, in a
        mixture run, ``env.suite``) a suite: its envs with their tables' kwargs, played by the run's agent.
        A multi-agent game (neither ``eval.envs`` nor a suite) gets its learning curve instead: games against
        ``multiagent.eval_opponents`` (:class:`~gymllm.suites.game_eval.GameEvaluator`)."""
        from gymllm.rollout.evaluation import HeldOutEvaluator, agent_for

        cfg, e = self.cfg, self.cfg.eval
        if not e.every:
            return
        if not (e.suite or e.envs):  # a multi-agent game: its learning curve against fixed players
            from gymllm.multiagent.factory import game_factory

            make = game_factory(cfg.env.id, dict(cfg.env.kwargs))
            if make is not None:
                from gymllm.suites.game_eval import GameEvaluator

                ma = cfg.multiagent
                self.evaluator = GameEvaluator(
                    make,
                    agent,
                    opponents=ma.eval_opponents,
                    games=ma.eval_games,
                    seed=e.seed_base,
                    temperature=e.temperature,
                    max_tokens=e.max_tokens or cfg.sampling.max_tokens,
                )
                return
        suite = e.suite or (cfg.env.suite if not e.envs else "")
        if (
            suite
        ):  # a suite's envs, each with its table's kwargs, agent and system prompt (else the run's)
            from gymllm.suites import load_suite

            specs = [
                (
                    s.id,
                    dict(s.kwargs),
                    agent_for(
                        s.id,
                        tok,
                        dict(s.kwargs),
                        system_prompt=s.system_prompt or cfg.env.system_prompt or None,
                        agent=s.agent,
                    ),
                )
                for s in load_suite(suite).envs
            ]
        else:
            specs = (
                [(cfg.env.id, dict(cfg.env.kwargs), agent)]
                if not e.envs
                else [
                    (i, dict(cfg.env.kwargs), agent)
                    if i == cfg.env.id
                    else (i, {}, agent_for(i, tok))
                    for i in e.envs
                ]
            )
        self.evaluator = HeldOutEvaluator(specs, config=eval_config(cfg), num_envs=cfg.env.num_envs)

    def due(self, step: int, last: bool) -> bool:
        """Whether to evaluate after ``step`` (``last``: the run's final step)."""
        every = self.cfg.eval.every
        return self.active and bool(every) and (step % every == 0 or last)

    async def evaluate(self, engine: Any, step: int) -> dict[str, float]:
        """Evaluate on ``engine`` at policy ``step`` (live on it): rows into ``evals``; returns the
        ``eval/<env>/...`` metrics and ``eval_s`` (the seconds it took)."""
        from gymllm.rollout.evaluation import eval_metrics

        t = time.perf_counter()
        rows = await self.evaluator.evaluate(engine, step)
        dt = time.perf_counter() - t
        self.evals += rows
        self.last_rows = list(rows)
        metrics = getattr(
            self.evaluator, "metrics", eval_metrics
        )  # a game's: eval/vs/<opponent>/...
        out = {k: v for row in rows for k, v in metrics(row).items()}
        out["eval_s"] = dt
        return out

    def close(self) -> None:
        if self.evaluator is not None:
            self.evaluator.close()
