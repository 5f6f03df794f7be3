"""``TextEnv``: the Gymnasium base class of every gymllm environment.

Subclasses fill hooks; the public methods own the invariants::

    class Echo(TextEnv):
        def _reset(self, *, seed, options):
            return "say something", {}
        def _step(self, action):
            return action, 1.0, True, {}

- ``reset(seed=...)`` seeds the per-env RNG ``self.np_random`` (never the global ``random`` /
  ``np.random`` state) before calling ``_reset``.
- ``step(action)`` checks the action (a ``str`` in ``action_space``; else
  :class:`~gymllm.errors.InvalidActionError`), refuses to run before ``reset`` or after the episode
  ended (:class:`~gymllm.errors.ResetNeededError`), counts turns and truncates at ``max_turns``.
- Async twins ``areset`` / ``astep`` await native ``async def _areset/_astep`` hooks, or run the
  sync hooks in the loop's default executor so a slow env never blocks the event loop. An env that
  only has async hooks still supports sync ``reset/step`` (run on a private event-loop thread, so the
  env's async resources stay bound to one loop).

Hooks: ``_reset(*, seed, options) -> (obs, info)`` and ``_step(action) -> (obs, reward, terminated,
info)``; ``_step`` may also return a 5-tuple whose ``truncated`` is or-ed with the turn limit.
Observations are a ``str`` (a new user message) or a ``list`` of message dicts.

The episode's invariants (order of calls, the action check, the result's shape, the reward check,
turn counting, truncation) live in :class:`EpisodeState`, one per env, so a subclass's own names
never collide with them; ``TextEnv`` seeds, dispatches to the hooks and bridges sync and async.

:func:`areset_env` / :func:`astep_env` call the async twins on any env, wrapped or not (falling back
to the sync method in an executor for envs without them).
"""

from __future__ import annotations

import asyncio
import math
import functools
import threading
from typing import Any, Awaitable, Callable, TypeVar

import gymnasium as gym

from gymllm.errors import ConfigError, InvalidActionError, ResetNeededError, RewardError, explain
from gymllm.spaces import Text

__all__ = ["TextEnv", "EpisodeState", "areset_env", "astep_env"]

ObsType = TypeVar("ObsType")
_T = TypeVar("_T")

_NEW, _RUNNING, _DONE = "new", "running", "done"


def _check_max_turns(max_turns: Any) -> int | None:
    if max_turns is None:
        return None
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ConfigError(
            explain(
                "TextEnv.max_turns",
                expected="None or an int >= 1",
                received=max_turns,
                fix="pass max_turns=None (no limit) or a positive int",
            )
        )
    return max_turns


