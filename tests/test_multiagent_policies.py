"""Several policies trained in one run (``--multiagent.policies``): the map's checks, groups routed by
seat to their policy's engine (never mixing seats or policies), and a tiny end-to-end run where both
policies are updated, end with different weights, and each version counter moves only with its own
updates. The game is a small PettingZoo AEC env written here (Nim)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from gymllm.errors import ConfigError
from turn_games import CounterGame, take_groups
from gymllm.inference.completion import Completion
from gymllm.multiagent.factory import game_factory
from gymllm.rollout import ModelAgent
from gymllm.rollout.config import RolloutConfig
from gymllm.rollout.policy_map import check_policy_seats, policy_map
from gymllm.rollout.seat_source import MultiAgentSection

PILE = 4


class NimGame(CounterGame):
    """Nim on one pile of 4: take 1 (move 0) or 2 (move 1, masked out below 2 stones); whoever
    takes the last stone wins (+1, the other -1). Observation ``{"observation": [pile], "action_mask"}``."""

    metadata = {"name": "nim_v0", "render_modes": [], "is_parallelizable": False}
    start, high = PILE, PILE

    def legal(self):
        return np.array([1, 1 if self.count >= 2 else 0], np.int8)

    def advance(self, action):
        self.count = max(0, self.count - min(action + 1, self.count))
        return self.count == 0


def nim():
    """``--env.id test_multiagent_policies:nim``: a raw PettingZoo AEC env."""
    return NimGame()


MAP = '{"north": "a", "south": "b"}'


# --- the map and its checks ------------------------------------------------------------------------------


def test_the_game_passes_pettingzoo_api_test():
    from pettingzoo.test import api_test

    api_test(NimGame(), num_cycles=30)


@pytest.mark.parametrize(
    "bad, says",
    [
        ("{", "JSON object"),
        ("[1]", "non-empty JSON object"),
        ("{}", "non-empty"),
        ('{"north": ""}', "policy names"),
        ('{"north": "a b"}', "policy names"),
        ('{"north": 3}', "policy names"),
    ],
)
def test_bad_policy_maps_are_config_errors_with_a_fix(bad, says):
    with pytest.raises(ConfigError, match="multiagent.policies") as e:
        MultiAgentSection(policies=bad)
    assert says in str(e.value) and "--multiagent.policies" in str(e.value)


def test_policies_compose_with_opponents_or_say_how_to_fix():
    assert policy_map(MAP) == {"north": "a", "south": "b"} and policy_map("") == {}
    MultiAgentSection(
        policies='{"north": "a"}', opponent="random"
    )  # the other seat to the opponent
    MultiAgentSection(policies='{"north": "a"}', opponent="my_pkg.bots:greedy")
    for o in ("frozen", "run:runs/x"):
        with pytest.raises(ConfigError, match="drop --multiagent.opponent"):
            MultiAgentSection(policies=MAP, opponent=o)
    with pytest.raises(ConfigError, match="drop --multiagent.learner-seats"):
        MultiAgentSection(policies=MAP, learner_seats=("north",))
    with pytest.raises(ConfigError, match="policy_weights"):
        MultiAgentSection(policies=MAP, policy_weights="half")
    with pytest.raises(ConfigError, match="seats of this game"):
        check_policy_seats({"east": "a"}, ["north", "south"], opponent="self")
    with pytest.raises(ConfigError, match="every seat in self-play"):
        check_policy_seats({"north": "a"}, ["north", "south"], opponent="self")
    check_policy_seats({"north": "a"}, ["north", "south"], opponent="random")


def test_policies_is_a_train_flag_and_full_weights_refuse_a_lora_rank(tmp_path):
    from gymllm.train.policies import policy_lora
    from gymllm.cli.train_args import parse_train_args

    cfg = parse_train_args(["--preset", "tiny", "--multiagent.policies", MAP])
    assert cfg.multiagent.policies == MAP and cfg.multiagent.policy_weights == "lora"
    assert policy_lora(cfg).rank == 8  # lora by default, even without --lora.rank
    full = parse_train_args(
        ["--preset", "tiny", "--multiagent.policies", MAP, "--multiagent.policy-weights", "full"]
    )
    assert policy_lora(full) is None
    both = parse_train_args(
        [
            "--preset",
            "tiny",
            "--multiagent.policies",
            MAP,
            "--multiagent.policy-weights",
            "full",
            "--lora.rank",
            "4",
        ]
    )
    with pytest.raises(ConfigError, match="drop --lora.rank"):
        policy_lora(both)
    with pytest.raises((ConfigError, SystemExit)):
        parse_train_args(["--preset", "tiny", "--multiagent.policies", "{not json"])


def test_policies_need_a_game_and_known_seats():
    import dataclasses

    from gymllm.train.components import load_model
    from gymllm.train.policies import build_policy_set
    from gymllm.cli.train_args import parse_train_args

    cfg = parse_train_args(
        [
            "--preset",
            "tiny",
            "--env.id",
            "test_multiagent_policies:nim",
            "--env-kwargs",
            "{}",
            "--multiagent.policies",
            '{"north": "a", "east": "b"}',
        ]
    )
    lm = load_model(cfg.model)
    with pytest.raises(ConfigError, match="seats of this game"):
        build_policy_set(cfg, lm)
    with pytest.raises(ConfigError, match="a multi-agent game"):
        build_policy_set(
            dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, id="gymllm/TinyRepeat-v0")),
            lm,
        )


# --- routing on scripted engines -------------------------------------------------------------------------


class ScriptEngine:
    """Test double of the Engine protocol: replies "0" (take one) as the tokenizer's ids, with made-up
    logprobs and this engine's version on every token; records the sessions it served."""

    def __init__(self, tok, version):
        self.tok, self.version, self.calls, self.max_len = tok, version, [], 512

    async def generate(self, prompt_ids, params, *, session_id=None):
        self.calls.append(session_id)
        ids = self.tok.encode("0") + [self.tok.eos_token_id]
        return Completion(
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason="stop",
            versions=[self.version] * len(ids),
            prompt_len=len(prompt_ids),
        )

    def end_session(self, session_id):
        pass


