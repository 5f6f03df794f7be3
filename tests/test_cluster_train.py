"""`gymllm train` on a real Ray cluster (every node a raylet on 127.0.0.1; no local_mode).

- The cluster run (2 engine replicas behind the pool, 2 env-worker actors, the learner in the driver)
  trains the same group ids with the same rewards, step by step, as the in-process run (eta = 0,
  seeded sampling: the per-request seeds do not depend on which replica serves a request).
- A replica's node is removed after step 1 (forced from a step listener, not a sleep): the run goes
  on, no group is trained twice, every live replica ends on the final weight version.
- The learner-host coordinator hand-off (jax.distributed across two actors) and, under ``slow``,
  a run whose learner lives on two such hosts.
- The ``--cluster.*`` flags, their validation, and ``backend="none"`` never importing Ray.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import subprocess
import sys

import pytest

import gymllm.ray_support  # noqa: F401  before ray: every node this file starts binds 127.0.0.1

pytest.importorskip(
    "ray", reason="the cluster tests need the optional package ray (pip install 'gymllm[ray]')"
)

from gymllm.train.train_config import ClusterSection, EnvSection, RunSection, TrainConfig, preset  # noqa: E402
from gymllm.train.trainer import train  # noqa: E402
from gymllm.errors import ConfigError  # noqa: E402

ENGINE = {"engine": 1}
ENVS = {"envhost": 1}  # env workers stay on the head: the node removed below hosts a replica only


def small_tiny(run_dir, *, steps: int = 3, cluster: ClusterSection | None = None) -> TrainConfig:
    """preset("tiny") cut to a few steps (G 4, 2 groups a step, 8 envs), eta = 0, no console or plots."""
    cfg = preset("tiny")
    return dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, num_envs=8),
        engine=dataclasses.replace(cfg.engine, num_slots=8, prefix_reuse=False),
        rollout=dataclasses.replace(cfg.rollout, group_size=4, max_concurrency=8, max_staleness=0),
        learner=dataclasses.replace(
            cfg.learner, groups_per_step=2, micro_batch_size=8, num_steps=steps
        ),
        run=RunSection(run_dir=str(run_dir), console=False, report=False),
        cluster=cluster or ClusterSection(),
    )


def ray_cluster(**kw) -> ClusterSection:
    return ClusterSection(
        backend="ray",
        env_workers=2,
        engine_replicas=2,
        env_num_cpus=0.5,
        engine_num_cpus=0.5,
        env_resources=ENVS,
        engine_resources=ENGINE,
        **kw,
    )


@pytest.fixture(scope="module")
def cluster():
    """Head (the env workers) plus two engine nodes, one replica each (one 'engine' resource a node)."""
    from gymllm.ray_support import LOOPBACK, LocalCluster

    with LocalCluster(
        [
            {"num_cpus": 2, "resources": {"envhost": 4}},
            {"num_cpus": 1, "resources": ENGINE},
            {"num_cpus": 1, "resources": ENGINE},
        ]
    ) as c:
        import ray

        assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {LOOPBACK}
        yield c


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The in-process run (3 steps) the cluster runs are compared with."""
    run_dir = tmp_path_factory.mktemp("local")
    return train(small_tiny(run_dir)), records(run_dir)


