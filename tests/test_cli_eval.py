"""`gymllm eval env ENV --model.checkpoint RUN_DIR` evaluates what `gymllm train` trained: train two steps through the
CLI, then evaluate that run directory through the CLI (the run's model, its trained weights, its env kwargs)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gymllm.models.trained import checkpoint_dir, apply_trained, restore_trained
from gymllm.cli.evaluate import load_model
from gymllm.cli.main import main
from gymllm.inference.params import SamplingParams
from gymllm.rollout.evaluation import EvalConfig, agent_for


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("eval") / "run"
    assert (
        main(
            [
                "train",
                "--preset",
                "tiny",
                "--run-dir",
                str(run),
                "--learner.num-steps",
                "2",
                "--run.no-console",
                "--run.no-report",
            ]
        )
        == 0
    )
    return run


def test_restored_weights_are_the_trained_ones(run_dir):
    trained, step = restore_trained(run_dir)
    assert step == 2
    loaded = load_model(
        None, checkpoint=str(run_dir)
    )  # no --model.name: the run's own model section
    assert (
        loaded.config.hidden_size == 64 and loaded.config.num_layers == 2
    )  # the tiny preset's dims
    flat = loaded.model.flat_params()
    assert set(flat) == set(trained)
    for k, v in trained.items():
        np.testing.assert_array_equal(np.asarray(flat[k]), np.asarray(v))


def test_restored_weights_differ_from_the_initial_ones(run_dir):
    from gymllm.models import make_tiny

    cfg = json.loads((run_dir / "config.json").read_text())["model"]
    init = make_tiny(
        "qwen3",
        seed=cfg["seed"],
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_layers"],
        num_heads=cfg["num_heads"],
        num_kv_heads=cfg["num_kv_heads"],
    )
    restored = apply_trained(init.model, run_dir).flat_params()
    changed = [
        k
        for k, v in init.model.flat_params().items()
        if not np.array_equal(np.asarray(v), np.asarray(restored[k]))
    ]
    assert changed, "two optimizer steps at lr 1e-2 must move some weights"


def test_eval_cli_on_the_run_directory_uses_the_runs_env_kwargs(run_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "env",
                "gymllm/TinyRepeat-v0",
                "--model.checkpoint",
                str(run_dir),
                "--eval.seeds",
                "2",
                "--eval.k",
                "2",
                "--sampling.max-tokens",
                "6",
                "--eval.max-turns",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    (row,) = json.loads(out.read_text())
    assert row["env"] == "gymllm/TinyRepeat-v0" and row["env_kwargs"] == {
        "num_letters": 2
    }  # the trained setting
    assert row["episodes"] == 4 and 0.0 <= row["mean_reward"] <= 1.0
    assert (
        main(
            [
                "eval",
                "env",
                "gymllm/TinyRepeat-v0",
                "--model.checkpoint",
                str(run_dir),
                "--eval.seeds",
                "1",
                "--eval.k",
                "2",
                "--sampling.max-tokens",
                "6",
                "--eval.max-turns",
                "1",
                "--env-kwargs",
                '{"num_letters": 3}',
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())[0]["env_kwargs"] == {"num_letters": 3}


def test_eval_errors_are_clear(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="run directory written by `gymllm train`"):
        checkpoint_dir(tmp_path)
    assert (
        main(
            [
                "eval",
                "env",
                "gymllm/TinyRepeat-v0",
                "--model.checkpoint",
                str(tmp_path),
                "--model.name",
                "tiny-qwen3",
            ]
        )
        == 2
    )
    assert "checkpoints" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "env",
                "gymllm/TinyRepeat-v0",
                "--model.name",
                "tiny-qwen3",
                "--env-kwargs",
                "[1]",
            ]
        )
        == 2
    )
    assert "JSON object" in capsys.readouterr().err


def test_eval_plays_the_trained_env_as_the_run_did(tmp_path, monkeypatch):
    """The run's env.agent and env.system_prompt reach the agent for the env it trained on (only that
    one), and the engine's row length follows the run's engine.max_len."""
    from gymllm.cli import evaluate
    from gymllm.rollout.agents import ModelAgent, ToolAgent

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps(
            {
                "model": {"name": "tiny-qwen3"},
                "engine": {"max_len": 96},
                "env": {
                    "id": "gymllm/ArithmeticTool-v0",
                    "kwargs": {"digits": 1},
                    "agent": "model",
                    "system_prompt": "Answer in one line.",
                },
            }
        )
    )
    seen = {}

    async def fake_eval_env(env_id, loaded, **kw):
        agent = agent_for(
            env_id,
            loaded.tokenizer,
            kw["env_kwargs"],
            system_prompt=kw["system_prompt"],
            agent=kw["agent"],
        )
        seen[env_id] = (type(agent), agent.system_prompt, kw["env_kwargs"], kw["max_len"])
        return {"env": env_id}

    from gymllm import models

    monkeypatch.setattr(
        evaluate, "load_model", lambda name, checkpoint=None: models.make_tiny("qwen3")
    )
    monkeypatch.setattr(evaluate, "eval_env", fake_eval_env)
    evaluate.run_eval(
        ["gymllm/ArithmeticTool-v0", "gymllm/CalcMath-v0"],
        checkpoint=str(run),
        config=EvalConfig(max_turns=2, sampling=SamplingParams(max_tokens=8)),
    )
    assert seen["gymllm/ArithmeticTool-v0"] == (
        ModelAgent,
        "Answer in one line.",
        {"digits": 1},
        96 + 16,
    )
    other = seen["gymllm/CalcMath-v0"]
    assert (
        other[0] is ToolAgent and other[1] != "Answer in one line." and other[2] == {}
    )  # its own defaults
