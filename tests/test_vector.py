"""The barrier-free vector env: parity with Gymnasium's SyncVectorEnv, send/recv, error paths."""

import asyncio
import functools
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from gymllm import TextEnv
from gymllm.envs.basic import EchoEnv, FailingEnv, LatencyEnv
from gymllm.errors import EnvError, EnvTimeoutError, InvalidActionError, ResetNeededError
from gymllm.spaces import Chat
from gymllm.vector import EnvIdError, VectorEnv, VectorStateError


def echo(length=3):
    return functools.partial(EchoEnv, episode_length=length)


def fixed_latency(seconds, length=100):
    return functools.partial(LatencyEnv, median_s=seconds, p99_s=seconds, episode_length=length)


class GatedEnv(EchoEnv):
    """Echo whose steps wait on a ``threading.Event`` (and meet a ``threading.Barrier``) the test holds:
    the test decides when a step finishes instead of racing a sleep."""

    def __init__(self, *, gate=None, barrier=None, episode_length=100):
        super().__init__(episode_length=episode_length)
        self.gate, self.barrier = gate, barrier

    def _step(self, action):
        if self.barrier is not None:
            self.barrier.wait(timeout=30)  # BrokenBarrierError unless all parties step at once
        if self.gate is not None:
            assert self.gate.wait(timeout=30), "the test never opened the gate"
        return super()._step(action)


@pytest.fixture
def closing():
    made = []
    yield made.append
    for v in made:
        v.close()


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_step_matches_gymnasium_sync_vector_env(mode, closing):
    lengths = [1, 2, 3, 5]
    fns = [echo(n) for n in lengths]
    ours = VectorEnv(fns, autoreset_mode=mode)
    closing(ours)
    ref = gym.vector.SyncVectorEnv(
        fns,
        autoreset_mode=gym.vector.AutoresetMode(
            {"next_step": "NextStep", "same_step": "SameStep"}[mode]
        ),
    )
    assert ours.metadata["autoreset_mode"] == ref.metadata["autoreset_mode"]
    o1, _ = ours.reset(seed=3)
    o2, _ = ref.reset(seed=3)
    assert list(o1) == list(o2)
    for t in range(9):
        acts = [f"a{t}"] * 4
        a, b = ours.step(acts), ref.step(acts)
        assert list(a[0]) == list(b[0])
        for x, y in zip(a[1:4], b[1:4]):
            np.testing.assert_array_equal(x, y)
        if mode == "same_step" and "final_obs" in b[4]:
            np.testing.assert_array_equal(a[4]["_final_obs"], b[4]["_final_obs"])
            assert list(a[4]["final_obs"][b[4]["_final_obs"]]) == list(
                b[4]["final_obs"][b[4]["_final_obs"]]
            )
    ref.close()


def test_disabled_autoreset_needs_a_masked_reset(closing):
    vec = VectorEnv([echo(1), echo(3)], autoreset_mode="disabled")
    closing(vec)
    obs, _ = vec.reset(seed=0)
    _, _, term, _, _ = vec.step(["a", "a"])
    assert list(term) == [True, False] and list(vec.ended) == [True, False]
    with pytest.raises(ResetNeededError, match="reset_mask"):
        vec.step(["a", "a"])
    kept = vec._slots[1].last_obs
    obs, infos = vec.reset(options={"reset_mask": vec.ended})
    assert (
        obs[1] == kept and obs[0].startswith("Repeat:") and list(infos["_task_id"]) == [True, False]
    )
    vec.step(["b", "b"])


def test_recv_returns_fast_envs_first_without_waiting_for_the_slow_one(closing):
    gate = threading.Event()  # env 0's step cannot finish until the test opens it
    vec = VectorEnv([functools.partial(GatedEnv, gate=gate), echo(100), echo(100)])
    closing(vec)
    vec.reset(seed=0)
    vec.send(["a", "b", "c"])
    _, _, _, _, _, ids = vec.recv(min_ready=2)
    assert sorted(ids) == [1, 2] and vec.in_flight == [0]  # returned while env 0 was still blocked
    vec.send(["x"], env_ids=[1])
    assert list(vec.recv(min_ready=1)[5]) == [1]  # env 1 goes round again; env 0 still blocked
    gate.set()
    got = []
    while vec.in_flight:
        got += list(vec.recv()[5])
    assert got == [0]


