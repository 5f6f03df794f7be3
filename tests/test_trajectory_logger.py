"""TrajectoryLogger: readable JSONL + zarr token arrays, crash safety (SIGKILL), resume without dups."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest

from gymllm.core import TextEnv
from gymllm.types import Trajectory
from gymllm.wrappers.trajectory_logger import TrajectoryLogger
from gymllm.trajectories.format import TrajectoryLoggerConfig
from gymllm.trajectories.reader import read_log, read_tokens, scan_jsonl
from gymllm.errors import ConfigError


class DiceEnv(TextEnv):
    """Roll a hidden die from np_random; reward 1 for guessing it; 3 turns."""

    def __init__(self, sides: int = 6):
        super().__init__(max_turns=3)
        self.sides = sides

    def _reset(self, *, seed, options):
        self.target = int(self.np_random.integers(1, self.sides + 1))
        return f"Guess a number from 1 to {self.sides}.", {"task_id": f"dice-{self.sides}"}

    def _step(self, action):
        hit = action.strip() == str(self.target)
        return (
            ("correct" if hit else f"no, not {action.strip()}"),
            float(hit),
            hit,
            {"tool_calls": []},
        )


gym.register("gymllm_test/Dice-v0", entry_point=DiceEnv)


def _run_episode(env, seed, guesses=("1", "2", "3")):
    env.reset(seed=seed)
    for g in guesses:
        _, _, term, trunc, _ = env.step(g)
        if term or trunc:
            break


def test_jsonl_is_readable_and_complete(tmp_path):
    env = TrajectoryLogger(gym.make("gymllm_test/Dice-v0", sides=4), tmp_path / "log")
    for s in range(5):
        _run_episode(env, s)
    env.close()
    records, good, torn = scan_jsonl(tmp_path / "log" / "episodes.jsonl")
    assert (
        torn == 0
        and records[0]["type"] == "header"
        and records[0]["env_id"] == "gymllm_test/Dice-v0"
    )
    assert records[0]["env_kwargs"] == {"sides": 4} and "gymnasium" in records[0]["versions"]
    eps = read_log(tmp_path / "log")
    assert [e.seed for e in eps] == [0, 1, 2, 3, 4]
    for e in eps:
        assert e.complete and e.info["task_id"] == "dice-4"
        assert e.observation == "Guess a number from 1 to 4."
        # the logged rewards/ends agree with a fresh env driven by the same seed and actions (reference)
        ref = DiceEnv(sides=4)
        ref.reset(seed=e.seed)
        for step in e.steps:
            obs, r, term, trunc, _ = ref.step(step["action"])
            assert (obs, r, term, trunc) == (
                step["observation"],
                step["reward"],
                step["terminated"],
                step["truncated"],
            )
            assert step["timing"]["step_s"] >= 0
        assert e.end["return"] == e.episode_return
        msgs = e.messages()
        assert msgs[0] == {"role": "user", "content": "Guess a number from 1 to 4."}
        assert [m["role"] for m in msgs[:4]] == ["user", "assistant", "user", "assistant"]


def test_seed_assigned_when_reset_without_seed(tmp_path):
    env = TrajectoryLogger(DiceEnv(), tmp_path / "log", env_id="gymllm_test/Dice-v0")
    _run_episode(env, None)
    env.close()
    (ep,) = read_log(tmp_path / "log")
    assert isinstance(ep.seed, int)


def test_tokens_append_and_read_back_as_arrays(tmp_path):
    env = TrajectoryLogger(DiceEnv(), tmp_path / "log", chunk_size=8)
    rng = np.random.default_rng(0)
    written = []
    for s in range(3):
        _run_episode(env, s)
        n = int(rng.integers(5, 20))
        traj = Trajectory(
            token_ids=rng.integers(0, 500, n).astype(np.int32),
            loss_mask=rng.integers(0, 2, n).astype(np.int8),
            behaviour_logprobs=-rng.random(n).astype(np.float32),
            versions=rng.integers(0, 3, n).astype(np.int32),
            reward=1.0,
        )
        written.append((env.log_trajectory(traj), traj))
    env.close()
    # a second writer session appends after the first one's arrays
    env = TrajectoryLogger(DiceEnv(), tmp_path / "log", chunk_size=8)
    _run_episode(env, 9)
    rec = env.record_tokens(token_ids=[1, 2, 3])
    env.annotate(policy_version=np.int64(4), sampling={"temperature": 0.7})
    env.close()
    assert rec["offset"] == sum(t.token_ids.size for _, t in written)
    for rec0, traj in written:
        back = read_tokens(tmp_path / "log", rec0)
        np.testing.assert_array_equal(back["token_ids"], traj.token_ids)
        np.testing.assert_array_equal(back["loss_mask"], traj.loss_mask)
        np.testing.assert_array_equal(back["logprobs"], traj.behaviour_logprobs)
        np.testing.assert_array_equal(back["versions"], traj.versions)
    eps = read_log(tmp_path / "log")
    assert [len(e.tokens) for e in eps] == [1, 1, 1, 1]
    np.testing.assert_array_equal(
        read_tokens(tmp_path / "log", eps[-1].tokens[0])["token_ids"], [1, 2, 3]
    )
    assert eps[-1].notes[0]["policy_version"] == 4 and eps[-1].notes[0]["sampling"] == {
        "temperature": 0.7
    }


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="fsync"):
        TrajectoryLoggerConfig(path=str(tmp_path), fsync="always")
    with pytest.raises(ConfigError, match="chunk_size"):
        TrajectoryLoggerConfig(path=str(tmp_path), chunk_size=0)


WRITER = textwrap.dedent(
    """
    from gymllm.core import TextEnv
    from gymllm.wrappers.trajectory_logger import TrajectoryLogger

    class DiceEnv(TextEnv):  # the same env as the test module's, without importing pytest/hypothesis
        def __init__(self):
            super().__init__(max_turns=3)

        def _reset(self, *, seed, options):
            self.target = int(self.np_random.integers(1, 7))
            return "Guess a number from 1 to 6.", {{"task_id": "dice-6"}}

        def _step(self, action):
            hit = action.strip() == str(self.target)
            return ("correct" if hit else "no"), float(hit), hit, {{}}

    env = TrajectoryLogger(DiceEnv(), {path!r}, fsync="never")
    seed = 0
    while True:
        env.reset(seed=seed)
        for g in ("1", "2", "3"):
            _, _, t, tr, _ = env.step(g)
            env.record_tokens(token_ids=list(range(50)))
            print("step", flush=True)
            if t or tr:
                break
        seed += 1
    """
)


def test_killed_writer_leaves_readable_log_and_resume_has_no_duplicates(tmp_path):
    path = str(tmp_path / "log")
    code = WRITER.format(path=path)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        for _ in range(25):  # wait until several episodes are written, then kill mid-stream
            assert proc.stdout.readline(), proc.stderr.read().decode()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    records, good, torn = scan_jsonl(os.path.join(path, "episodes.jsonl"))
    assert torn <= 1 and records[0]["type"] == "header"
    done = read_log(path)
    assert len(done) >= 5
    for e in done:
        for t in e.tokens:
            np.testing.assert_array_equal(read_tokens(path, t)["token_ids"], np.arange(50))
    everything = read_log(path, include_incomplete=True)
    assert len(everything) - len(done) <= 1  # at most the episode in flight is incomplete

    # resume: skip complete seeds, redo the rest; nothing duplicated, nothing lost
    env = TrajectoryLogger(DiceEnv(), path)
    n_done = len(done)
    for seed in range(n_done + 3):
        if env.is_complete(seed, "dice-6"):
            continue
        _run_episode(env, seed)
    env.close()
    after = read_log(path, dedupe=False)
    assert sorted(e.seed for e in after) == list(range(n_done + 3))
    assert [e.episode for e in after[:n_done]] == [e.episode for e in done]
    records, _, torn = scan_jsonl(os.path.join(path, "episodes.jsonl"))
    assert torn == 0  # the torn tail (if any) was cut before appending
    assert any(r["type"] == "abort" for r in records) == (len(everything) > len(done))


def test_async_twins_log_the_same_records_as_sync(tmp_path):
    import asyncio

    def strip(path):
        out = []
        for e in read_log(path):
            out.append(
                (
                    e.seed,
                    e.observation,
                    [(s["action"], s["observation"], s["reward"]) for s in e.steps],
                )
            )
        return out

    sync = TrajectoryLogger(DiceEnv(), tmp_path / "sync")
    for s in range(3):
        _run_episode(sync, s)
    sync.close()

    async def run():
        env = TrajectoryLogger(DiceEnv(), tmp_path / "async")
        for s in range(3):
            await env.areset(seed=s)
            for g in ("1", "2", "3"):
                _, _, t, tr, _ = await env.astep(g)
                if t or tr:
                    break
        env.close()

    asyncio.run(run())
    assert strip(tmp_path / "sync") == strip(tmp_path / "async")


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_vector_logger_writes_one_file_per_sub_env_and_replays(tmp_path, backend):
    import gymllm
    from gymllm.trajectories import replay
    from gymllm.wrappers.trajectory_logger import vector_logger

    def run(seed):
        vec = gymllm.make_vec(
            "gymllm/Echo-v0",
            num_envs=3,
            episode_length=2,
            backend=backend,
            wrappers=[vector_logger(tmp_path / "log")],
        )
        vec.reset(seed=seed)
        for _ in range(4):
            vec.step(["hello"] * 3)
        vec.close()

    run(0)
    names = ["env-000.jsonl", "env-001.jsonl", "env-002.jsonl"]
    assert sorted(p.name for p in (tmp_path / "log").glob("*.jsonl")) == names
    assert not list((tmp_path / "log").glob("*.lock"))  # released on close
    first = len(read_log(tmp_path / "log"))
    run(100)  # a second run reuses the names and appends
    assert sorted(p.name for p in (tmp_path / "log").glob("*.jsonl")) == names
    eps = read_log(tmp_path / "log")
    assert len(eps) > first >= 3 and all(e.env_id == "gymllm/Echo-v0" for e in eps)
    report = replay(tmp_path / "log")
    assert report.ok and report.episodes_checked == len(eps), report.summary()


def test_stale_writer_lock_is_taken_over(tmp_path):
    from gymllm.trajectories.writers import claim_writer_name

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (tmp_path / "env-000.lock").write_text(dead.stdout.strip())  # a crashed run's lock
    (tmp_path / "env-001.lock").write_text(str(os.getpid()))  # a live writer's lock
    assert claim_writer_name(tmp_path)[0] == "env-000"
    assert claim_writer_name(tmp_path)[0] == "env-002"


class _Parrot(TextEnv):
    """Echoes arbitrary text back, to check that any str survives the log unchanged."""

    def __init__(self, texts):
        super().__init__()
        from gymllm.spaces import Text

        self.action_space = Text(max_length=10**6)
        self.texts = texts

    def _reset(self, *, seed, options):
        return self.texts[0], {"meta": self.texts[-1]}

    def _step(self, action):
        return action + self.texts[self.turn % len(self.texts)], 0.5, self.turn + 1 >= 2, {}


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=4), st.text())
def test_any_text_round_trips_through_the_log(tmp_path_factory, texts, action):
    path = tmp_path_factory.mktemp("log")
    env = TrajectoryLogger(_Parrot(texts), path)
    obs0, info0 = env.reset(seed=0)
    steps = [env.step(action), env.step(action)]
    env.close()
    (ep,) = read_log(path)
    assert ep.observation == obs0 and ep.info == info0
    assert [s["observation"] for s in ep.steps] == [s[0] for s in steps] and ep.actions == [
        action,
        action,
    ]


def test_lone_surrogate_in_an_observation_is_logged_not_fatal(tmp_path):
    env = TrajectoryLogger(_Parrot(["bad \udc80 byte"]), tmp_path)
    obs, _ = env.reset(seed=0)
    env.step("x"), env.step("y")
    env.close()
    assert read_log(tmp_path)[0].observation == obs
