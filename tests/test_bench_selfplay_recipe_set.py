"""benchmarks/selfplay_learning.py ``--recipe-set SECTION.KEY=VALUE``: the run trains from a copy of the
shipped recipe with those values (the warm start's [sft] keys have no gymllm train flag), and its
evaluation reads the same copy; and its Kuhn card-dependence goal, read within a decision."""

from __future__ import annotations

import pathlib
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import selfplay_learning  # noqa: E402


def test_the_copy_has_each_value_set_or_added_and_the_rest_as_shipped(tmp_path):
    shipped = tomllib.loads((ROOT / "gymllm/recipes/kuhn_poker_selfplay.toml").read_text())
    path = selfplay_learning.recipe_copy(
        "kuhn_poker_selfplay",
        ['sft.demo_policy="first"', "sft.num_steps=12", "multiagent.eval_keep_best=true"],
        tmp_path,
    )
    assert path == tmp_path / "kuhn_poker_selfplay.toml"
    copy = tomllib.loads(path.read_text())
    assert copy["sft"]["demo_policy"] == "first" and shipped["sft"]["demo_policy"] != "first"
    assert copy["sft"]["num_steps"] == 12 and shipped["sft"]["num_steps"] != 12
    assert copy["multiagent"]["eval_keep_best"] is True  # added: the shipped recipe has none
    assert "eval_keep_best" not in shipped["multiagent"]
    assert copy["learner"] == shipped["learner"] and copy["env"] == shipped["env"]
    assert {k: v for k, v in copy["sft"].items() if k not in ("demo_policy", "num_steps")} == {
        k: v for k, v in shipped["sft"].items() if k not in ("demo_policy", "num_steps")
    }
    assert {k: v for k, v in copy["multiagent"].items() if k != "eval_keep_best"} == shipped[
        "multiagent"
    ]
    run_dir = tmp_path / "kuhn_poker_selfplay"
    assert selfplay_learning.recipe_table("kuhn_poker_selfplay", run_dir) == copy
    assert selfplay_learning.recipe_table("kuhn_poker_selfplay", tmp_path / "x" / "y") == shipped


@pytest.mark.parametrize(
    "bad, says",
    [("num_steps=12", "SECTION.KEY=VALUE"), ("nosuch.key=1", r"no \[nosuch\] table")],
)
def test_a_bad_setting_stops_with_what_was_expected(tmp_path, bad, says):
    with pytest.raises(SystemExit, match=says):
        selfplay_learning.recipe_copy("tictactoe_selfplay", [bad], tmp_path)


def _table(bet, check, call, fold):
    return {"[bet]": bet, "[check]": check, "[call]": call, "[fold]": fold}


def test_card_dependence_is_read_within_a_decision_not_over_all_of_a_cards_moves():
    """The self-play checkpoint of a CPU run (2026-12-07) bet every time it could and folded every bet, with
    every card; its overall bet-or-call share was still K 0.85 > J 0.73, because the K met fewer bets.
    Within each decision K and J play alike: not card-dependent. The equilibrium's greedy play is."""
    blind = {
        "J": _table(69, 0, 0, 25),
        "Q": _table(61, 0, 0, 21),
        "K": _table(68, 0, 0, 12),
    }
    shares = selfplay_learning.situation_shares(blind)
    assert shares["K"] == {"bet": 1.0, "call": 0.0} == shares["J"]
    assert not selfplay_learning.k_over_j(shares)
    greedy_eq = {"J": _table(0, 69, 0, 51), "Q": _table(0, 61, 44, 0), "K": _table(68, 0, 12, 0)}
    assert selfplay_learning.k_over_j(selfplay_learning.situation_shares(greedy_eq))
    # a K that bets more but calls less is not "more often" in both decisions
    mixed = {"J": _table(0, 10, 10, 0), "Q": _table(0, 1, 1, 0), "K": _table(10, 0, 0, 10)}
    assert not selfplay_learning.k_over_j(selfplay_learning.situation_shares(mixed))
    # a decision neither card met is left out
    lone = {"J": _table(0, 10, 0, 0), "Q": _table(0, 1, 0, 0), "K": _table(5, 5, 0, 0)}
    assert selfplay_learning.k_over_j(selfplay_learning.situation_shares(lone))


def test_the_probability_shares_average_each_decision_kind_by_card():
    table = {
        "first to act": {"J": {"[check]": 0.8, "[bet]": 0.2}, "K": {"[check]": 0.4, "[bet]": 0.6}},
        "second, after a check": {
            "J": {"[check]": 0.6, "[bet]": 0.4},
            "K": {"[check]": 0.0, "[bet]": 1.0},
        },
        "second, facing a bet": {
            "J": {"[call]": 0.1, "[fold]": 0.9},
            "K": {"[call]": 0.9, "[fold]": 0.1},
        },
        "first, facing a bet after checking": {
            "J": {"[call]": 0.3, "[fold]": 0.7},
            "K": {"[call]": 0.7, "[fold]": 0.3},
        },
    }
    shares = selfplay_learning.prob_shares(table)
    assert shares["J"] == pytest.approx({"bet": 0.3, "call": 0.2})
    assert shares["K"] == pytest.approx({"bet": 0.8, "call": 0.8})
    assert selfplay_learning.k_over_j(shares)
    flipped = {s: {"J": row["K"], "K": row["J"]} for s, row in table.items()}
    assert not selfplay_learning.k_over_j(selfplay_learning.prob_shares(flipped))
    assert list(selfplay_learning.KUHN_SITUATIONS) == list(table)
