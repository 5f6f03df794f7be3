"""Multi-agent training: the ``multiagent`` config section, the seat group source (self-play, random and
scripted opponents, groups per seat and seed, barrier-free games), a PettingZoo game written here
(not one of ours) trained from ``MODULE:FACTORY``, and the role-conditioned EMA baseline."""

from __future__ import annotations

import dataclasses

import asyncio

import numpy as np
import pytest

from game_runs import run_to_end
from gymllm.multiagent.baseline import group_role_advantages, role_ema_advantages
from gymllm.errors import ConfigError
from turn_games import CounterGame, take_groups
from gymllm.inference.completion import Completion
from gymllm.multiagent import text_api_test
from gymllm.multiagent.factory import game_factory
from gymllm.rollout import ModelAgent
from gymllm.rollout.config import RolloutConfig
from gymllm.rollout.seat_source import MultiAgentSection, SeatGroupSource

TARGET = 5


class RaceGame(CounterGame):
    """Race to 5: two players add 1 (move 0) or 2 (move 1) to a shared counter in turn; whoever brings
    it to 5 or more wins (+1, the other -1). Observation ``{"observation": [counter], "action_mask"}``."""

    metadata = {"name": "race_v0", "render_modes": [], "is_parallelizable": False}
    seats, start, high = ("first", "second"), 0, TARGET + 1

    def advance(self, action):
        self.count = min(TARGET + 1, self.count + action + 1)
        return self.count >= TARGET


def race():
    """The ``MODULE:FACTORY`` the tests name (``test_multiagent_seats:race``): a raw PettingZoo AEC env."""
    return RaceGame()


class DealtRaceGame(RaceGame):
    """The race with a private "hand" in each seat's info at the deal (what ``baseline_key`` keys on): the
    first seat's is ``"hi"`` on even seeds, else ``"lo"``; the second seat's the other."""

    def reset(self, seed=None, options=None):
        super().reset(seed, options)
        hands = ("hi", "lo") if (seed or 0) % 2 == 0 else ("lo", "hi")
        self.infos = {a: {"hand": h} for a, h in zip(self.agents, hands)}


def dealt_race():
    """``test_multiagent_seats:dealt_race``."""
    return DealtRaceGame()


CALLS: list[tuple[int, str]] = []


def always_two(observation, agent):
    """A scripted opponent on the game's own observation: always +2 (records what it saw)."""
    CALLS.append((int(observation["observation"][0]), agent))
    return 1


def test_the_test_game_passes_pettingzoo_api_test_raw_and_as_text():
    from pettingzoo.test import api_test

    api_test(RaceGame(), num_cycles=50)
    text_api_test(game_factory("test_multiagent_seats:race")(), num_cycles=50)


# --- config ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "selfish", "run:", "no_colon_module", "mod:1fn", "a b:c"])
def test_bad_opponent_strings_are_config_errors(bad):
    with pytest.raises(ConfigError, match="multiagent.opponent") as e:
        MultiAgentSection(opponent=bad)
    assert "MODULE:FN" in str(e.value) and "--multiagent.opponent" in str(e.value)


def test_config_section_checks_and_unknown_scripted_fn():
    for ok in ("self", "frozen", "random", "run:runs/x", "pkg.mod:fn"):
        assert MultiAgentSection(opponent=ok).opponent == ok
    with pytest.raises(ConfigError, match="learner_seats"):
        MultiAgentSection(learner_seats=("all", "first"))
    with pytest.raises(ConfigError, match="baseline"):
        MultiAgentSection(baseline="mean")
    with pytest.raises(ConfigError, match="refresh_every"):
        MultiAgentSection(refresh_every=0)
    with pytest.raises(ConfigError, match="seats of this game"):
        MultiAgentSection(learner_seats=("third",)).seats(["first", "second"])
    with pytest.raises(ConfigError, match="importable MODULE:FN"):
        _source(ScriptEngine(), MultiAgentSection(opponent="test_multiagent_seats:nope"))
    with pytest.raises(ConfigError, match="opponent engine"):
        _source(ScriptEngine(), MultiAgentSection(opponent="run:runs/x"))


