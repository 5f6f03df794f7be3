"""The vector env's Ray backend on a real 2-node loopback cluster (no local_mode).

One module-scoped ``LocalCluster`` of 3 CPUs: a head with 1 CPU and a "sandbox" node with 2 CPUs and
``{"sandbox": 2}``. Interleavings are forced with gate files the test creates (an env's step
blocks until its gate exists), never with sleeps racing each other.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import time

import numpy as np
import pytest

import gymllm  # noqa: E402  (gymllm.ray_support sets Ray's environment before ray is imported)
import gymllm.ray_support  # noqa: E402,F401

ray = pytest.importorskip("ray")  # the optional `ray` extra (in the test extra)

from gymllm.envs.basic import EchoEnv  # noqa: E402
from gymllm.errors import ConfigError, EnvError, EnvTimeoutError, ResetNeededError  # noqa: E402
from gymllm.ray_support import LOOPBACK, LocalCluster  # noqa: E402
from gymllm.vector import VectorEnv  # noqa: E402
from gymllm.vector.config import RayOptions  # noqa: E402
from gymllm.vector.ray_backend import ACTORS_PER_CPU, EnvShard, plan_placement  # noqa: E402

SMALL = {"num_cpus": 0.25}  # 4 actors per CPU: the whole module fits the 3-CPU cluster


class GateEcho(EchoEnv):
    """Echo whose steps block while the file ``gate`` does not exist (up to 60 s, then it raises)."""

    def __init__(self, *, gate: str | None = None, **kw):
        super().__init__(**kw)
        self.gate = gate

    def _step(self, action):
        end = time.monotonic() + 60.0
        while self.gate is not None and not os.path.exists(self.gate):
            if time.monotonic() > end:
                raise TimeoutError(f"gate {self.gate} never opened")
            time.sleep(0.002)
        return super()._step(action)


class Unpicklable(str):
    """A str action that refuses to be pickled."""

    def __reduce__(self):
        raise TypeError("this action does not pickle")


ray.cloudpickle.register_pickle_by_value(
    sys.modules[__name__]
)  # GateEcho travels to the actors by value


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster([{"num_cpus": 1}, {"num_cpus": 2, "resources": {"sandbox": 2}}]) as c:
        yield c


@pytest.fixture(scope="module")
def echo2(cluster):
    """2 Echo sub-envs, one actor each (the checker builds its own from its env_fns and config)."""
    vec = gymllm.make_vec("gymllm/Echo-v0", 2, episode_length=3, backend="ray", ray_options=SMALL)
    yield vec
    vec.close()


def echo_fns(n, length=3, **kw):
    return [functools.partial(GateEcho, episode_length=length, **kw) for _ in range(n)]


def wait_dead(actor, timeout=60.0):
    """Block until calls to ``actor`` fail (its death reached this driver): orders the test's next step after it."""
    end = time.monotonic() + timeout
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < end:
            ray.get(actor.where.remote(), timeout=10)
            time.sleep(0.05)
        raise AssertionError("the actor is still alive")


def test_every_node_is_on_loopback(cluster):
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2 and {n["NodeManagerAddress"] for n in nodes} == {LOOPBACK}


def test_custom_resources_pin_the_actors_to_their_node(cluster, echo2):
    sandboxed = gymllm.make_vec(
        "gymllm/Echo-v0", 2, backend="ray", ray_options={**SMALL, "resources": {"sandbox": 1}}
    )
    try:
        sandbox_node = cluster.node_id(cluster.nodes[1])
        assert [sandboxed.runner.where(i)["node_id"] for i in range(2)] == [sandbox_node] * 2
        assert len({sandboxed.runner.where(i)["pid"] for i in range(2)}) == 2  # one actor per env
        assert list(sandboxed.reset(seed=1)[0]) == list(echo2.reset(seed=1)[0])
    finally:
        sandboxed.close()


def test_ray_backend_passes_the_vector_checker(echo2):
    from gymllm.utils import check_vector_env

    check_vector_env(echo2, num_steps=5)  # step, send/recv and async paths on fresh Ray vector envs


