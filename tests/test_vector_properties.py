"""Hypothesis properties of the vector env: ids received exactly once, autoreset modes as Gymnasium,
async == sync per env."""

import functools

import gymnasium as gym
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.envs.basic import EchoEnv, FailingEnv, LatencyEnv
from gymllm.utils import check_vector_env
from gymllm.vector import VectorEnv

MODES = {
    "next_step": gym.vector.AutoresetMode.NEXT_STEP,
    "same_step": gym.vector.AutoresetMode.SAME_STEP,
    "disabled": gym.vector.AutoresetMode.DISABLED,
}


def pick(values, mask):
    return [v for v, m in zip(values, mask) if m]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.lists(st.booleans(), min_size=4, max_size=4)),
        st.tuples(st.just("recv"), st.integers(1, 5)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None)
@given(
    schedule=ops,
    seed=st.integers(0, 1000),
    fail_at=st.integers(1, 3),
    mode=st.sampled_from(["next_step", "same_step"]),
)
def test_every_sent_env_id_is_received_exactly_once(schedule, seed, fail_at, mode):
    fns = [
        functools.partial(LatencyEnv, median_s=0.0005, p99_s=0.004, episode_length=2 + i)
        for i in range(3)
    ]
    fns.append(
        functools.partial(FailingEnv, fail_at_step=fail_at, episode_length=4)
    )  # fails every episode
    vec = VectorEnv(fns, autoreset_mode=mode)
    try:
        vec.reset(seed=seed)
        in_flight, sent, received = set(), [0] * 4, [0] * 4
        for op, arg in schedule:
            if op == "send":
                ids = [i for i in range(4) if arg[i] and i not in in_flight]
                if ids:
                    vec.send([f"a{i}" for i in ids], env_ids=ids)
                    in_flight |= set(ids)
                    for i in ids:
                        sent[i] += 1
            elif in_flight:
                ids = list(vec.recv(min_ready=arg)[5])
                assert len(ids) == len(set(ids)) and set(ids) <= in_flight
                assert len(ids) >= min(arg, len(in_flight))
                in_flight -= set(ids)
                for i in ids:
                    received[i] += 1
        while in_flight:
            ids = list(vec.recv()[5])
            assert set(ids) <= in_flight
            in_flight -= set(ids)
            for i in ids:
                received[i] += 1
        assert sent == received and vec.in_flight == []
    finally:
        vec.close()


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    mode=st.sampled_from(sorted(MODES)),
    steps=st.integers(1, 10),
    seed=st.integers(0, 1000),
)
def test_autoreset_semantics_match_gymnasium_per_mode(lengths, mode, steps, seed):
    fns = [functools.partial(EchoEnv, episode_length=n) for n in lengths]
    ours = VectorEnv(fns, autoreset_mode=mode)
    ref = gym.vector.SyncVectorEnv(fns, autoreset_mode=MODES[mode])
    try:
        assert list(ours.reset(seed=seed)[0]) == list(ref.reset(seed=seed)[0])
        for t in range(steps):
            acts = [f"{t}-{i}" for i in range(len(lengths))]
            a, b = ours.step(acts), ref.step(acts)
            assert list(a[0]) == list(b[0])
            for x, y in zip(a[1:4], b[1:4]):
                np.testing.assert_array_equal(x, y)
            if mode == "same_step":
                mask = b[4].get("_final_obs", np.zeros(len(lengths), bool))
                np.testing.assert_array_equal(
                    a[4].get("_final_obs", np.zeros(len(lengths), bool)), mask
                )
                n = len(lengths)
                assert pick(a[4].get("final_obs", [None] * n), mask) == pick(
                    b[4].get("final_obs", [None] * n), mask
                )
            if mode == "disabled":
                ended = np.logical_or(a[2], a[3])
                np.testing.assert_array_equal(ours.ended, ended)
                if ended.any():
                    o1, _ = ours.reset(options={"reset_mask": ended})
                    o2, _ = ref.reset(options={"reset_mask": ended})
                    assert pick(o1, ended) == pick(o2, ended)
    finally:
        ours.close()
        ref.close()


@settings(max_examples=8, deadline=None)
@given(lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4), seed=st.integers(0, 10_000))
def test_async_and_barrier_free_paths_equal_sync_per_env(lengths, seed):
    fns = [functools.partial(EchoEnv, episode_length=n) for n in lengths]
    check_vector_env(lambda: VectorEnv(fns), seed=seed, num_steps=6, median_s=0.001, max_s=0.005)