def test_multiagent_section_is_a_train_flag():
    from gymllm.cli.train_args import parse_train_args

    cfg = parse_train_args(
        [
            "--preset",
            "tiny",
            "--multiagent.opponent",
            "random",
            "--multiagent.learner-seats",
            "first",
            "--multiagent.baseline",
            "role_ema",
        ]
    )
    assert cfg.multiagent == MultiAgentSection(
        opponent="random", learner_seats=("first",), baseline="role_ema"
    )
    with pytest.raises((ConfigError, SystemExit)):
        parse_train_args(["--preset", "tiny", "--multiagent.opponent", "bogus"])


# --- the seat source on a scripted engine ---------------------------------------------------------------


def _tok():
    from gymllm.models.tiny import tiny_tokenizer

    return tiny_tokenizer(512)


class ScriptEngine:
    """Test double of the Engine protocol: replies "0" or "1" (+1 or +2) as the tokenizer's ids, with
    made-up logprobs and the engine's version per token; ``gates`` hold given sessions' requests."""

    def __init__(self, tok=None, gates=None):
        self.tok = tok or _tok()
        self.version, self.calls, self.gates = 0, [], gates or {}
        self.max_len = 512

    async def generate(self, prompt_ids, params, *, session_id=None):
        self.calls.append(session_id)
        gate = self.gates.get(session_id)
        if gate is not None:
            await gate()
        text = "1" if len(self.calls) % 3 else "0"
        ids = self.tok.encode(text) + [self.tok.eos_token_id]
        return Completion(
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason="stop",
            versions=[self.version] * len(ids),
            prompt_len=len(prompt_ids),
        )

    def end_session(self, session_id):
        pass


def _params():
    from gymllm.inference.params import SamplingParams

    return SamplingParams(temperature=1.0, max_tokens=4)


def _source(engine, config, *, group_size=2, game="race"):
    r = RolloutConfig(
        group_size=group_size, max_concurrency=8, max_staleness=None, max_model_calls=4
    )
    return SeatGroupSource(
        game_factory(f"test_multiagent_seats:{game}"),
        engine,
        ModelAgent(engine.tok),
        sampling=_params(),
        rollout=r,
        config=config,
    )


def test_self_play_groups_one_per_seat_and_seed_with_tokens_logprobs_versions():
    engine = ScriptEngine()
    engine.version = 3
    groups = asyncio.run(take_groups(_source(engine, MultiAgentSection()), 4))
    by_batch = {}
    for g in groups:
        batch, seat = g.group_id.split(":")
        by_batch.setdefault(batch, set()).add(seat)
        assert g.info["agent"] == seat and len(g.trajectories) == 2
        assert (
            len({t.seed for t in g.trajectories}) == 1 and g.trajectories[0].seed == g.info["seed"]
        )
        for t in g.trajectories:
            assert t.info["agent"] == seat and t.info["policy"] == "learner"
            sampled = t.loss_mask.astype(bool)
            assert sampled.sum() >= 2  # at least one move of 2 tokens
            assert np.all(t.behaviour_logprobs[sampled] == -0.5) and np.all(
                t.versions[sampled] == 3
            )
    assert by_batch["g0"] == {"first", "second"}  # self-play: both seats of every batch
    # zero-sum game: a seat's reward is minus the other's in the same game
    g0 = {g.info["agent"]: g for g in groups if g.group_id.startswith("g0:")}
    np.testing.assert_allclose(g0["first"].rewards, -g0["second"].rewards)


