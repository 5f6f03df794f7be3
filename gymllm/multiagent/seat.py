""":class:`SingleAgentView`: one seat of a :class:`TextAECEnv` as a single-agent
:class:`~gymllm.core.TextEnv`, the other seats played by policies."""

from __future__ import annotations

from typing import Any

from gymllm.core import TextEnv
from gymllm.validation import require
from gymllm.spaces import Text
from gymllm.multiagent.aec import TextAECEnv
from gymllm.multiagent.policies import Policy, advance_game

__all__ = ["SingleAgentView", "game_outcome"]


def game_outcome(seat: str, final_reward: float, info: dict[str, Any]) -> str:
    """The learner's result of a finished game: "forfeit" (its own, ``info["forfeit"] == seat``), "win"
    (the game's final reward for ``seat`` > 0, or the other seat forfeited), "loss" (< 0) or "draw" (0).
    The final reward is the game's own (invalid-move penalties are cleared by the next legal move)."""
    forfeit = info.get("forfeit")
    if forfeit is not None:
        return "forfeit" if forfeit == seat else "win"
    return "win" if final_reward > 0 else "loss" if final_reward < 0 else "draw"


class SingleAgentView(TextEnv):
    """One seat of a :class:`TextAECEnv` as a :class:`~gymllm.core.TextEnv`; other seats are policies.

    ``learner``: the seat played through ``step`` (None: drawn from ``np_random`` at every reset, so
    the policy learns both first and second moves). ``opponent``: a policy for every other seat (a
    callable ``f(observation_dict, rng) -> str``, a dict seat -> policy, or None for random legal
    moves from ``np_random``). ``step`` returns the learner's reward accumulated since its last move;
    the step that ends the game has ``info["outcome"]`` (:func:`game_outcome`: win, loss, draw, forfeit).
    """

    def __init__(
        self,
        env: TextAECEnv,
        *,
        learner: str | None = None,
        opponent: Policy | dict | None = None,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        require(
            learner is None or learner in env.possible_agents,
            "SingleAgentView.learner",
            expected=f"one of {env.possible_agents}",
            received=learner,
            fix="pass a seat name or None",
        )
        self.env, self.fixed_learner = env, learner
        self.opponents = (
            opponent if isinstance(opponent, dict) else {a: opponent for a in env.possible_agents}
        )
        self.observation_space = Text()
        self.action_space = Text()

    def _until_learner(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        me = self.learner
        advance_game(
            self.env,
            lambda a: a == me,
            {a: p for a, p in self.opponents.items() if a != me},
            self.np_random,
        )
        if (
            me not in self.env.agents
        ):  # removed already (should not happen with final-step-first games)
            return "The game is over.", 0.0, True, False, {}
        obs, reward, term, trunc, info = self.env.last()
        info = {**info, "agent": me, "action_mask": obs.get("action_mask")}
        if term:
            info["outcome"] = game_outcome(me, float(reward), info)
        return obs["observation"], float(reward), bool(term), bool(trunc), info

    def _reset(self, *, seed, options):
        self.env.reset(seed=int(self.np_random.integers(0, 2**31 - 1)), options=options)
        seats = self.env.possible_agents
        self.learner = self.fixed_learner or seats[int(self.np_random.integers(len(seats)))]
        text, _, _, _, info = self._until_learner()
        return text, info

    def _step(self, action: str):
        self.env.step(action)
        return self._until_learner()

    def close(self) -> None:
        self.env.close()
        super().close()
