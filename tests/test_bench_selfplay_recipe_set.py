"""benchmarks/selfplay_learning.py ``--recipe-set SECTION.KEY=VALUE``: the run trains from a copy of the
shipped recipe with those values (the warm start's [sft] keys have no gymllm train flag), and its
evaluation reads the same copy."""

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
        ['sft.demo_policy="first"', "sft.num_steps=12", "loss.entropy_coef=0.01"],
        tmp_path,
    )
    assert path == tmp_path / "kuhn_poker_selfplay.toml"
    copy = tomllib.loads(path.read_text())
    assert copy["sft"]["demo_policy"] == "first"  # added: the shipped [sft] has none
    assert copy["sft"]["num_steps"] == 12 and shipped["sft"]["num_steps"] != 12
    assert copy["loss"]["entropy_coef"] == 0.01
    assert copy["learner"] == shipped["learner"] and copy["env"] == shipped["env"]
    assert {k: v for k, v in copy["sft"].items() if k not in ("demo_policy", "num_steps")} == {
        k: v for k, v in shipped["sft"].items() if k != "num_steps"
    }
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
