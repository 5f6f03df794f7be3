"""Env-side figures of finished episodes: the valid-action (tic-tac-toe: legal-move) rate and a game's
win-or-draw rate, in the held-out evaluation row and the training step metrics. Checked against the
same games replayed directly on the env (its own ``info["invalid_action"]`` flag and final reward)."""

from __future__ import annotations

import asyncio
import types

import pytest

import gymllm
from gymllm.envs.games import TICTACTOE_MOVES
from gymllm.models import tiny
from gymllm.rollout.agents import ModelAgent
from gymllm.rollout.episode import is_invalid_step
from gymllm.inference.params import SamplingParams
from gymllm.rollout.evaluation import EvalConfig, episode_figures, eval_metrics, evaluate_env
from gymllm.multiagent.seat import game_outcome

ENV = "gymllm/TicTacToe-v0"


class SquareByTurnEngine:
    """A stand-in engine (a tiny random model writes no moves): the n-th reply of a session is
    ``script(n)``. Implements the generate/end_session/version part of the Engine protocol."""

    def __init__(self, tokenizer, script):
        self.tok, self.script, self.turns, self.version = tokenizer, script, {}, 0

    async def generate(self, prompt_ids, params, *, session_id=None):
        from gymllm.inference.completion import Completion

        n = self.turns.get(session_id, 0)
        self.turns[session_id] = n + 1
        ids = self.tok.encode(self.script(n)) + [int(self.tok.eos_token_id)]
        return Completion(
            token_ids=ids,
            logprobs=[-1.0] * len(ids),
            finish_reason="stop",
            versions=[0] * len(ids),
            prompt_len=len(prompt_ids),
        )

    def end_session(self, session_id):
        self.turns.pop(session_id, None)


def squares_in_order(n: int) -> str:
    """a1, a2, ... c3, then a1 again: a legal move until the square is taken (then an illegal one)."""
    return TICTACTOE_MOVES[n % 9]


def replay(seed: int, script, kwargs) -> tuple[int, int, str]:
    """The same episode played directly on the env: (env steps, steps the env flagged invalid, result
    from the final reward)."""
    env = gymllm.make(ENV, **kwargs)
    env.reset(seed=seed)
    steps = invalid = 0
    while True:
        _, reward, term, trunc, info = env.step(script(steps))
        steps += 1
        invalid += bool(info.get("invalid_action")) or (info.get("forfeit") == info.get("agent"))
        if term or trunc:
            env.close()
            if info.get("forfeit") is not None:
                return steps, invalid, "forfeit" if info["forfeit"] == info["agent"] else "win"
            return steps, invalid, "win" if reward > 0 else "loss" if reward < 0 else "draw"


def run_eval(script, kwargs, seeds=12):
    tok = tiny.tiny_tokenizer(512)
    envs = gymllm.make_vec(ENV, 4, **kwargs)
    try:
        config = EvalConfig(
            seeds=seeds, max_turns=30, sampling=SamplingParams(temperature=0.0, max_tokens=8)
        )  # seeds from HELD_OUT_SEED_BASE
        return asyncio.run(
            evaluate_env(
                envs,
                SquareByTurnEngine(tok, script),
                ModelAgent(tok),
                config=config,
                env_id=ENV,
                env_kwargs=kwargs,
            )
        )
    finally:
        envs.close()


def test_eval_row_legal_move_and_win_or_draw_rates_match_a_direct_replay():
    kwargs = {"max_invalid": 9}  # squares in order: some replies hit a taken square, none forfeits
    row = run_eval(squares_in_order, kwargs)
    ref = [replay(1_000_000 + i, squares_in_order, kwargs) for i in range(12)]
    steps, invalid = sum(r[0] for r in ref), sum(r[1] for r in ref)
    assert 0 < invalid < steps  # the script does make illegal moves, and legal ones
    assert row["valid_action_rate"] == pytest.approx(1 - invalid / steps)
    results = [r[2] for r in ref]
    assert row["win_or_draw"] == pytest.approx(sum(r in ("win", "draw") for r in results) / 12)
    for o in ("win", "loss", "draw", "forfeit"):
        assert row[f"outcome/{o}"] == pytest.approx(results.count(o) / 12)
    assert row["outcome/forfeit"] == 0.0
    m = eval_metrics(row)
    assert m[f"eval/{ENV}/valid_action_rate"] == row["valid_action_rate"]
    assert m[f"eval/{ENV}/win_or_draw"] == row["win_or_draw"]


def test_a_policy_that_never_writes_a_move_forfeits_every_game():
    row = run_eval(lambda n: "You are X.", {"max_invalid": 2}, seeds=4)
    assert row["valid_action_rate"] == 0.0 and row["win_or_draw"] == 0.0
    assert row["outcome/forfeit"] == 1.0 and row["pass@1"] == 0.0


def test_game_outcome_and_invalid_step_rules():
    assert game_outcome("x", 1.0, {}) == "win" and game_outcome("x", -1.0, {}) == "loss"
    assert game_outcome("x", 0.0, {}) == "draw"
    assert (
        game_outcome("x", -1.0, {"forfeit": "x"}) == "forfeit"
        and game_outcome("x", 0.0, {"forfeit": "o"}) == "win"
    )
    assert is_invalid_step({"invalid_action": "retry"}) and not is_invalid_step(
        {"invalid_action": False}
    )
    assert is_invalid_step({"forfeit": "x", "agent": "x"}) and not is_invalid_step(
        {"forfeit": "o", "agent": "x"}
    )


def test_won_game_reports_a_win_through_the_seat():
    # X (the learner, first to move) takes the top row while the scripted opponent plays elsewhere
    env = gymllm.make(
        ENV,
        learner="player_1",
        opponent=lambda obs, rng: next(
            m
            for m in ("b1", "b2", "c1", "c2", "c3")
            if m in obs["observation"].split("Legal moves:")[-1]
        ),
    )
    env.reset(seed=0)
    for move in ("a1", "a2", "a3"):
        _, reward, term, _, info = env.step(move)
    env.close()
    assert term and reward == 1.0 and info["outcome"] == "win"


def test_episode_figures_without_game_results_has_no_outcome_keys():
    episode = types.SimpleNamespace(
        info={"env_steps": 4, "invalid_actions": 1}
    )  # a Trajectory's info part
    assert episode_figures([episode]) == {"valid_action_rate": 0.75}


def test_training_step_metrics_carry_the_figures_over_every_rollout():
    from gymllm.train.step_log import RolloutTally

    def episode(seed, steps, invalid, outcome):
        return types.SimpleNamespace(
            seed=seed,
            row_index=0,
            info={
                "env_steps": steps,
                "invalid_actions": invalid,
                "outcome": outcome,
                "tool_calls": 0,
            },
        )

    tally = RolloutTally()
    tally.add(
        types.SimpleNamespace(
            group_id="g0",
            rewards=[1.0, -1.0],
            trajectories=[episode(0, 3, 0, "win"), episode(0, 5, 2, "loss")],
        )
    )
    tally.add(
        types.SimpleNamespace(
            group_id="g1",
            rewards=[0.0, -1.0],
            trajectories=[episode(1, 5, 1, "draw"), episode(1, 2, 2, "forfeit")],
        )
    )
    m = tally.pop()
    assert m["valid_action_rate"] == pytest.approx(1 - 5 / 15)
    assert m["win_or_draw"] == 0.5 and m["outcome/forfeit"] == 0.25
    assert "valid_action_rate" not in tally.pop()  # popped: the next step starts afresh