def test_game_seeds_game_gives_each_game_of_a_batch_its_own_deal():
    """``game_seeds="game"``: game m of batch k from seed k * group_size + m (run.seed 0), so a group mixes
    deals and no two batches share one; the default keeps one seed per batch."""
    groups = asyncio.run(
        take_groups(_source(ScriptEngine(), MultiAgentSection(game_seeds="game"), group_size=3), 4)
    )
    for g in groups:
        k = int(g.group_id.split(":")[0][1:])
        assert sorted(t.seed for t in g.trajectories) == [3 * k, 3 * k + 1, 3 * k + 2]
        assert g.info["seed"] == 3 * k
    shared = asyncio.run(take_groups(_source(ScriptEngine(), MultiAgentSection(), group_size=3), 2))
    assert all({t.seed for t in g.trajectories} == {int(g.group_id[1])} for g in shared)
    with pytest.raises(ConfigError, match="game_seeds"):
        MultiAgentSection(game_seeds="deal")


def test_random_and_scripted_opponents_play_the_other_seat_and_seats_rotate():
    CALLS.clear()
    engine = ScriptEngine()
    groups = asyncio.run(
        take_groups(
            _source(engine, MultiAgentSection(opponent="test_multiagent_seats:always_two")), 2
        )
    )
    seats = {int(g.group_id.split(":")[0][1:]): g.info["agent"] for g in groups}
    assert seats[0] == "first" and seats[1] == "second"  # batch k trains seat k % 2
    assert CALLS and {a for _, a in CALLS} == {
        "first",
        "second",
    }  # the fn played the non-learner seats
    # the scripted seat moved with its own observation: counters it saw are the game's raw counters
    assert all(0 <= c < TARGET for c, _ in CALLS)
    # only learner seats reached the engine
    assert all(s is not None for s in engine.calls)
    rnd = _source(ScriptEngine(), MultiAgentSection(opponent="random", learner_seats=("second",)))
    groups = asyncio.run(take_groups(rnd, 2))
    assert {g.info["agent"] for g in groups} == {"second"} and rnd.counts["opponent_moves"] > 0


def test_games_interleave_a_game_waits_only_for_its_own_mover():
    """Game 0's first move is held until game 1 has made two moves: lockstep turns would deadlock."""
    progress = asyncio.Event()
    counts = {"g0/m2/a0": 0}

    async def hold():  # game 1 (member 1, seat first -> member index 2) must move twice meanwhile
        await asyncio.wait_for(progress.wait(), 10)

    engine = ScriptEngine(gates={"g0/m0/a0": hold})
    orig = engine.generate

    async def generate(prompt_ids, params, *, session_id=None):
        out = await orig(prompt_ids, params, session_id=session_id)
        if session_id in ("g0/m2/a0", "g0/m3/a0"):
            counts["g0/m2/a0"] += 1
            if counts["g0/m2/a0"] >= 2:
                progress.set()
        return out

    engine.generate = generate
    groups = asyncio.run(take_groups(_source(engine, MultiAgentSection()), 2))
    first_g0 = engine.calls.index("g0/m0/a0")
    game1 = [i for i, s in enumerate(engine.calls) if s in ("g0/m2/a0", "g0/m3/a0")]
    assert sum(i > first_g0 for i in game1) >= 2 and len(groups) >= 2


# --- role-conditioned EMA baseline ----------------------------------------------------------------------


def test_role_ema_advantages_match_a_hand_computation():
    baselines = {}
    adv, baselines = role_ema_advantages(
        [1.0, -1.0, 0.0],
        [("race", "first"), ("race", "second"), ("race", "first")],
        baselines,
        decay=0.9,
    )
    # first: b=0 -> A=1, b=0.1; second: b=0 -> A=-1, b=-0.1; first again: b=0.1 -> A=-0.1 (pre-update),
    # b = 0.9*0.1 + 0.1*0 = 0.09
    np.testing.assert_allclose(adv, [1.0, -1.0, -0.1], atol=1e-7)
    assert baselines == pytest.approx({("race", "first"): 0.09, ("race", "second"): -0.1})
    adv2, b2 = role_ema_advantages([0.5], [("race", "second")], baselines, decay=0.9)
    np.testing.assert_allclose(adv2, [0.6], atol=1e-7)
    assert b2[("race", "second")] == pytest.approx(0.9 * -0.1 + 0.1 * 0.5) and baselines[
        ("race", "second")
    ] == pytest.approx(-0.1)


