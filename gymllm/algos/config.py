"""Frozen, keyword-only configs of the GRPO loss family, validated on creation, and the presets.

One dataclass per component: :class:`AdvantageConfig`, :class:`PolicyLossConfig`,
:class:`CorrectionConfig`, :class:`KLConfig`, :class:`ShapingConfig`, composed by :class:`LossConfig`.
Presets: ``grpo`` (DeepSeekMath / Tunix-like), ``dapo``, ``dr_grpo``, ``gspo`` and ``async_agentic``
(the default: train against the sampler with token TIS, eps 0.2/0.28, no KL, global token-mean).
"""

from __future__ import annotations

import dataclasses

from gymllm.validation import check_choice, check_range, require


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdvantageConfig:
    """How rewards become advantages."""

    estimator: str = "grpo"
    """grpo | dr_grpo | rloo | batch_std | role_ema (SPIRAL's role-conditioned EMA baseline, R - b[role], no
    normalization; a run on a game sets it with --multiagent.baseline role_ema)."""
    ddof: int = 0
    """0 (population) or 1 (Bessel)."""
    eps: float = 1e-6
    """The epsilon of the std normalization (see eps_placement)."""
    eps_placement: str = "std"
    """"std" (std + eps) or "var" (sqrt(var + eps))."""
    ema_decay: float = 0.95
    """role_ema's decay (``b <- decay * b + (1 - decay) * R``)."""
    ema_scale: bool = False
    """role_ema only: also divide each advantage by its key's running spread (an EMA of ``(R - b)**2``, same
    decay), so a role or card whose payoffs spread little teaches as loudly as one whose spread is large
    (:func:`gymllm.multiagent.baseline.group_role_advantages`); False: centred only, as SPIRAL's RAE."""
    ema_scale_floor: float = 0.25
    """With ema_scale, the least spread an advantage is divided by (a key whose rewards stopped varying would
    otherwise turn its next deviation into a huge advantage)."""

    def __post_init__(self) -> None:
        from gymllm.algos.advantages import ESTIMATORS, STATEFUL

        check_choice(
            "AdvantageConfig", "estimator", self.estimator, (*ESTIMATORS, *sorted(STATEFUL))
        )
        check_range("AdvantageConfig", "ema_decay", self.ema_decay, lo=0.0, hi=1.0)
        check_range(
            "AdvantageConfig", "ema_scale_floor", self.ema_scale_floor, lo=0.0, lo_open=True
        )
        check_choice("AdvantageConfig", "ddof", self.ddof, (0, 1))
        check_range("AdvantageConfig", "eps", self.eps, lo=0.0)
        check_choice("AdvantageConfig", "eps_placement", self.eps_placement, ("std", "var"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyLossConfig:
    """The policy objective; the clip range is [1 - eps_low, 1 + eps_high]."""

    objective: str = "ppo"
    """ppo | cispo."""
    ratio_level: str = "token"
    """token | sequence (GSPO)."""
    ratio_against: str = "behaviour"
    """behaviour (the sampler's logprobs mu) | proximal (the trainer's own logprobs at the step's start, decoupled
    PPO)."""
    eps_low: float = 0.2
    """The clip range's lower side: ratios below 1 - eps_low are clipped."""
    eps_high: float = 0.28
    """The clip range's upper side: ratios above 1 + eps_high are clipped."""
    dual_clip: float | None = None
    """None or c > 1 (applies when A < 0)."""

    def __post_init__(self) -> None:
        check_choice("PolicyLossConfig", "objective", self.objective, ("ppo", "cispo"))
        check_choice("PolicyLossConfig", "ratio_level", self.ratio_level, ("token", "sequence"))
        check_choice(
            "PolicyLossConfig", "ratio_against", self.ratio_against, ("behaviour", "proximal")
        )
        check_range("PolicyLossConfig", "eps_low", self.eps_low, lo=0.0, hi=1.0)
        check_range("PolicyLossConfig", "eps_high", self.eps_high, lo=0.0)
        if self.dual_clip is not None:
            check_range("PolicyLossConfig", "dual_clip", self.dual_clip, lo=1.0, lo_open=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorrectionConfig:
    """Off-policy corrections of the token weights."""

    kinds: tuple[str, ...] = ()
    """Any of tis | mis | geo_mask (their weights multiply); empty: none."""
    tis_cap: float = 2.0
    """Truncated importance sampling's cap C on the token ratio."""
    mis_low: float = 0.5
    """Masked importance sampling: tokens whose ratio is below this are masked."""
    mis_high: float = 2.0
    """Masked importance sampling: tokens whose ratio is above this are masked."""
    geo_low: float = 0.99
    """Geometric sequence mask: sequences whose geometric-mean ratio is below this are masked."""
    geo_high: float = 1.01
    """Geometric sequence mask: sequences whose geometric-mean ratio is above this are masked."""

    def __post_init__(self) -> None:
        for k in self.kinds:
            check_choice("CorrectionConfig", "kinds", k, ("tis", "mis", "geo_mask"))
        check_range("CorrectionConfig", "tis_cap", self.tis_cap, lo=0.0, lo_open=True)
        check_range("CorrectionConfig", "mis_low", self.mis_low, lo=0.0, hi=self.mis_high)
        check_range("CorrectionConfig", "geo_low", self.geo_low, lo=0.0, hi=self.geo_high)

    def params(self) -> dict[str, float]:
        return dict(
            cap=self.tis_cap,
            low=self.mis_low,
            high=self.mis_high,
            geo_low=self.geo_low,
            geo_high=self.geo_high,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class KLConfig:
    """The KL penalty to the reference model."""

    beta: float = 0.0
    """0 disables KL and the reference model entirely."""
    estimator: str = "k3"
    """k1 | k2 | k3."""
    placement: str = "loss"
    """loss (a KL term in the loss) | reward (a per-sequence penalty on the reward)."""

    def __post_init__(self) -> None:
        check_range("KLConfig", "beta", self.beta, lo=0.0)
        check_choice("KLConfig", "estimator", self.estimator, ("k1", "k2", "k3"))
        check_choice("KLConfig", "placement", self.placement, ("loss", "reward"))

    @property
    def needs_reference(self) -> bool:
        return self.beta > 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShapingConfig:
    """Reward shaping and group filtering."""

    filter_zero_variance: bool = False
    """drop groups whose rewards are all equal (counted, not trained)."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment over the last overlong_buffer sampled tokens before overlong_max_len (0 = off)."""
    overlong_max_len: int = 0
    """The overlong punishment's length (0 = the run's sample budget, sampling.max_tokens *
    rollout.max_model_calls)."""

    def __post_init__(self) -> None:
        check_range("ShapingConfig", "overlong_buffer", self.overlong_buffer, lo=0)
        check_range("ShapingConfig", "overlong_max_len", self.overlong_max_len, lo=0)
        require(
            not self.overlong_buffer
            or not self.overlong_max_len
            or self.overlong_buffer <= self.overlong_max_len,
            "ShapingConfig.overlong_buffer",
            expected=f"<= overlong_max_len ({self.overlong_max_len})",
            received=self.overlong_buffer,
            fix="use a buffer shorter than the response budget",
        )


AGGREGATION_MODES = (
    "token_mean",
    "micro_token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "constant",
    "prompt_mean",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    """The whole loss: advantages, policy loss, corrections, KL, aggregation mode, shaping and an
    optional entropy bonus (``entropy_coef`` > 0 rewards entropy)."""

    advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
    """How rewards become advantages (estimator, normalization)."""
    policy: PolicyLossConfig = dataclasses.field(default_factory=PolicyLossConfig)
    """The policy objective (PPO clip or CISPO, token or sequence ratios)."""
    correction: CorrectionConfig = dataclasses.field(default_factory=CorrectionConfig)
    """Off-policy corrections (truncated / masked importance sampling, geometric mask)."""
    kl: KLConfig = dataclasses.field(default_factory=KLConfig)
    """The KL penalty to a reference model (beta 0: no reference at all)."""
    shaping: ShapingConfig = dataclasses.field(default_factory=ShapingConfig)
    """Reward shaping and group filtering (zero-variance filter, overlong penalty)."""
    aggregation: str = "token_mean"
    """How token losses are averaged: token_mean | micro_token_mean | seq_mean_token_mean | seq_mean_token_sum |
    constant (Dr. GRPO)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (> 0 rewards entropy; 0 = off)."""

    def __post_init__(self) -> None:
        for name, typ in (
            ("advantage", AdvantageConfig),
            ("policy", PolicyLossConfig),
            ("correction", CorrectionConfig),
            ("kl", KLConfig),
            ("shaping", ShapingConfig),
        ):
            require(
                isinstance(getattr(self, name), typ),
                f"LossConfig.{name}",
                expected=f"a {typ.__name__}",
                received=getattr(self, name),
                fix=f"pass {name}={typ.__name__}(...)",
            )
        check_choice("LossConfig", "aggregation", self.aggregation, AGGREGATION_MODES)
        check_range("LossConfig", "entropy_coef", self.entropy_coef, lo=0.0)


def grpo() -> LossConfig:
    """DeepSeekMath / Tunix-like GRPO: group z-score, clip 0.2, seq-mean-token-mean, k3 KL in the loss, beta 0.04."""
    return LossConfig(
        advantage=AdvantageConfig(estimator="grpo", ddof=0, eps=1e-6),
        policy=PolicyLossConfig(eps_low=0.2, eps_high=0.2),
        kl=KLConfig(beta=0.04, estimator="k3", placement="loss"),
        aggregation="seq_mean_token_mean",
    )


def dapo() -> LossConfig:
    """DAPO: clip-higher 0.2/0.28, global token-mean, no KL, zero-variance groups filtered."""
    return LossConfig(
        policy=PolicyLossConfig(eps_low=0.2, eps_high=0.28),
        shaping=ShapingConfig(filter_zero_variance=True),
        aggregation="token_mean",
    )


def dr_grpo() -> LossConfig:
    """Dr. GRPO: centred rewards (no std), token sums divided by the constant N_seq * L_max."""
    return LossConfig(
        advantage=AdvantageConfig(estimator="dr_grpo"),
        policy=PolicyLossConfig(eps_low=0.2, eps_high=0.2),
        aggregation="constant",
    )


def gspo() -> LossConfig:
    """GSPO: sequence-level ratio, clip 3e-4 / 4e-4, per-sequence aggregation."""
    return LossConfig(
        policy=PolicyLossConfig(ratio_level="sequence", eps_low=3e-4, eps_high=4e-4),
        aggregation="seq_mean_token_mean",
    )


def async_agentic() -> LossConfig:
    """Async agentic default: ratio against the trainer's own (proximal) logprobs with token TIS (C = 2)
    against the sampler, clip 0.2/0.28, no KL, global token-mean, zero-variance groups filtered."""
    return LossConfig(
        policy=PolicyLossConfig(ratio_against="proximal", eps_low=0.2, eps_high=0.28),
        correction=CorrectionConfig(kinds=("tis",), tis_cap=2.0),
        shaping=ShapingConfig(filter_zero_variance=True),
        aggregation="token_mean",
    )


PRESETS = {
    "grpo": grpo,
    "dapo": dapo,
    "dr_grpo": dr_grpo,
    "gspo": gspo,
    "async_agentic": async_agentic,
}


def loss_preset(name: str) -> LossConfig:
    check_choice("loss preset", "name", name, PRESETS)
    return PRESETS[name]()