def test_results_match_the_thread_backend_in_every_autoreset_mode(cluster):
    for mode in ("next_step", "same_step", "disabled"):
        got = {}
        for backend, extra in (
            ("thread", {}),
            ("ray", {"ray_options": {**SMALL, "num_workers": 1}}),
        ):
            vec = VectorEnv(echo_fns(2, length=2), autoreset_mode=mode, backend=backend, **extra)
            try:
                out = [list(vec.reset(seed=[5, 9])[0])]
                for t in range(3):
                    if mode == "disabled" and t == 2:
                        with pytest.raises(ResetNeededError):
                            vec.step(["a", "b"])
                        out.append(list(vec.reset(options={"reset_mask": vec.ended})[0]))
                        continue
                    obs, rew, term, trunc, infos = vec.step([f"a{t}", f"b{t}"])
                    out.append(
                        (
                            list(obs),
                            list(rew),
                            list(term),
                            list(trunc),
                            list(infos.get("final_obs", [None, None])),
                        )
                    )
                got[backend] = out
            finally:
                vec.close()
        assert got["ray"] == got["thread"], mode


def test_a_blocked_env_holds_back_nothing_and_a_killed_actor_fails_only_its_env(cluster, tmp_path):
    gate = str(tmp_path / "gate")
    fns = (
        echo_fns(1, length=50)
        + [functools.partial(GateEcho, episode_length=50, gate=gate)]
        + echo_fns(1, length=50)
    )
    vec = VectorEnv(fns, backend="ray", ray_options=SMALL)
    try:
        vec.reset(seed=0)
        pid = vec.runner.where(1)["pid"]
        vec.send(["a", "a", "a"])
        for _ in range(3):
            *_, ids = vec.recv(
                min_ready=2
            )  # env 1 is blocked: only envs 0 and 2 can make up these two
            assert sorted(ids) == [0, 2]
            vec.send(["b", "b"], env_ids=[0, 2])
        *_, ids = vec.recv(min_ready=2)
        assert sorted(ids) == [0, 2] and vec.in_flight == [1]

        vec.send(["c", "c"], env_ids=[0, 2])
        os.kill(pid, signal.SIGKILL)  # env 1's actor dies mid-step
        out = {}
        while len(out) < 3:
            obs, rew, term, trunc, infos, ids = vec.recv(min_ready=1)
            for j, i in enumerate(ids):
                err = infos["error"][j] if "error" in infos and infos["_error"][j] else None
                out[int(i)] = (obs[j], bool(trunc[j]), err)
        assert (
            out[1][0] is None
            and out[1][1]
            and isinstance(out[1][2], EnvError)
            and out[1][2].env_id == 1
        )
        assert "actor died" in str(out[1][2])
        assert out[0][2] is None and out[2][2] is None and out[0][0].startswith("You said: c")
        assert list(vec.ended) == [False, True, False]
        open(gate, "w").close()
        obs, rew, term, trunc, infos = vec.step(
            ["d", "d", "d"]
        )  # NEXT_STEP: env 1 is reset on a new actor
        assert (
            obs[1].startswith("Repeat:")
            and "error" not in infos
            and obs[0].startswith("You said: d")
        )
        assert vec.runner.where(1)["pid"] != pid
        obs, *_ = vec.step(["e", "e", "e"])
        assert all(o.startswith("You said: e") for o in obs)

        actor = vec.runner.actor_for(
            0
        )  # an idle actor killed through Ray: seen on its env's next step
        ray.kill(actor)
        wait_dead(actor)
        obs, _, _, trunc, infos = vec.step(["f", "f", "f"])
        assert obs[0] is None and trunc[0] and infos["error"][0].env_id == 0
        assert obs[1].startswith("You said: f") and obs[2].startswith("You said: f")
        obs, *_ = vec.step(["g", "g", "g"])
        assert obs[0].startswith("Repeat:") and obs[2].startswith("You said: g")
    finally:
        vec.close()


@pytest.mark.slow  # ~20 s: two node start-ups and a 5 s placement watchdog; the killed-process test covers the default tier
def test_a_lost_node_fails_its_env_which_comes_back_on_a_new_node(cluster):
    node = cluster.add_node(num_cpus=1, resources={"edge": 1})
    vec = gymllm.make_vec(
        "gymllm/Echo-v0",
        1,
        episode_length=50,
        backend="ray",
        ray_options={**SMALL, "resources": {"edge": 1}, "ready_timeout_s": 5.0},
    )
    new = None
    try:
        vec.reset(seed=0)
        assert vec.runner.where(0)["node_id"] == cluster.node_id(node)
        actor = vec.runner.actor_for(0)
        cluster.remove_node(node)  # the host is lost with the actor on it
        wait_dead(actor)
        obs, _, _, trunc, infos = vec.step(["a"])
        assert obs[0] is None and trunc[0] and "actor died" in str(infos["error"][0])
        obs, _, _, _, infos = vec.step(
            ["b"]
        )  # autoreset: no node has "edge" now, the watchdog reports it
        assert obs[0] is None and "placed within ready_timeout_s" in str(infos["error"][0])
        new = cluster.add_node(num_cpus=1, resources={"edge": 1})
        obs, _, _, _, infos = vec.step(["c"])  # the next reset places the actor on the new host
        assert obs[0].startswith("Repeat:") and "error" not in infos
        assert vec.runner.where(0)["node_id"] == cluster.node_id(new)
    finally:
        vec.close()
        if new is not None:
            cluster.remove_node(new)