def test_group_role_advantages_read_every_key_before_the_group_then_update_each_with_its_mean():
    adv, b = group_role_advantages(
        [1.0, -1.0, 3.0, 0.0], ["s/hi", "s/lo", "s/hi", "s/new"], {"s/hi": 0.5}, decay=0.9
    )
    # b before the group: hi 0.5, lo 0, new 0 -> A = [0.5, -1, 2.5, 0]
    np.testing.assert_allclose(adv, [0.5, -1.0, 2.5, 0.0], atol=1e-7)
    # hi takes mean(1, 3) = 2: 0.9 * 0.5 + 0.1 * 2 = 0.65; lo: 0.1 * -1; new: 0
    assert b == pytest.approx({"s/hi": 0.65, "s/lo": -0.1, "s/new": 0.0})
    # one key for the group: SPIRAL's RAE a group at a time (R - b, then b takes the group's mean)
    rewards = [1.0, 0.0, -1.0, 1.0]
    adv1, b1 = group_role_advantages(rewards, ["first"] * 4, {"first": 0.2}, decay=0.9)
    np.testing.assert_allclose(adv1, np.array(rewards) - 0.2, atol=1e-7)
    assert b1 == role_ema_advantages([np.mean(rewards)], ["first"], {"first": 0.2}, decay=0.9)[1]


def one_token_trajectory(i: int, group_id: str, *, reward: float = 0.0):
    """A trajectory of one prompt token and one sampled token (what the advantage code reads)."""
    from gymllm.types import Trajectory

    return Trajectory(
        token_ids=np.array([1, 2], np.int32),
        loss_mask=np.array([0, 1], np.int8),
        reward=reward,
        behaviour_logprobs=np.zeros(2, np.float32),
        versions=np.array([-1, 0], np.int32),
        trajectory_id=f"t{i}",
        group_id=group_id,
    )


def test_scaled_role_advantages_divide_by_each_keys_running_spread_by_hand():
    from gymllm.multiagent.baseline import SCALE_SUFFIX as S

    base = {"p/J": -1.5, "p/J" + S: 0.25, "p/K": 1.0}  # K's spread unseen: 1
    adv, b = group_role_advantages(
        [-1.0, -2.0, 2.0, -1.0], ["p/J", "p/J", "p/K", "p/K"], base, decay=0.9, scaled=True
    )
    # J: (R - -1.5) / sqrt(0.25) = [+1, -1]; K: (R - 1) / 1 = [+1, -2]
    np.testing.assert_allclose(adv, [1.0, -1.0, 1.0, -2.0], atol=1e-6)
    # the baselines move as unscaled ones do; each spread takes the mean squared deviation as read
    plain = group_role_advantages(
        [-1.0, -2.0, 2.0, -1.0], ["p/J", "p/J", "p/K", "p/K"], base, decay=0.9
    )
    assert {k: b[k] for k in ("p/J", "p/K")} == pytest.approx(
        {"p/J": plain[1]["p/J"], "p/K": plain[1]["p/K"]}
    )
    assert b["p/J" + S] == pytest.approx(0.9 * 0.25 + 0.1 * 0.25)  # deviations +-0.5: 0.25
    assert b["p/K" + S] == pytest.approx(0.9 * 1.0 + 0.1 * (1.0 + 4.0) / 2)
    # the floor: a key whose rewards stopped varying does not blow its next deviation up
    adv_f, _ = group_role_advantages(
        [-1.0], ["p/J"], {"p/J": -2.0, "p/J" + S: 0.0}, scaled=True, floor=0.5
    )
    np.testing.assert_allclose(adv_f, [2.0], atol=1e-6)
    assert base == {"p/J": -1.5, "p/J" + S: 0.25, "p/K": 1.0}  # pure