def test_recv_timeout_returns_what_is_ready(closing):
    vec = VectorEnv([fixed_latency(0.4)])
    closing(vec)
    vec.reset(seed=0)
    vec.send(["a"])
    obs, rew, term, trunc, infos, ids = vec.recv(timeout=0.05)
    assert len(ids) == 0 and obs.shape == (0,) and vec.in_flight == [0]
    assert list(vec.recv(timeout=5)[5]) == [0]


def test_step_is_barrier_free_inside_a_sync_step(closing):
    barrier = threading.Barrier(
        8
    )  # each step waits for all eight: only concurrent steps get through
    vec = VectorEnv([functools.partial(GatedEnv, barrier=barrier) for _ in range(8)])
    closing(vec)
    vec.reset(seed=0)
    obs, *_, infos = vec.step(["a"] * 8)
    assert "error" not in infos and all(o.startswith("You said") for o in obs)


def test_bounded_concurrency(closing):
    live, peak, lock = [0], [0], threading.Lock()

    class Tracked(EchoEnv):
        def _step(self, action):
            with lock:
                live[0] += 1
                peak[0] = max(peak[0], live[0])
            time.sleep(0.03)
            with lock:
                live[0] -= 1
            return super()._step(action)

    vec = VectorEnv([functools.partial(Tracked, episode_length=50)] * 6, max_concurrency=2)
    closing(vec)
    vec.reset(seed=0)
    for _ in range(3):
        vec.step(["a"] * 6)
    assert peak[0] == 2


def test_per_env_reset_and_chat_observations(closing):
    class ChatEnv(EchoEnv):
        def __init__(self):
            super().__init__(episode_length=5)
            self.observation_space = Chat(16)

        def _reset(self, *, seed, options):
            obs, info = super()._reset(seed=seed, options=options)
            return [{"role": "system", "content": "s"}, {"role": "user", "content": obs}], info

        def _step(self, action):
            obs, r, d, info = super()._step(action)
            return [{"role": "tool", "content": obs, "tool_call_id": "1"}], r, d, info

    vec = VectorEnv([ChatEnv, echo()])
    closing(vec)
    obs, _ = vec.reset(seed=0)
    assert (
        obs.dtype == object
        and isinstance(obs[0], list)
        and len(obs[0]) == 2
        and isinstance(obs[1], str)
    )
    o, info = vec.reset_env(0, seed=0)
    assert o == obs[0] and info["task_id"]
    vec.send(["q"], env_ids=[0])
    out = vec.recv()
    assert out[0][0][0]["role"] == "tool" and list(out[5]) == [0]


def test_caller_errors_are_clear_and_start_nothing(closing):
    vec = VectorEnv([echo(), echo()])
    closing(vec)
    with pytest.raises(ResetNeededError, match="never reset"):
        vec.step(["a", "a"])
    vec.reset(seed=0)
    with pytest.raises(InvalidActionError, match="2 actions"):
        vec.step(["a"])
    with pytest.raises(InvalidActionError, match="action for env 1"):
        vec.send(["a", 7])
    assert vec.in_flight == []  # env 0 was not started either
    with pytest.raises(InvalidActionError, match="sequence"):
        vec.send("ab")
    with pytest.raises(EnvIdError, match=r"an int in \[0, 2\)"):
        vec.send(["a"], env_ids=[2])
    with pytest.raises(EnvIdError, match="distinct"):
        vec.send(["a", "b"], env_ids=[0, 0])
    with pytest.raises(VectorStateError, match="send"):
        vec.recv()
    vec.send(["a"], env_ids=[0])
    with pytest.raises(VectorStateError, match="recv"):
        vec.send(["a"], env_ids=[0])
    with pytest.raises(VectorStateError, match="in flight"):
        vec.reset()
    with pytest.raises(InvalidActionError, match="min_ready"):
        vec.recv(min_ready=0)
    assert list(vec.recv(min_ready=5)[5]) == [0]  # clamped to what is in flight


