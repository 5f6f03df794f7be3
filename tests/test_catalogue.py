"""Catalogue adapters: every reasoning-gym dataset registered (checked against the live registry),
scored by the dataset itself; TextArena games through PettingZoo's tests and as single-seat envs; the
global RNGs are never disturbed; a missing extra gives MissingExtraError."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest

import gymllm
from gymllm.envs import catalogue, catalogue_textarena
from gymllm.envs.catalogue import PrivateGlobalRandom
from gymllm.envs.catalogue_textarena import textarena_env
from gymllm.errors import ConfigError, MissingExtraError
from gymllm.multiagent import AgentVectorEnv, text_api_test

pytestmark = pytest.mark.filterwarnings("ignore")

RG_SAMPLE = [
    "leg_counting",
    "basic_arithmetic",
    "word_sorting",
    "maze",
    "gcd",
    "spell_backward",
    "composite",
]
TA_SAMPLE = ["GuessTheNumber-v0-raw", "Mastermind-v0-raw", "TowerOfHanoi-v0-raw"]


def _check_env(env):
    try:
        from gymllm.utils import check_env
    except ImportError:  # the project checker lands separately; Gymnasium's own checker is the peer
        from gymnasium.utils.env_checker import check_env
    check_env(env)


def test_every_reasoning_gym_dataset_is_registered():
    from reasoning_gym.factory import DATASETS

    assert set(catalogue.REASONING_GYM_DATASETS) == set(DATASETS)
    ids = set(gymllm.registration.registered_ids())
    assert {f"gymllm/rg-{n}-v0" for n in DATASETS} <= ids
    assert set(catalogue.register_reasoning_gym()) <= set(gymllm.registration.registered_ids())


@pytest.mark.parametrize("name", RG_SAMPLE)
def test_reasoning_gym_env_check_env_and_scoring(name):
    env = gymllm.make(f"gymllm/rg-{name}-v0", dataset_size=50)
    _check_env(env.unwrapped)
    obs, info = env.reset(seed=4)
    assert "<answer>" in obs and info["task_id"].startswith(f"rg/{name}/")
    # the reference answer, extracted from the tag, scores like the dataset scores it directly
    data = env.unwrapped.data
    item = data[info["index"]]
    _, r, term, _, step_info = env.step(f"thinking...\n<answer>{info['answer']}</answer>")
    assert term and r == data.score_answer(answer=str(info["answer"]), entry=item)
    env.reset(seed=4)
    _, r_wrong, *_ = env.step("<answer>definitely not it</answer>")
    assert r_wrong < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name", catalogue.REASONING_GYM_DATASETS)
def test_every_reasoning_gym_env_passes_check_env(name):
    _check_env(gymllm.make(f"gymllm/rg-{name}-v0", dataset_size=20).unwrapped)


def test_reasoning_gym_seeding_and_options():
    a = gymllm.make("gymllm/rg-gcd-v0")
    b = gymllm.make("gymllm/rg-gcd-v0")
    assert a.reset(seed=1)[0] == b.reset(seed=1)[0]
    assert len({a.reset(seed=s)[0] for s in range(6)}) > 1
    assert a.reset(options={"index": 7})[1]["index"] == 7
    with pytest.raises(ConfigError, match="dataset"):
        catalogue.ReasoningGymEnv("no_such_dataset").reset(seed=0)


def test_global_random_is_never_disturbed():
    random.seed(5), np.random.seed(5)
    expect = (random.random(), np.random.random())
    random.seed(5), np.random.seed(5)
    for env_id in ("gymllm/ta-GuessTheNumber-v0", "gymllm/rg-maze-v0"):
        env = gymllm.make(env_id)
        env.reset(seed=0)
        env.step("[7] <answer>x</answer>")
    assert (random.random(), np.random.random()) == expect


def test_private_global_random_is_deterministic_and_threadsafe_to_nest():
    a, b = PrivateGlobalRandom(3), PrivateGlobalRandom(3)
    with a.active():
        xs = [random.random() for _ in range(3)]
    with b.active():
        ys = [random.random() for _ in range(2)]
        with a.active():  # re-entrant (same thread)
            pass
        ys.append(random.random())
    assert xs == ys


@pytest.mark.parametrize("ta_id", TA_SAMPLE)
def test_textarena_single_player_envs(ta_id):
    env = gymllm.make(f"gymllm/{catalogue_textarena.ta_gym_id(ta_id)}")
    _check_env(env.unwrapped)
    o1, _ = env.reset(seed=2)
    o2, _ = gymllm.make(f"gymllm/{catalogue_textarena.ta_gym_id(ta_id)}").reset(seed=2)
    assert o1 == o2 and o1.startswith("[GAME]")


@pytest.mark.slow
@pytest.mark.parametrize("ta_id", catalogue_textarena.TEXTARENA_SINGLE_PLAYER)
def test_every_textarena_single_player_env_passes_check_env(ta_id):
    _check_env(gymllm.make(f"gymllm/{catalogue_textarena.ta_gym_id(ta_id)}").unwrapped)


def test_textarena_two_player_pettingzoo_tests():
    from pettingzoo.test import seed_test

    text_api_test(textarena_env("TicTacToe-v0-raw"), num_cycles=30)
    seed_test(lambda: textarena_env("TicTacToe-v0-raw"), num_cycles=20)


def test_textarena_self_play_one_trajectory_per_seat():
    vec = AgentVectorEnv(lambda: textarena_env("TicTacToe-v0-raw"), num_games=2)
    rng = np.random.default_rng(0)
    obs, rew, term, trunc, infos, ids = vec.reset(seed=0)
    returns = {i: 0.0 for i in range(4)}
    finished = set()
    for _ in range(200):
        acts, act_ids = [], []
        for r, te, tr, i in zip(rew, term, trunc, ids):
            returns[int(i)] += float(r)
            if te or tr:
                finished.add(int(i))
            else:
                acts.append(f"[{int(rng.integers(9))}]"), act_ids.append(int(i))
        if len(finished) == 4:
            break
        vec.send(acts, act_ids)
        obs, rew, term, trunc, infos, ids = vec.recv()
    assert finished == {0, 1, 2, 3}
    assert returns[0] == -returns[1] and returns[2] == -returns[3]


def test_missing_extra_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if the extra were not installed
    with pytest.raises(MissingExtraError, match=r"gymllm\[catalogue\]"):
        catalogue.ReasoningGymEnv("gcd").reset(seed=0)
