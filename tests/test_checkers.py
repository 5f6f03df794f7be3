"""The checkers catch what they promise to catch (each bad env fails exactly its check)."""

import itertools
import random

import numpy as np
import pytest

from gymllm import TextEnv
from gymllm.envs.basic import EchoEnv
from gymllm.utils import EnvCheckError, check_env, check_vector_env
from gymllm.vector import VectorEnv


class GlobalRandom(EchoEnv):
    def _step(self, action):
        np.random.random()  # touches the global NumPy RNG
        return super()._step(action)


class PyRandom(EchoEnv):
    def _reset(self, *, seed, options):
        random.random()
        return super()._reset(seed=seed, options=options)


class Unseeded(EchoEnv):
    _ticks = itertools.count()

    def _reset(self, *, seed, options):
        obs, info = super()._reset(seed=seed, options=options)
        return f"{obs} #{next(self._ticks)}", info


class AsciiOnly(EchoEnv):
    def _step(self, action):
        action.encode("ascii")
        return super()._step(action)


class WrongObs(EchoEnv):
    def _step(self, action):
        _, r, d, info = super()._step(action)
        return 42, r, d, info


class OverridesStep(EchoEnv):
    def step(self, action):  # drops the base class's checks
        return "x", 0.0, False, False, {}


class AsyncDiffers(EchoEnv):
    async def _astep(self, action):
        obs, r, d, info = self._step(action)
        return obs + "!", r, d, info


class SharedCounter(EchoEnv):
    """Each instance's output depends on the other instances' progress: interleaving changes it."""

    shared = [0]

    def _step(self, action):
        self.shared[0] += 1
        obs, r, d, info = super()._step(action)
        return f"{obs} {self.shared[0] % 2}", r, d, info


@pytest.mark.parametrize(
    "env_cls,check",
    [
        (GlobalRandom, "global RNG"),
        (PyRandom, "global RNG"),
        (Unseeded, "determinism"),
        (AsciiOnly, "UnicodeEncodeError: 'ascii' codec"),
        (WrongObs, "observation"),
        (OverridesStep, "action type"),
        (AsyncDiffers, "async == sync"),
    ],
)
def test_check_env_catches_each_defect(env_cls, check):
    with pytest.raises(EnvCheckError, match=check):
        check_env(env_cls(episode_length=4), skip_gymnasium=env_cls in (WrongObs, AsciiOnly))


def test_check_env_passes_a_good_env_and_returns_gymnasium_warnings():
    assert isinstance(check_env(EchoEnv()), list)


def test_check_env_error_explains_expected_received_fix():
    with pytest.raises(EnvCheckError) as info:
        check_env(GlobalRandom())
    msg = str(info.value)
    assert "expected" in msg and "received" in msg and "Fix: use self.np_random" in msg


def test_check_vector_env_passes_good_envs_and_catches_shared_state():
    check_vector_env(
        lambda: VectorEnv([lambda: EchoEnv(episode_length=2), lambda: EchoEnv(episode_length=3)]),
        num_steps=5,
    )
    with pytest.raises(EnvCheckError, match="reference trajectory"):
        check_vector_env(
            lambda: VectorEnv([SharedCounter] * 3), num_steps=6, median_s=0.003, max_s=0.01
        )


def test_text_env_without_hooks_fails_clearly():
    class Empty(TextEnv):
        pass

    with pytest.raises(EnvCheckError, match="NotImplementedError: Empty must define _reset"):
        check_env(Empty())