def test_raising_sub_env_is_reported_with_its_id_and_others_keep_running(closing):
    vec = VectorEnv(
        [echo(10), functools.partial(FailingEnv, fail_at_step=2, episode_length=10), echo(10)]
    )
    closing(vec)
    vec.reset(seed=0)
    vec.step(["a"] * 3)
    obs, _, _, trunc, infos = vec.step(["a"] * 3)
    assert obs[1] is None and trunc[1] and list(infos["_error"]) == [False, True, False]
    err = infos["error"][1]
    assert isinstance(err, EnvError) and err.env_id == 1 and isinstance(err.cause, RuntimeError)
    assert obs[0].startswith("You said") and obs[2].startswith("You said")
    obs, *_ = vec.step(["a"] * 3)  # NEXT_STEP: the failed env is reset, the others step on
    assert obs[1].startswith("Repeat:") and obs[0].startswith("You said")


def test_on_error_raise_is_catchable_and_keeps_the_batch(closing):
    vec = VectorEnv([echo(10), functools.partial(FailingEnv, fail_at_step=1)], on_error="raise")
    closing(vec)
    vec.reset(seed=0)
    with pytest.raises(EnvError) as info:
        vec.step(["a", "a"])
    assert info.value.env_id == 1 and info.value.results[0][0].startswith("You said")
    vec.send(["b", "b"])  # env 1 autoresets; nothing deadlocked
    assert sorted(vec.recv(min_ready=2)[5]) == [0, 1]


def test_hanging_sub_env_times_out_with_its_id_and_is_rebuilt(closing):
    hang = functools.partial(FailingEnv, fail_at_step=1, mode="hang", hang_s=60.0)
    vec = VectorEnv([echo(10), hang], step_timeout=0.3)
    closing(vec)
    vec.reset(seed=0)
    old = vec.envs[1]
    t0 = time.perf_counter()
    obs, _, _, trunc, infos = vec.step(["a", "a"])
    assert 0.25 < time.perf_counter() - t0 < 30  # waited for the timeout, not for the 60 s hang
    assert (
        isinstance(infos["error"][1], EnvTimeoutError)
        and infos["error"][1].env_id == 1
        and trunc[1]
    )
    assert obs[0].startswith("You said")
    obs, *_ = vec.step(["a", "a"])  # rebuilt from its factory and reset
    assert vec.envs[1] is not old and obs[1].startswith("Repeat:")


def test_astep_env_raises_env_errors_and_timeouts(closing):
    hang = functools.partial(FailingEnv, fail_at_step=1, mode="hang", hang_s=3.0)
    vec = VectorEnv([functools.partial(FailingEnv, fail_at_step=1), hang, echo()], step_timeout=0.3)
    closing(vec)

    async def main():
        for i in range(3):
            await vec.areset_env(i, seed=i)
        with pytest.raises(EnvError) as e0:
            await vec.astep_env(0, "a")
        with pytest.raises(EnvTimeoutError) as e1:
            await vec.astep_env(1, "a")
        with pytest.raises(ResetNeededError):
            await vec.astep_env(0, "a")
        with pytest.raises(InvalidActionError):
            await vec.astep_env(2, 5)
        return e0.value.env_id, e1.value.env_id, await vec.astep_env(2, "é")

    i0, i1, ok = asyncio.run(main())
    assert (i0, i1) == (0, 1) and ok[0].startswith("You said: é")


def test_close_returns_with_a_hung_env_in_flight_and_is_idempotent():
    hang = functools.partial(FailingEnv, fail_at_step=1, mode="hang", hang_s=120.0)
    vec = VectorEnv([echo(), hang])
    vec.reset(seed=0)
    vec.send(["a", "a"])
    vec.recv(min_ready=1)
    t0 = time.perf_counter()
    vec.close()
    vec.close()
    assert time.perf_counter() - t0 < 60 and vec.closed  # did not wait for the 120 s hang
    with pytest.raises(VectorStateError, match="closed"):
        vec.step(["a", "a"])


