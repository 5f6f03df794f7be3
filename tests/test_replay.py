"""Replay: logged episodes re-executed match; a nondeterministic env is caught and reported."""

from __future__ import annotations

import os

import gymnasium as gym
import pytest

import gymllm.wrappers
from gymllm.core import TextEnv
from gymllm.trajectories.replaying import ReplayReport
from gymllm.wrappers.trajectory_logger import TrajectoryLogger
from gymllm.trajectories.reader import read_log


class Walk(TextEnv):
    """A seeded random walk: the observation shows the position, the reward is the step's noise."""

    def __init__(self, noisy: bool = False):
        super().__init__(max_turns=4)
        self.noisy = noisy

    def _reset(self, *, seed, options):
        self.pos = int(self.np_random.integers(0, 10))
        return f"at {self.pos}", {}

    def _step(self, action):
        self.pos += 1 if action == "right" else -1
        # the deliberate bug: fresh OS entropy instead of the env's np_random
        noise = (
            int.from_bytes(os.urandom(2), "little")
            if self.noisy
            else int(self.np_random.integers(0, 3))
        )
        return f"at {self.pos}", float(noise), self.pos == 0, {}


gym.register("gymllm_test/Walk-v0", entry_point=Walk)


def _log(path, noisy, episodes=3):
    env = TrajectoryLogger(gym.make("gymllm_test/Walk-v0", noisy=noisy), path)
    for s in range(episodes):
        env.reset(seed=s)
        for a in ("right", "left", "right", "right"):
            _, _, t, tr, _ = env.step(a)
            if t or tr:
                break
    env.close()


def test_replay_of_logged_episodes_matches(tmp_path):
    _log(tmp_path / "log", noisy=False)
    report = gymllm.trajectories.replay(tmp_path / "log")
    assert isinstance(report, ReplayReport)
    assert report.ok, report.summary()
    assert report.episodes_checked == 3 and report.steps_checked == 12
    assert "OK" in report.summary()


def test_nondeterministic_env_is_reported(tmp_path):
    _log(tmp_path / "log", noisy=True)
    report = gymllm.trajectories.replay(tmp_path / "log", max_episodes=2)
    assert not report.ok and report.episodes_checked == 2
    assert {d.field for d in report.differences} == {"reward"}
    assert {d.step for d in report.differences} <= {1, 2, 3, 4}
    assert len(report.mismatched_episodes) == 2 and "MISMATCH" in report.summary()


def test_replay_names_the_function_after_every_submodule_is_imported(tmp_path):
    _log(tmp_path / "log", noisy=False, episodes=1)
    import importlib
    import pkgutil

    import gymllm.trajectories as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"gymllm.trajectories.{info.name}")
    from gymllm.trajectories import replay as fn
    from gymllm.trajectories.replaying import replay as same

    assert fn is same and pkg.replay is same and fn(tmp_path / "log").ok


def test_broken_episode_is_isolated(tmp_path):
    _log(tmp_path / "log", noisy=False, episodes=2)
    first = read_log(tmp_path / "log")[0].episode

    def factory(ep):
        if ep.episode == first:
            raise RuntimeError("cannot build")
        return gym.make("gymllm_test/Walk-v0")

    report = gymllm.trajectories.replay(tmp_path / "log", env_factory=factory)
    assert (
        report.episodes_checked == 1
        and len(report.errors) == 1
        and "cannot build" in report.errors[0]
    )


def test_changed_env_is_reported_per_step(tmp_path):
    _log(tmp_path / "log", noisy=False, episodes=1)
    # replaying against a different env (no seeding of the start) reports the reset observation
    report = gymllm.trajectories.replay(tmp_path / "log", env_factory=lambda ep: _Shifted())
    assert (
        not report.ok
        and report.differences[0].step == 0
        and report.differences[0].field == "observation"
    )


class _Shifted(Walk):
    def _reset(self, *, seed, options):
        obs, info = super()._reset(seed=seed, options=options)
        self.pos += 100
        return f"at {self.pos}", info


@pytest.mark.parametrize(
    "env_id",
    [
        "gymllm/FrozenLake-v0",
        "gymllm/Taxi-v0",
        "gymllm/TicTacToe-v0",
        "gymllm/ConnectFour-v0",
        "gymllm/rg-gcd-v0",
        "gymllm/ta-Mastermind-v0",
    ],
)
def test_registered_adapters_replay_exactly(tmp_path, env_id):
    """Random replies (some invalid) through the adapters are logged, then replayed without a difference."""
    import numpy as np

    import gymllm

    env = TrajectoryLogger(gymllm.make(env_id), tmp_path / "log")
    rng = np.random.default_rng(0)
    replies = [
        "0",
        "1",
        "2",
        "3",
        "4",
        "a1",
        "b2",
        "LEFT",
        "DOWN",
        "[1 2 3 4]",
        "<answer>3</answer>",
        "nonsense",
    ]
    for seed in range(3):
        env.reset(seed=seed)
        for _ in range(12):
            _, _, te, tr, _ = env.step(replies[int(rng.integers(len(replies)))])
            if te or tr:
                break
    env.close()
    report = gymllm.trajectories.replay(tmp_path / "log")
    assert report.ok and report.episodes_checked == len(read_log(tmp_path / "log")), (
        report.summary()
    )


def test_logged_wrapper_stack_is_rebuilt_for_replay(tmp_path):
    import gymllm
    from gymllm.wrappers import Limits, RecordEpisodeStatistics, RewardTransform, TransformReward

    def stack():
        env = gymllm.make("gymllm/FrozenLake-v0")
        return RewardTransform(
            Limits(RecordEpisodeStatistics(env), max_turns=4), scale=3.0, clip=(-1.0, 2.0)
        )

    env = TrajectoryLogger(stack(), tmp_path / "log")
    for seed in range(3):
        env.reset(seed=seed)
        for a in ("DOWN", "RIGHT", "bad", "DOWN", "RIGHT"):
            _, _, te, tr, _ = env.step(a)
            if te or tr:
                break
    env.close()
    (first, *_) = read_log(tmp_path / "log")
    assert [w["name"] for w in first.wrappers] == [
        "RecordEpisodeStatistics",
        "Limits",
        "RewardTransform",
    ]
    report = gymllm.trajectories.replay(tmp_path / "log")
    assert report.ok and report.episodes_checked == 3, report.summary()
    # without the stack (the bare registered env) the scaled rewards and the turn limit differ
    bare = gymllm.trajectories.replay(
        tmp_path / "log", env_factory=lambda ep: gymllm.make(ep.env_id, **ep.env_kwargs)
    )
    assert not bare.ok and {d.field for d in bare.differences} & {"reward", "truncated"}

    # a wrapper whose kwargs are not plain JSON (a lambda) cannot be rebuilt: a clear per-episode error
    env = TrajectoryLogger(
        TransformReward(gymllm.make("gymllm/FrozenLake-v0"), lambda r: 2 * r), tmp_path / "lam"
    )
    env.reset(seed=0)
    for a in ("LEFT",) * 200:
        if env.step(a)[2:4] != (False, False):
            break
    env.close()
    report = gymllm.trajectories.replay(tmp_path / "lam")
    assert (
        not report.ok
        and "TransformReward" in report.errors[0]
        and "env_factory" in report.errors[0]
    )