def _source(engines, policies, opponent="self"):
    from gymllm.train.policies import PolicySeatSource
    from gymllm.inference.params import SamplingParams

    tok = next(iter(engines.values())).tok
    r = RolloutConfig(group_size=2, max_concurrency=8, max_staleness=None, max_model_calls=4)
    cfg = MultiAgentSection(policies=json.dumps(policies), opponent=opponent)
    return PolicySeatSource(
        game_factory("test_multiagent_policies:nim"),
        engines,
        policies,
        ModelAgent(tok),
        sampling=SamplingParams(temperature=1.0, max_tokens=4),
        rollout=r,
        config=cfg,
    )


def test_groups_are_routed_by_seat_and_never_mix_seats_or_policies():
    from gymllm.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer(512)
    engines = {"a": ScriptEngine(tok, 3), "b": ScriptEngine(tok, 7)}
    groups = asyncio.run(take_groups(_source(engines, {"north": "a", "south": "b"}), 4))
    seat_index = {"north": 0, "south": 1}
    for g in groups:
        seat, policy = g.info["agent"], g.info["policy"]
        assert policy == {"north": "a", "south": "b"}[seat] and g.group_id.endswith(":" + seat)
        assert {t.info["agent"] for t in g.trajectories} == {seat}
        assert (
            len({t.seed for t in g.trajectories}) == 1 and g.trajectories[0].seed == g.info["seed"]
        )
        assert {t.info["policy"] for t in g.trajectories} == {policy}
        for (
            t
        ) in g.trajectories:  # every sampled token came from this policy's engine, at its version
            sampled = t.loss_mask.astype(bool)
            assert sampled.any() and np.all(t.versions[sampled] == engines[policy].version)
            assert int(t.trajectory_id.split("/")[1][1:]) % 2 == seat_index[seat]
    # each engine served only its own seat's sessions (member index m: game m // 2, seat m % 2)
    for policy, engine in engines.items():
        assert engine.calls and {int(s.split("/")[1][1:]) % 2 for s in engine.calls} == {
            {"a": 0, "b": 1}[policy]
        }
    assert {g.info["agent"] for g in groups} == {"north", "south"}


