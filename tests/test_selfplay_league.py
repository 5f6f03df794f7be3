"""Self-play that can be measured: the league of earlier snapshots (its pool, its draws, the frozen opponent
serving the drawn one), the in-run learning curve against fixed players (the same rows as ``gymllm eval
--game`` plays on the same schedule) and its config errors."""

from __future__ import annotations

import asyncio
import json
import types

import numpy as np
import pytest
from game_runs import run_to_end, tictactoe_tiny_args

from gymllm.train.opponents import FrozenOpponent, League
from gymllm.errors import ConfigError
from gymllm.inference.completion import Completion
from gymllm.rollout.seat_source import MultiAgentSection
from gymllm.suites.game_eval import GameEvaluator, opponent_key
from gymllm.suites.games import MatchConfig, Player, opponent_player, resolve_game, run_matches


def test_the_league_keeps_the_last_snapshots_and_draws_uniformly_from_them():
    league = League(3, seed=7)
    for v in range(5):
        league.add(v, {"w": np.full(2, v)})
    assert [v for v, _ in league.pool] == [2, 3, 4]  # the oldest left
    draws = [league.draw()[0] for _ in range(3000)]
    counts = np.bincount(draws, minlength=5)
    assert counts[0] == counts[1] == 0 and all(
        abs(counts[v] / 3000 - 1 / 3) < 0.04 for v in (2, 3, 4)
    )
    assert league.draws == draws
    again = League(3, seed=7)
    for v in range(5):
        again.add(v, {})
    assert [again.draw()[0] for _ in range(50)] == draws[:50]  # seeded: a run replays its draws
    latest = League(4, latest=1.0, seed=0)
    for v in range(4):
        latest.add(v, {})
    assert {latest.draw()[0] for _ in range(20)} == {3}
    with pytest.raises(ValueError, match="empty"):
        League(2).draw()
    with pytest.raises(ValueError, match="size >= 1"):
        League(0)


class _Learner:
    def __init__(self):
        self.version = 0

    def policy_params(self):
        return {"w": np.full(3, float(self.version))}


class _Pusher:
    def __init__(self):
        self.pushed = []

    def push(self, flat, version):
        self.pushed.append((int(version), float(flat["w"][0])))


def test_a_league_opponent_serves_a_drawn_earlier_snapshot_at_each_refresh():
    learner, pusher = _Learner(), _Pusher()
    opp = FrozenOpponent(None, pusher, learner, version=0, flat={}, league=League(2, seed=3))
    for step in range(6):
        learner.version = step
        opp.refresh(step)
        served, weights = pusher.pushed[-1]
        assert served in (step - 1, step) if step else served == 0  # one of the last two snapshots
        assert (
            weights == float(served) and opp.version == served
        )  # the weights pushed are that snapshot's
    assert len({v for v, _ in pusher.pushed}) > 2 and any(
        v < s for (v, _), s in zip(pusher.pushed, range(6))
    )


def test_league_and_eval_flags_are_checked():
    assert MultiAgentSection(opponent="frozen", league_size=4).league_size == 4
    with pytest.raises(ConfigError, match="league_size"):
        MultiAgentSection(league_size=4)  # a league is of frozen snapshots
    with pytest.raises(ConfigError, match="league_latest"):
        MultiAgentSection(opponent="frozen", league_size=2, league_latest=1.5)
    with pytest.raises(ConfigError, match="eval_opponents"):
        MultiAgentSection(eval_opponents=("self",))
    with pytest.raises(ConfigError, match="eval_games"):
        MultiAgentSection(eval_games=3)
    assert opponent_key("gymllm.envs.games:tictactoe_one_ply") == "tictactoe_one_ply"


class CyclingEngine:
    """Test double of the Engine protocol: the n-th reply of a session is the n-th cell name in turn
    (an occupied one is an illegal move the game retries), so a game's moves depend only on the game."""

    def __init__(self, tok):
        self.tok, self.max_len, self.calls = tok, 4096, {}

    async def generate(self, prompt_ids, params, *, session_id=None):
        n = self.calls[session_id] = self.calls.get(session_id, 0) + 1
        cells = [c + r for c in "bac" for r in "213"]
        ids = self.tok.encode(cells[(n * 4) % 9]) + [self.tok.eos_token_id]
        return Completion(
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason="stop",
            versions=[0] * len(ids),
            prompt_len=len(prompt_ids),
        )

    def end_session(self, session_id):
        pass

    async def close(self):
        pass