def test_scaled_advantages_make_a_jacks_lesson_as_loud_as_a_kings():
    """Kuhn facing a bet from a player who bets every card: a K calls for +2 or folds for -1, a J calls for -2
    or folds for -1. Centred by its card, the J's fold-over-call lesson is a third of the K's; scaled by each
    card's spread, the two are equal."""
    keys = ["s/J", "s/J", "s/K", "s/K"] * 8
    rewards = [-1.0, -2.0, 2.0, -1.0] * 8
    b: dict = {}
    for _ in range(150):  # the baselines and spreads settle
        scaled, b = group_role_advantages(rewards, keys, b, decay=0.9, scaled=True)
    centred, _ = group_role_advantages(rewards, keys, {k: v for k, v in b.items() if "#" not in k})
    assert (centred[0] - centred[1]) == pytest.approx((centred[2] - centred[3]) / 3, rel=1e-3)
    assert (scaled[0] - scaled[1]) == pytest.approx(scaled[2] - scaled[3], rel=1e-2)


def test_the_scaled_baseline_needs_the_role_ema_estimator():
    from gymllm.algos.config import AdvantageConfig, LossConfig
    from gymllm.algos.learner_scoring import GroupScorer

    loss = LossConfig(advantage=AdvantageConfig(ema_scale=True))
    with pytest.raises(ConfigError, match="ema_scale.*role_ema|role_ema.*ema_scale"):
        GroupScorer(loss, None, ref_logp=None, ref_params=None, mesh=None)
    with pytest.raises(ConfigError, match="ema_scale_floor"):
        AdvantageConfig(ema_scale=True, ema_scale_floor=0.0)
    from gymllm.cli.train_args import parse_train_args
    from gymllm.train.wiring import learner_loss

    cfg = parse_train_args(
        [
            "--preset",
            "tiny",
            "--multiagent.baseline",
            "role_ema",
            "--loss.advantage.ema-scale",
        ]
    )

    a = learner_loss(cfg).advantage
    assert (a.estimator, a.ema_scale) == ("role_ema", True)
    # the learner's scorer keys each member by seat and card, and scales by that key's spread
    from gymllm.types import Group, Trajectory

    def member(i: int, card: str) -> Trajectory:
        t = one_token_trajectory(i, "g0")
        t.info["baseline_key"] = card
        return t

    group = Group(group_id="g0", task_id="s", trajectories=[member(0, "J"), member(1, "K")])
    group.info["agent"] = "first"
    scorer = GroupScorer(learner_loss(cfg), None, ref_logp=None, ref_params=None, mesh=None)
    from gymllm.multiagent.baseline import SCALE_SUFFIX as S

    b = {"first/J": -1.5, "first/J" + S: 0.25, "first/K": 0.5, "first/K" + S: 2.25}
    adv, b2 = scorer.role_advantages(group, np.array([-1.0, -1.0], np.float32), b)
    np.testing.assert_allclose(
        adv, [1.0, -1.0], atol=1e-6
    )  # (R - b) / spread: 0.5 / 0.5, -1.5 / 1.5
    assert set(b2) == set(b)


def test_baseline_key_tags_each_trajectory_with_its_seats_first_decision_info():
    config = MultiAgentSection(baseline="role_ema", baseline_key="hand", game_seeds="game")
    groups = asyncio.run(
        take_groups(_source(ScriptEngine(), config, group_size=2, game="dealt_race"), 4)
    )
    for g in groups:
        seat = g.info["agent"]
        for t in g.trajectories:
            first_is_hi = t.seed % 2 == 0
            want = "hi" if first_is_hi == (seat == "first") else "lo"
            assert t.info["baseline_key"] == want, (seat, t.seed, t.info)
    plain = asyncio.run(
        take_groups(_source(ScriptEngine(), MultiAgentSection(), game="dealt_race"), 2)
    )
    assert all("baseline_key" not in t.info for g in plain for t in g.trajectories)
    with pytest.raises(ConfigError, match="baseline_key"):
        MultiAgentSection(baseline_key="hand")  # keys only the role_ema baseline