def test_one_policy_against_a_random_opponent_trains_only_its_seat():
    from gymllm.models.tiny import tiny_tokenizer

    engines = {"solo": ScriptEngine(tiny_tokenizer(512), 0)}
    src = _source(engines, {"south": "solo"}, opponent="random")
    groups = asyncio.run(take_groups(src, 3))
    assert {(g.info["agent"], g.info["policy"]) for g in groups} == {("south", "solo")}
    assert src.counts["opponent_moves"] > 0


class CountingLearner:
    """Test double of the learner interface: one update every ``per_step`` groups; records what it got."""

    def __init__(self, per_step=2):
        import collections

        self.version, self.per_step, self.got, self.consumed_groups = 0, per_step, [], set()
        self.counts = collections.Counter()

    @property
    def groups_in_step(self):
        return len(self.got) % self.per_step

    def submit(self, groups):
        from gymllm.algos.learner import StepReport

        out = []
        for g in groups:
            self.got.append(g.group_id)
            self.consumed_groups.add(g.group_id)
            if len(self.got) % self.per_step == 0:
                self.version += 1
                out.append(
                    StepReport(
                        step=self.version,
                        metrics={"loss": 0.5, "reward_mean": float(self.version)},
                        sample_ids=[],
                    )
                )
        return out

    def policy_params(self):
        return {"w": self.version}


def test_policy_set_routes_each_group_to_its_policy_and_stops_at_num_steps():
    from gymllm.train.policies import PolicySet
    from gymllm.types import Group

    def group(k, seat, policy):
        return Group(
            group_id=f"g{k}:{seat}",
            task_id="t",
            trajectories=[],
            admitted_version=0,
            info={"agent": seat, "policy": policy},
        )

    a, b = CountingLearner(), CountingLearner()
    ps = PolicySet({"a": a, "b": b}, {"north": "a", "south": "b"}, num_steps=3)
    assert ps.groups_in_step == 0 and ps.version == 0
    reps = ps.submit([group(0, "north", "a"), group(0, "south", "b"), group(1, "north", "a")])
    assert (
        a.got == ["g0:north", "g1:north"] and b.got == ["g0:south"] and ps.groups_in_step == 0
    )  # b holds 1
    assert [r.step for r in reps] == [1] and reps[0].metrics["policy/a/version"] == 1
    assert reps[0].metrics["policy/b/version"] == 0 and reps[0].metrics["policy/a/loss"] == 0.5
    assert ps.policy_params() == {"w": 1} and list(ps.to_push) == ["a"]  # the next push is a's
    assert ps.consumed_groups == {"g0:north", "g0:south", "g1:north"}
    reps = ps.submit(
        [
            group(2, "north", "a"),
            group(1, "south", "b"),
            group(3, "north", "a"),
            group(4, "north", "a"),
        ]
    )
    # b's second group completes its update (step 2), a's fourth completes a's second (step 3)
    assert (
        [r.step for r in reps] == [2, 3] and ps.version == 3 and ps.versions() == {"a": 2, "b": 1}
    )
    assert [r.metrics["policy/b/version"] for r in reps] == [1, 1] and list(ps.to_push) == [
        "a",
        "b",
        "a",
    ]
    assert (
        a.got[-1] == "g3:north" and ps.counts["groups_after_end"] == 1
    )  # past num_steps: left untrained
    assert "g4:north" not in ps.consumed_groups
    with pytest.raises(ConfigError, match="info\\['policy'\\]"):
        PolicySet({"a": CountingLearner()}, {"north": "a"}, num_steps=5).submit(
            [group(0, "north", "zz")]
        )
    with pytest.raises(ConfigError, match="policy names among"):
        PolicySet({"a": a}, {"north": "a", "south": "b"}, num_steps=3)


