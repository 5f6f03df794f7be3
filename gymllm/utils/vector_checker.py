"""``check_vector_env(vec)``: the barrier-free paths give the same per-env trajectories as a plain loop.

For a fixed seed, each sub-env's sequence of transitions (NEXT_STEP autoreset: the transition after
an episode end is the reset) is computed four ways and must be identical:

1. reference: one sub-env at a time, ``reset(seed + i)`` then ``step`` in a plain loop;
2. ``vec.step(actions)`` (send to all + receive all);
3. barrier-free ``send`` / ``recv(min_ready=1)``, each ready env re-sent at once;
4. one coroutine per sub-env with ``areset_env`` / ``astep_env``.

Paths 2-4 run with a random per-env, per-step latency injected around every sub-env (seeded
lognormal sleeps), so completion order differs from send order. The check also verifies that every
env id sent is received exactly once. Actions depend only on (seed, env id, transition index).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import data_equivalence

from gymllm.errors import explain
from gymllm.utils.env_checker import EnvCheckError, seeded_action
from gymllm.vector import VectorEnv

__all__ = ["check_vector_env", "LatencyJitter"]

Transition = tuple[Any, float, bool, bool]


class LatencyJitter(gym.Wrapper):
    """Sleeps a seeded lognormal delay (median ``median_s``, capped at ``max_s``) before each reset/step."""

    def __init__(self, env: gym.Env, seed: int, median_s: float = 0.002, max_s: float = 0.02):
        super().__init__(env)
        self._rng = np.random.default_rng(seed)
        self.median_s, self.max_s = median_s, max_s

    def _sleep(self) -> None:
        time.sleep(min(self.max_s, self.median_s * math.exp(1.2 * self._rng.standard_normal())))

    def reset(self, **kwargs: Any):
        self._sleep()
        return self.env.reset(**kwargs)

    def step(self, action: Any):
        self._sleep()
        return self.env.step(action)


def _fail(path: str, expected: str, received: Any, fix: str) -> None:
    raise EnvCheckError(
        explain(f"check_vector_env[{path}]", expected=expected, received=received, fix=fix)
    )


def _reference(
    fn: Callable[[], gym.Env], seed: int, n: int, act: Callable[[int], Any]
) -> list[Transition]:
    env = fn()
    try:
        obs, _ = env.reset(seed=seed)
        out, done = [(obs, 0.0, False, False)], False
        for k in range(n):
            if done:
                obs, _ = env.reset()
                rec = (obs, 0.0, False, False)
            else:
                obs, r, te, tr, _ = env.step(act(k))
                rec = (obs, float(r), bool(te), bool(tr))
            out.append(rec)
            done = rec[2] or rec[3]
        return out
    finally:
        env.close()


def _jittered(
    fns: list[Callable[[], gym.Env]], seed: int, median_s: float, max_s: float
) -> list[Callable]:
    return [
        lambda fn=fn, i=i: LatencyJitter(fn(), seed=seed * 1009 + i, median_s=median_s, max_s=max_s)
        for i, fn in enumerate(fns)
    ]


def _rec(obs: Any, r: Any, te: Any, tr: Any) -> Transition:
    return obs, float(r), bool(te), bool(tr)


def _via_step(
    vec: VectorEnv, seed: int, n: int, acts: list[Callable[[int], Any]]
) -> list[list[Transition]]:
    obs, _ = vec.reset(seed=seed)
    out = [[(obs[i], 0.0, False, False)] for i in range(vec.num_envs)]
    for k in range(n):
        obs, r, te, tr, _ = vec.step([acts[i](k) for i in range(vec.num_envs)])
        for i in range(vec.num_envs):
            out[i].append(_rec(obs[i], r[i], te[i], tr[i]))
    return out


def _via_send_recv(
    vec: VectorEnv, seed: int, n: int, acts: list[Callable[[int], Any]]
) -> list[list[Transition]]:
    obs, _ = vec.reset(seed=seed)
    out = [[(obs[i], 0.0, False, False)] for i in range(vec.num_envs)]
    sent = [0] * vec.num_envs
    vec.send([acts[i](0) for i in range(vec.num_envs)])
    sent = [1] * vec.num_envs
    received = [0] * vec.num_envs
    while sum(received) < n * vec.num_envs:
        obs, r, te, tr, _, ids = vec.recv(min_ready=1)
        again = []
        for j, i in enumerate(ids):
            received[i] += 1
            if received[i] > sent[i]:
                _fail(
                    "send/recv",
                    "each sent env id received exactly once",
                    f"env {i} received twice",
                    "report a bug in gymllm.vector",
                )
            out[i].append(_rec(obs[j], r[j], te[j], tr[j]))
            if sent[i] < n:
                again.append(i)
        if again:
            vec.send([acts[i](sent[i]) for i in again], env_ids=again)
            for i in again:
                sent[i] += 1
    if vec.in_flight:
        _fail("send/recv", "nothing left in flight", vec.in_flight, "report a bug in gymllm.vector")
    return out


async def _via_async(
    vec: VectorEnv, seed: int, n: int, acts: list[Callable[[int], Any]]
) -> list[list[Transition]]:
    async def one(i: int) -> list[Transition]:
        obs, _ = await vec.areset_env(i, seed=seed + i)
        out, done = [(obs, 0.0, False, False)], False
        for k in range(n):
            if done:
                obs, _ = await vec.areset_env(i)
                rec = (obs, 0.0, False, False)
            else:
                rec = _rec(*(await vec.astep_env(i, acts[i](k)))[:4])
            out.append(rec)
            done = rec[2] or rec[3]
        return out

    return list(await asyncio.gather(*(one(i) for i in range(vec.num_envs))))


def check_vector_env(
    vec_or_factory: VectorEnv | Callable[[], VectorEnv],
    *,
    seed: int = 0,
    num_steps: int = 8,
    median_s: float = 0.002,
    max_s: float = 0.02,
) -> None:
    """Check that every path of the vector env gives the reference per-env trajectories (see module doc).

    ``vec_or_factory`` is a :class:`~gymllm.vector.VectorEnv` (its ``env_fns`` and config are used;
    it is not stepped) or a zero-argument factory returning one (closed afterwards).
    Raises :class:`~gymllm.utils.env_checker.EnvCheckError` on the first difference.
    """
    own = not isinstance(vec_or_factory, VectorEnv)
    base = vec_or_factory() if own else vec_or_factory
    try:
        fns, config = (
            list(base.env_fns),
            dataclasses.replace(base.config, autoreset_mode="next_step"),
        )
        spaces = [s for s in base.single_action_spaces]
    finally:
        if own:
            base.close()
    acts = [lambda k, i=i: seeded_action(spaces[i], seed, i, k) for i in range(len(fns))]
    ref = [_reference(fn, seed + i, num_steps, acts[i]) for i, fn in enumerate(fns)]
    paths: dict[str, Callable[[VectorEnv], list[list[Transition]]]] = {
        "step": lambda v: _via_step(v, seed, num_steps, acts),
        "send/recv": lambda v: _via_send_recv(v, seed, num_steps, acts),
        "async per-env": lambda v: asyncio.run(_via_async(v, seed, num_steps, acts)),
    }
    for name, run in paths.items():
        vec = VectorEnv(_jittered(fns, seed, median_s, max_s), config=config)
        try:
            got = run(vec)
        finally:
            vec.close()
        for i, (want, have) in enumerate(zip(ref, got)):
            if not data_equivalence(want, have, exact=True):
                k = next(
                    (
                        k
                        for k, (a, b) in enumerate(zip(want, have))
                        if not data_equivalence(a, b, exact=True)
                    ),
                    min(len(want), len(have)),
                )
                _fail(
                    name,
                    f"env {i}'s reference trajectory",
                    f"a difference at transition {k}: "
                    f"{want[k] if k < len(want) else None!r} vs {have[k] if k < len(have) else None!r}",
                    "keep all env randomness in self.np_random and state per instance (no shared globals)",
                )