def test_role_ema_baseline_sets_the_learners_estimator_and_the_groups_carry_their_role():
    from gymllm.train.wiring import learner_loss
    from gymllm.cli.train_args import parse_train_args

    cfg = parse_train_args(
        [
            "--preset",
            "tiny",
            "--multiagent.baseline",
            "role_ema",
            "--multiagent.baseline-decay",
            "0.8",
        ]
    )
    a = learner_loss(cfg).advantage
    assert (a.estimator, a.ema_decay) == ("role_ema", 0.8)
    assert learner_loss(dataclasses.replace(cfg, multiagent=MultiAgentSection())) is cfg.loss
    src = _source(ScriptEngine(), MultiAgentSection(baseline="role_ema"))  # no longer refused
    assert src.config.baseline == "role_ema"
    from gymllm.algos.config import ShapingConfig
    from gymllm.train.resume import make_group_filter
    from gymllm.types import Group

    filtering = dataclasses.replace(
        cfg, loss=dataclasses.replace(cfg.loss, shaping=ShapingConfig(filter_zero_variance=True))
    )
    equal = Group(
        group_id="g0:first",
        task_id="seed0",
        trajectories=[one_token_trajectory(i, "g0:first", reward=1.0) for i in range(2)],
    )
    assert make_group_filter(filtering, {}, set())(equal)  # R - b[seat] is not 0: the group trains
    plain = dataclasses.replace(filtering, multiagent=MultiAgentSection())
    assert not make_group_filter(plain, {}, set())(equal)  # a group estimator would centre it to 0


def test_a_drained_full_queue_wakes_the_producer_with_no_batch_in_flight():
    """The producer stops at a full queue (rollout.queue_size); when the consumer drains it while no
    batch is in flight (so no batch's end will wake the producer), taking groups must wake it."""
    engine = ScriptEngine()
    r = RolloutConfig(
        group_size=2, max_concurrency=2, max_staleness=None, max_model_calls=4, queue_size=2
    )
    src = SeatGroupSource(
        game_factory("test_multiagent_seats:race"),
        engine,
        ModelAgent(engine.tok),
        sampling=_params(),
        rollout=r,
        config=MultiAgentSection(),
    )

    async def go():
        await src.start()
        try:
            while not (
                src.ready_groups >= 2 and not src.in_flight
            ):  # full, and nothing left to finish
                await asyncio.sleep(0.01)
            for _ in range(20):  # let the producer run until it waits on the full queue
                await asyncio.sleep(0)
            first = await src.next_groups()
            more = await asyncio.wait_for(src.next_groups(), 20)  # hung here before the fix
            return first, more
        finally:
            await src.close()

    first, more = asyncio.run(go())
    assert (
        len(first) == 2
        and more
        and {g.group_id for g in first}.isdisjoint(g.group_id for g in more)
    )


def test_registered_tic_tac_toe_is_a_game_and_plays_against_random():
    make = game_factory("tic-tac-toe")
    assert make is not None and game_factory("gymllm/TinyRepeat-v0") is None
    text_api_test(make(), num_cycles=20)
    engine = ScriptEngine()
    src = SeatGroupSource(
        make,
        engine,
        ModelAgent(engine.tok),
        sampling=_params(),
        rollout=RolloutConfig(
            group_size=2, max_concurrency=8, max_staleness=None, max_model_calls=3
        ),
        config=MultiAgentSection(opponent="random"),
    )
    groups = asyncio.run(take_groups(src, 2))
    assert {g.info["agent"] for g in groups} == set(make().possible_agents) and src.counts[
        "opponent_moves"
    ] > 0


# --- training end to end --------------------------------------------------------------------------------