def test_recv_blocked_in_another_thread_is_released_by_close():
    vec = VectorEnv([fixed_latency(5.0)])
    vec.reset(seed=0)
    vec.send(["a"])
    errors = []

    def waiter():
        try:
            vec.recv()
        except VectorStateError as e:
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    vec.close()
    t.join(2.0)
    assert not t.is_alive() and errors


class RendezvousEnv(TextEnv):
    """Native async env whose step waits (without blocking the loop) until ``parties`` steps are in
    flight at once: it can only succeed when the sub-envs' steps really run concurrently."""

    metadata = {"render_modes": [], "gymllm_skip_check": "test-only env"}
    inside: list = []  # set per test: [count]

    def __init__(self, parties: int):
        super().__init__()
        self.parties = parties

    async def _areset(self, *, seed, options):
        return "go", {}

    async def _astep(self, action):
        RendezvousEnv.inside[0] += 1  # all sub-envs share the vector env's one loop thread
        for _ in range(30_000):
            if RendezvousEnv.inside[0] >= self.parties:
                return f"met {action}", 1.0, True, {}
            await asyncio.sleep(0.001)
        raise TimeoutError("the other sub-envs' steps never ran alongside this one")


def test_async_native_sub_envs_run_concurrently_on_the_loop(closing):
    RendezvousEnv.inside = [0]
    vec = VectorEnv([functools.partial(RendezvousEnv, 8)] * 8)
    closing(vec)
    assert {s.kind for s in vec._slots} == {"async"}

    async def main():
        vec.reset(seed=0)
        await vec.asend(["a"] * 8)
        got, errors = [], []
        while len(got) < 8:
            out = await vec.arecv(min_ready=3)
            got += list(out[5])
            errors += [e for e in out[4].get("error", []) if e is not None]
        return sorted(got), errors

    got, errors = asyncio.run(main())
    assert got == list(range(8)) and errors == []


def test_process_backend_matches_thread_backend_and_isolates_failures():
    fns = [echo(2), echo(3), functools.partial(FailingEnv, fail_at_step=2, episode_length=5)]
    results = {}
    for backend in ("thread", "process"):
        vec = VectorEnv(fns, backend=backend)
        try:
            obs, _ = vec.reset(seed=11)
            rows = [list(obs)]
            for t in range(4):
                o, r, te, tr, infos = vec.step([f"x{t}"] * 3)
                rows.append(
                    (list(o), list(r), list(te), list(tr), list(infos.get("_error", [False] * 3)))
                )
            results[backend] = rows
        finally:
            vec.close()
    assert results["thread"] == results["process"]
    assert results["process"][2][4] == [False, False, True]


def test_process_backend_kills_a_hung_child():
    hang = functools.partial(FailingEnv, fail_at_step=1, mode="hang", hang_s=30.0)
    vec = VectorEnv([hang], backend="process", step_timeout=0.5)
    try:
        vec.reset(seed=0)
        proc = vec.envs[0].process
        _, _, _, _, infos = vec.step(["a"])
        assert isinstance(infos["error"][0], EnvTimeoutError)
        proc.join(2.0)
        assert not proc.is_alive()
    finally:
        vec.close()


def test_mixed_spaces_are_kept_per_env(closing):
    class ChatAct(TextEnv):
        def __init__(self):
            super().__init__()
            self.observation_space = Chat(4)

        def _reset(self, *, seed, options):
            return [], {}

        def _step(self, action):
            return [], 0.0, False, {}

    vec = VectorEnv([echo(), ChatAct])
    closing(vec)
    assert isinstance(vec.observation_space, gym.spaces.Tuple)
    assert vec.single_observation_spaces[1] == Chat(4)


def test_same_step_mode_recovers_a_failed_sub_env(closing):
    vec = VectorEnv(
        [echo(10), functools.partial(FailingEnv, fail_at_step=1, episode_length=10)],
        autoreset_mode="same_step",
    )
    closing(vec)
    vec.reset(seed=0)
    obs, _, _, trunc, infos = vec.step(["a", "a"])
    assert obs[1] is None and trunc[1] and infos["error"][1].env_id == 1
    obs, _, _, trunc, infos = vec.step(["a", "a"])  # the failed env is reset by this send
    assert obs[1].startswith("Repeat:") and not trunc[1] and "error" not in infos


