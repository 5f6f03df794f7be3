"""``check_env(env)``: Gymnasium's ``check_env`` plus the checks text environments need.

On top of ``gymnasium.utils.env_checker.check_env`` it checks that

- a fixed seed gives the same episode twice (observations, rewards, flags, info keys) with the
  same actions, and that observations lie in ``observation_space``;
- the env never touches the global ``random`` / ``np.random`` state (state compared before/after);
- a Unicode action (``"héllo ✓ 日本 🙂"``) is accepted and answered with an in-space observation;
- for :class:`~gymllm.core.TextEnv` envs: ``step`` after the end raises ``ResetNeededError`` and a
  non-``str`` action raises ``InvalidActionError``;
- the async twins (``areset``/``astep``) give the same episode as the sync methods.

Failures raise :class:`EnvCheckError` (an ``AssertionError``) naming the check, what was expected
and what was received. Gymnasium's warnings are returned as a list of strings.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import random
import warnings
from typing import Any, Callable, Iterator

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env as gym_check_env
from gymnasium.utils.env_checker import data_equivalence

from gymllm.core import TextEnv, areset_env, astep_env
from gymllm.errors import GymLLMError, InvalidActionError, ResetNeededError, explain

__all__ = ["check_env", "EnvCheckError", "run_episode", "seeded_action", "UNICODE_ACTION"]

UNICODE_ACTION = "héllo ✓ 日本 🙂\nΩ≈ç√ \\boxed{42}"


class EnvCheckError(GymLLMError, AssertionError):
    """An environment failed a conformance check."""


def seeded_action(space: gym.Space, *key: int) -> Any:
    """A sample of ``space`` that depends only on ``key`` (a private copy of the space is seeded)."""
    s = copy.deepcopy(space)
    s.seed(int(np.random.SeedSequence([abs(int(k)) for k in key]).generate_state(1)[0]))
    return s.sample()


Step = tuple[Any, float, bool, bool, tuple]  # obs, reward, terminated, truncated, sorted info keys


def run_episode(
    env: gym.Env, seed: int, num_steps: int, policy: Callable[[int], Any] | None = None
) -> list[Step]:
    """``reset(seed)`` then up to ``num_steps`` steps (stopping at the end); the records of each."""
    policy = policy or (lambda t: seeded_action(env.action_space, seed, t))
    obs, info = env.reset(seed=seed)
    out: list[Step] = [(obs, 0.0, False, False, tuple(sorted(info)))]
    for t in range(num_steps):
        obs, r, term, trunc, info = env.step(policy(t))
        out.append((obs, float(r), bool(term), bool(trunc), tuple(sorted(info))))
        if term or trunc:
            break
    return out


async def _arun_episode(
    env: gym.Env, seed: int, num_steps: int, policy: Callable[[int], Any] | None = None
):
    policy = policy or (lambda t: seeded_action(env.action_space, seed, t))
    obs, info = await areset_env(env, seed=seed)
    out: list[Step] = [(obs, 0.0, False, False, tuple(sorted(info)))]
    for t in range(num_steps):
        obs, r, term, trunc, info = await astep_env(env, policy(t))
        out.append((obs, float(r), bool(term), bool(trunc), tuple(sorted(info))))
        if term or trunc:
            break
    return out


def _fail(check: str, expected: str, received: Any, fix: str) -> None:
    raise EnvCheckError(
        explain(f"check_env[{check}]", expected=expected, received=received, fix=fix)
    )


@contextlib.contextmanager
def _phase(name: str) -> Iterator[None]:
    """Turn an exception the env raises during check ``name`` into an EnvCheckError naming the check."""
    try:
        yield
    except EnvCheckError:
        raise
    except Exception as e:  # noqa: BLE001 - reported with the check's name
        raise EnvCheckError(
            explain(
                f"check_env[{name}]",
                expected="no exception from the env",
                received=f"{type(e).__name__}: {e}",
                fix="see the chained exception for where the env raised",
            )
        ) from e


def _first_diff(a: list[Step], b: list[Step]) -> str | None:
    if len(a) != len(b):
        return f"episode lengths {len(a)} vs {len(b)}"
    for t, (x, y) in enumerate(zip(a, b)):
        if not data_equivalence(x, y, exact=True):
            return f"step {t}: {x!r} vs {y!r}"
    return None


def _rng_state() -> tuple:
    return random.getstate(), np.random.get_state()


def _rng_unchanged(before: tuple) -> bool:
    py, npy = before
    now_py, now_np = _rng_state()
    return (
        py == now_py
        and npy[0] == now_np[0]
        and np.array_equal(npy[1], now_np[1])
        and npy[2:] == now_np[2:]
    )


def check_env(
    env: gym.Env,
    *,
    seed: int = 0,
    num_steps: int = 6,
    skip_gymnasium: bool = False,
    skip_render_check: bool = True,
    policy: Callable[[int], Any] | None = None,
) -> list[str]:
    """Run every check on ``env`` (it is reset and stepped; not closed). Returns Gymnasium's warnings.

    ``policy(t) -> action`` picks the actions (default: seeded samples of ``action_space``).
    """
    before = _rng_state()
    caught: list[str] = []
    if not skip_gymnasium:
        with warnings.catch_warnings(record=True) as w, _phase("gymnasium"):
            warnings.simplefilter("always")
            gym_check_env(env, skip_render_check=skip_render_check, skip_close_check=True)
        caught = [str(x.message) for x in w]
    with _phase("determinism"):
        a = run_episode(env, seed, num_steps, policy)
        b = run_episode(env, seed, num_steps, policy)
    diff = _first_diff(a, b)
    if diff is not None:
        _fail(
            "determinism",
            "the same episode for the same seed and actions",
            diff,
            "draw all randomness from self.np_random (seeded by reset(seed=...))",
        )
    for t, (obs, *_rest) in enumerate(a):
        if not env.observation_space.contains(obs):
            why = getattr(env.observation_space, "why_not", lambda o: None)(obs)
            _fail(
                "observation_space",
                f"observations in {env.observation_space!r}",
                f"step {t}: {why or obs!r}",
                "return str (Text) or a list of message dicts (Chat) matching the declared space",
            )
    with _phase("unicode"):
        _check_unicode(env, seed)
    if isinstance(env.unwrapped, TextEnv):
        with _phase("text env errors"):
            _check_text_env_errors(env.unwrapped, seed, num_steps, policy)
    if not _rng_unchanged(before):
        _fail(
            "global RNG",
            "random.getstate() and np.random.get_state() unchanged",
            "a changed global state",
            "use self.np_random (or a generator derived from it), never random.* / np.random.*",
        )
    with _phase("async"):
        c = asyncio.run(_arun_episode(env, seed, num_steps, policy))
    diff = _first_diff(a, c)
    if diff is not None:
        _fail(
            "async == sync",
            "areset/astep to give the sync episode",
            diff,
            "make the async hooks do the same work as the sync ones",
        )
    if not _rng_unchanged(before):
        _fail(
            "global RNG (async)",
            "global RNG state unchanged",
            "a changed global state",
            "use self.np_random",
        )
    return caught


def _check_unicode(env: gym.Env, seed: int) -> None:
    if not env.action_space.contains(UNICODE_ACTION):
        return
    env.reset(seed=seed)
    obs, *_ = env.step(UNICODE_ACTION)
    if not env.observation_space.contains(obs):
        _fail(
            "unicode",
            "an in-space observation after a Unicode action",
            obs,
            "handle any Unicode text (no ASCII-only encode/decode)",
        )


def _check_text_env_errors(
    env: TextEnv, seed: int, num_steps: int, policy: Callable[[int], Any] | None
) -> None:
    env.reset(seed=seed)
    try:
        env.step(12345)  # type: ignore[arg-type]
    except InvalidActionError:
        pass
    else:
        _fail(
            "action type",
            "InvalidActionError for a non-str action",
            "no error",
            "keep TextEnv.step's action check (do not override step)",
        )
    policy = policy or (lambda t: seeded_action(env.action_space, seed, t))
    env.reset(seed=seed)
    for t in range(max(num_steps, 1) * 5):
        _, _, term, trunc, _ = env.step(policy(t))
        if term or trunc:
            break
    else:
        return  # no episode end within the budget: nothing to check
    try:
        env.step(policy(0))
    except ResetNeededError:
        pass
    else:
        _fail(
            "step after end",
            "ResetNeededError",
            "no error",
            "keep TextEnv.step's order check (do not override step)",
        )
