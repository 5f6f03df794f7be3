"""Every recipe in examples/ loads, validates, and trains for a couple of steps.

The recipes name the real small model; here each runs with a tiny random model of the same
interface (model.name = tiny-qwen3) so that the env, agent, rollout, loss and learner wiring of every
recipe is exercised in CI time. The real-model runs are what the recipes' descriptions report.
"""

import json
import pathlib
import textwrap

import pytest

from gymllm.cli.recipes import (
    EXAMPLES_DIR,
    load_recipe,
    recipe_tables,
    sft_config_for,
    sft_stage_from,
)
from gymllm.validation import apply_overrides
from gymllm.errors import ConfigError

RECIPES = sorted(p.stem for p in EXAMPLES_DIR.glob("*.toml"))


def _config(name: str, run_dir: pathlib.Path):
    from gymllm.train.train_config import preset

    overrides = load_recipe(name)
    assert overrides.pop("description", "").strip(), f"{name}: document what reward to expect"
    overrides.pop("sft", None)  # the SFT stage's table: test_staged_recipe_* run it
    cfg = preset(overrides.pop("preset", "default"))
    if "loss_preset" in overrides:
        cfg = cfg.with_loss(overrides.pop("loss_preset"))
    cfg = recipe_tables(overrides, cfg)
    small = {
        "model": {"name": "tiny-qwen3"},
        "env": {"num_envs": 4},
        "engine": {"num_slots": 4},
        "sampling": {"max_tokens": 8},
        "rollout": {
            "group_size": 2,
            "max_concurrency": 4,
            "max_model_calls": min(cfg.rollout.max_model_calls, 2),
        },
        "learner": {"groups_per_step": 2, "num_steps": 2, "micro_batch_size": 4},
        "run": {"run_dir": str(run_dir), "console": False, "report": False, "checkpoint_every": 0},
        "eval": {
            "seeds": min(cfg.eval.seeds, 2)
        },  # a recipe's [eval] table runs, on 2 held-out seeds
        "multiagent": {
            "eval_games": 2
        },  # a game's learning curve: 2 games against each fixed player
    }
    return apply_overrides(cfg, small)


def test_there_are_recipes_for_every_kind_of_task():
    assert {
        "arithmetic_tiny",
        "math_word",
        "calc_math",
        "frozenlake",
        "tictactoe",
        "code",
        "terminal",
    } <= set(RECIPES)


# the self-play recipes' two steps (about 30 s each) run in the slow tier; their game paths have default-tier tests
SELF_PLAY = ("tictactoe_selfplay", "kuhn_poker_selfplay")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SELF_PLAY else n for n in RECIPES]
)
def test_recipe_trains_a_couple_of_steps(name, tmp_path):
    from gymllm.train.trainer import train

    result = train(_config(name, tmp_path))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    evals = [
        r for r in records if any(k.startswith("eval/") for k in r)
    ]  # a recipe's [eval]: step 0 and the last
    records = [r for r in records if r not in evals or "reward_mean" in r]
    assert [r["step"] for r in records][-2:] == [1, 2] or len(records) >= 2, records
    assert all("reward_mean" in r for r in records)
    assert result.steps == 2


STAGED = ("tictactoe", "calc_math", "frozenlake", "tictactoe_selfplay", "kuhn_poker_selfplay")


@pytest.mark.parametrize("name", STAGED)
def test_staged_recipe_sft_table_builds_a_valid_sft_config(name, tmp_path):
    from gymllm.train.sft import SFTConfig
    from gymllm.cli.train_args import train_config_from
    from gymllm.envs.demos import SOLVERS

    table = load_recipe(name)["sft"]
    cfg = train_config_from(name, None, None, str(tmp_path))
    stage = sft_stage_from(table)
    assert (stage.demo_env or cfg.env.id) in SOLVERS, (
        f"{name}: its env (or [sft].demo_env) needs a demo solver"
    )
    sft = sft_config_for(stage, cfg, data="d.jsonl", run_dir=str(tmp_path / "sft"))
    assert isinstance(sft, SFTConfig) and sft.model.name == cfg.model.name and sft.data == "d.jsonl"
    if "num_steps" in table:
        assert sft.learner.num_steps == table["num_steps"] and sft.sft.epochs == 0
    if "learning_rate" in table:
        assert sft.optimizer.learning_rate == table["learning_rate"]
    assert sft.sft.system_prompt == cfg.env.system_prompt


