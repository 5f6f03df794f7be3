"""Illegal moves and crashing seats in multi-agent training (``--multiagent.illegal-move``,
``--multiagent.max-invalid``): a small PettingZoo game written here, scripted seats that crash or
return illegal actions, a learner that replies nonsense; every game ends, every group is whole, the
counts reach the step record and the run goes on."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gymllm.errors import ConfigError
from turn_games import CounterGame, take_groups
from gymllm.inference.completion import Completion
from gymllm.multiagent.factory import game_factory
from gymllm.rollout import ModelAgent
from gymllm.rollout.config import RolloutConfig
from gymllm.rollout.seat_source import MultiAgentSection, SeatGroupSource, SeatMetrics

STONES = 5


class PileGame(CounterGame):
    """A pile of 5 stones: take 1 (move 0) or 2 (move 1); taking the last stone wins. The game's own
    mask forbids taking 2 from a pile of 1, and its step asserts no illegal move reaches it."""

    metadata = {"name": "pile_v0", "render_modes": [], "is_parallelizable": False}
    start, high = STONES, STONES

    def legal(self):
        return np.array([self.count >= 1, self.count >= 2], np.int8)

    def advance(self, action):
        assert self.legal()[action], "the text layer let an illegal move through"
        self.count -= action + 1
        return self.count == 0


def pile():
    """The ``MODULE:FACTORY`` the tests name (``test_selfplay_rules:pile``)."""
    return PileGame()


CALLS = {"n": 0}


def crashing(observation, agent):
    """A scripted seat that always raises."""
    CALLS["n"] += 1
    raise RuntimeError("the bot fell over")


def out_of_range(observation, agent):
    """A scripted seat returning an action the game does not have."""
    return 7


def greedy(observation, agent):
    """Always take 2 (illegal from a pile of 1)."""
    return 1


class ReplyEngine:
    """Test double of the Engine protocol: always replies ``reply`` (the tokenizer's ids), made-up logprobs."""

    def __init__(self, reply: str):
        from gymllm.models.tiny import tiny_tokenizer

        self.tok, self.reply, self.version, self.calls, self.max_len = (
            tiny_tokenizer(512),
            reply,
            0,
            0,
            512,
        )

    async def generate(self, prompt_ids, params, *, session_id=None):
        self.calls += 1
        ids = self.tok.encode(self.reply) + [self.tok.eos_token_id]
        return Completion(
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason="stop",
            versions=[self.version] * len(ids),
            prompt_len=len(prompt_ids),
        )

    def end_session(self, session_id):
        pass


def _source(engine, config, metrics=None):
    from gymllm.inference.params import SamplingParams

    r = RolloutConfig(group_size=2, max_concurrency=4, max_staleness=None, max_model_calls=8)
    return SeatGroupSource(
        game_factory("test_selfplay_rules:pile"),
        engine,
        ModelAgent(engine.tok),
        sampling=SamplingParams(temperature=1.0, max_tokens=4),
        rollout=r,
        config=config,
        group_filter=None if metrics is None else metrics.observe(None),
    )


def _take(source, n):
    return asyncio.run(take_groups(source, n))


def test_illegal_move_fields_are_checked_and_are_train_flags():
    for bad in ("lose", "", "RANDOM"):
        with pytest.raises(ConfigError, match="multiagent.illegal_move"):
            MultiAgentSection(illegal_move=bad)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError, match="multiagent.max_invalid"):
            MultiAgentSection(max_invalid=bad)
    from gymllm.cli.train_args import parse_train_args

    cfg = parse_train_args(
        ["--preset", "tiny", "--multiagent.illegal-move", "random", "--multiagent.max-invalid", "2"]
    )
    assert (cfg.multiagent.illegal_move, cfg.multiagent.max_invalid) == ("random", 2)
    with pytest.raises((ConfigError, SystemExit)):
        parse_train_args(["--preset", "tiny", "--multiagent.illegal-move", "lose"])


