"""Evaluation that can tell two checkpoints apart: the paired-by-seed difference and its interval against a
hand computation, the schedule's random draws shared between pairings (so two players meet the same games),
the one-ply tic-tac-toe heuristic, the scripted Kuhn players and the Kuhn action table by card."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gymllm.envs.games import tictactoe_one_ply
from gymllm.multiagent.policies import ScriptedContext
from gymllm.suites.game_stats import game_value, paired_comparisons, seed_results
from gymllm.suites.games import MatchConfig, opponent_player, resolve_game, run_matches
from gymllm.utils.paired import paired_difference

FAST = dict(num_resamples=50)


def _rows(out):
    return [json.loads(line) for line in (out / "games.jsonl").read_text().splitlines()]


def test_paired_difference_matches_a_hand_computation():
    a = {1: 1.0, 2: 1.0, 3: 0.5, 4: 0.0, 9: 1.0}  # unit 9 has no partner: left out
    b = {1: 0.0, 2: 0.5, 3: 0.5, 4: 0.0}
    d = paired_difference(a, b)
    # differences 1, .5, 0, 0: mean .375; sample variance (.625^2 + .125^2 + 2 * .375^2) / 3 = .6875 / 3
    se = math.sqrt(0.6875 / 3 / 4)
    t = 3.182446305284263  # Student's t, 3 degrees of freedom, 0.975
    assert d["n"] == 4 and d["diff"] == pytest.approx(0.375) and d["se"] == pytest.approx(se)
    assert (
        d["t"] == pytest.approx(t)
        and d["mean_a"] == pytest.approx(0.625)
        and d["mean_b"] == pytest.approx(0.25)
    )
    assert (d["lo"], d["hi"]) == pytest.approx((0.375 - t * se, 0.375 + t * se))
    assert (d["lo"], d["hi"]) == pytest.approx((-0.38674, 1.13674), abs=1e-5)
    # a 90% interval is narrower; constant differences have no spread
    assert paired_difference(a, b, confidence=0.9)["hi"] < d["hi"]
    same = paired_difference({1: 1.0, 2: 0.0}, {1: 0.5, 2: -0.5})
    assert (same["diff"], same["lo"], same["hi"]) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="at least two units"):
        paired_difference({1: 1.0}, {1: 0.0, 2: 1.0})


def _row(pairing, seed, game, players, winner, rewards=None):
    return {
        "pairing": list(pairing),
        "seed": seed,
        "game": game,
        "players": players,
        "winner": winner,
        "scored": True,
        "rewards": rewards or {},
    }


def test_seed_units_average_the_seat_swapped_games_and_the_comparison_is_later_minus_earlier():
    rows = []
    # "new" vs random: seed 0 won twice, seed 1 won once and drew once, seed 2 lost twice
    for seed, winners in ((0, ("new", "new")), (1, ("new", None)), (2, ("random", "random"))):
        for g, w in enumerate(winners):
            rows.append(
                _row(
                    ("new", "random"),
                    seed,
                    2 * seed + g,
                    {},
                    w,
                    {"new": 1.0 if w == "new" else -1.0},
                )
            )
    # "old" vs random: seed 0 drew twice, seed 1 lost twice, seed 2 lost twice
    for seed, winners in ((0, (None, None)), (1, ("random", "random")), (2, ("random", "random"))):
        for g, w in enumerate(winners):
            rows.append(_row(("old", "random"), seed, 2 * seed + g, {}, w))
    assert seed_results(rows, "new", "random", "score") == {0: 1.0, 1: 0.75, 2: 0.0}
    assert seed_results(rows, "old", "random", "win_or_draw") == {0: 1.0, 1: 0.0, 2: 0.0}
    assert seed_results(rows, "new", "random", "reward") == {0: 1.0, 1: 0.0, 2: -1.0}
    assert game_value(rows[0], "random", "win") == 0.0
    out = paired_comparisons(rows, ["old", "new"], ["random"], metrics=("score",))
    assert len(out) == 1
    c = out[0]
    assert (c["player"], c["baseline"], c["opponent"], c["n"]) == ("new", "old", "random", 3)
    ref = paired_difference({0: 1.0, 1: 0.75, 2: 0.0}, {0: 0.5, 1: 0.0, 2: 0.0})
    assert c["diff"] == pytest.approx(ref["diff"]) and (c["lo"], c["hi"]) == pytest.approx(
        (ref["lo"], ref["hi"])
    )
    assert c["mean_a"] == pytest.approx(0.5 / 3) and c["mean_b"] == pytest.approx(1.75 / 3)


def first_legal(observation, agent):
    return int(np.flatnonzero(observation["action_mask"])[0])


def test_two_players_meet_the_same_random_draws_on_the_same_seeds(tmp_path):
    """The random player's RNG is the seed's and the game's, not the pairing's: two identical players get
    identical games, so a paired difference between them is exactly 0."""
    players = [
        opponent_player("test_game_eval_paired:first_legal", label="a"),
        opponent_player("test_game_eval_paired:first_legal", label="b"),
        opponent_player("random"),
    ]
    run_matches(resolve_game("tic-tac-toe"), players, tmp_path, config=MatchConfig(games=8, **FAST))
    rows = _rows(tmp_path)
    vs_a = {r["game"]: r for r in rows if set(r["pairing"]) == {"a", "random"}}
    vs_b = {r["game"]: r for r in rows if set(r["pairing"]) == {"b", "random"}}
    assert sorted(vs_a) == sorted(vs_b) == list(range(8))
    for g in vs_a:
        assert vs_a[g]["moves"] == vs_b[g]["moves"] and vs_a[g]["seed"] == vs_b[g]["seed"]
    assert (
        len({json.dumps(r["moves"]) for r in vs_a.values()}) > 2
    )  # the random player does vary across seeds
    d = paired_comparisons(rows, ["a", "b"], ["random"], metrics=("score",))[0]
    assert (d["diff"], d["lo"], d["hi"]) == (0.0, 0.0, 0.0)


def _board(mine, theirs):
    planes = np.zeros((3, 3, 2), np.int8)
    for i in mine:
        planes[i // 3, i % 3, 0] = 1
    for i in theirs:
        planes[i // 3, i % 3, 1] = 1
    mask = np.array([0 if i in mine or i in theirs else 1 for i in range(9)], np.int8)
    return {"observation": planes, "action_mask": mask}


def test_the_one_ply_heuristic_takes_a_win_then_blocks_then_plays_at_random():
    ctx = ScriptedContext(rng=np.random.default_rng(0), env=None)
    assert (
        tictactoe_one_ply(_board(mine=(0, 4), theirs=(1, 2)), "player_1", ctx) == 8
    )  # the diagonal wins
    assert (
        tictactoe_one_ply(_board(mine=(0,), theirs=(3, 4)), "player_1", ctx) == 5
    )  # block the middle line
    assert (
        tictactoe_one_ply(_board(mine=(0, 1), theirs=(3, 4)), "player_1", ctx) == 2
    )  # win over block
    picks = {
        tictactoe_one_ply(
            _board(mine=(), theirs=()), "p", ScriptedContext(np.random.default_rng(s), None)
        )
        for s in range(40)
    }
    assert len(picks) > 4  # no line to take or block: random legal cells


def test_the_one_ply_heuristic_beats_random_and_the_random_player_does_not(tmp_path):
    players = [
        opponent_player("gymllm.envs.games:tictactoe_one_ply", label="one_ply"),
        opponent_player("random"),
        opponent_player("test_game_eval_paired:first_legal", label="first"),
    ]
    summary = run_matches(
        resolve_game("tic-tac-toe"), players, tmp_path, config=MatchConfig(games=40, **FAST)
    )
    line = {(x["player"], x["opponent"]): x for x in summary["pairings"]}
    assert line[("one_ply", "random")]["win"] > 0.6 and line[("one_ply", "random")]["loss"] < 0.2
    assert line[("one_ply", "first")]["loss"] == 0.0  # first-legal never gets a line past a blocker


def test_kuhn_scripted_players_and_the_action_table_by_card(tmp_path):
    pytest.importorskip("textarena", reason="Kuhn poker needs the catalogue extra (textarena)")
    from gymllm.envs.kuhn_poker import kuhn_action_table, replay_chips

    players = [
        opponent_player("gymllm.envs.kuhn_poker:kuhn_card_player", label="card"),
        opponent_player("random"),
        opponent_player("gymllm.envs.kuhn_poker:kuhn_equilibrium_player", label="nash"),
    ]
    run_matches(
        resolve_game("gymllm.envs.kuhn_poker:kuhn_poker"),
        players,
        tmp_path,
        config=MatchConfig(games=60, **FAST),
    )
    rows = _rows(tmp_path)
    table = kuhn_action_table(rows, "card")
    assert (
        table["K"]["aggressive"] == 1.0 and table["J"]["aggressive"] == 0.0
    )  # it follows its card
    assert 0.0 <= table["Q"]["aggressive"] < 1.0 and table["Q"]["[bet]"] == 0
    assert sum(t["decisions"] for t in table.values()) > 60
    nash = kuhn_action_table(rows, "nash")
    assert (
        nash["K"]["first"].get("[check]", 0) == 0 and nash["J"]["facing_bet"].get("[call]", 0) == 0
    )
    assert (
        nash["Q"]["first"].get("[bet]", 0) == 0 and nash["J"]["first"].get("[bet]", 0) > 0
    )  # it bluffs a J
    for r in rows:  # the rows' final rewards are the chips replayed from the moves
        assert r["rewards"] == pytest.approx(replay_chips(r))
    chips = paired_comparisons(rows, ["card", "nash"], ["random"], metrics=("reward",))[0]
    assert chips["n"] == 30 and chips["lo"] <= chips["diff"] <= chips["hi"]