def records(run_dir) -> dict[str, list[tuple[str, float]]]:
    """trajectories.jsonl: group id -> [(trajectory id, reward)] of every trained trajectory."""
    out: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)
    for line in (run_dir / "trajectories.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["group_id"]].append((r["trajectory_id"], r["reward"]))
    return {g: sorted(v) for g, v in out.items()}


# ------------------------------------------------------------------------------ config and flags


def test_cluster_flags_are_in_train_help():
    proc = subprocess.run(
        [sys.executable, "-m", "gymllm.cli.main", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for flag in (
        "--cluster.backend",
        "--cluster.address",
        "--cluster.env-workers",
        "--cluster.engine-replicas",
        "--cluster.learner-hosts",
        "--cluster.engine-resources",
        "--cluster.env-num-cpus",
    ):
        assert flag in proc.stdout


def test_cluster_flags_parse_into_the_section():
    import tyro

    cfg = tyro.cli(
        TrainConfig,
        default=preset("tiny"),
        args=[
            "--cluster.backend",
            "ray",
            "--cluster.address",
            "auto",
            "--cluster.env-workers",
            "4",
            "--cluster.engine-replicas",
            "2",
            "--cluster.learner-hosts",
            "2",
            "--cluster.env-resources",
            "sandbox",
            "1",
        ],
    )
    assert cfg.cluster == ClusterSection(
        backend="ray",
        address="auto",
        env_workers=4,
        engine_replicas=2,
        learner_hosts=2,
        env_resources={"sandbox": 1.0},
    )


def test_cluster_section_rejects_bad_input_with_a_fix():
    with pytest.raises(ConfigError, match="backend='ray'"):
        ClusterSection(engine_replicas=2)  # replicas without Ray
    with pytest.raises(ConfigError, match="backend"):
        ClusterSection(backend="slurm")
    with pytest.raises(ConfigError, match="sandbox"):
        ClusterSection(backend="ray", env_resources={"sandbox": -1})
    with pytest.raises(ConfigError, match="env_workers"):
        dataclasses.replace(
            preset("tiny"),
            env=EnvSection(num_envs=8),
            rollout=dataclasses.replace(preset("tiny").rollout, group_size=8),
            cluster=ClusterSection(backend="ray", env_workers=9),
        )


def test_embedded_run_never_imports_ray(tmp_path):
    """backend 'none' builds LocalComponents; the cluster module and Ray stay unloaded."""
    code = (
        "import sys, dataclasses; from gymllm.train.train_config import preset; "
        "from gymllm.train.trainer import components_for; "
        "c = components_for(preset('tiny')); "
        "print(type(c).__name__, 'ray' in sys.modules, 'gymllm.train.cluster' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.stdout.split() == ["LocalComponents", "False", "False"], out.stderr


# ------------------------------------------------------------------------------ runs on the cluster


def test_cluster_run_trains_the_same_groups_and_rewards_as_in_process(tmp_path, cluster, reference):
    local, local_records = reference
    remote = train(small_tiny(tmp_path / "ray", cluster=ray_cluster(address=cluster.address)))
    assert remote.steps == local.steps == 3
    assert [sorted(ids) for ids in remote.trained_ids] == [sorted(ids) for ids in local.trained_ids]
    assert records(tmp_path / "ray") == local_records  # same groups, same rewards
    assert remote.rewards() == local.rewards()  # it learns as the in-process run does
    assert remote.counts.get("stale_groups", 0) == 0


@pytest.mark.slow  # a drill: kills a process or a node
def test_losing_a_replicas_node_mid_run_loses_nothing(tmp_path, cluster, reference):
    """After step 1 the node of replica r0 is removed (a spare engine node joins first, so the pool can
    recreate it there); the run finishes, no group is trained twice, every live replica ends on the
    final version, and (eta = 0: a retried request keeps its seed) it trains what the in-process run does."""

    from gymllm.train.cluster import RayComponents

    steps = 3
    cfg = small_tiny(tmp_path / "run", steps=steps, cluster=ray_cluster(address=cluster.address))
    components = RayComponents(cfg.cluster)
    seen: dict[str, object] = {}

    async def on_step(rec):
        pool = components.pool
        if rec["step"] == 1:
            info = await pool.replica_info()
            victim = info["r0"]["node_id"]
            node = next(n for n in cluster.nodes if cluster.node_id(n) == victim)
            assert node is not cluster.nodes[0]  # replicas live on the engine nodes, never the head
            cluster.add_node(num_cpus=1, resources=ENGINE)
            cluster.remove_node(node)
            seen["victim"] = victim
        if rec["step"] == steps:
            for _ in range(600):  # the recreated replica rejoins (bounded: 60 s)
                if not any(s["down"] for s in pool.stats()):
                    break
                await asyncio.sleep(0.1)
            seen["stats"] = pool.stats()
            seen["versions"] = await pool.replica_versions()
            seen["nodes"] = {i["node_id"] for i in (await pool.replica_info()).values()}

    result = train(cfg, on_step=[on_step], components=components)
    assert result.steps == steps
    trained = [t for ids in result.trained_ids for t in ids]
    assert len(trained) == len(set(trained))  # no trajectory (so no group) trained twice
    assert len(records(tmp_path / "run")) == steps * cfg.learner.groups_per_step
    assert records(tmp_path / "run") == reference[1]  # the loss changed nothing that was trained
    assert seen["versions"] == {"r0": steps, "r1": steps}  # both live, both on the final weights
    assert seen["victim"] not in seen["nodes"]  # r0 was recreated on another node
    assert sum(s["restarts"] for s in seen["stats"]) >= 1


def test_learner_hosts_hand_off_the_coordinator(cluster):
    """Host 0 picks the address on its node; both hosts join it through jax.distributed."""
    import ray

    from gymllm.train.cluster import LearnerHost, join_learner_hosts

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # on the head node: a node an earlier test removed can still look alive to the scheduler until its
    # heartbeats time out ("the actor's node was terminated unexpectedly" once in a full-suite run)
    head = NodeAffinitySchedulingStrategy(node_id=cluster.node_id(cluster.nodes[0]), soft=False)
    actor = ray.remote(LearnerHost)
    hosts = [actor.options(num_cpus=0, scheduling_strategy=head).remote(i, 2) for i in range(2)]
    try:
        views = join_learner_hosts(ray, hosts, timeout_s=120)
    finally:
        for h in hosts:
            ray.kill(h)
    assert sorted(v["process_index"] for v in views) == [0, 1]
    assert all(v["process_count"] == 2 and v["devices"] == 2 for v in views)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_learner_on_two_hosts_trains_like_one(tmp_path, cluster):
    """The learner on two jax.distributed hosts (one per node, data-parallel) trains the same groups
    with the same rewards as the learner in the driver."""
    one = train(small_tiny(tmp_path / "one", steps=2, cluster=ray_cluster(address=cluster.address)))
    two = train(
        small_tiny(
            tmp_path / "two",
            steps=2,
            cluster=ray_cluster(address=cluster.address, learner_hosts=2, learner_num_cpus=0.5),
        )
    )
    assert records(tmp_path / "two") == records(tmp_path / "one")
    assert [h["loss"] for h in two.history] == pytest.approx(
        [h["loss"] for h in one.history], rel=1e-4, abs=1e-6
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_cluster_run_resumes_like_an_uninterrupted_one(tmp_path, cluster):
    """Killed after step 1 (max_steps) and resumed on the cluster: the pool's replicas get the
    checkpoint's weights, consumed groups are skipped, and the steps equal an uninterrupted in-process run."""
    whole = train(small_tiny(tmp_path / "whole", steps=2))
    cfg = small_tiny(tmp_path / "cut", steps=2, cluster=ray_cluster(address=cluster.address))
    first = train(cfg, max_steps=1)
    second = train(cfg)
    assert (first.steps, second.steps, second.resumed_from) == (1, 2, 1)
    assert records(tmp_path / "cut") == records(tmp_path / "whole")
    assert first.rewards() + second.rewards() == whole.rewards()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_lora_cluster_run_pushes_adapters_and_trains_like_in_process(tmp_path, cluster):
    """LoRA on the cluster: each push sends the adapters once through the object store, every replica
    merges them onto its own base; at eta = 0 the same groups and rewards as the in-process LoRA run."""
    from gymllm.models.lora import LoRAConfig

    lora = LoRAConfig(rank=4)
    local = train(dataclasses.replace(small_tiny(tmp_path / "local"), lora=lora))
    remote = train(
        dataclasses.replace(
            small_tiny(tmp_path / "ray", cluster=ray_cluster(address=cluster.address)), lora=lora
        )
    )
    assert [sorted(ids) for ids in remote.trained_ids] == [sorted(ids) for ids in local.trained_ids]
    assert (
        records(tmp_path / "ray") == records(tmp_path / "local")
        and remote.rewards() == local.rewards()
    )
