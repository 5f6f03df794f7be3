"""TextEnv: the base class owns seeding, turn limit, order and action checks, and the async twins."""

import asyncio
import random
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm import TextEnv
from gymllm.core import areset_env, astep_env
from gymllm.errors import ConfigError, InvalidActionError, ResetNeededError
from gymllm.spaces import Chat, Text


class Counter(TextEnv):
    """Ends after `length` steps; obs carries a draw from the env RNG."""

    def __init__(self, length=3, **kw):
        super().__init__(**kw)
        self.length = length

    def _reset(self, *, seed, options):
        return f"start {int(self.np_random.integers(1000))}", {"options": options}

    def _step(self, action):
        return (
            f"{action}:{int(self.np_random.integers(1000))}",
            1.0,
            self.turn + 1 >= self.length,
            {},
        )


class AsyncOnly(TextEnv):
    async def _areset(self, *, seed, options):
        await asyncio.sleep(0)
        return [{"role": "user", "content": f"hi {int(self.np_random.integers(100))}"}], {}

    async def _astep(self, action):
        await asyncio.sleep(0.001)
        return (
            [{"role": "tool", "content": action}],
            0.5,
            False,
            {"loop": id(asyncio.get_running_loop())},
        )


class Sleepy(Counter):
    def _step(self, action):
        time.sleep(0.2)
        return super()._step(action)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 6), max_turns=st.one_of(st.none(), st.integers(1, 6)))
def test_turn_limit_truncates_exactly_like_a_reference_count(length, max_turns):
    env = Counter(length, max_turns=max_turns)
    env.reset(seed=0)
    t = 0
    while True:
        _, _, term, trunc, _ = env.step("a")
        t += 1
        want_term = t >= length
        want_trunc = not want_term and max_turns is not None and t >= max_turns
        assert (term, trunc) == (want_term, want_trunc) and env.turn == t
        if term or trunc:
            break
    assert env.episode_done
    with pytest.raises(ResetNeededError, match="after the episode ended"):
        env.step("a")


def test_step_before_reset_raises_a_clear_error():
    with pytest.raises(ResetNeededError, match=r"before reset\(\).*Fix: call env.reset"):
        Counter().step("a")


@pytest.mark.parametrize("action", [3, b"bytes", None, ["a"], "x" * 11])
def test_invalid_actions_raise_and_lose_nothing(action):
    env = Counter(10)
    env.action_space = Text(10)
    env.reset(seed=0)
    with pytest.raises(InvalidActionError, match="expected an action in Text"):
        env.step(action)
    assert env.turn == 0 and not env.episode_done
    assert env.step("ok")[0].startswith("ok:")


def test_seed_fixes_episode_and_global_rng_is_untouched():
    random.seed(1)
    np.random.seed(1)
    py, npy = random.getstate(), np.random.get_state()[1].copy()
    env = Counter(5)

    def run():
        out = [env.reset(seed=42)[0]]
        out += [env.step("x")[0] for _ in range(4)]
        return out

    assert run() == run()
    assert random.getstate() == py and np.array_equal(np.random.get_state()[1], npy)


def test_reset_without_seed_continues_the_env_rng():
    env = Counter()
    a = env.reset(seed=7)[0]
    b = env.reset()[0]
    env.reset(seed=7)
    assert env.reset()[0] == b and a == env.reset(seed=7)[0]


def test_five_tuple_hooks_and_options_pass_through():
    class Five(Counter):
        def _step(self, action):
            return "o", 2, False, True, None

    env = Five()
    _, info = env.reset(seed=0, options={"k": 1})
    assert info == {"options": {"k": 1}}
    assert env.step("a") == ("o", 2.0, False, True, {})


