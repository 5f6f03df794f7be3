"""The best in-run checkpoint of a game run (``multiagent.eval_keep_best``).

    best = BestCheckpoint.for_run(cfg)        # None unless multiagent.eval_keep_best
    best.open(evaluator, resumed_from)        # Run.setup: the in-run evaluator, the step resumed from
    best.offer(step, rows, learner)           # after each in-run evaluation: True when it saved

A game run with ``eval.every`` evaluates its policy against fixed players at step 0, every ``eval.every``
steps and at the last (:class:`gymllm.suites.game_eval.GameEvaluator`). Its **score** at a step is
:func:`game_score`: the mean over ``multiagent.eval_opponents`` of ``multiagent.eval_best_metric`` (by default
the policy's win-or-draw rate: wins plus draws over the games scored against that opponent; ``reward``: its
mean payoff a game, chips in Kuhn poker), every opponent weighing the same. Whenever a
step's score is above every earlier step's (strictly: a tie keeps the earlier step), the learner's
weights of that step are saved to ``RUN/best`` and ``RUN/best.json`` says which:
``{"step", "score", "opponents": {name: value}, "metric"}``.

The step-0 evaluation counts: it is the weights the run starts from (a fresh run's warm start, e.g. the
SFT checkpoint), so when no later step beats it ``RUN/best`` holds the warm start's weights (step 0)
and is still a checkpoint of its own. ``RUN/best`` is a run directory as ``gymllm train`` writes one:
``config.json`` (the run's) and ``checkpoints/<step>/`` holding the trained arrays only (no optimizer
state: it is for evaluation, not for resuming), so ``gymllm eval game GAME --model.checkpoint RUN/best``,
``--multiagent.opponent run:RUN/best`` and ``gymllm.models.load("RUN/best")`` load it as they load ``RUN``.
It is written whole into a temporary directory and renamed (a reader sees the old best or the new one),
then ``best.json``. A resumed run keeps the best so far when ``best.json`` names a step up to the one it
resumed from (and that step is on disk); a fresh run, or a best from past the resumed step (a lost
lineage), starts over.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any, Sequence

from gymllm.atomic import atomic_directory, atomic_write_text
from gymllm.validation import require

__all__ = ["BestCheckpoint", "check_keep_best", "game_score", "weights_only"]

METRIC = "win_or_draw"
#: the in-run evaluation's figures a best step may be chosen by (``multiagent.eval_best_metric``)
METRICS = ("win_or_draw", "score", "win", "reward")


def game_score(rows: Sequence[dict[str, Any]], metric: str = METRIC) -> float:
    """The in-run score of one evaluation step (module doc): the mean of ``rows``' ``metric``, one row per
    opponent (:meth:`gymllm.suites.game_eval.GameEvaluator.evaluate`)."""
    require(
        bool(rows) and all(metric in r for r in rows),
        "best checkpoint score",
        expected=f"one evaluation row per opponent, each with {metric!r}",
        received=[sorted(r) for r in rows],
        fix="score the rows of gymllm.suites.game_eval.GameEvaluator.evaluate",
    )
    return sum(float(r[metric]) for r in rows) / len(rows)


def weights_only(state: dict[str, Any]) -> dict[str, Any]:
    """A learner's checkpoint state (``{"trainable", "opt_state"}``, or ``{"policies": {name: ...}}``)
    without its optimizer state: the arrays :func:`gymllm.models.trained.restore_trained` reads."""
    if "trainable" in state:
        return {"trainable": state["trainable"]}
    return {"policies": {name: weights_only(s) for name, s in state["policies"].items()}}


def check_keep_best(cfg: Any) -> None:
    """With ``multiagent.eval_keep_best``, the settings it needs (``TrainConfig`` calls it when built, so a
    staged recipe fails before its SFT stage): ``eval.every`` on, the game's own evaluation (no ``eval.envs``
    / ``eval.suite``) and the learner in this process. Raises :class:`~gymllm.errors.ConfigError`."""
    require(
        cfg.multiagent.eval_best_metric in METRICS,
        "multiagent.eval_best_metric",
        expected=f"one of {METRICS}",
        received=repr(cfg.multiagent.eval_best_metric),
        fix="e.g. --multiagent.eval-best-metric reward (a game's own payoff, chips in Kuhn poker)",
    )
    if not cfg.multiagent.eval_keep_best:
        return
    require(
        cfg.eval.every > 0,
        "multiagent.eval_keep_best",
        expected="eval.every > 0 (the in-run evaluation whose score picks the best step)",
        received="eval.every=0",
        fix="add --eval.every N (e.g. 10), or drop --multiagent.eval-keep-best",
    )
    require(
        not (cfg.eval.envs or cfg.eval.suite),
        "multiagent.eval_keep_best",
        expected="the game's in-run evaluation (games against multiagent.eval_opponents)",
        received=f"eval.envs={list(cfg.eval.envs)}, eval.suite={cfg.eval.suite!r}",
        fix="drop --eval.envs / --eval.suite, or drop --multiagent.eval-keep-best",
    )
    require(
        cfg.cluster.learner_hosts == 0,
        "multiagent.eval_keep_best",
        expected="the learner in this process (cluster.learner_hosts = 0): the best step's "
        "weights are saved from it",
        received=f"cluster.learner_hosts={cfg.cluster.learner_hosts}",
        fix="drop --multiagent.eval-keep-best, or run the learner in the driver",
    )


class BestCheckpoint:
    """Keeps ``run_dir/best`` and ``run_dir/best.json`` (module doc). ``step`` / ``score``: the best so
    far (None before the first evaluation)."""

    def __init__(self, run_dir: str | pathlib.Path, *, env_id: str = "", metric: str = METRIC):
        self.run_dir, self.metric = pathlib.Path(run_dir), metric
        self.dir, self.record = self.run_dir / "best", self.run_dir / "best.json"
        self.env_id = env_id
        self.step: int | None = None
        self.score: float | None = None

    @classmethod
    def for_run(cls, cfg: Any) -> "BestCheckpoint | None":
        """The run's best checkpoint when ``multiagent.eval_keep_best`` (else None); ``cfg`` was checked by
        :func:`check_keep_best` when it was built."""
        if not cfg.multiagent.eval_keep_best:
            return None
        return cls(cfg.run.run_dir, env_id=cfg.env.id, metric=cfg.multiagent.eval_best_metric)

    def open(self, evaluator: Any, resumed_from: int | None) -> None:
        """Check that the run's in-run evaluation is a game's, then take up the best so far: a resumed
        run's (``resumed_from``: the step restored) when it is from that lineage, else none (a stale
        ``best`` of an earlier run in this directory is removed)."""
        from gymllm.suites.game_eval import GameEvaluator

        require(
            isinstance(evaluator, GameEvaluator),
            "multiagent.eval_keep_best",
            expected="a two-player game as env.id (its in-run evaluation plays "
            "multiagent.eval_opponents; the best step is the one with the highest eval_best_metric)",
            received=f"env.id={self.env_id!r}, evaluated by {type(evaluator).__name__}",
            fix="drop --multiagent.eval-keep-best for this env",
        )
        kept = self.load_record() if resumed_from is not None else None
        if (
            kept is not None
            and int(kept["step"]) <= resumed_from
            and (self.dir / "checkpoints" / str(int(kept["step"]))).is_dir()
        ):
            self.step, self.score = int(kept["step"]), float(kept["score"])
            return
        self.record.unlink(missing_ok=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def load_record(self) -> dict[str, Any] | None:
        """``best.json``, or None when there is none (or it cannot be read)."""
        try:
            data = json.loads(self.record.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and {"step", "score"} <= set(data) else None

    def offer(self, step: int, rows: Sequence[dict[str, Any]], learner: Any) -> bool:
        """The evaluation ``rows`` of policy ``step`` (the learner's current weights): when their
        :func:`game_score` beats the best so far, save the learner's weights as the best; whether it did."""
        score = game_score(rows, self.metric)
        if self.score is not None and score <= self.score:
            return False
        self.save(int(step), weights_only(learner.state()))
        self.step, self.score = int(step), score
        record = {
            "step": self.step,
            "score": score,
            "opponents": {r["opponent"]: float(r[self.metric]) for r in rows},
            "metric": f"mean {self.metric} over multiagent.eval_opponents",
        }
        atomic_write_text(self.record, json.dumps(record, indent=1) + "\n")
        return True

    def save(self, step: int, state: dict[str, Any]) -> None:
        """``state`` as ``best/checkpoints/<step>`` beside the run's ``config.json``, replacing the old best."""
        import orbax.checkpoint as ocp

        config = (self.run_dir / "config.json").read_text()
        with atomic_directory(self.dir, replace=True) as tmp:
            (tmp / "config.json").write_text(config)
            manager = ocp.CheckpointManager(
                (tmp / "checkpoints").resolve(),
                options=ocp.CheckpointManagerOptions(create=True),
            )
            try:
                manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
                manager.wait_until_finished()
            finally:
                manager.close()
