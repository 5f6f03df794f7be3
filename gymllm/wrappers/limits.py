"""Turn and wall-clock limits per episode: ``Limits`` (``TurnLimit`` / ``TimeLimit`` are shorthands).

    env = Limits(env, max_turns=8, max_seconds=30.0)

A step that reaches ``max_turns`` steps, or ends after ``max_seconds`` of wall time since ``reset``,
comes back with ``truncated=True`` (unless the env terminated on that step) and
``info["truncation_reason"]`` = ``"turn_limit"`` or ``"time_limit"``. Further steps need a reset
(:class:`~gymllm.errors.ResetNeededError`). The time limit is checked after each step: a step that
itself runs long is the vector env's ``step_timeout``'s business. ``areset`` / ``astep`` await the
inner env's async twins, so a wrapped async env stays async.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import gymnasium as gym

from gymllm.core import areset_env, astep_env
from gymllm.errors import ResetNeededError
from gymllm.validation import check_range, require


@dataclasses.dataclass(frozen=True, kw_only=True)
class LimitsConfig:
    """max_turns: steps per episode (None: no limit); max_seconds: wall seconds per episode (None: none)."""

    max_turns: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        check_range(
            "LimitsConfig",
            "max_turns",
            self.max_turns,
            lo=1,
            integer=True,
            optional=True,
            fix="pass max_turns=8",
        )
        require(
            self.max_seconds is None
            or (
                not isinstance(self.max_seconds, bool)
                and isinstance(self.max_seconds, (int, float))
                and self.max_seconds > 0
            ),
            "LimitsConfig.max_seconds",
            expected="None or a number > 0",
            received=self.max_seconds,
            fix="pass max_seconds=30.0",
        )


def check_limits(turns: int, elapsed: float, config: LimitsConfig) -> str | None:
    """The limit an episode has reached after ``turns`` steps and ``elapsed`` seconds, or None."""
    if config.max_turns is not None and turns >= config.max_turns:
        return "turn_limit"
    if config.max_seconds is not None and elapsed >= config.max_seconds:
        return "time_limit"
    return None


class Limits(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Truncate episodes at a turn and/or wall-clock limit (see module doc)."""

    def __init__(
        self,
        env: gym.Env,
        config: LimitsConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        **fields: Any,
    ):
        self.config = config or LimitsConfig(**fields)
        gym.utils.RecordConstructorArgs.__init__(
            self, **dataclasses.asdict(self.config)
        )  # replayable from logs
        super().__init__(env)
        self.clock = clock
        self._turns, self._t0, self._done = 0, 0.0, True

    def _on_reset(self, result: tuple) -> tuple:
        self._turns, self._t0, self._done = 0, self.clock(), False
        return result

    def _before_step(self) -> None:
        require(
            not self._done,
            f"{type(self).__name__}.step()",
            expected="reset() first",
            received="a step after the episode ended (or before reset)",
            fix="call env.reset() to start a new episode",
            error=ResetNeededError,
        )

    def _on_step(self, result: tuple) -> tuple:
        obs, reward, terminated, truncated, info = result
        self._turns += 1
        reason = (
            None
            if terminated or truncated
            else check_limits(self._turns, self.clock() - self._t0, self.config)
        )
        if reason is not None:
            truncated = True
            info = {**info, "truncation_reason": reason}
        self._done = bool(terminated or truncated)
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._on_reset(self.env.reset(seed=seed, options=options))

    def step(self, action: Any):
        self._before_step()
        return self._on_step(self.env.step(action))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._on_reset(await areset_env(self.env, seed=seed, options=options))

    async def astep(self, action: Any):
        self._before_step()
        return self._on_step(await astep_env(self.env, action))


def TurnLimit(env: gym.Env, max_turns: int) -> Limits:  # noqa: N802 - reads like a wrapper class
    """Truncate after ``max_turns`` steps."""
    return Limits(env, LimitsConfig(max_turns=max_turns))


def TimeLimit(
    env: gym.Env, max_seconds: float, *, clock: Callable[[], float] = time.monotonic
) -> Limits:  # noqa: N802
    """Truncate once ``max_seconds`` of wall time have passed since reset."""
    return Limits(env, LimitsConfig(max_seconds=max_seconds), clock=clock)


__all__ = ["Limits", "LimitsConfig", "TurnLimit", "TimeLimit", "check_limits"]