def test_the_learning_curve_rows_are_the_games_gymllm_eval_game_plays(tmp_path):
    from gymllm.models.tiny import tiny_tokenizer
    from gymllm.rollout import ModelAgent

    tok = tiny_tokenizer(512)
    make = resolve_game("tic-tac-toe")
    ev = GameEvaluator(
        make,
        ModelAgent(tok),
        opponents=("random", "gymllm.envs.games:tictactoe_one_ply"),
        games=8,
        seed=1_000_000,
        max_tokens=4,
    )
    rows = asyncio.run(ev.evaluate(CyclingEngine(tok), step=3))
    assert [r["opponent"] for r in rows] == ["random", "tictactoe_one_ply"] and all(
        r["step"] == 3 for r in rows
    )
    for r in rows:
        assert r["games"] == 8 and r["win"] + r["draw"] + r["loss"] == pytest.approx(1.0)
        assert r["win_or_draw"] == pytest.approx(r["win"] + r["draw"])
    m = GameEvaluator.metrics(rows[0])
    assert set(m) == {
        f"eval/vs/random/{k}"
        for k in ("win", "draw", "loss", "win_or_draw", "score", "reward", "illegal", "overflow")
    }
    # the reference: the same player through gymllm eval game's runner, same schedule and seeds
    player = Player(
        label="policy",
        loaded=types.SimpleNamespace(tokenizer=tok),
        make_engine=lambda: CyclingEngine(tok),
    )
    summary = run_matches(
        make,
        [player, opponent_player("random")],
        tmp_path,
        config=MatchConfig(
            games=8, seed=1_000_000, temperature=0.0, max_tokens=4, num_resamples=20
        ),
    )
    line = next(x for x in summary["pairings"] if x["player"] == "policy")
    assert (line["win"], line["draw"], line["loss"]) == pytest.approx(
        (rows[0]["win"], rows[0]["draw"], rows[0]["loss"])
    )
    ref = [json.loads(x) for x in (tmp_path / "games.jsonl").read_text().splitlines()]
    assert sum(r["winner"] == "policy" for r in ref) == round(rows[0]["win"] * 8)


@pytest.mark.slow  # ~1 min on a shared 2-core machine: a tiny model, two engines, an evaluation per step
def test_a_league_run_logs_its_learning_curve(tmp_path):
    from gymllm.train.run import Run
    from gymllm.cli.train_args import parse_train_args

    cfg = parse_train_args(
        tictactoe_tiny_args(
            tmp_path,
            "--multiagent.opponent",
            "frozen",
            "--multiagent.league-size",
            "3",
            "--multiagent.league-keep-first",
            "1",
            "--eval.every",
            "1",
            "--multiagent.eval-games",
            "4",
            "--multiagent.eval-opponents",
            "random",
            "gymllm.envs.games:tictactoe_one_ply",
        )
    )
    run = Run(cfg)
    run_to_end(run)
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    curve = [r for r in records if "eval/vs/random/win_or_draw" in r]
    assert [r["step"] for r in curve] == [0, 1, 2, 3]
    assert all("eval/vs/tictactoe_one_ply/score" in r for r in curve)
    league = run.source.opponent.league
    assert league.draws and [v for v, _ in league.pool] == [0, 2, 3]  # the warm start is kept


