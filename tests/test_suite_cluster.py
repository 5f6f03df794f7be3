"""Benchmark suites on a real Ray cluster (every node a raylet on 127.0.0.1; no local_mode).

- ``gymllm eval suite --eval.suite S --cluster.backend ray``: each policy on engine replica actors, each env's
  sub-envs on env-worker actors, gives the rows of the in-process run: the same (policy, env, seed,
  sample) keys and, the sampling being seeded per request (the seed follows from the env's seed_base,
  the group and the sample, not from the replica or the batch that serves it), the same rewards,
  successes, turns and tokens; a failing env's episodes are error rows on both paths.
- ``gymllm train --env.suite S --cluster.backend ray``: the mixture's sub-envs on Ray env workers
  (:class:`~gymllm.suites.training.SuiteSlotEnv`), the draw in the driver: per-env figures
  ``env/<name>/groups`` sum to the groups that finished, and the run trains the groups, with the
  rewards, of the in-process mixture run.
- Without Ray: a mixture over a vector env of slot envs plays what the in-process mixture plays; the
  ``--cluster.*`` flags of ``gymllm eval``; an evaluation refuses learner hosts.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import pathlib

import pytest

import gymllm.ray_support  # noqa: F401  before ray: every node this file starts binds 127.0.0.1
from gymllm.train.train_config import ClusterSection, EnvSection
from gymllm.cli.eval_args import EngineShape, Policies
from gymllm.errors import ConfigError
from gymllm.suites import load_suite
from gymllm.suites.results import ResultsFile, row_key
from gymllm.suites.training import MixtureEnvs, SuiteSlotEnv, mixture_vec, slot_table

HERE = pathlib.Path(__file__).resolve().parent

# two envs the tiny model sometimes solves (so rewards vary with the samples), and one that fails
EVAL_SUITE = """
name = "tiny"
k = 2
num_seeds = 2
seed_base = 1_000_000
max_tokens = 4
max_turns = 1
temperature = 1.0

[[env]]
id = "gymllm/TinyRepeat-v0"
name = "repeat"
kwargs = { num_letters = 2 }
num_seeds = 3

[[env]]
id = "gymllm/TinyRepeat-v0"
name = "repeat3"
kwargs = { num_letters = 3 }

[[env]]
id = "gymllm/Failing-v0"
name = "failing"
kwargs = { fail_at_step = 1 }
"""

# the default tier's: one env, 2 seeds, 2 samples each
SMALL_SUITE = """
name = "small"
k = 2
num_seeds = 2
max_tokens = 4
max_turns = 1
temperature = 1.0

