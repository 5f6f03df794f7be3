"""from_gymnasium: FrozenLake, Taxi, Blackjack, CliffWalking (and Box/MultiDiscrete/Dict envs) as text
envs with no per-env code; each text episode is checked step by step against the raw Gymnasium env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings, strategies as st

import gymllm
from gymllm.envs import from_gymnasium
from gymllm.space_text import ansi_to_text, format_action, parse_action
from gymllm.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore")

TOY = ["FrozenLake-v1", "Taxi-v4", "Blackjack-v1", "CliffWalking-v1"]


def _check_env(env):
    try:
        from gymllm.utils import check_env
    except ImportError:  # the project checker lands separately; Gymnasium's own checker is the peer
        from gymnasium.utils.env_checker import check_env
    check_env(env)


@pytest.mark.parametrize("gym_id", TOY)
def test_text_episode_matches_raw_env(gym_id):
    """Same seed, same actions (by name in text): identical rewards, ends and raw observations."""
    text = from_gymnasium(gym_id)
    rng = np.random.default_rng(0)
    for seed in range(3):
        obs, info = text.reset(seed=seed)
        raw = gym.make(gym_id)
        raw_seed = int(
            np.random.default_rng(seed).integers(0, 2**31 - 1)
        )  # the adapter's derivation
        robs, _ = raw.reset(seed=raw_seed)
        assert info["raw_observation"] == robs and isinstance(obs, str) and "Actions:" in obs
        for _ in range(30):
            a = int(rng.integers(text.inner.action_space.n))
            obs, r, te, tr, info = text.step(
                f"I choose {format_action(a, raw.action_space, text.names)}"
            )
            robs, rr, rte, rtr, _ = raw.step(a)
            assert (info["raw_observation"], r, te, tr) == (robs, rr, rte, rtr)
            if te or tr:
                break


@pytest.mark.parametrize(
    "env_id",
    [
        "gymllm/FrozenLake-v0",
        "gymllm/FrozenLake8x8-v0",
        "gymllm/Taxi-v0",
        "gymllm/CliffWalking-v0",
        "gymllm/Blackjack-v0",
    ],
)
def test_registered_games_pass_check_env_and_are_seeded(env_id):
    env = gymllm.make(env_id)
    _check_env(env.unwrapped)
    a, _ = gymllm.make(env_id).reset(seed=7)
    b, _ = gymllm.make(env_id).reset(seed=7)
    assert a == b


def test_ansi_board_keeps_highlight_and_kwargs_reach_inner_env():
    env = gymllm.make("gymllm/FrozenLake-v0", is_slippery=False, invalid_action="forfeit")
    obs, _ = env.reset(seed=0)
    assert "[S:red background]FFF" in obs and "0 (LEFT), 1 (DOWN), 2 (RIGHT), 3 (UP)" in obs
    for move in (
        "DOWN",
        "DOWN",
        "RIGHT",
        "RIGHT",
        "DOWN",
        "RIGHT",
    ):  # deterministic path to the goal
        obs, r, te, tr, _ = env.step(move)
    assert (r, te) == (1.0, True)
    assert (
        ansi_to_text("\x1b[43mX\x1b[0m|\x1b[34;1mB\x1b[0m") == "[X:yellow background]|[B:blue bold]"
    )


def test_invalid_action_policies():
    env = from_gymnasium("FrozenLake-v1", invalid_penalty=-0.5, max_invalid=2)
    env.reset(seed=0)
    obs, r, te, tr, info = env.step("fly")
    assert (r, te, info["invalid_action"]) == (
        -0.5,
        False,
        "retry",
    ) and "Invalid action (1 in a row)" in obs
    assert "Actions:" in obs  # the menu is repeated
    obs, r, te, tr, info = env.step("fly")
    assert (r, te, info["invalid_action"]) == (-0.5, True, "forfeit")
    env = from_gymnasium("Taxi-v4", invalid_action="forfeit")
    env.reset(seed=0)
    assert env.step("7")[2] is True


def test_action_mask_lists_legal_actions_only():
    obs, info = from_gymnasium("Taxi-v4").reset(seed=0)
    legal = [
        n
        for n, ok in zip(
            ("SOUTH", "NORTH", "EAST", "WEST", "PICKUP", "DROPOFF"), info["action_mask"]
        )
        if ok
    ]
    menu = obs.splitlines()[-1]
    assert all(n in menu for n in legal) and sum(n in menu for n in ("PICKUP", "DROPOFF")) == sum(
        n in legal for n in ("PICKUP", "DROPOFF")
    )


class DictBoxEnv(gym.Env):
    """A tiny env with Dict observations and a Box action, to cover the structured renderer/parser."""

    observation_space = spaces.Dict(
        {"pos": spaces.Box(-1, 1, (2,), np.float32), "mode": spaces.Discrete(3)}
    )
    action_space = spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return {"pos": self.pos.copy(), "mode": 0}, {}

    def step(self, action):
        self.pos = np.clip(self.pos + action, -1, 1).astype(np.float32)
        return {"pos": self.pos.copy(), "mode": 1}, -float(np.abs(self.pos).sum()), False, False, {}


def test_structured_description_and_numeric_actions():
    env = from_gymnasium(DictBoxEnv())
    obs, _ = env.reset(seed=0)
    assert "observation.pos: [" in obs and "observation.mode: 0" in obs and "between" in obs
    obs, r, *_ = env.step("0.5, -0.25")
    assert "observation.mode: 1" in obs and r <= 0
    assert env.step("[0.1, 0.2, 0.3]")[4]["invalid_action"] == "retry"
    _check_env(from_gymnasium(DictBoxEnv()))


SPACES = [
    spaces.Discrete(5, start=-2),
    spaces.MultiDiscrete([3, 4]),
    spaces.Box(-2, 2, (3,), np.float32),
    spaces.MultiBinary(4),
    spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Box(0, 1, (2,), np.float64)}),
    spaces.Tuple((spaces.Discrete(2), spaces.MultiDiscrete([2, 2]))),
]


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
def test_format_parse_round_trip(space):
    space.seed(0)
    for _ in range(20):
        a = space.sample()
        back = parse_action(format_action(a, space), space)
        assert space.contains(back)
        np.testing.assert_equal(gym.spaces.flatten(space, back), gym.spaces.flatten(space, a))


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text_never_crashes(text):
    env = from_gymnasium("CliffWalking-v1", max_invalid=None)
    env.reset(seed=0)
    obs, r, te, tr, info = env.step(text)
    assert isinstance(obs, str) and isinstance(r, float)


def test_config_errors():
    with pytest.raises(ConfigError, match="invalid_action"):
        from_gymnasium("FrozenLake-v1", invalid_action="ignore")
    with pytest.raises(ConfigError, match="4 names"):
        from_gymnasium("FrozenLake-v1", action_names=("a", "b"))
    with pytest.raises(ConfigError, match="observation_space"):
        from_gymnasium(_Weird())


class _Weird(gym.Env):
    observation_space = spaces.Text(5)
    action_space = spaces.Discrete(2)