class _LoopThread:
    """A private event loop on a daemon thread, for running an async-only env's hooks synchronously."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="gymllm-env-loop", daemon=True
        )
        self.thread.start()

    def run(self, coro: Awaitable[_T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=1.0)


def overrides_hook(obj: Any, name: str) -> bool:
    """Whether ``type(obj)`` defines hook ``name`` itself (not the TextEnv default)."""
    return _overrides_cls(type(obj), name)


_overrides = overrides_hook  # the former private name


def _overrides_cls(cls: type, name: str) -> bool:
    return getattr(cls, name, None) is not getattr(TextEnv, name)


class EpisodeState:
    """One env's episode: its phase (new, running, done), turn count and last observation, and the
    checks around each hook call (what :class:`TextEnv`'s public methods guarantee).

    - :meth:`check_step` refuses a step before ``reset`` or after the episode ended
      (:class:`~gymllm.errors.ResetNeededError`) and an action outside the env's ``action_space``
      (:class:`~gymllm.errors.InvalidActionError`, with the space's reason when it gives one).
    - :meth:`finish_reset` / :meth:`finish_step` record what the hook returned: a 4- or 5-tuple
      from ``_step`` (else ``TypeError``), a finite reward (else :class:`~gymllm.errors.RewardError`),
      one more turn, truncation at ``max_turns``, the episode ended on termination or truncation.
    """

    __slots__ = ("phase", "turn", "last_obs")

    def __init__(self) -> None:
        self.phase, self.turn, self.last_obs = _NEW, 0, None

    def begin(self) -> None:
        """A reset starts: turn 0, the episode running."""
        self.phase, self.turn = _RUNNING, 0

    def check_step(self, env: Any, action: Any) -> None:
        """Raise unless the episode is running and ``action`` is in ``env.action_space``."""
        if self.phase != _RUNNING:
            what = "before reset()" if self.phase == _NEW else "after the episode ended"
            raise ResetNeededError(
                explain(
                    f"{type(env).__name__}.step() called {what}",
                    expected="reset() first",
                    received=f"step({_short(action)})",
                    fix="call env.reset(seed=...) before step()",
                )
            )
        space = env.action_space
        why_not = getattr(space, "why_not", None)
        why = why_not(action) if why_not is not None else (None if space.contains(action) else "")
        if why is not None:
            raise InvalidActionError(
                explain(
                    f"{type(env).__name__}.step(action)",
                    expected=f"an action in {space!r}",
                    received=f"{_short(action)}{' (' + why + ')' if why else ''}",
                    fix="pass the model's reply as one Python str",
                )
            )

    def finish_reset(self, obs: Any, info: Any) -> tuple[Any, dict]:
        """Record the reset's observation; ``(obs, info as a dict)``."""
        self.last_obs = obs
        return obs, dict(info) if info is not None else {}

    def finish_step(self, env: Any, result: tuple) -> tuple[Any, float, bool, bool, dict]:
        """The checked 5-tuple of ``env``'s ``_step`` result; counts the turn and ends the episode."""
        if len(result) == 5:
            obs, reward, terminated, truncated, info = result
        elif len(result) == 4:
            (obs, reward, terminated, info), truncated = result, False
        else:
            raise TypeError(
                explain(
                    f"{type(env).__name__}._step",
                    expected="(obs, reward, terminated, info)",
                    received=f"a {len(result)}-tuple",
                    fix="return 4 values from _step",
                )
            )
        self.turn += 1
        terminated = bool(terminated)
        max_turns = env.max_turns
        truncated = bool(truncated) or (
            not terminated and max_turns is not None and self.turn >= max_turns
        )
        if terminated or truncated:
            self.phase = _DONE
        self.last_obs = obs
        return (
            obs,
            _checked_reward(env, reward),
            terminated,
            truncated,
            dict(info) if info is not None else {},
        )


class TextEnv(gym.Env[ObsType, str]):
    """A text environment: ``str`` actions, ``str`` or message-list observations, 5-tuple ``step``.

    Args:
        max_turns: truncate the episode after this many ``step`` calls (None: no limit).
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the last observation as text).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}
    max_turns: int | None = None
    _sync_reset_hook = _sync_step_hook = True  # set per subclass in __init_subclass__

    def __init__(self, *, max_turns: int | None = None, render_mode: str | None = None):
        self.max_turns = _check_max_turns(max_turns)
        if render_mode not in (None, "ansi"):
            raise ConfigError(
                explain(
                    "TextEnv.render_mode",
                    expected="None or 'ansi'",
                    received=render_mode,
                    fix="pass render_mode='ansi' or leave it unset",
                )
            )
        self.render_mode = render_mode
        if "observation_space" not in self.__dict__:
            self.observation_space = Text()
        if "action_space" not in self.__dict__:
            self.action_space = Text()

    # ------------------------------------------------------------------ hooks (fill in subclasses)
    def _reset(self, *, seed: int | None, options: dict | None) -> tuple[ObsType, dict]:
        raise NotImplementedError(f"{type(self).__name__} must define _reset (or async _areset)")

    def _step(self, action: str) -> tuple:
        raise NotImplementedError(f"{type(self).__name__} must define _step (or async _astep)")

    async def _areset(self, *, seed: int | None, options: dict | None) -> tuple[ObsType, dict]:
        return await _in_executor(functools.partial(self._reset, seed=seed, options=options))

    async def _astep(self, action: str) -> tuple:
        return await _in_executor(functools.partial(self._step, action))

    # ------------------------------------------------------------------ state
    @property
    def turn(self) -> int:
        """Number of ``step`` calls in the current episode."""
        return self._text_episode.turn

    @property
    def episode_done(self) -> bool:
        """True after the episode terminated or was truncated (until the next reset)."""
        return self._text_episode.phase == _DONE

    @property
    def _text_episode(self) -> EpisodeState:
        """This env's :class:`EpisodeState` (made on first use: a subclass may skip ``__init__``)."""
        ep = self.__dict__.get("_text_episode_state")
        if ep is None:
            ep = self.__dict__["_text_episode_state"] = EpisodeState()
        return ep

    # ------------------------------------------------------------------ sync API
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Which hooks the sync methods call: the sync ones, unless only the async ones are defined.
        cls._sync_reset_hook = _overrides_cls(cls, "_reset") or not _overrides_cls(cls, "_areset")
        cls._sync_step_hook = _overrides_cls(cls, "_step") or not _overrides_cls(cls, "_astep")

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[ObsType, dict]:
        episode = self._before_reset(seed)
        if self._sync_reset_hook:
            obs, info = self._reset(seed=seed, options=options)
        else:
            obs, info = self._loop_thread().run(self._areset(seed=seed, options=options))
        return episode.finish_reset(obs, info)

    def step(self, action: str) -> tuple[ObsType, float, bool, bool, dict]:
        self._text_episode.check_step(self, action)
        return self.step_prechecked(action)

    def step_prechecked(self, action: str) -> tuple[ObsType, float, bool, bool, dict]:
        """``step`` after the action check: for callers that already checked ``action`` against this
        env's ``action_space`` (the vector env validates a whole send before starting any of it)."""
        episode = self._text_episode
        if episode.phase != _RUNNING:
            episode.check_step(self, action)  # raises the order error
        if self._sync_step_hook:
            result = self._step(action)
        else:
            result = self._loop_thread().run(self._astep(action))
        return episode.finish_step(self, result)

    # ------------------------------------------------------------------ async API
    async def areset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[ObsType, dict]:
        episode = self._before_reset(seed)
        obs, info = await self._areset(seed=seed, options=options)
        return episode.finish_reset(obs, info)

    async def astep(self, action: str) -> tuple[ObsType, float, bool, bool, dict]:
        episode = self._text_episode
        episode.check_step(self, action)
        return episode.finish_step(self, await self._astep(action))

    # ------------------------------------------------------------------ misc
    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        obs = self._text_episode.last_obs
        if isinstance(obs, list):
            return "\n".join(f"[{m.get('role')}] {m.get('content', '')}" for m in obs)
        return None if obs is None else str(obs)

    def close(self) -> None:
        lt = self.__dict__.pop("_loop", None)
        if lt is not None:
            lt.stop()
        super().close()

    # ------------------------------------------------------------------ invariants
    def _before_reset(self, seed: int | None) -> EpisodeState:
        if "action_space" not in self.__dict__ and not hasattr(type(self), "action_space"):
            TextEnv.__init__(self)  # a subclass skipped super().__init__(): install the defaults
        super().reset(seed=seed)  # seeds self.np_random from `seed` (only when one is given)
        episode = self._text_episode
        episode.begin()
        return episode

    def _loop_thread(self) -> _LoopThread:
        lt = self.__dict__.get("_loop")
        if lt is None:
            lt = self._loop = _LoopThread()
        return lt


async def _in_executor(fn: Callable[[], _T]) -> _T:
    return await asyncio.get_running_loop().run_in_executor(None, fn)


def _checked_reward(env: Any, reward: Any) -> float:
    """``reward`` as a finite float, or :class:`~gymllm.errors.RewardError` saying what was returned."""
    try:
        value = float(reward) if not isinstance(reward, (str, bytes)) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise RewardError(
            explain(
                f"{type(env).__name__}._step reward",
                expected="a finite real number",
                received=_short(reward),
                fix="return a float (e.g. 0.0 for no credit); "
                "NaN or inf rewards would poison every advantage of their group",
            )
        )
    return value


def _short(x: Any, n: int = 60) -> str:
    s = repr(x)
    return s if len(s) <= n else s[: n - 3] + "..."


async def areset_env(
    env: gym.Env, *, seed: int | None = None, options: dict | None = None
) -> tuple[Any, dict]:
    """``await env.areset(...)`` when the env (or its outermost wrapper) has it, else ``reset`` in an executor."""
    fn = getattr(env, "areset", None)
    if fn is not None:
        return await fn(seed=seed, options=options)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        None, functools.partial(env.reset, seed=seed, options=options)
    )


async def astep_env(env: gym.Env, action: Any) -> tuple[Any, float, bool, bool, dict]:
    """``await env.astep(action)`` when available, else ``env.step`` in the loop's executor."""
    fn = getattr(env, "astep", None)
    if fn is not None:
        return await fn(action)
    return await asyncio.get_running_loop().run_in_executor(None, env.step, action)
