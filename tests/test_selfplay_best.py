"""The best in-run checkpoint of a game run (``multiagent.eval_keep_best``, :mod:`gymllm.train.best`): the
step with the highest score is saved whole to ``RUN/best``, named in ``RUN/best.json``, and loads as a
checkpoint; the scores are forced (the evaluation is replaced), so nothing here depends on learning."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from game_runs import run_to_end, tictactoe_tiny_args

from gymllm.errors import ConfigError
from gymllm.rollout.seat_source import MultiAgentSection
from gymllm.suites.game_eval import GameEvaluator
from gymllm.suites.games import resolve_game
from gymllm.train.best import BestCheckpoint, game_score, weights_only
from gymllm.train.train_config import EvalSection, preset


def rows(*win_or_draw: float, step: int = 0) -> list[dict]:
    return [
        {"step": step, "opponent": name, "win_or_draw": x}
        for name, x in zip(("random", "tictactoe_one_ply"), win_or_draw)
    ]


def keep_best_config(run_dir, **eval_kw):
    cfg = preset("tiny")
    return dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, id="tic-tac-toe"),
        run=dataclasses.replace(cfg.run, run_dir=str(run_dir)),
        eval=EvalSection(**{"every": 1, **eval_kw}),
        multiagent=MultiAgentSection(eval_keep_best=True),
    )


class ShiftedLearner:
    """The tiny model's weights plus ``version / 100`` (each step's weights differ), and an optimizer
    state the best checkpoint must leave out."""

    def __init__(self, base):
        self.base, self.version = base, 0

    def weights(self, version):
        return {
            k: np.asarray(v) + np.asarray(version / 100, np.asarray(v).dtype)
            for k, v in self.base.items()
        }

    def state(self):
        return {"trainable": self.weights(self.version), "opt_state": {"mu": np.zeros(3)}}


def test_the_score_is_the_mean_win_or_draw_over_the_opponents():
    assert game_score(rows(1.0, 0.5)) == pytest.approx(0.75)
    with pytest.raises(ConfigError, match="win_or_draw"):
        game_score([])
    assert weights_only({"trainable": {"w": 1}, "opt_state": 2}) == {"trainable": {"w": 1}}
    assert weights_only({"policies": {"a": {"trainable": 1, "opt_state": 2}}}) == {
        "policies": {"a": {"trainable": 1}}
    }


def test_the_best_step_is_saved_and_loads_as_a_checkpoint(tmp_path):
    from gymllm import models
    from gymllm.cli.game_cli import players_from_flags
    from gymllm.train.components import load_model

    cfg = keep_best_config(tmp_path)
    (tmp_path / "config.json").write_text(cfg.to_json())
    learner = ShiftedLearner(dict(load_model(cfg.model).model.flat_params()))
    evaluator = GameEvaluator(resolve_game("tic-tac-toe"), None, seed=1_000_000, games=2)
    best = BestCheckpoint.for_run(cfg)
    best.open(evaluator, resumed_from=None)
    scores = {0: (0.5, 0.5), 1: (0.75, 0.0), 2: (1.0, 0.5), 3: (0.5, 1.0), 4: (0.75, 0.5)}
    saved = []
    for step, s in scores.items():
        learner.version = step
        saved.append(best.offer(step, rows(*s, step=step), learner))
    # step 0 (the warm start) counts; step 3 ties step 2 (0.75) and the earlier is kept
    assert saved == [True, False, True, False, False]
    record = json.loads((tmp_path / "best.json").read_text())
    assert record["step"] == 2 and record["score"] == pytest.approx(0.75)
    assert record["opponents"] == {"random": 1.0, "tictactoe_one_ply": 0.5}
    assert sorted(p.name for p in (tmp_path / "best" / "checkpoints").iterdir()) == ["2"]
    loaded = models.load(str(tmp_path / "best"))
    want = learner.weights(2)
    got = loaded.model.flat_params()
    assert set(got) == set(want) and all(np.array_equal(np.asarray(got[k]), want[k]) for k in want)
    # what `gymllm eval game --model.checkpoint RUN/best` plays: the same weights, the run's prompt
    (player,) = players_from_flags([], [str(tmp_path / "best")], ["best"], [])
    played = player.loaded.model.flat_params()
    assert all(np.array_equal(np.asarray(played[k]), want[k]) for k in want)
    # a resumed run keeps a best of its own lineage; one from past the resumed step, or a fresh run, starts over
    again = BestCheckpoint(tmp_path)
    again.open(evaluator, resumed_from=3)
    assert (again.step, again.score) == (2, pytest.approx(0.75))
    assert not again.offer(3, rows(0.75, 0.75), learner)
    lost = BestCheckpoint(tmp_path)
    lost.open(evaluator, resumed_from=1)
    assert lost.step is None and not (tmp_path / "best").exists()
    assert not (tmp_path / "best.json").exists()


def test_keep_best_settings_are_checked_when_the_config_is_built(tmp_path):
    with pytest.raises(ConfigError, match="eval.every"):
        keep_best_config(tmp_path, every=0)
    cfg = keep_best_config(tmp_path)
    with pytest.raises(ConfigError, match="eval_best_metric.*one of"):
        dataclasses.replace(
            cfg, multiagent=dataclasses.replace(cfg.multiagent, eval_best_metric="chips")
        )


def test_the_best_step_by_reward_ranks_by_the_games_payoff(tmp_path):
    """Kuhn poker's case: every step wins half its games (showdowns), only the chips tell them apart."""
    cfg = keep_best_config(tmp_path)
    cfg = dataclasses.replace(
        cfg, multiagent=dataclasses.replace(cfg.multiagent, eval_best_metric="reward")
    )
    (tmp_path / "config.json").write_text(cfg.to_json())
    best = BestCheckpoint.for_run(cfg)
    assert best.metric == "reward"

    def kuhn_rows(*chips):
        return [
            {"opponent": name, "win_or_draw": 0.5, "reward": c}
            for name, c in zip(("random", "kuhn_card_player"), chips)
        ]

    assert game_score(kuhn_rows(0.25, -0.05), "reward") == pytest.approx(0.1)
    best.save = lambda step, state: None  # the saving itself is the test above's
    offered = [
        best.offer(s, kuhn_rows(*c), ShiftedLearner({}))
        for s, c in enumerate([(0.25, -0.03), (0.22, 0.06), (-0.3, 0.0)])
    ]
    assert offered == [True, True, False]
    record = json.loads((tmp_path / "best.json").read_text())
    assert record["step"] == 1 and record["metric"] == "mean reward over multiagent.eval_opponents"
    assert record["opponents"] == {"random": 0.22, "kuhn_card_player": 0.06}
    with pytest.raises(ConfigError, match="eval.envs"):
        keep_best_config(tmp_path, envs=("gymllm/TinyRepeat-v0",))
    off = dataclasses.replace(keep_best_config(tmp_path), multiagent=MultiAgentSection())
    assert BestCheckpoint.for_run(off) is None
    with pytest.raises(ConfigError, match="two-player game"):
        BestCheckpoint(tmp_path, env_id="gymllm/TinyRepeat-v0").open(object(), None)