def test_async_only_env_supports_sync_and_async_and_keeps_one_loop():
    env = AsyncOnly(max_turns=2)
    env.observation_space = Chat(8)
    obs, _ = env.reset(seed=3)
    _, _, _, _, i1 = env.step("a")
    _, _, _, trunc, i2 = env.step("b")
    assert trunc and i1["loop"] == i2["loop"]  # sync calls run on one private loop

    async def main():
        o, _ = await env.areset(seed=3)
        return o, await env.astep("é")

    o2, step = asyncio.run(main())
    assert o2 == obs and step[0] == [{"role": "tool", "content": "é"}]
    env.close()
    env.close()


def test_sync_env_async_twins_do_not_block_the_event_loop():
    env = Sleepy(5)

    async def main():
        await env.areset(seed=0)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await env.astep("a")
        task.cancel()
        return ticks

    assert asyncio.run(main()) >= 5  # the 0.2 s step ran in an executor while the loop kept ticking


def test_async_helpers_work_on_wrapped_envs_and_match_sync():
    from gymnasium.wrappers import TimeLimit

    wrapped = TimeLimit(Counter(10), max_episode_steps=2)

    async def main():
        o, _ = await areset_env(wrapped, seed=5)
        return [o] + [(await astep_env(wrapped, "a"))[:4] for _ in range(2)]

    got = asyncio.run(main())
    o = wrapped.reset(seed=5)[0]
    assert got == [o, wrapped.step("a")[:4], wrapped.step("a")[:4]]
    assert got[-1][3] is True  # TimeLimit truncation kept


def test_render_ansi_and_config_validation():
    env = Counter(render_mode="ansi")
    env.reset(seed=0)
    assert env.render().startswith("start")
    with pytest.raises(ConfigError, match="max_turns"):
        Counter(max_turns=0)
    with pytest.raises(ConfigError, match="render_mode"):
        Counter(render_mode="human")


def test_subclass_that_skips_super_init_still_gets_defaults():
    class Lazy(TextEnv):
        def __init__(self):
            pass

        def _reset(self, *, seed, options):
            return "x", {}

        def _step(self, action):
            return action, 0.0, False, {}

    env = Lazy()
    env.reset(seed=0)
    assert env.step("é")[0] == "é"
    with pytest.raises(InvalidActionError):
        env.step(1)


def test_envs_are_independent_across_threads():
    envs = [Counter(100) for _ in range(4)]
    results = {}

    def run(i):
        envs[i].reset(seed=i)
        results[i] = [envs[i].step("a")[0] for _ in range(50)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for i in range(4):
        e = Counter(100)
        e.reset(seed=i)
        assert results[i] == [e.step("a")[0] for _ in range(50)]


class OwnNames(Counter):
    """A subclass using the names TextEnv's invariants once lived under, for its own purposes."""

    def _reset(self, *, seed, options):
        self._state, self._turn, self._last_obs = "mine", -5, "mine"
        return super()._reset(seed=seed, options=options)

    def _after_step(self, *args):
        raise AssertionError("TextEnv must not call a subclass's _after_step")

    def _before_step(self, *args):
        raise AssertionError("TextEnv must not call a subclass's _before_step")


def test_the_episode_invariants_never_collide_with_a_subclass_names_and_survive_pickling():
    import pickle

    env, ref = (
        OwnNames(length=5, max_turns=2, render_mode="ansi"),
        Counter(length=5, max_turns=2, render_mode="ansi"),
    )
    assert env.reset(seed=3) == ref.reset(seed=3)
    assert env.step("a") == ref.step("a") and env.turn == 1 and not env.episode_done
    copy = pickle.loads(
        pickle.dumps(env)
    )  # the process backend ships envs pickled: the episode goes along
    assert copy.turn == 1 and copy.render() == env.render() == ref.render()
    assert (
        env.step("b") == ref.step("b") and env.episode_done and env.turn == 2
    )  # truncated at max_turns
    with pytest.raises(ResetNeededError, match="after the episode ended"):
        env.step("c")
    assert copy.step("b")[3] and copy.episode_done
    assert env._state == "mine" and env._turn == -5  # the subclass's own attributes are left alone