def test_self_play_trains_a_pettingzoo_factory_from_the_command_line(tmp_path):
    from gymllm.train.trainer import train
    from gymllm.cli.train_args import parse_train_args

    cfg = parse_train_args(
        [
            "--preset",
            "tiny",
            "--env.id",
            "test_multiagent_seats:race",
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
            "2",
            "--learner.num-steps",
            "2",
            "--engine.max-len",
            "192",
            "--learner.max-len",
            "192",
            "--rollout.max-staleness",
            "1",
            "--run.no-report",
        ]
    )
    assert cfg.env.id == "test_multiagent_seats:race" and cfg.multiagent.opponent == "self"
    seen = []
    result = train(cfg, on_step=[seen.append])
    assert result.steps == 2 and len(seen) == 2
    import json

    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("type") == "trajectory"]
    assert {r["info"]["agent"] for r in rows} == {
        "first",
        "second",
    }  # groups of both seats were trained
    for r in rows:
        assert r["group_id"].endswith(":" + r["info"]["agent"]) and r["info"]["policy"] == "learner"
        sampled = [i for i, v in enumerate(r["token_versions"]) if v >= 0]
        assert sampled and len(r["logprobs"]) == len(r["token_ids"]) == len(r["token_versions"])
        assert all(r["logprobs"][i] < 0 for i in sampled) and all(
            r["token_versions"][i] <= r["step"] for i in sampled
        )
    # per-seat figures in each step record: every finished group counted under its seat
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    assert {k for k in last if k.startswith("seat/") and k.endswith("/groups")} == {
        "seat/first/groups",
        "seat/second/groups",
    }
    for seat in ("first", "second"):
        shares = [
            m[f"seat/{seat}/{o}"]
            for m in metrics
            if f"seat/{seat}/win" in m
            for o in ("win", "draw", "loss")
        ]
        assert shares and all(0.0 <= x <= 1.0 for x in shares)


class HeldOpponent:
    """Test double of FrozenOpponent: its own scripted engine; ``refresh`` records the steps."""

    def __init__(self):
        self.engine, self.version, self.refreshed, self.closed = ScriptEngine(), 0, [], False

    def refresh(self, version):
        self.version = version
        self.refreshed.append(version)

    async def close(self):
        self.closed = True


def test_frozen_opponent_seats_are_played_by_the_opponent_engine_and_refresh_on_schedule():
    with pytest.raises(ConfigError, match="opponent engine"):
        _source(ScriptEngine(), MultiAgentSection(opponent="frozen"))
    engine, opp = ScriptEngine(), HeldOpponent()
    r = RolloutConfig(group_size=2, max_concurrency=8, max_staleness=None, max_model_calls=4)
    src = SeatGroupSource(
        game_factory("test_multiagent_seats:race"),
        engine,
        ModelAgent(engine.tok),
        sampling=_params(),
        rollout=r,
        config=MultiAgentSection(opponent="frozen", refresh_every=2),
        opponent=opp,
    )
    for v in (1, 2, 3, 4):
        src.set_policy_version(v)
    assert opp.refreshed == [2, 4] and src.stats()["opponent_version"] == 4
    groups = asyncio.run(take_groups(src, 2))
    for g in groups:
        seat = g.info["agent"]
        other = "second" if seat == "first" else "first"
        k = g.group_id.split(":")[0]
        members = {int(t.trajectory_id.split("/")[1][1:]) for t in g.trajectories}
        idx = {"first": 0, "second": 1}
        # the learner seat's sessions went to the learner's engine, the other seat's to the opponent's
        assert all(f"{k}/m{m}/a0" in engine.calls for m in members)
        assert all(f"{k}/m{m - idx[seat] + idx[other]}/a0" in opp.engine.calls for m in members)
        assert not any(f"{k}/m{m}/a0" in opp.engine.calls for m in members)
    assert opp.closed