def test_fast_sub_envs_run_inline_and_slow_ones_go_back_to_the_pool(closing):
    class Slows(EchoEnv):
        def _step(self, action):
            if self.turn >= 6:
                time.sleep(0.01)
            return super()._step(action)

    vec = VectorEnv([functools.partial(Slows, episode_length=100)], inline_below_s=1e-3)
    closing(vec)
    vec.reset(seed=0)
    for _ in range(5):
        vec.step(["a"])
    assert vec._slots[0].inline  # 3 fast steps in a row
    for _ in range(4):
        vec.step(["a"])
    assert not vec._slots[0].inline  # 3 slow steps in a row
    ref = EchoEnv(episode_length=100)
    ref.reset(seed=0)
    assert [ref.step("a")[0] for _ in range(10)][-1] == vec.step(["a"])[0][0]


def test_failure_on_the_inline_fast_path_is_reported_too(closing):
    vec = VectorEnv([echo(20), functools.partial(FailingEnv, fail_at_step=6, episode_length=20)])
    closing(vec)
    vec.reset(seed=0)
    for _ in range(5):
        vec.step(["a", "a"])
    assert all(s.inline for s in vec._slots)  # the next step takes the one-pass path
    obs, _, _, trunc, infos = vec.step(["a", "a"])
    assert (
        obs[1] is None
        and trunc[1]
        and infos["error"][1].env_id == 1
        and obs[0].startswith("You said")
    )
    obs, *_ = vec.step(["a", "a"])
    assert obs[1].startswith("Repeat:")


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_factory_that_raises_names_the_sub_env(backend):
    def broken():
        raise ValueError("no such dataset")

    with pytest.raises(EnvError, match=r"creating sub-env 1.*ValueError: no such dataset") as info:
        VectorEnv([echo(), broken], backend=backend)
    assert info.value.env_id == 1


def test_close_answers_awaiting_coroutines():
    vec = VectorEnv([fixed_latency(2.0)])

    async def main():
        await vec.areset_env(0, seed=0)
        task = asyncio.ensure_future(vec.astep_env(0, "a"))
        await asyncio.sleep(0.05)
        vec.close()
        with pytest.raises(VectorStateError, match="closed during this call"):
            await asyncio.wait_for(task, 1.0)

    asyncio.run(main())


def test_pooled_sub_env_ops_are_traced_on_their_own_track(closing):
    from gymllm.telemetry import get_tracer

    vec = VectorEnv([fixed_latency(0.01), fixed_latency(0.01)])
    closing(vec)
    vec.reset(seed=0)
    vec.step(["a", "b"])
    tracks = {
        e.get("track") for e in get_tracer().events() if str(e.get("name", "")).startswith("env.")
    }
    assert {"env/0", "env/1"} <= tracks


@pytest.mark.slow  # ~4 s of process start-ups; the thread/process parity test covers the default tier
def test_process_backend_passes_the_vector_checker():
    from gymllm.utils import check_vector_env

    check_vector_env(lambda: VectorEnv([echo(2), echo(3)], backend="process"), num_steps=4)


class WhereEnv(TextEnv):
    """Native async env that records, for each op, the task, thread and loop its coroutine ran on;
    ``block`` makes a step wait on an event nobody sets (until cancelled)."""

    metadata = {"render_modes": [], "gymllm_skip_check": "test-only env"}
    made = 0

    def __init__(self, block: bool = False):
        super().__init__()
        WhereEnv.made += 1
        self.block, self.seen = block, []
        self.entered: asyncio.Event | None = None

    def note(self, op):
        self.seen.append(
            (op, asyncio.current_task(), threading.get_ident(), asyncio.get_running_loop())
        )

    async def _areset(self, *, seed, options):
        self.note("reset")
        return "go", {}

    async def _astep(self, action):
        self.note("step")
        if self.block:
            self.entered.set()
            await asyncio.Event().wait()
        return f"got {action}", 1.0, False, {}


