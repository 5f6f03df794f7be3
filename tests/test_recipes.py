"""Every recipe in examples/ loads, validates, and trains for a couple of steps.

The recipes name the real small model; here each runs with a tiny random model of the same
interface (model.name = tiny-qwen3) so that the env, agent, rollout, loss and learner wiring of every
recipe is exercised in CI time. The real-model runs are what the recipes' descriptions report.
"""

import json
import pathlib

import pytest

from gymllm.cli.recipes import EXAMPLES_DIR, apply_overrides, load_recipe

RECIPES = sorted(p.stem for p in EXAMPLES_DIR.glob("*.toml"))


def _config(name: str, run_dir: pathlib.Path):
    from gymllm.algos import trainer

    overrides = load_recipe(name)
    assert overrides.pop("description", "").strip(), f"{name}: document what reward to expect"
    cfg = trainer.preset(overrides.pop("preset", "default"))
    if "loss_preset" in overrides:
        cfg = cfg.with_loss(overrides.pop("loss_preset"))
    cfg = apply_overrides(cfg, overrides)
    small = {
        "model": {"name": "tiny-qwen3"},
        "env": {"num_envs": 4},
        "rollout": {"group_size": 2, "max_concurrency": 4, "engine_slots": 4, "max_tokens": 8,
                    "max_turns": min(cfg.rollout.max_turns, 2)},
        "learner": {"groups_per_step": 2, "num_steps": 2, "micro_batch_size": 4},
        "run": {"run_dir": str(run_dir), "console": False, "report": False, "checkpoint_every": 0},
    }
    return apply_overrides(cfg, small)


def test_there_are_recipes_for_every_kind_of_task():
    assert {"arithmetic_tiny", "math_word", "calc_math", "frozenlake", "tictactoe", "code", "terminal"} <= set(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_trains_a_couple_of_steps(name, tmp_path):
    from gymllm.algos.trainer import train

    result = train(_config(name, tmp_path))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    assert [r["step"] for r in records][-2:] == [1, 2] or len(records) >= 2, records
    assert all("reward_mean" in r for r in records)
    assert result.steps == 2