# --- training end to end ---------------------------------------------------------------------------------


def test_two_policies_both_update_differ_and_keep_their_own_versions(tmp_path):
    from gymllm.train.policies import PolicySet
    from gymllm.train.run import Run
    from gymllm.cli.train_args import parse_train_args

    cfg = parse_train_args(
        [
            "--preset",
            "tiny",
            "--env.id",
            "test_multiagent_policies:nim",
            "--env-kwargs",
            "{}",
            "--run-dir",
            str(tmp_path),
            "--rollout.group-size",
            "2",
            "--env.num-envs",
            "2",
            "--rollout.max-model-calls",
            "2",
            "--sampling.max-tokens",
            "4",
            "--learner.groups-per-step",
            "1",
            "--learner.num-steps",
            "2",
            "--engine.max-len",
            "192",
            "--learner.max-len",
            "192",
            "--rollout.max-staleness",
            "2",
            "--run.no-report",
            "--loss.shaping.no-filter-zero-variance",
            "--loss.entropy-coef",
            "0.01",
            "--multiagent.policies",
            MAP,
        ]
    )
    seen = []

    def look(record):  # each policy's learner and engine version at every step
        ps = run.learner
        seen.append((record, ps.versions(), {n: int(e.version) for n, e in ps.engines.items()}))

    run = Run(cfg, on_step=[look])
    base = None

    async def go():
        nonlocal base
        run.setup()
        assert isinstance(run.learner, PolicySet) and set(run.learner.engines) == {"a", "b"}
        # LoRA policies: the run's one engine serves both, an adapter each (no engine of their own)
        assert all(e.engine is run.parts.engine for e in run.learner.engines.values())
        assert run.learner.extra_engines == [] and run.parts.engine.adapters.names == ("a", "b")
        base = {
            n: {k: np.asarray(v) for k, v in lrn.trainable.items()}
            for n, lrn in run.learner.learners.items()
        }
        try:
            await run.train()
        finally:
            await run.close()

    asyncio.run(go())
    learners = run.learner.learners
    assert [r["step"] for r, _, _ in seen] == [1, 2] and run.learner.version == 2
    # both policies were updated, and each counter moved only with its own updates
    prev = {"a": 0, "b": 0}
    for record, versions, engine_versions in seen:
        moved = [n for n in versions if versions[n] != prev[n]]
        assert (
            len(moved) == 1 and versions[moved[0]] == prev[moved[0]] + 1
        )  # one policy per step, by one
        assert engine_versions == versions  # pushed to its own adapter only, at its own version
        name = moved[0]
        assert (
            record[f"policy/{name}/version"] == versions[name]
            and record[f"policy/{name}/loss"] == record["loss"]
        )
        assert record[f"policy/{name}/reward"] == record["reward_mean"]
        assert {k for k in record if k.startswith("policy/") and k.endswith("/version")} == {
            "policy/a/version",
            "policy/b/version",
        }
        prev = versions
    assert prev == {"a": 1, "b": 1}  # one update each: a self-play batch gives both a group
    # LoRA adapters by default: only the adapters train; each moved from its start, and they differ
    a, b = ({k: np.asarray(v) for k, v in learners[n].trainable.items()} for n in ("a", "b"))
    assert set(a) == set(b) and all(k.endswith(("lora_a", "lora_b")) for k in a)
    assert any(not np.array_equal(a[k], base["a"][k]) for k in a)
    assert any(not np.array_equal(b[k], base["b"][k]) for k in b)
    assert any(not np.allclose(a[k], b[k]) for k in a)
    # every trajectory record carries its seat and its policy; a group holds one seat (and policy)
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("type") == "trajectory"]
    assert {(r["info"]["agent"], r["info"]["policy"]) for r in rows} == {
        ("north", "a"),
        ("south", "b"),
    }
    by_group = {}
    for r in rows:
        by_group.setdefault(r["group_id"], set()).add((r["info"]["agent"], r["info"]["policy"]))
        assert r["group_id"].endswith(":" + r["info"]["agent"])
    assert all(len(v) == 1 for v in by_group.values())
    # a policy's tokens carry its own versions: never ahead of its version at the step that trained them
    at_step = {rec["step"]: versions for rec, versions, _ in seen}
    for r in rows:
        sampled = [v for v in r["token_versions"] if v >= 0]
        assert sampled and max(sampled) <= at_step[r["step"]][r["info"]["policy"]]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("seat/north/reward" in m for m in metrics) and any(
        "seat/south/reward" in m for m in metrics
    )


