"""Where a value two components share is wired, once, as a constructor argument: each setting has one
field in :class:`~gymllm.train.train_config.TrainConfig`, and these give each part of a run what it
reads from more than its own section.

    learner_kwargs(cfg)   every learner of the run: its sections, the sampler's temperature, the sample
                          budget (``TrainConfig.sample_budget``), the engine's context, the rollout's
                          staleness bound, the loss (with a game's ``role_ema`` baseline: :func:`learner_loss`)
    engine_config(cfg)    the engine's config, seeded with ``run.seed``
    eval_config(cfg)      the held-out evaluation (``eval``, with the rollout's turns and concurrency)
    watchdog_config(cfg)  the stage watchdog (``run.stall_timeout_s``)

The group sources get ``run.seed`` and ``learner.groups_per_step`` where they are built
(:data:`gymllm.train.assembly.KINDS`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gymllm.train.train_config import TrainConfig

__all__ = ["learner_kwargs", "learner_loss", "engine_config", "eval_config", "watchdog_config"]


def learner_loss(cfg: TrainConfig) -> Any:
    """The learner's :class:`~gymllm.algos.config.LossConfig`: ``cfg.loss``, with the advantage estimator
    ``role_ema`` (decay ``multiagent.baseline_decay``) when a game trains with ``multiagent.baseline =
    "role_ema"``; with ``"group"`` the run's estimator as it is."""
    if cfg.multiagent.baseline != "role_ema":
        return cfg.loss
    advantage = dataclasses.replace(
        cfg.loss.advantage, estimator="role_ema", ema_decay=cfg.multiagent.baseline_decay
    )
    return dataclasses.replace(cfg.loss, advantage=advantage)


def learner_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The keyword arguments every learner of the run is built with (besides the model, mesh and pad
    id): its own sections, and the values it shares with the sampler, the engine and the group source."""
    return dict(
        loss=learner_loss(cfg),
        optimizer=cfg.optimizer,
        config=cfg.learner,
        temperature=cfg.sampling.temperature,
        sample_budget=cfg.sample_budget,
        context_len=cfg.engine.max_len,
        default_staleness=cfg.rollout.max_staleness,
    )


def engine_config(cfg: TrainConfig) -> Any:
    """The run's :class:`~gymllm.inference.EngineConfig`: ``cfg.engine`` seeded with ``run.seed`` (the
    engine's keys for requests without a seed, e.g. an agent program's)."""
    return dataclasses.replace(cfg.engine, seed=cfg.run.seed)


def eval_config(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.rollout.evaluation.EvalConfig` of the in-run held-out evaluation (``eval``)."""
    from gymllm.inference.params import SamplingParams
    from gymllm.rollout.evaluation import EvalConfig

    e, r = cfg.eval, cfg.rollout
    sampling = SamplingParams(
        temperature=e.temperature, max_tokens=e.max_tokens or cfg.sampling.max_tokens
    )
    return EvalConfig(
        seeds=e.seeds,
        k=1,
        seed_base=e.seed_base,
        sampling=sampling,
        max_turns=r.max_model_calls,
        max_concurrency=r.max_concurrency,
    )


def watchdog_config(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.telemetry.watchdog.WatchdogConfig` of the run (``run.stall_timeout_s``)."""
    from gymllm.telemetry.watchdog import WatchdogConfig

    return WatchdogConfig(stall_s=cfg.run.stall_timeout_s)