def test_async_twins_and_step_timeout(cluster, tmp_path):
    gate = str(tmp_path / "gate")
    fns = [functools.partial(GateEcho, episode_length=50, gate=gate)] + echo_fns(1, length=50)
    vec = VectorEnv(fns, backend="ray", ray_options=SMALL, step_timeout=2.0)
    try:

        async def main():
            open(gate, "w").close()
            obs0, _ = await vec.areset_env(0, seed=1)
            obs1, _ = await vec.areset_env(1, seed=2)
            await vec.asend(["a", "a"])
            ids = []
            while len(ids) < 2:
                ids += list((await vec.arecv(min_ready=1))[5])
            step = await vec.astep_env(1, "b")
            os.remove(gate)  # env 0 now hangs: the timeout must report it
            with pytest.raises(EnvTimeoutError) as info:
                await vec.astep_env(0, "c")
            return obs0, obs1, sorted(ids), step, info.value

        obs0, obs1, ids, step, err = asyncio.run(main())
        ref = [EchoEnv(episode_length=50) for _ in range(2)]
        assert obs0 == ref[0].reset(seed=1)[0] and obs1 == ref[1].reset(seed=2)[0]
        assert ids == [0, 1] and err.env_id == 0
        ref[1].step("a")
        assert step[0] == ref[1].step("b")[0]
        open(gate, "w").close()
        obs, _ = vec.reset(seed=3)  # the hung actor was killed; a fresh one serves the reset
        assert list(obs) == [EchoEnv(episode_length=50).reset(seed=s)[0] for s in (3, 4)]
    finally:
        vec.close()


def test_shards_and_bad_options(cluster):
    vec = gymllm.make_vec(
        "gymllm/Echo-v0", 5, backend="ray", ray_options={**SMALL, "num_workers": 2}
    )
    try:
        assert [vec.runner.shard_of[i].index for i in range(5)] == [0, 0, 0, 1, 1]
        ref = gymllm.make_vec("gymllm/Echo-v0", 5)
        try:
            assert list(vec.reset(seed=4)[0]) == list(ref.reset(seed=4)[0])
            assert list(vec.step(["a"] * 5)[0]) == list(ref.step(["a"] * 5)[0])
        finally:
            ref.close()
        vec.send(
            ["a", Unpicklable("a"), "a", "a", "a"]
        )  # a valid action that cannot travel to the actor
        obs, _, _, _, infos, ids = vec.recv(min_ready=5)
        errs = {int(i): infos["error"][j] for j, i in enumerate(ids) if infos["_error"][j]}
        assert set(errs) == {1} and isinstance(
            errs[1], EnvError
        )  # one call per env op: its shard-mates go on
        assert obs[list(ids).index(0)].startswith("You said: a")
    finally:
        vec.close()
    with pytest.raises(ConfigError, match="picklable"):
        VectorEnv(
            [lambda: EchoEnv(), lambda lock=__import__("threading").Lock(): lock], backend="ray"
        )
    with pytest.raises(ConfigError, match="sandbox"):
        gymllm.make_vec(
            "gymllm/Echo-v0", 2, backend="ray", ray_options={"resources": {"sandbox": 5}}
        )
    with pytest.raises(ConfigError, match="num_workers or envs_per_actor"):
        gymllm.make_vec(
            "gymllm/Echo-v0", 2, backend="ray", ray_options={"num_workers": 1, "envs_per_actor": 1}
        )
    with pytest.raises(ConfigError, match="only with backend='ray'"):
        gymllm.make_vec("gymllm/Echo-v0", 2, ray_options={"num_workers": 1})


def recv_all(vec, n, timeout=60.0):
    """``{env_id: (obs, truncated, error or None)}`` of the next ``n`` results (bounded by ``timeout``)."""
    out = {}
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        obs, _, _, trunc, infos, ids = vec.recv(
            min_ready=1, timeout=max(0.0, end - time.monotonic())
        )
        for j, i in enumerate(ids):
            err = infos["error"][j] if "error" in infos and infos["_error"][j] else None
            out[int(i)] = (obs[j], bool(trunc[j]), err)
    return out