def test_sft_table_bad_keys_are_named():
    from gymllm.train.train_config import preset

    cfg = preset("tiny")
    with pytest.raises(ConfigError, match="sft.num_stepz"):
        sft_config_for(sft_stage_from({"num_stepz": 3}), cfg, data="d", run_dir="r")
    with pytest.raises(ConfigError, match="run_dir"):
        sft_stage_from({"run_dir": "x"})
    with pytest.raises(ConfigError, match="demos"):
        sft_stage_from({"demos": 0})
    with pytest.raises(ConfigError, match="demo_env"):
        sft_stage_from({"demo_env": 3})
    assert sft_stage_from({"demo_env": "gymllm/TicTacToe-v0"}).demo_env == "gymllm/TicTacToe-v0"
    with pytest.raises(ConfigError, match="demo_policy.*'solver', 'uniform'.*received 'random'"):
        sft_stage_from({"demo_policy": "random"})
    assert sft_stage_from({"demo_policy": "uniform"}).demo_policy == "uniform"


TINY_STAGED = """
description = "tiny staged recipe: demos -> SFT -> GRPO"
preset = "tiny"
[model]
name = "tiny-qwen3"
[env]
id = "gymllm/Arithmetic-v0"
kwargs = {{ digits = 1, num_operands = 2, ops = "+" }}
num_envs = 4
[rollout]
group_size = 2
max_concurrency = 4
[engine]
num_slots = 4
max_len = 256
[sampling]
max_tokens = 8
[learner]
groups_per_step = 2
num_steps = 2
micro_batch_size = 4
max_len = 256
[run]
run_dir = "{run_dir}"
console = false
report = false
checkpoint_every = 0
[sft]
demos = 8
epochs = 0
num_steps = 3
batch_size = 4
micro_batch_size = 4
learning_rate = 1e-3
fast_compile = true
"""


def test_staged_recipe_runs_demos_sft_grpo_through_the_cli_and_skips_on_rerun(tmp_path, capsys):
    from gymllm.cli.main import main

    run_dir = tmp_path / "run"
    recipe = tmp_path / "staged.toml"
    recipe.write_text(textwrap.dedent(TINY_STAGED.format(run_dir=run_dir)))
    assert main(["train", str(recipe)]) == 0
    out = capsys.readouterr().out
    demos = [json.loads(x) for x in (run_dir / "demos.jsonl").read_text().splitlines()]
    assert len(demos) == 8 and all(
        d["reward"] >= 1 for d in demos
    )  # the solver's episodes, confirmed by the env
    stages = json.loads((run_dir / "stages.json").read_text())
    assert stages["demos"]["episodes"] == 8 and stages["sft"]["step"] == 3
    sft_steps = [
        json.loads(x)["step"] for x in (run_dir / "sft" / "metrics.jsonl").read_text().splitlines()
    ]
    assert sft_steps == [1, 2, 3]
    conf = json.loads((run_dir / "config.json").read_text())
    assert conf["model"]["checkpoint"] == str(
        run_dir / "sft"
    )  # GRPO warm-started from the SFT weights
    grpo = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in grpo if "reward_mean" in r][-2:] == [1, 2]
    assert "[stages] grpo" in out

    before = {
        p: p.stat().st_mtime_ns
        for p in (run_dir / "demos.jsonl", run_dir / "sft" / "metrics.jsonl")
    }
    assert (
        main(["train", str(recipe)]) == 0
    )  # rerun: demos and SFT skipped, GRPO resumes at its last step
    out = capsys.readouterr().out
    assert "demos.jsonl exists (8 episodes): skipped" in out and "finished (step 3): skipped" in out
    assert {p: p.stat().st_mtime_ns for p in before} == before
    grpo2 = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in grpo2 if "reward_mean" in r] == [
        r["step"] for r in grpo if "reward_mean" in r
    ]


def test_given_checkpoint_skips_the_stages(tmp_path):
    from gymllm.train.train_config import preset
    from gymllm.cli.commands import run_stages
    import dataclasses

    cfg = preset("tiny")
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, checkpoint=str(tmp_path / "elsewhere")),
        run=dataclasses.replace(cfg.run, run_dir=str(tmp_path / "r")),
    )
    lines = []
    assert run_stages(cfg, sft_stage_from({"demos": 4}), log=lines.append) is cfg
    assert not (tmp_path / "r").exists() and "skipped" in lines[0]
