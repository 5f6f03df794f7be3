"""Every registered gymllm id's *raw* env (``env.unwrapped``) returns observations inside its declared space.

``tests/test_registered_envs.py`` checks the env ``gymllm.make`` returns; a wrapper's space can hide a
raw env that lies about its own (``ToolUse`` declares ``Chat`` over an inner env that declared
``Text`` and returned messages). Here Gymnasium's ``check_env`` and ``gymllm.utils.check_env`` run on
``env.unwrapped`` itself, and Gymnasium's passive-checker warnings about observations count as
failures. The ids are read from the registry at collection time. The default tier checks every id
outside the catalogue and the first id of each catalogue entry point (the catalogue registers one id
per reasoning-gym dataset and TextArena game, ~160 in all); the other catalogue ids run under
``-m slow``. An id whose optional package is absent is skipped, naming the package. An env whose
metadata carries ``gymllm_skip_check`` (it fails on purpose, as ``Failing-v0``, or needs what the
registry cannot give, as ``OpenEnv-v0`` without a server URL) must fail Gymnasium's check here.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env

import gymllm
from gymllm.envs.arithmetic_tool import ArithmeticToolTask
from gymllm.envs.calc_math import CalcMathTask
from gymllm.errors import MissingExtraError
from gymllm.registration import registered_ids
from gymllm.spaces import Chat
from gymllm.utils import check_env
from gymllm.utils.env_checker import run_episode

IDS = registered_ids()
CATALOGUE = ("gymllm.envs.catalogue:", "gymllm.envs.catalogue_textarena:")


def _entry_point(env_id: str) -> str:
    ep = gym.spec(env_id).entry_point
    return (
        ep
        if isinstance(ep, str)
        else f"{getattr(ep, '__module__', '?')}:{getattr(ep, '__qualname__', ep)}"
    )


def _params() -> list:
    seen: set[str] = set()
    params = []
    for env_id in IDS:
        ep = _entry_point(env_id)
        slow = ep.startswith(CATALOGUE) and ep in seen
        seen.add(ep)
        params.append(pytest.param(env_id, marks=[pytest.mark.slow] if slow else [], id=env_id))
    return params


def _make(env_id: str) -> gym.Env:
    try:
        return gymllm.make(env_id)
    except MissingExtraError as e:
        pytest.skip(
            f"{env_id}: optional package {e.package!r} is not installed (pip install 'gymllm[{e.extra}]')"
        )


def _gymnasium_check(raw: gym.Env) -> None:
    """Gymnasium's check_env on ``raw``; its warnings about observations are failures."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym_check_env(raw, skip_render_check=True)
    about_obs = [str(w.message) for w in caught if "observation" in str(w.message).lower()]
    assert not about_obs, (
        f"Gymnasium's checker warned about {type(raw).__name__}'s observations: {about_obs}"
    )


@pytest.mark.parametrize("env_id", _params())
def test_raw_env_observations_lie_in_its_declared_space(env_id):
    env = _make(env_id)
    raw = env.unwrapped
    try:
        on_purpose = getattr(raw, "metadata", {}).get("gymllm_skip_check")
        if on_purpose:  # declared to fail the checks (metadata["gymllm_skip_check"] says why): it must fail them
            try:
                obs, _ = raw.reset(seed=0)
            except Exception:  # noqa: BLE001 - e.g. OpenEnv-v0 without a server URL refuses to reset
                obs = None
            else:  # a reset that succeeds still returns an in-space observation
                assert raw.observation_space.contains(obs), raw.observation_space.why_not(obs)
            with pytest.raises(Exception):  # noqa: B017 - whatever it raises, it must raise
                gym_check_env(raw, skip_render_check=True)
            return
        _gymnasium_check(raw)
        check_env(raw, num_steps=2, skip_gymnasium=True)  # Gymnasium's part ran just above
        for seed in (
            0,
            1,
        ):  # reset and every step, with seeded actions from the raw env's action space
            for t, (obs, *_rest) in enumerate(run_episode(raw, seed, num_steps=3)):
                assert raw.observation_space.contains(obs), (
                    f"{env_id}: seed {seed}, {'reset' if t == 0 else f'step {t}'} returned an observation outside "
                    f"{raw.observation_space!r}: {getattr(raw.observation_space, 'why_not', repr)(obs)}"
                )
    finally:
        env.close()


@pytest.mark.parametrize(
    "env_id, task_cls",
    [("gymllm/ArithmeticTool-v0", ArithmeticToolTask), ("gymllm/CalcMath-v0", CalcMathTask)],
)
def test_tool_tasks_declare_chat_and_their_wrapped_env_returns_the_same_messages(env_id, task_cls):
    wrapped, reference = gymllm.make(env_id), gymllm.make(env_id)
    raw = reference.unwrapped
    assert isinstance(raw, task_cls) and isinstance(raw.observation_space, Chat)
    for seed in range(4):
        obs, info = wrapped.reset(seed=seed)
        raw_obs, raw_info = raw.reset(seed=seed)
        assert obs == raw_obs and [m["role"] for m in obs] == ["system", "user"]
        assert raw_info["answer"] == info["answer"] and "tools" in info and "tools" not in raw_info
        # a wrong then the right final answer (no tool call, so the wrapper passes both through)
        for action in ("\\boxed{-999999}", "\\boxed{" + info["answer"] + "}"):
            obs, r, term, trunc, _ = wrapped.step(action)
            raw_obs, raw_r, raw_term, raw_trunc, _ = raw.step(action)
            assert (obs, r, term, trunc) == (raw_obs, raw_r, raw_term, raw_trunc)
            assert raw.observation_space.contains(raw_obs) and [m["role"] for m in raw_obs] == [
                "user"
            ]
            assert raw_obs[0]["content"] in ("Correct.", "Incorrect.", "Incorrect. Try again.")
            if term or trunc:
                break
    wrapped.close()
    reference.close()