def test_placement_is_fitted_to_the_cluster_and_explicit_options_win():
    three = {"CPU": 3.0}
    auto = plan_placement(6, RayOptions(), three, three)
    assert (auto.envs_per_actor, auto.num_actors, auto.num_cpus) == (
        1,
        6,
        0.5,
    )  # one actor per env, 0.5 CPU each
    busy = plan_placement(6, RayOptions(), three, {"CPU": 2.5})
    assert busy.num_actors == 6 and busy.num_cpus * 6 <= 2.5 and busy.num_cpus == 0.4166
    # 2.5 free CPUs split over two hosts (0.5 + 2.0): a share of 2.5 / 6 would fit only 1 + 4 actors;
    # the share leaves room for one wasted share per host, so all six fit whatever the split
    split = plan_placement(6, RayOptions(), three, {"CPU": 2.5}, nodes=2)
    assert split.num_cpus == 0.3571 and int(0.5 / split.num_cpus) + int(2.0 / split.num_cpus) >= 6
    assert (
        plan_placement(2, RayOptions(), three, three).num_cpus == 1.0
    )  # at most one CPU per actor
    assert (
        plan_placement(6, RayOptions(), three, {"CPU": 0.0}).num_cpus == 0.0
    )  # full: Ray's running default
    many = plan_placement(
        100, RayOptions(), three, three
    )  # more envs than 4 actors per CPU: shards
    assert (
        many.num_actors <= 3 * ACTORS_PER_CPU and many.envs_per_actor == 9 and many.num_actors == 12
    )
    assert many.num_cpus == 0.25
    one_cpu_each = plan_placement(
        6, RayOptions(num_cpus=1), three, three
    )  # explicit CPUs: fewer, larger shards
    assert (one_cpu_each.envs_per_actor, one_cpu_each.num_actors, one_cpu_each.num_cpus) == (
        2,
        3,
        1.0,
    )
    explicit = plan_placement(
        6, RayOptions(num_workers=4, num_cpus=1), three, three
    )  # kept as given
    assert (explicit.envs_per_actor, explicit.num_actors, explicit.num_cpus) == (2, 3, 1.0)
    per_env = plan_placement(6, RayOptions(envs_per_actor=1), three, three)
    assert (per_env.num_actors, per_env.num_cpus) == (6, 0.5)
    sandboxed = plan_placement(
        6,
        RayOptions(resources={"sandbox": 1}),
        {"CPU": 3.0, "sandbox": 2.0},
        {"CPU": 3.0, "sandbox": 2.0},
    )
    assert (sandboxed.envs_per_actor, sandboxed.num_actors) == (3, 2)  # as many actors as sandboxes


def test_with_no_options_six_envs_start_on_the_three_cpu_cluster_and_run_barrier_free(
    cluster, tmp_path
):
    with pytest.raises(
        ConfigError, match=r"need 6\.0, cluster has 3\.0"
    ):  # a truly impossible request
        gymllm.make_vec(
            "gymllm/Echo-v0", 6, backend="ray", ray_options={"num_cpus": 1, "envs_per_actor": 1}
        )
    gate = str(tmp_path / "gate")
    fns = [functools.partial(GateEcho, episode_length=50, gate=gate)] + echo_fns(5, length=50)
    vec = VectorEnv(fns, backend="ray")  # no ray_options at all
    try:
        placement = vec.runner.placement
        assert (placement.num_actors, placement.envs_per_actor) == (
            6,
            1,
        ) and 0 < placement.num_cpus <= 0.5
        assert (
            len({vec.runner.where(i)["pid"] for i in range(6)}) == 6
        )  # per-env failure isolation kept
        ref = gymllm.make_vec("gymllm/Echo-v0", 6, episode_length=50)
        try:
            assert list(vec.reset(seed=2)[0]) == list(ref.reset(seed=2)[0])
        finally:
            ref.close()
        vec.send(["a"] * 6)
        for t in range(3):  # env 0 is blocked on its gate: the other five go round without it
            got = recv_all(vec, 5)
            assert sorted(got) == [1, 2, 3, 4, 5] and all(e is None for _, _, e in got.values())
            assert vec.in_flight == [0]
            vec.send([f"b{t}"] * 5, env_ids=[1, 2, 3, 4, 5])
        open(gate, "w").close()
        got = recv_all(vec, 6)
        assert sorted(got) == list(range(6)) and got[0][0].startswith("You said: a")
    finally:
        vec.close()