@pytest.mark.parametrize("mode,errors_per_game", [("retry", 2), ("forfeit", 1)])
def test_a_crashing_seat_forfeits_as_configured_and_the_run_goes_on(mode, errors_per_game):
    CALLS["n"] = 0
    metrics = SeatMetrics(opponent="test_selfplay_rules:crashing")
    src = _source(
        ReplyEngine("0"),
        MultiAgentSection(
            opponent="test_selfplay_rules:crashing", illegal_move=mode, max_invalid=2
        ),
        metrics,
    )
    groups = _take(src, 4)
    assert src.counts["failed_batches"] == 0 and all(len(g.trajectories) == 2 for g in groups)
    for g in groups:
        assert (
            g.info["opponent_errors"] == errors_per_game * 2
        )  # every game: the scripted seat's moves, all errors
        assert g.info["opponent_illegal"] == errors_per_game * 2
        for t in g.trajectories:
            # the crashing seat forfeited: the learner gets 0 (PettingZoo's classic convention), its own moves legal
            assert (
                t.rewards[-1] == 0.0 and t.info["illegal"] == 0 and t.finish_reason == "terminated"
            )
    assert {g.info["agent"] for g in groups} == {"north", "south"}  # both seats trained, in turn
    out = metrics.flush()
    assert (
        out["opponent/errors"] >= errors_per_game * 2 * 4
        and out["opponent/illegal"] == errors_per_game
    )
    assert out["seat/north/illegal"] == 0.0


def test_random_mode_replaces_a_crash_or_an_out_of_range_action_and_the_game_plays_out():
    CALLS["n"] = 0
    src = _source(
        ReplyEngine("0"),
        MultiAgentSection(opponent="test_selfplay_rules:crashing", illegal_move="random"),
    )
    groups = _take(src, 2)
    assert src.counts["failed_batches"] == 0 and src.counts["seat_errors"] == CALLS["n"] > 0
    for g in groups:  # the game went on to a winner: every trajectory ends with +1 or -1
        assert all(abs(t.rewards[-1]) == 1.0 for t in g.trajectories)
        assert g.info["opponent_errors"] == g.info["opponent_illegal"] > 0
    src = _source(
        ReplyEngine("0"),
        MultiAgentSection(opponent="test_selfplay_rules:out_of_range", illegal_move="random"),
    )
    groups = _take(src, 2)
    assert src.counts["failed_batches"] == 0 and src.counts["seat_errors"] > 0
    assert all(abs(t.rewards[-1]) == 1.0 for g in groups for t in g.trajectories)


def test_a_masked_out_scripted_move_is_illegal_not_a_crash():
    src = _source(
        ReplyEngine("0"),
        MultiAgentSection(opponent="test_selfplay_rules:greedy", illegal_move="forfeit"),
    )
    groups = _take(src, 2)
    # greedy takes 2 while it can; a pile of 1 on its turn forfeits it (an illegal move, not an error)
    assert src.counts["seat_errors"] == 0 and src.counts["failed_batches"] == 0
    assert all(g.info["opponent_errors"] == 0 for g in groups)
    assert all(t.rewards[-1] in (1.0, -1.0, 0.0) for g in groups for t in g.trajectories)


@pytest.mark.parametrize("mode", ["retry", "forfeit", "random"])
def test_a_learner_that_replies_nonsense(mode):
    """The learner's reply names no move: retry (penalty, again, forfeit after max_invalid), forfeit at
    once, or a random legal move played for it with the penalty owed."""
    engine = ReplyEngine("zzz")
    src = _source(
        engine, MultiAgentSection(illegal_move=mode, max_invalid=2)
    )  # self-play: both seats
    groups = _take(src, 2)
    assert src.counts["failed_batches"] == 0
    trajs = [t for g in groups for t in g.trajectories]
    penalty = -0.1  # MultiAgentConfig's invalid_penalty
    if mode == "forfeit":  # the first mover forfeits on its first move; the other seat never moved
        first = [t for t in trajs if t.info["agent"] == "north"]
        assert all(t.info["illegal"] == 1 and t.reward == -1.0 for t in first)
        assert all(
            t.info["illegal"] == 0 and t.reward == 0.0 for t in trajs if t.info["agent"] == "south"
        )
    elif mode == "retry":
        first = [t for t in trajs if t.info["agent"] == "north"]
        assert all(
            t.info["illegal"] == 2 and t.rewards == pytest.approx([penalty, -1.0]) for t in first
        )
    else:  # every reply was replaced by a random legal move: the game had a winner; each move cost the penalty
        for t in trajs:
            moves = int(t.loss_mask.astype(bool).sum()) // len(engine.tok.encode("zzz") + [0])
            outcome = t.reward - moves * penalty
            assert t.info["illegal"] == moves > 0 and abs(outcome) == pytest.approx(1.0)


def always_crashes(observation, agent):
    raise ValueError("scripted seat down")


