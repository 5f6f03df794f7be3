"""The Optax optimizer of the learner: AdamW with a learning-rate schedule, global-norm clipping and
decoupled weight decay, from one frozen :class:`OptimizerConfig`."""

from __future__ import annotations

import dataclasses

import optax

from gymllm.validation import check_choice, check_range


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The optimizer and its learning-rate schedule."""

    name: str = "adamw"
    """adamw | sgd (plain SGD: an update exactly linear in the gradient)."""
    learning_rate: float = 1e-5
    """The peak learning rate."""
    schedule: str = "constant"
    """constant | cosine | linear (decay to end_lr_fraction of the peak over decay_steps)."""
    warmup_steps: int = 0
    """Steps of linear warm-up from 0 to the peak."""
    decay_steps: int = 0
    """Steps the cosine / linear decay takes (0 = the learner's num_steps)."""
    end_lr_fraction: float = 0.0
    """The decayed learning rate as a fraction of the peak."""
    b1: float = 0.9
    """AdamW's first-moment decay."""
    b2: float = 0.999
    """AdamW's second-moment decay."""
    eps: float = 1e-8
    """AdamW's epsilon."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    max_grad_norm: float = 1.0
    """Clip gradients by global norm (0 = off)."""

    def __post_init__(self) -> None:
        check_choice("OptimizerConfig", "name", self.name, ("adamw", "sgd"))
        check_range("OptimizerConfig", "learning_rate", self.learning_rate, lo=0.0, lo_open=True)
        check_choice("OptimizerConfig", "schedule", self.schedule, ("constant", "cosine", "linear"))
        check_range("OptimizerConfig", "warmup_steps", self.warmup_steps, lo=0)
        check_range("OptimizerConfig", "decay_steps", self.decay_steps, lo=0)
        check_range("OptimizerConfig", "end_lr_fraction", self.end_lr_fraction, lo=0.0, hi=1.0)
        check_range("OptimizerConfig", "b1", self.b1, lo=0.0, hi=1.0)
        check_range("OptimizerConfig", "b2", self.b2, lo=0.0, hi=1.0)
        check_range("OptimizerConfig", "weight_decay", self.weight_decay, lo=0.0)
        check_range("OptimizerConfig", "max_grad_norm", self.max_grad_norm, lo=0.0)


def _decay(cfg: OptimizerConfig, steps: int) -> optax.Schedule:
    lr, end = cfg.learning_rate, cfg.learning_rate * cfg.end_lr_fraction
    table = {
        "constant": lambda: optax.constant_schedule(lr),
        "cosine": lambda: optax.cosine_decay_schedule(lr, max(steps, 1), alpha=cfg.end_lr_fraction),
        "linear": lambda: optax.linear_schedule(lr, end, max(steps, 1)),
    }
    return table[cfg.schedule]()


def make_schedule(cfg: OptimizerConfig, num_steps: int) -> optax.Schedule:
    decay = _decay(cfg, (cfg.decay_steps or num_steps) - cfg.warmup_steps)
    if cfg.warmup_steps == 0:
        return decay
    warm = optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    return optax.join_schedules([warm, decay], [cfg.warmup_steps])


def make_optimizer(cfg: OptimizerConfig, num_steps: int) -> optax.GradientTransformation:
    parts = [optax.clip_by_global_norm(cfg.max_grad_norm)] if cfg.max_grad_norm > 0 else []
    lr = make_schedule(cfg, num_steps)
    if cfg.name == "sgd":
        parts += [optax.add_decayed_weights(cfg.weight_decay)] if cfg.weight_decay else []
        parts.append(optax.sgd(lr))
    else:
        parts.append(
            optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
        )
    return optax.chain(*parts)