def test_envs_sharing_an_actor_are_barrier_free_and_its_death_fails_exactly_them(cluster, tmp_path):
    gate = str(tmp_path / "gate")
    fns = [functools.partial(GateEcho, episode_length=50, gate=gate)] + echo_fns(3, length=50)
    vec = VectorEnv(fns, backend="ray", ray_options={**SMALL, "envs_per_actor": 2})
    try:
        vec.reset(seed=0)
        pids = [vec.runner.where(i)["pid"] for i in range(4)]
        assert pids[0] == pids[1] and pids[2] == pids[3] and pids[0] != pids[2]  # two shards of two
        vec.send(["a"] * 4)
        for t in range(
            3
        ):  # env 0 is blocked inside the actor it shares with env 1: env 1 still goes round
            got = recv_all(vec, 3)
            assert sorted(got) == [1, 2, 3] and vec.in_flight == [0]
            vec.send([f"b{t}"] * 3, env_ids=[1, 2, 3])
        got = recv_all(vec, 3)
        assert sorted(got) == [1, 2, 3] and got[1][0].startswith("You said: b2")

        os.kill(pids[0], signal.SIGKILL)  # the shared actor dies with env 0 mid-step
        got = recv_all(vec, 1)
        assert (
            got[0][0] is None
            and got[0][1]
            and isinstance(got[0][2], EnvError)
            and got[0][2].env_id == 0
        )
        assert "actor died" in str(got[0][2])
        vec.send(
            ["c"] * 3, env_ids=[1, 2, 3]
        )  # env 1 was idle in the dead actor: its episode is gone too
        got = recv_all(vec, 3)
        assert isinstance(got[1][2], EnvError) and got[1][2].env_id == 1 and got[1][0] is None
        assert (
            got[2][2] is None and got[3][2] is None and got[2][0].startswith("You said: c")
        )  # the other shard
        assert list(vec.ended) == [True, True, False, False]

        open(gate, "w").close()
        obs, _, _, _, infos = vec.step(
            ["d"] * 4
        )  # NEXT_STEP: envs 0 and 1 reset onto one new actor
        assert (
            obs[0].startswith("Repeat:") and obs[1].startswith("Repeat:") and "error" not in infos
        )
        assert obs[2].startswith("You said: d")
        new = vec.runner.where(0)["pid"]
        assert new == vec.runner.where(1)["pid"] and new != pids[0]
        obs, *_ = vec.step(["e"] * 4)
        assert all(o.startswith("You said: e") for o in obs)
    finally:
        vec.close()


def test_env_shard_twin_runs_without_ray():
    shard = EnvShard(
        [
            functools.partial(EchoEnv, episode_length=1),
            functools.partial(EchoEnv, episode_length=2),
        ],
        first_env_id=3,
    )
    status, spaces = shard.start()
    assert status == "ok" and len(spaces) == 2
    out = shard.run(
        [
            (0, "reset", None, 7, None, False),
            (1, "reset", None, 8, None, False),
            (0, "step_same", "a", None, None, False),
            (1, "step", "a", None, None, False),
            (1, "step", 42, None, None, False),
        ]
    )
    ref = EchoEnv(episode_length=1)
    assert out[0] == ("ok", (ref.reset(seed=7)[0], 0.0, False, False, ref.reset(seed=7)[1]))
    assert (
        out[2][0] == "ok" and out[2][1][2] and "final_obs" in out[2][1][4]
    )  # SAME_STEP reset in the shard
    assert out[3][0] == "ok" and out[4][0] == "err"  # a bad op fails alone
    assert shard.where()["pid"] == os.getpid()
    bad = EnvShard([EchoEnv, functools.partial(EchoEnv, episode_length=0)], first_env_id=10)
    status, (env_id, exc) = bad.start()
    assert status == "err" and env_id == 11 and isinstance(exc, ConfigError)
    shard.close()
    assert np.all([e is None for e in shard.envs])


def test_without_ray_the_backend_names_the_extra():
    import subprocess

    code = (
        "import sys; sys.modules['ray'] = None\n"  # a fresh interpreter where `import ray` fails
        "import gymllm\n"
        "from gymllm.errors import MissingExtraError\n"
        "try:\n    gymllm.make_vec('gymllm/Echo-v0', 2, backend='ray')\n"
        "except MissingExtraError as e:\n    print('MISSING', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "MISSING" in out.stdout and "gymllm[ray]" in out.stdout, out.stderr