def test_checkpoints_compared_without_model_pairings_get_a_paired_row_per_opponent(tmp_path):
    from gymllm.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer(512)
    models = [
        Player(
            label=name,
            loaded=types.SimpleNamespace(tokenizer=tok),
            make_engine=lambda: CyclingEngine(tok),
        )
        for name in ("sft", "selfplay")
    ]
    summary = run_matches(
        resolve_game("tic-tac-toe"),
        [*models, opponent_player("random")],
        tmp_path,
        config=MatchConfig(
            games=6, temperature=0.0, max_tokens=4, num_resamples=20, model_pairs=False
        ),
    )
    rows = [json.loads(x) for x in (tmp_path / "games.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(
        "random" in r["pairing"] for r in rows
    )  # no sft-vs-selfplay games
    paired = [d for d in summary["paired"] if d["metric"] == "score"]
    assert [(d["player"], d["baseline"], d["opponent"]) for d in paired] == [
        ("selfplay", "sft", "random")
    ]
    assert (
        paired[0]["n"] == 3 and paired[0]["diff"] == 0.0
    )  # the same deterministic player on the same games


@pytest.mark.parametrize("overflow", ["error", "random"])
def test_a_conversation_past_the_context_errors_or_plays_random_moves_as_training_does(
    tmp_path, overflow
):
    from gymllm.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer(512)
    engine = CyclingEngine(tok)
    engine.max_len = 200  # the first observations fit, a whole game's conversation does not
    player = Player(
        label="m", loaded=types.SimpleNamespace(tokenizer=tok), make_engine=lambda: engine
    )
    run_matches(
        resolve_game("tic-tac-toe"),
        [player, opponent_player("random")],
        tmp_path,
        config=MatchConfig(
            games=4, temperature=0.0, max_tokens=4, num_resamples=20, overflow=overflow
        ),
    )
    rows = [json.loads(x) for x in (tmp_path / "games.jsonl").read_text().splitlines()]
    if overflow == "error":
        assert all(r["crashed"] == "m" and "past the engine's context" in r["error"] for r in rows)
    else:
        assert all(r["error"] is None and r["overflow"].get("m", 0) > 0 for r in rows)
        assert all(r["outcomes"] for r in rows)  # every game finished, by the game's own rules


def test_the_run_summary_names_a_games_learning_curve():
    import pathlib

    from gymllm.train.trainer import TrainResult

    rows = [
        {"step": 0, "opponent": "random", "games": 16, "win_or_draw": 0.75, "reward": 0.5},
        {"step": 3, "opponent": "random", "games": 16, "win_or_draw": 0.875, "reward": 0.625},
    ]
    text = TrainResult(
        run_dir=pathlib.Path("r"),
        steps=3,
        history=[{"reward_mean": 0.0, "rollout_reward_mean": 0.0}],
        trained_ids=[],
        wall_s=1.0,
        evals=rows,
    ).summary()
    assert (
        "against random (16 games, eval/vs/random/...): win-or-draw 0.750 (step 0) -> 0.875 (step 3)"
        in text
    )


def test_the_first_snapshots_stay_in_the_league_and_are_drawn_with_the_rest():
    league = League(4, latest=0.25, seed=11, keep_first=1)
    for v in range(10):
        league.add(v, {"w": np.full(2, v)})
        assert league.pool[0][0] == 0 and len(league.pool) == min(v + 1, 4)
    assert [v for v, _ in league.pool] == [0, 7, 8, 9]  # the warm start stays; the rest rotate
    n = 8000
    counts = np.bincount([league.draw()[0] for _ in range(n)], minlength=10) / n
    assert counts[1:7].sum() == 0  # evicted ones are never drawn
    # latest with 0.25, else uniform over the 4 places: the latest 0.25 + 0.75 / 4, each other 0.75 / 4
    assert abs(counts[9] - (0.25 + 0.75 / 4)) < 0.03
    assert all(abs(counts[v] - 0.75 / 4) < 0.03 for v in (0, 7, 8))
    two = League(3, seed=0, keep_first=2)
    for v in range(6):
        two.add(v, {})
    assert [v for v, _ in two.pool] == [0, 1, 5]
    for bad in ({"keep_first": 3}, {"keep_first": -1}):
        with pytest.raises(ValueError, match="keep_first"):
            League(3, **bad)


def test_the_warm_start_is_the_first_snapshot_of_the_league_and_stays():
    learner, pusher = _Learner(), _Pusher()  # the learner's weights at version v are all v
    opp = FrozenOpponent.of_learner(None, pusher, learner, league=League(3, seed=5, keep_first=1))
    assert [v for v, _ in opp.league.pool] == [0] and pusher.pushed == [(0, 0.0)]
    assert opp.refreshes == 0 and opp.version == 0  # served from the start, before any step
    for step in range(1, 9):
        learner.version = step
        opp.refresh(step)
        assert opp.league.pool[0][0] == 0 and float(opp.league.pool[0][1]["w"][0]) == 0.0
    assert [v for v, _ in opp.league.pool] == [0, 7, 8]
    assert 0 in opp.league.draws[1:]  # the warm start is still served late in the run


def test_keep_first_and_keep_best_flags_are_checked():
    ok = MultiAgentSection(opponent="frozen", league_size=4, league_keep_first=1)
    assert ok.league_keep_first == 1 and not ok.eval_keep_best
    for bad in (
        {"opponent": "frozen", "league_size": 2, "league_keep_first": 2},  # no place for the latest
        {"league_keep_first": 1},  # no league
        {"opponent": "frozen", "league_size": 2, "league_keep_first": -1},
        {"opponent": "frozen", "league_size": 2, "league_keep_first": 1.5},
    ):
        with pytest.raises(ConfigError, match="league_keep_first"):
            MultiAgentSection(**bad)
    with pytest.raises(ConfigError, match="eval_keep_best"):
        MultiAgentSection(eval_keep_best="yes")
    with pytest.raises(ConfigError, match="eval_keep_best"):
        MultiAgentSection(eval_keep_best=True, policies='{"player_1": "a", "player_2": "b"}')