@pytest.mark.slow  # ~35 s on a shared 2-core machine: three tiny steps with two engines
def test_frozen_opponent_trains_and_its_weights_change_only_at_a_refresh(tmp_path):
    from gymllm.train.run import Run
    from gymllm.cli.train_args import parse_train_args

    cfg = parse_train_args(
        [
            "--preset",
            "tiny",
            "--env.id",
            "test_multiagent_seats:race",
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
            "3",
            "--engine.max-len",
            "192",
            "--learner.max-len",
            "192",
            "--rollout.max-staleness",
            "1",
            "--run.no-report",
            "--multiagent.opponent",
            "frozen",
            "--multiagent.refresh-every",
            "2",
        ]
    )
    seen = []

    def look(record):
        opp = run.source.opponent
        seen.append((record["step"], opp.version, opp.weights_hash()))

    run = Run(cfg, on_step=[look])
    run_to_end(run)
    assert [(s, v) for s, v, _ in seen] == [
        (1, 0),
        (2, 2),
        (3, 2),
    ]  # never ahead of the learner's step
    assert seen[0][2] != seen[1][2] and seen[1][2] == seen[2][2]


FLAKY = {"calls": 0}


def crashes_first(observation, agent):
    """A scripted opponent whose first three calls raise (a crashing seat), then plays +1."""
    FLAKY["calls"] += 1
    if FLAKY["calls"] <= 3:
        raise RuntimeError("opponent crashed")
    return 0


def test_a_crashing_opponent_is_an_illegal_move_and_the_run_goes_on(caplog):
    """Each crash is an illegal move (multiagent.illegal_move, default retry with max_invalid 3): the three
    crashes come in one game (the seat is asked again at once), which the opponent forfeits; no batch is lost."""
    FLAKY["calls"] = 0
    src = _source(ScriptEngine(), MultiAgentSection(opponent="test_multiagent_seats:crashes_first"))
    with caplog.at_level("WARNING", logger="gymllm.rollout"):
        groups = asyncio.run(take_groups(src, 3))
    assert (
        len(groups) >= 3 and src.counts["failed_batches"] == 0 and "opponent crashed" in caplog.text
    )
    assert src.counts["seat_errors"] == 3 and sum(g.info["opponent_errors"] for g in groups) == 3
    assert all(
        len(g.trajectories) == 2 for g in groups
    )  # every game ended, none left a group short
    forfeited = [t for g in groups for t in g.trajectories if g.info["opponent_errors"]]
    assert any(
        t.rewards[-1] == 0.0 for t in forfeited
    )  # the crashing seat forfeited: the learner gets 0


def test_seat_metrics_count_every_group_under_its_seat():
    from gymllm.rollout.seat_source import SeatMetrics

    class G:
        def __init__(self, seat, rewards):
            self.info = {"agent": seat}
            self.trajectories = [type("T", (), {"reward": r})() for r in rewards]

    m = SeatMetrics(version=lambda: 4)
    keep = m.observe(lambda g: g.info["agent"] == "first")  # the run's filter still decides
    assert keep(G("first", [1.0, -1.0, 0.0, 1.0])) and not keep(G("second", [-1.0, -1.0]))
    out = m.flush()
    assert (
        out["seat/first/reward"] == 0.25
        and out["seat/first/win"] == 0.5
        and out["seat/first/draw"] == 0.25
    )
    assert (
        out["seat/second/loss"] == 1.0
        and out["seat/second/groups"] == 1
        and out["opponent/version"] == 4
    )
    assert (
        "seat/first/reward" not in m.flush() and m.flush()["seat/first/groups"] == 1
    )  # figures since the last flush
    vs = SeatMetrics(opponent="my_pkg.bots:greedy")
    keep = vs.observe(None)
    keep(G("first", [1.0, 0.0])), keep(G("second", [-1.0, 1.0]))
    out = vs.flush()
    assert (
        out["vs/my_pkg.bots:greedy/win"],
        out["vs/my_pkg.bots:greedy/draw"],
        out["vs/my_pkg.bots:greedy/loss"],
    ) == (0.5, 0.25, 0.25)
    selfplay = SeatMetrics()
    selfplay.observe(None)(G("first", [1.0]))
    assert not any(k.startswith("vs/") for k in selfplay.flush())  # self-play: no vs/ figures