@pytest.mark.slow  # two tiny runs with two engines each (~1 min on a shared 2-core machine)
def test_full_weight_policies_checkpoint_and_resume_each_policy(tmp_path):
    import orbax.checkpoint as ocp

    from gymllm.algos.checkpoint import Checkpointer
    from gymllm.train.trainer import train
    from gymllm.cli.train_args import parse_train_args

    def cfg(steps):
        return parse_train_args(
            [
                "--preset",
                "tiny",
                "--env.id",
                "test_multiagent_policies:nim",
                "--env-kwargs",
                "{}",
                "--run-dir",
                str(tmp_path),
                "--rollout.group-size",
                "2",
                "--env.num-envs",
                "2",
                "--rollout.max-model-calls",
                "2",
                "--sampling.max-tokens",
                "4",
                "--learner.groups-per-step",
                "1",
                "--learner.num-steps",
                str(steps),
                "--engine.max-len",
                "192",
                "--learner.max-len",
                "192",
                "--rollout.max-staleness",
                "2",
                "--run.no-report",
                "--loss.shaping.no-filter-zero-variance",
                "--loss.entropy-coef",
                "0.01",
                "--multiagent.policies",
                MAP,
                "--multiagent.policy-weights",
                "full",
            ]
        )

    first = train(cfg(2))
    assert (
        first.steps == 2
        and first.counts["policy/a/steps"] == 1
        and first.counts["policy/b/steps"] == 1
    )
    ckpt = Checkpointer(tmp_path / "checkpoints")
    meta = ckpt.manager.restore(2, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    ckpt.close()
    assert {n: p["version"] for n, p in meta["policies"].items()} == {"a": 1, "b": 1}
    seen = []
    second = train(cfg(4), on_step=[seen.append])
    assert second.resumed_from == 2 and second.steps == 4 and [r["step"] for r in seen] == [3, 4]
    last = seen[-1]
    assert last["policy/a/version"] + last["policy/b/version"] == 4
    assert min(last["policy/a/version"], last["policy/b/version"]) >= 1


def test_several_policies_are_refused_on_ray_and_their_checkpoint_says_so_when_loaded_as_one(
    tmp_path,
):
    import dataclasses

    import orbax.checkpoint as ocp

    from gymllm.train.train_config import ClusterSection, preset
    from gymllm.models.trained import restore_trained

    base = preset("tiny")
    with pytest.raises(ConfigError, match="drop --cluster.backend ray"):
        dataclasses.replace(
            base, multiagent=MultiAgentSection(policies=MAP), cluster=ClusterSection(backend="ray")
        )
    manager = ocp.CheckpointManager(
        tmp_path / "checkpoints"
    )  # what a --multiagent.policies run saves: state/policies/<name>
    manager.save(
        2,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(
                {
                    "policies": {
                        name: {"trainable": {"w": np.zeros(2, np.float32)}} for name in ("a", "b")
                    }
                }
            )
        ),
    )
    manager.wait_until_finished()
    manager.close()
    with pytest.raises(ConfigError, match=r"several policies \(a, b\)"):
        restore_trained(tmp_path)
