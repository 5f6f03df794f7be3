"""Reward transforms as pure functions composed by one wrapper.

    env = RewardTransform(env, step_penalty=0.01, scale=2.0, clip=(-1.0, 1.0))
    env = RewardTransform(env, terminal_only=True)       # the episode's sum, paid on its last step
    env = TransformReward(env, lambda r: r ** 2)         # any function of the reward

Order per step: ``r - step_penalty`` -> ``r * scale + shift`` -> ``clip(r, low, high)``; with
``terminal_only`` the transformed rewards are summed and paid on the final step (0 before), the
outcome-reward form GRPO uses. ``info["raw_reward"]`` keeps the untransformed reward.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import gymnasium as gym

from gymllm.core import areset_env, astep_env
from gymllm.errors import ConfigError, explain


def penalize(r: float, penalty: float) -> float:
    return r - penalty


def scale_shift(r: float, scale: float, shift: float) -> float:
    return r * scale + shift


def clip(r: float, low: float, high: float) -> float:
    return min(max(r, low), high)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardTransformConfig:
    """step_penalty subtracted per step; then ``scale``/``shift``; then ``clip=(low, high)``; then
    ``terminal_only`` (pay the sum on the last step)."""

    step_penalty: float = 0.0
    scale: float = 1.0
    shift: float = 0.0
    clip: tuple[float, float] | None = None
    terminal_only: bool = False

    def __post_init__(self) -> None:
        for name in ("step_penalty", "scale", "shift"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(
                    explain(
                        f"RewardTransformConfig.{name}",
                        expected="a finite number",
                        received=v,
                        fix=f"pass {name}=<float>",
                    )
                )
        if self.clip is not None:
            ok = (
                isinstance(self.clip, (tuple, list))
                and len(self.clip) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in self.clip)
                and self.clip[0] <= self.clip[1]
            )
            if not ok:
                raise ConfigError(
                    explain(
                        "RewardTransformConfig.clip",
                        expected="None or (low, high) with low <= high",
                        received=self.clip,
                        fix="pass clip=(-1.0, 1.0)",
                    )
                )
            object.__setattr__(self, "clip", (float(self.clip[0]), float(self.clip[1])))


def compose(config: RewardTransformConfig) -> Callable[[float], float]:
    """The per-step transform a config describes, as one function."""
    fns: list[Callable[[float], float]] = []
    if config.step_penalty:
        fns.append(lambda r: penalize(r, config.step_penalty))
    if config.scale != 1.0 or config.shift != 0.0:
        fns.append(lambda r: scale_shift(r, config.scale, config.shift))
    if config.clip is not None:
        fns.append(lambda r: clip(r, *config.clip))

    def transform(r: float) -> float:
        for f in fns:
            r = f(r)
        return float(r)

    return transform


class TransformReward(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Apply ``fn(reward) -> reward`` on every step; ``terminal_only`` pays the running sum at the end."""

    def __init__(self, env: gym.Env, fn: Callable[[float], float], *, terminal_only: bool = False):
        gym.utils.RecordConstructorArgs.__init__(self, fn=fn, terminal_only=terminal_only)
        super().__init__(env)
        if not callable(fn):
            raise ConfigError(
                explain(
                    "TransformReward(fn)",
                    expected="a callable float -> float",
                    received=fn,
                    fix="pass e.g. lambda r: 2 * r",
                )
            )
        self.fn, self.terminal_only = fn, terminal_only
        self._pending = 0.0

    def _on_reset(self, result: tuple) -> tuple:
        self._pending = 0.0
        return result

    def _on_step(self, result: tuple) -> tuple:
        obs, reward, terminated, truncated, info = result
        r = float(self.fn(float(reward)))
        info = {**info, "raw_reward": reward}
        if self.terminal_only:
            self._pending += r
            r = self._pending if (terminated or truncated) else 0.0
            if terminated or truncated:
                self._pending = 0.0
        return obs, r, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._on_reset(self.env.reset(seed=seed, options=options))

    def step(self, action: Any):
        return self._on_step(self.env.step(action))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._on_reset(await areset_env(self.env, seed=seed, options=options))

    async def astep(self, action: Any):
        return self._on_step(await astep_env(self.env, action))


class RewardTransform(TransformReward):
    """The configured transform (see module doc); ``RewardTransform(env, scale=2.0, clip=(-1, 1))``."""

    def __init__(self, env: gym.Env, config: RewardTransformConfig | None = None, **fields: Any):
        self.config = config or RewardTransformConfig(**fields)
        gym.utils.RecordConstructorArgs.__init__(
            self, **dataclasses.asdict(self.config)
        )  # replayable from logs
        super().__init__(env, compose(self.config), terminal_only=self.config.terminal_only)


__all__ = [
    "RewardTransform",
    "RewardTransformConfig",
    "TransformReward",
    "compose",
    "penalize",
    "scale_shift",
    "clip",
]