def test_an_awaited_async_sub_env_runs_in_the_callers_own_task(closing):
    vec = VectorEnv([WhereEnv, WhereEnv])
    closing(vec)

    async def main():
        await vec.areset_env(1, seed=0)
        out = await vec.astep_env(1, "x")
        return out, asyncio.current_task(), asyncio.get_running_loop()

    out, task, loop = asyncio.run(main())
    assert out[0] == "got x"
    env = vec._slots[1].env
    # no task and no thread hand-off: the env's coroutine ran inside the caller's coroutine
    assert [(op, t, th, lp) for op, t, th, lp in env.seen] == [
        ("reset", task, threading.get_ident(), loop),
        ("step", task, threading.get_ident(), loop),
    ]


def test_an_async_sub_env_stays_on_the_loop_of_its_first_op(closing):
    vec = VectorEnv([WhereEnv])
    closing(vec)
    env = vec._slots[0].env

    async def first():
        await vec.areset_env(0, seed=0)
        return asyncio.get_running_loop()

    loop1 = asyncio.run(first())  # pinned to loop1 ... which then ends
    vec.reset(seed=1)  # the blocking API: the runner's loop thread (loop1 is closed)
    loop_thread = vec._runner.loop.loop
    assert env.seen[-1][3] is loop_thread and loop_thread is not loop1

    async def second():
        await vec.areset_env(0, seed=2)  # pinned to the loop thread's running loop: it stays there
        return (await vec.astep_env(0, "y"))[0]

    assert asyncio.run(second()) == "got y"
    assert [lp for *_, lp in env.seen[1:]] == [loop_thread] * 3


def test_a_blocking_call_on_the_pinned_loops_own_thread_does_not_hang(closing):
    vec = VectorEnv([WhereEnv])
    closing(vec)
    env = vec._slots[0].env
    done = []

    async def main():
        await vec.areset_env(0, seed=0)  # pinned to this loop
        obs, _ = vec.reset_env(0, seed=1)  # blocks this loop's thread: must run elsewhere
        done.append(obs)

    t = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive() and done == ["go"]
    assert env.seen[0][3] is not env.seen[1][3] and env.seen[1][3] is vec._runner.loop.loop


def test_a_cancelled_caller_abandons_the_op_and_the_sub_env_is_rebuilt(closing):
    WhereEnv.made = 0
    vec = VectorEnv([functools.partial(WhereEnv, block=True)])
    closing(vec)

    async def main():
        await vec.areset_env(0, seed=0)
        env = vec._slots[0].env
        env.entered = asyncio.Event()
        task = asyncio.ensure_future(vec.astep_env(0, "x"))
        await env.entered.wait()  # the step is inside the env's coroutine
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert vec._slots[0].lost and not vec._slots[0].pending
        obs, _ = await vec.areset_env(0, seed=1)  # rebuilt from its factory
        return obs, vec._slots[0].env is not env

    obs, fresh = asyncio.run(main())
    assert obs == "go" and fresh and WhereEnv.made == 2


def test_close_answers_a_caller_running_an_async_sub_env_in_its_own_task():
    vec = VectorEnv([functools.partial(WhereEnv, block=True)])

    async def main():
        await vec.areset_env(0, seed=0)
        env = vec._slots[0].env
        env.entered = asyncio.Event()
        task = asyncio.ensure_future(vec.astep_env(0, "x"))
        await env.entered.wait()
        vec.close()
        done, _ = await asyncio.wait(
            {task}, timeout=30.0
        )  # answered by close, not by a caller's timeout
        assert task in done
        with pytest.raises(VectorStateError, match="closed during this call"):
            task.result()

    asyncio.run(main())


def test_a_caller_task_cancelled_at_loop_shutdown_after_close_ends_cancelled_not_failed():
    # a rollout's env call left running when the vector env closes and then asyncio.run() shuts down
    # (cancelling it too): it must end cancelled, not with an error nobody retrieves
    vec = VectorEnv([functools.partial(WhereEnv, block=True)])
    reported, left = [], []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        await vec.areset_env(0, seed=0)
        env = vec._slots[0].env
        env.entered = asyncio.Event()
        left.append(asyncio.ensure_future(vec.astep_env(0, "x")))
        await env.entered.wait()
        vec.close()  # cancels the op; asyncio.run() then cancels the caller's task as well

    asyncio.run(main())
    assert left[0].cancelled() and reported == []
