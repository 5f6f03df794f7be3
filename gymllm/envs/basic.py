"""Small envs for tests and benchmarks: Echo, Latency (sync and async), Failing.

- ``gymllm/Echo-v0``: the reset observation is a short seeded word; each step echoes the action
  back with a seeded token; reward 1.0 when the action equals the current word. Ends after
  ``episode_length`` steps.
- ``gymllm/Latency-v0`` / ``gymllm/AsyncLatency-v0``: Echo plus a seeded heavy-tailed delay per
  step (lognormal with median ``median_s`` and 99th percentile ``p99_s``), slept with
  ``time.sleep`` or ``asyncio.sleep``. The delays come from their own generator seeded from the
  env's RNG at reset, so a fixed seed gives the same observations and the same delays.
- ``gymllm/Failing-v0``: raises (``mode="raise"``) or hangs for ``hang_s`` (``mode="hang"``) at
  step ``fail_at_step`` (or at reset with ``fail_at_step=0``). It fails on purpose, so its metadata
  says ``check_env`` must skip it.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import numpy as np

from gymllm.core import TextEnv
from gymllm.registration import register
from gymllm.validation import check_range, require, require_one_of

__all__ = ["EchoEnv", "LatencyEnv", "AsyncLatencyEnv", "FailingEnv", "lognormal_sigma"]

_WORDS = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "héllo",
    "naïve",
    "café",
    "✓ok",
    "日本",
    "Ωmega",
    "🙂smile",
    "zeta",
)
_Z99 = 2.3263478740408408  # standard normal 99th percentile


def _positive(cls: str, name: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (value >= 0 if allow_zero else value > 0)
    )
    require(
        ok,
        f"{cls}.{name}",
        expected=f"a number {'>=' if allow_zero else '>'} 0",
        received=value,
        fix=f"pass {name}=<positive number>",
    )


def lognormal_sigma(median_s: float, p99_s: float) -> float:
    """The lognormal sigma whose 99th percentile is ``p99_s`` given the median ``median_s``."""
    return math.log(p99_s / median_s) / _Z99 if p99_s > median_s > 0 else 0.0


class EchoEnv(TextEnv):
    """Echoes the action; reward 1.0 when the action equals the word shown."""

    def __init__(
        self,
        *,
        episode_length: int = 3,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        check_range(
            "EchoEnv",
            "episode_length",
            episode_length,
            lo=1,
            integer=True,
            fix="pass episode_length=3",
        )
        self.episode_length = episode_length
        self._word = ""

    def _draw_word(self) -> str:
        return _WORDS[int(self.np_random.integers(len(_WORDS)))]

    def _reset(self, *, seed, options):
        self._word = self._draw_word()
        return f"Repeat: {self._word}", {"task_id": f"echo-{self._word}", "answer": self._word}

    def _step(self, action: str):
        reward = 1.0 if action.strip() == self._word else 0.0
        self._word = self._draw_word()
        done = self.turn + 1 >= self.episode_length
        return f"You said: {action} | Repeat: {self._word}", reward, done, {"answer": self._word}


class LatencyEnv(EchoEnv):
    """Echo with a seeded lognormal delay per step (``time.sleep``)."""

    def __init__(
        self,
        *,
        median_s: float = 0.02,
        p99_s: float = 0.5,
        max_s: float | None = None,
        reset_latency: bool = False,
        episode_length: int = 3,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(
            episode_length=episode_length, max_turns=max_turns, render_mode=render_mode
        )
        _positive("LatencyEnv", "median_s", median_s, allow_zero=True)
        _positive("LatencyEnv", "p99_s", p99_s, allow_zero=True)
        if max_s is not None:
            _positive("LatencyEnv", "max_s", max_s)
        self.median_s, self.p99_s, self.max_s = float(median_s), float(p99_s), max_s
        self.reset_latency = reset_latency
        self._sigma = lognormal_sigma(self.median_s, self.p99_s)
        self._delay_rng: np.random.Generator | None = None

    def next_delay(self) -> float:
        """The next delay in seconds from the env's own delay generator."""
        if self.median_s == 0.0:
            return 0.0
        if self._delay_rng is None:
            self._delay_rng = np.random.default_rng(int(self.np_random.integers(2**63)))
        d = float(self.median_s * math.exp(self._sigma * self._delay_rng.standard_normal()))
        return min(d, self.max_s) if self.max_s is not None else d

    def _reset(self, *, seed, options):
        self._delay_rng = np.random.default_rng(int(self.np_random.integers(2**63)))
        if self.reset_latency:
            time.sleep(self.next_delay())
        return super()._reset(seed=seed, options=options)

    def _step(self, action: str):
        delay = self.next_delay()
        if delay > 0.0:
            time.sleep(delay)
        return super()._step(action)


class AsyncLatencyEnv(LatencyEnv):
    """``LatencyEnv`` with native async hooks (``asyncio.sleep``): an I/O-bound env."""

    async def _areset(self, *, seed, options):
        self._delay_rng = np.random.default_rng(int(self.np_random.integers(2**63)))
        if self.reset_latency:
            await asyncio.sleep(self.next_delay())
        return EchoEnv._reset(self, seed=seed, options=options)

    async def _astep(self, action: str):
        await asyncio.sleep(self.next_delay())
        return EchoEnv._step(self, action)

    # The sync hooks are the async ones run on the env's private loop (TextEnv does this when only
    # async hooks are overridden; LatencyEnv's sync hooks are inherited, so route explicitly).
    def _reset(self, *, seed, options):
        return self._loop_thread().run(self._areset(seed=seed, options=options))

    def _step(self, action: str):
        return self._loop_thread().run(self._astep(action))


class FailingEnv(EchoEnv):
    """Raises ``RuntimeError`` (``mode="raise"``) or sleeps ``hang_s`` (``mode="hang"``) at step ``fail_at_step``."""

    metadata = {
        "render_modes": ["ansi"],
        "gymllm_skip_check": "fails on purpose (error-path tests)",
    }

    def __init__(
        self,
        *,
        fail_at_step: int = 1,
        mode: str = "raise",
        hang_s: float = 3600.0,
        episode_length: int = 3,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(
            episode_length=episode_length, max_turns=max_turns, render_mode=render_mode
        )
        require_one_of(
            mode,
            ("raise", "hang"),
            "FailingEnv.mode",
            fix="pass mode='raise' or mode='hang'",
        )
        check_range(
            "FailingEnv",
            "fail_at_step",
            fail_at_step,
            lo=0,
            integer=True,
            fix="pass fail_at_step=1 (0: fail at reset)",
        )
        _positive("FailingEnv", "hang_s", hang_s)
        self.fail_at_step, self.mode, self.hang_s = fail_at_step, mode, float(hang_s)

    def _fail(self, where: str) -> None:
        if self.mode == "hang":
            time.sleep(self.hang_s)
            return
        raise RuntimeError(f"FailingEnv: deliberate failure at {where}")

    def _reset(self, *, seed, options):
        if self.fail_at_step == 0:
            self._fail("reset")
        return super()._reset(seed=seed, options=options)

    def _step(self, action: str):
        if self.turn + 1 == self.fail_at_step:
            self._fail(f"step {self.fail_at_step}")
        return super()._step(action)


register("Echo-v0", "gymllm.envs.basic:EchoEnv")
register("Latency-v0", "gymllm.envs.basic:LatencyEnv")
register("AsyncLatency-v0", "gymllm.envs.basic:AsyncLatencyEnv")
register("Failing-v0", "gymllm.envs.basic:FailingEnv")
