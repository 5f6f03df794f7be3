"""The configs of the parts a training run builds from several of its sections. The engine, the
sampler and the orchestrator take the run's own ``cfg.engine``, ``cfg.sampling`` and ``cfg.rollout``
as they are (:class:`~gymllm.algos.train_config.TrainConfig` is composed of them); these are the
rest, each derived in the open from the sections it reads:

    proxy_source_config(cfg)    -> gymllm.rollout.proxy_source.ProxySourceConfig
    eval_config(cfg)            -> gymllm.rollout.evaluation.EvalConfig (held-out evaluation)
    watchdog_config(cfg)        -> gymllm.telemetry.watchdog.WatchdogConfig
    learner_loss(cfg)           -> gymllm.algos.config.LossConfig (the run's, with a game's baseline)
"""

from __future__ import annotations

from typing import Any

from gymllm.algos.train_config import TrainConfig

__all__ = ["proxy_source_config", "eval_config", "watchdog_config", "learner_loss"]


def proxy_source_config(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.rollout.proxy_source.ProxySourceConfig` of ``rollout.mode="proxy"``."""
    from gymllm.rollout.proxy_source import ProxySourceConfig

    return ProxySourceConfig(group_size=cfg.rollout.group_size, max_queued_groups=cfg.rollout.queue_size,
                             max_staleness=cfg.rollout.max_staleness)


def eval_config(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.rollout.evaluation.EvalConfig` of the in-run held-out evaluation (``eval``)."""
    from gymllm.inference.params import SamplingParams
    from gymllm.rollout.evaluation import EvalConfig

    e, r = cfg.eval, cfg.rollout
    sampling = SamplingParams(temperature=e.temperature, max_tokens=e.max_tokens or cfg.sampling.max_tokens)
    return EvalConfig(seeds=e.seeds, k=1, seed_base=e.seed_base, sampling=sampling, max_turns=r.max_model_calls,
                      max_concurrency=r.max_concurrency)


def watchdog_config(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.telemetry.watchdog.WatchdogConfig` of the run (``run.stall_timeout_s``)."""
    from gymllm.telemetry.watchdog import WatchdogConfig

    return WatchdogConfig(stall_s=cfg.run.stall_timeout_s)


def learner_loss(cfg: TrainConfig) -> Any:
    """The learner's :class:`~gymllm.algos.config.LossConfig`: ``cfg.loss``, with the advantage estimator
    ``role_ema`` (decay ``multiagent.baseline_decay``) when a game trains with ``multiagent.baseline =
    "role_ema"``; with ``"group"`` the run's estimator as it is."""
    import dataclasses

    if cfg.multiagent.baseline != "role_ema":
        return cfg.loss
    advantage = dataclasses.replace(cfg.loss.advantage, estimator="role_ema", ema_decay=cfg.multiagent.baseline_decay)
    return dataclasses.replace(cfg.loss, advantage=advantage)