@pytest.mark.slow  # a tiny model trained 3 steps on tic-tac-toe (the evaluation is forced)
def test_a_run_keeps_its_best_in_run_checkpoint(tmp_path, monkeypatch):
    from gymllm import models
    from gymllm.cli.train_args import parse_train_args
    from gymllm.train.run import Run

    forced = {0: 0.5, 1: 0.875, 2: 0.25, 3: 0.875}  # step 1 is the best (step 3 only ties it)

    async def evaluate(self, engine, step):
        return [
            {**GameEvaluator.row([], key, step), "win_or_draw": forced[step]}
            for key in ("random", "tictactoe_one_ply")
        ]

    monkeypatch.setattr(GameEvaluator, "evaluate", evaluate)
    cfg = parse_train_args(
        tictactoe_tiny_args(
            tmp_path,
            "--multiagent.opponent",
            "random",
            "--eval.every",
            "1",
            "--multiagent.eval-keep-best",
            "--multiagent.eval-opponents",
            "random",
            "gymllm.envs.games:tictactoe_one_ply",
        )
    )
    weights = {}
    run = Run(
        cfg, on_step=[lambda r: weights.setdefault(r["step"], dict(run.learner.policy_params()))]
    )
    run_to_end(run)
    record = json.loads((tmp_path / "best.json").read_text())
    assert record["step"] == 1 and record["score"] == pytest.approx(0.875)
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if "eval/vs/random/win_or_draw" in r] == [0, 1, 2, 3]
    assert [p.name for p in (tmp_path / "best" / "checkpoints").iterdir()] == ["1"]
    got = models.load(str(tmp_path / "best")).model.flat_params()
    assert all(np.array_equal(np.asarray(got[k]), np.asarray(v)) for k, v in weights[1].items())