@pytest.mark.slow  # one tiny training step: ~90 s with its compiles on a shared 2-core machine
def test_training_goes_on_against_a_crashing_seat_and_records_it(tmp_path):
    import json

    from gymllm.train.trainer import train
    from gymllm.cli.train_args import parse_train_args

    cfg = parse_train_args(
        [
            "--preset",
            "tiny",
            "--env.id",
            "test_selfplay_rules:pile",
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
            "1",
            "--engine.max-len",
            "192",
            "--learner.max-len",
            "192",
            "--rollout.max-staleness",
            "1",
            "--run.no-report",
            "--multiagent.opponent",
            "test_selfplay_rules:always_crashes",
            "--multiagent.illegal-move",
            "random",
        ]
    )
    result = train(cfg)
    assert result.steps == 1
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = [m for m in metrics if "opponent/errors" in m]
    assert step and step[-1]["opponent/errors"] > 0 and step[-1]["opponent/illegal"] > 0
    assert any(k.startswith("seat/") and k.endswith("/illegal") for k in step[-1])


# --- a trained checkpoint as the opponent (--multiagent.opponent run:DIR) ---------------------------------


def _weights_hash(flat) -> str:
    from gymllm.train.opponents import FrozenOpponent

    return FrozenOpponent(None, None, None, version=0, flat=dict(flat)).weights_hash()


def _run(args, on_step):
    from gymllm.train.run import Run
    from gymllm.cli.train_args import parse_train_args

    run = Run(parse_train_args(args), on_step=[lambda record: on_step(run, record)])

    async def go():  # as gymllm.train.trainer.train runs it: the run saves its checkpoint at its end
        run.setup()
        try:
            await run.train()
            run.save()
        finally:
            await run.close()

    asyncio.run(go())
    return run


@pytest.mark.slow  # two tiny runs (the second with a second engine): ~70 s on a shared 2-core machine
def test_a_run_dir_opponent_serves_the_saved_weights_and_the_games_complete(tmp_path):
    import json

    from gymllm.train.components import load_model
    from gymllm.cli.train_args import parse_train_args

    # illegal replies become random legal moves, so the G games of a seed differ and every group has a
    # reward spread: each step updates the weights (zero-spread groups would leave them unchanged)
    common = [
        "--preset",
        "tiny",
        "--env.id",
        "test_selfplay_rules:pile",
        "--env-kwargs",
        "{}",
        "--rollout.group-size",
        "4",
        "--env.num-envs",
        "4",
        "--rollout.max-model-calls",
        "2",
        "--sampling.max-tokens",
        "4",
        "--learner.groups-per-step",
        "2",
        "--engine.max-len",
        "192",
        "--learner.max-len",
        "192",
        "--rollout.max-staleness",
        "1",
        "--run.no-report",
        "--multiagent.illegal-move",
        "random",
    ]
    first, second = tmp_path / "first", tmp_path / "second"
    trained = {}
    _run(
        common
        + ["--run-dir", str(first), "--learner.num-steps", "1", "--multiagent.opponent", "random"],
        lambda run, rec: trained.update(h=_weights_hash(run.parts.learner.policy_params())),
    )
    base = load_model((parse_train_args(common)).model)  # the preset's weights before training
    assert trained["h"] != _weights_hash(
        base.model.flat_params()
    )  # the first run's step changed its weights

    seen = []

    def look(run, record):
        opp = run.source.opponent
        seen.append(
            (
                opp.version,
                opp.weights_hash(),
                _weights_hash(run.parts.learner.policy_params()),
                dict(run.source.counts),
            )
        )

    _run(
        common
        + [
            "--run-dir",
            str(second),
            "--learner.num-steps",
            "2",
            "--multiagent.opponent",
            f"run:{first}",
        ],
        look,
    )
    assert len(seen) == 2
    for version, opp_hash, learner_hash, counts in seen:
        assert version == -1 and opp_hash == trained["h"]  # the saved weights, never refreshed
        assert (
            counts["opponent_moves"] > 0 and counts["games"] >= 2 and counts["failed_batches"] == 0
        )
    assert (
        seen[0][2] != seen[1][2]
    )  # the learner trained on between the two steps; the opponent stayed the checkpoint
    metrics = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert [m["opponent/version"] for m in metrics if "opponent/version" in m] == [-1.0, -1.0]
    assert any("vs/" + f"run:{first}".replace("/", "_") + "/win" in m for m in metrics)