[[env]]
id = "gymllm/TinyRepeat-v0"
name = "repeat"
kwargs = { num_letters = 2 }
"""

# a training mixture of registered envs only: a Ray worker imports what the suite names by id itself
MIX_SUITE = (
    'name = "mix"\nmax_turns = 1\n'
    '[[env]]\nname = "two"\nweight = 3.0\nid = "gymllm/TinyRepeat-v0"\nkwargs = { num_letters = 2 }\n'
    '[[env]]\nname = "three"\nweight = 1.0\nid = "gymllm/TinyRepeat-v0"\nkwargs = { num_letters = 3 }\n'
)

EVAL_ARGS = dict(
    model=Policies(name=("tiny-qwen3",)),
    max_concurrency_per_env=3,
    engine=EngineShape(num_slots=4, max_len=64),
    episode_timeout_s=120.0,
    progress=False,
)


@pytest.fixture
def mix_file(tmp_path):
    path = tmp_path / "mix.toml"
    path.write_text(MIX_SUITE)
    return path


# ------------------------------------------------------------------------------ without Ray


def test_a_mixture_over_slot_envs_plays_what_the_in_process_mixture_plays(tmp_path, monkeypatch):
    """The same groups' envs, observations and rewards whether the mixture binds its own env instances
    or tells sub-envs of a vector env (in process here; Ray env workers in cluster mode) what to play."""
    monkeypatch.syspath_prepend(str(HERE))  # user_envs: a user's module (in process only)
    path = tmp_path / "two.toml"
    path.write_text(
        MIX_SUITE + '[[env]]\nname = "count"\nid = "user_envs:make_count"\nkwargs = { start = 5 }\n'
    )
    suite = load_suite(path)
    local = MixtureEnvs(suite, num_envs=4, seed=3)
    slots = MixtureEnvs(suite, num_envs=4, seed=3, vec=mixture_vec(suite, 4))

    async def play(envs):
        out = []
        for k, seed in enumerate(range(12)):
            obs, info = await envs.areset_env(k % 4, seed=seed)
            _, reward, terminated, _, _ = await envs.astep_env(k % 4, obs.split()[-1].rstrip("."))
            out.append((info["suite_env"], obs, reward, terminated))
        return out

    try:
        a, b = asyncio.run(play(local)), asyncio.run(play(slots))
    finally:
        local.close()
        slots.close()
    assert a == b
    assert {name for name, *_ in a} == {"two", "three", "count"}
    assert any(
        r == 1.0 for *_, r, _ in a
    )  # the echoed letter solves the repeat envs: rewards are not all 0


def test_slot_env_errors_name_the_fix(mix_file):
    env = SuiteSlotEnv(slot_table(load_suite(mix_file)))
    with pytest.raises(ConfigError, match="suite_env"):
        env.reset(seed=0)  # never told which env to play
    with pytest.raises(ConfigError, match=r"one of \['three', 'two'\]"):
        env.reset(seed=0, options={"suite_env": "nope"})
    with pytest.raises(ConfigError, match="reset"):
        env.step("a")
    obs, info = env.reset(seed=0, options={"suite_env": "two"})
    assert (
        info["suite_env"] == "two" and env.reset(seed=1)[1]["suite_env"] == "two"
    )  # an autoreset replays it
    env.close()
    with pytest.raises(ConfigError, match="num_envs=4"):
        MixtureEnvs(load_suite(mix_file), num_envs=4, vec=mixture_vec(load_suite(mix_file), 2))


def test_eval_takes_the_cluster_flags_of_train_and_refuses_learner_hosts(monkeypatch, capsys):
    from gymllm.train import cluster as cluster_mod
    from gymllm.cli.eval_args import eval_main

    with pytest.raises(SystemExit) as done:
        eval_main(["suite", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--cluster.backend",
        "--cluster.address",
        "--cluster.env-workers",
        "--cluster.engine-replicas",
        "--cluster.engine-num-gpus",
        "--cluster.env-resources",
    ):
        assert flag in text

    class Seen(Exception):
        pass

    def placement(
        cluster, *, num_envs
    ):  # what `gymllm eval suite` hands the Ray placement, without starting Ray
        raise Seen(cluster, num_envs)

    monkeypatch.setattr(cluster_mod, "SuiteOnRay", placement)
    with pytest.raises(Seen) as seen:
        eval_main(
            [
                "suite",
                "--eval.suite",
                "core",
                "--model.name",
                "tiny-qwen3",
                "--cluster.backend",
                "ray",
                "--cluster.address",
                "auto",
                "--cluster.env-workers",
                "3",
                "--cluster.engine-replicas",
                "2",
                "--cluster.env-resources",
                "sandbox",
                "1",
            ]
        )
    assert seen.value.args == (
        ClusterSection(
            backend="ray",
            address="auto",
            env_workers=3,
            engine_replicas=2,
            env_resources={"sandbox": 1.0},
        ),
        len(load_suite("core").envs),
    )
    with pytest.raises(Seen) as seen:  # env ids as a one-off suite on the cluster
        eval_main(
            [
                "suite",
                "--eval.envs",
                "gymllm/Arithmetic-v0",
                "--model.name",
                "tiny-qwen3",
                "--cluster.backend",
                "ray",
            ]
        )
    assert seen.value.args == (ClusterSection(backend="ray"), 1)
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="learner_hosts=0"):
        cluster_mod.SuiteOnRay(ClusterSection(backend="ray", learner_hosts=2))


# ------------------------------------------------------------------------------ on a Ray cluster

ray_needed = pytest.mark.skipif(
    __import__("importlib").util.find_spec("ray") is None,
    reason="the cluster tests need the optional package ray (pip install 'gymllm[ray]')",
)


@pytest.fixture(scope="module")
def cluster():
    """A real Ray cluster on 127.0.0.1 (one raylet: the cheapest real cluster; the replicas and env
    workers are actors, processes of their own, as on several hosts)."""
    from gymllm.ray_support import LOOPBACK, LocalCluster

    with LocalCluster([{"num_cpus": 4}]) as c:
        import ray

        assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {LOOPBACK}
        yield c


def ray_section(address: str, **kw) -> ClusterSection:
    return ClusterSection(
        backend="ray", address=address, env_num_cpus=0.25, engine_num_cpus=0.5, **kw
    )


def rows_by_key(out: pathlib.Path) -> dict[tuple, dict]:
    rows = ResultsFile(out / "results.jsonl").read()
    by = {row_key(r): r for r in rows}
    assert len(by) == len(rows)  # every key once
    return by


def eval_local_and_on_ray(tmp_path, suite_text: str, cluster_section: ClusterSection):
    """The suite run in process and on the cluster: (suite, local rows, cluster rows) by key; the
    keys, the fields of every row and the summaries' results are checked equal here."""
    from gymllm.cli.suite_cli import SuiteEval, SuiteSelection, eval_suite
    from gymllm.suites.runner import work_items

    suite_path = tmp_path / "tiny.toml"
    suite_path.write_text(suite_text)
    picked = SuiteSelection(suite=str(suite_path))
    assert eval_suite(SuiteEval(eval=picked, out=str(tmp_path / "local"), **EVAL_ARGS)) == 0
    assert (
        eval_suite(
            SuiteEval(eval=picked, out=str(tmp_path / "ray"), **EVAL_ARGS, cluster=cluster_section)
        )
        == 0
    )
    local, remote = rows_by_key(tmp_path / "local"), rows_by_key(tmp_path / "ray")
    suite = load_suite(suite_path)
    expected = {("tiny-qwen3", e.name, seed, m) for e in suite.envs for _, seed, m in work_items(e)}
    assert set(local) == set(remote) == expected
    fields = ("reward", "success", "turns", "tokens")
    assert {k: [r[f] for f in fields] for k, r in remote.items()} == {
        k: [r[f] for f in fields] for k, r in local.items()
    }
    for k in expected:  # a failing env's episodes are error rows on both paths, the others are not
        assert (local[k]["error"] is None) == (remote[k]["error"] is None) == (k[1] != "failing"), (
            local[k],
            remote[k],
        )
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("local", "ray")]
    assert (
        summaries[0]["results"] == summaries[1]["results"]
    )  # the same summary, intervals included
    return suite, local, remote


