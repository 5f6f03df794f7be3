"""The training config mapped onto the components' own configs: one function per component config,
each reading the :class:`~gymllm.algos.train_config.TrainConfig` sections it needs (the one place
that knows both vocabularies; :class:`~gymllm.algos.run.Run`, the components and the Ray wiring call
these and never map a section by hand).

    engine_config(cfg)          -> gymllm.inference.EngineConfig        (one per engine replica)
    sampling_params(cfg)        -> gymllm.inference.SamplingParams      (training rollouts)
    rollout_config(cfg)         -> gymllm.rollout.RolloutConfig         (orchestrator / sync baseline)
    proxy_source_config(cfg)    -> gymllm.rollout.proxy_source.ProxySourceConfig
    eval_config(cfg)            -> gymllm.rollout.evaluation.EvalConfig (held-out evaluation)
    watchdog_config(cfg)        -> gymllm.telemetry.watchdog.WatchdogConfig
"""

from __future__ import annotations

from typing import Any

from gymllm.algos.train_config import TrainConfig

__all__ = ["engine_config", "sampling_params", "rollout_config", "proxy_source_config", "eval_config",
           "watchdog_config"]


def engine_config(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.inference.EngineConfig` the rollout section describes (one per replica)."""
    from gymllm.inference.config import EngineConfig

    r = cfg.rollout
    return EngineConfig(num_slots=r.engine_slots, max_len=r.engine_max_len, prefix_reuse=r.prefix_reuse,
                        min_bucket=min(64, r.engine_max_len), seed=cfg.run.seed, idle_wait_s=0.002,
                        compute_dtype=r.engine_compute_dtype)


def sampling_params(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.inference.SamplingParams` of training rollouts."""
    from gymllm.inference.params import SamplingParams

    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens)


def rollout_config(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.rollout.RolloutConfig` of the run's group source (``num_groups`` unbounded:
    the run stops at its step count)."""
    from gymllm.rollout.config import RolloutConfig

    r, gps = cfg.rollout, cfg.learner.groups_per_step
    return RolloutConfig(group_size=r.group_size, max_concurrency=r.max_concurrency, max_staleness=r.eta,
                         groups_per_step=gps, queue_size=max(8, 2 * gps), seed=cfg.run.seed,
                         max_model_calls=r.max_turns, group_timeout_s=r.group_timeout_s)


def proxy_source_config(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.rollout.proxy_source.ProxySourceConfig` of ``rollout.mode="proxy"``."""
    from gymllm.rollout.proxy_source import ProxySourceConfig

    return ProxySourceConfig(group_size=cfg.rollout.group_size, max_queued_groups=rollout_config(cfg).queue_size,
                             max_staleness=cfg.rollout.eta)


def eval_config(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.rollout.evaluation.EvalConfig` of the in-run held-out evaluation (``eval``)."""
    from gymllm.rollout.evaluation import EvalConfig

    e, r = cfg.eval, cfg.rollout
    return EvalConfig(num_seeds=e.seeds, k=1, seed_base=e.seed_base, temperature=e.temperature,
                      max_tokens=e.max_tokens or r.max_tokens, max_turns=r.max_turns, max_concurrency=r.max_concurrency)


def watchdog_config(cfg: TrainConfig) -> Any:
    """The :class:`~gymllm.telemetry.watchdog.WatchdogConfig` of the run (``run.stall_timeout_s``)."""
    from gymllm.telemetry.watchdog import WatchdogConfig

    return WatchdogConfig(stall_s=cfg.run.stall_timeout_s)