@ray_needed
def test_suite_eval_on_ray_gives_the_rows_of_the_in_process_run(tmp_path, cluster):
    """One engine replica actor and one env actor: the same rows as the in-process run (the slow test
    below spreads three envs, a failing one among them, over two replicas and two env actors each)."""
    _, local, _ = eval_local_and_on_ray(tmp_path, SMALL_SUITE, ray_section(cluster.address))
    assert len(local) == 4


@ray_needed
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_suite_eval_on_two_replicas_and_two_env_workers_gives_the_in_process_rows(
    tmp_path, cluster
):
    """Two engine replicas behind the pool (requests of one policy spread over both) and two env
    actors per env, three envs in flight: still the in-process rows (the per-request seeds do not
    depend on the replica or the batch)."""
    _, local, _ = eval_local_and_on_ray(
        tmp_path, EVAL_SUITE, ray_section(cluster.address, engine_replicas=2, env_workers=2)
    )
    assert (
        0 < sum(r["reward"] for r in local.values() if r["env"] != "failing") < len(local) - 4
    )  # rewards vary


def group_rewards(run_dir: pathlib.Path) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list] = collections.defaultdict(list)
    for line in (run_dir / "trajectories.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["group_id"]].append((r["trajectory_id"], r["reward"]))
    return {g: sorted(v) for g, v in out.items()}


@ray_needed
def test_a_mixture_on_ray_env_workers_plays_what_the_in_process_mixture_plays(mix_file, cluster):
    """The env side of `gymllm train --env.suite S --cluster.backend ray`: the sub-envs in two Ray env
    actors, told by the driver's draw which env to play, give the groups' envs, observations and
    rewards of the in-process mixture."""
    suite = load_suite(mix_file)
    local = MixtureEnvs(suite, num_envs=4, seed=5)
    remote = MixtureEnvs(
        suite,
        num_envs=4,
        seed=5,
        vec=mixture_vec(suite, 4, backend="ray", ray_options={"num_workers": 2, "num_cpus": 0.25}),
    )

    async def play(envs):
        out = []
        for k, seed in enumerate(range(10)):
            obs, info = await envs.areset_env(k % 4, seed=seed)
            _, reward, terminated, _, _ = await envs.astep_env(k % 4, obs.split()[-1].rstrip("."))
            out.append((info["suite_env"], obs, reward, terminated))
        return out

    try:
        pids = {remote.vec.runner.where(i)["pid"] for i in range(4)}
        a, b = asyncio.run(play(local)), asyncio.run(play(remote))
    finally:
        local.close()
        remote.close()
    assert a == b and {name for name, *_ in a} == {"two", "three"}
    assert len(pids) == 2 and os.getpid() not in pids  # two env-worker processes, not this one


@ray_needed
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_training_on_a_mixture_on_ray_logs_per_env_groups_like_in_process(
    tmp_path, cluster, mix_file
):
    """2 steps on a two-env mixture with the sub-envs on 2 Ray env workers and the engine on a replica
    actor: env/<name>/groups per env, summing to the groups that finished, and (eta = 0, seeded
    sampling) the same trained groups and rewards as the in-process mixture run."""
    from test_cluster_train import small_tiny

    from gymllm.train.trainer import train

    def config(run_dir, cluster_section=None):
        cfg = small_tiny(run_dir, steps=2, cluster=cluster_section)
        return dataclasses.replace(cfg, env=EnvSection(suite=str(mix_file), num_envs=8))

    local = train(config(tmp_path / "local"))
    remote = train(config(tmp_path / "ray", ray_section(cluster.address, env_workers=2)))
    assert remote.steps == local.steps == 2
    rows = [
        json.loads(line) for line in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()
    ]
    last = rows[-1]
    groups = {n: last.get(f"env/{n}/groups", 0) for n in ("two", "three")}  # counts so far, by env
    assert all(groups.values()), last  # both envs drawn (the draw is seeded: the same every run)
    assert sum(groups.values()) == sum(
        r.get("rollout_groups", 0) for r in rows
    )  # every finished group, by env
    assert all(f"env/{n}/weight" in last for n in groups)
    assert group_rewards(tmp_path / "ray") == group_rewards(
        tmp_path / "local"
    )  # the same groups and rewards
