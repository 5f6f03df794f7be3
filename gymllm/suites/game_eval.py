"""The learning curve of a multi-agent run: games against fixed players at every evaluation step.

    ev = GameEvaluator(make_game, agent, opponents=("random", "gymllm.envs.games:tictactoe_one_ply"), games=32)
    rows = await ev.evaluate(engine, step)    # one row per opponent: win / draw / loss / score / reward
    ev.metrics(row)                           # {"eval/vs/random/win": ..., "eval/vs/random/win_or_draw": ...}

A training run on a game with ``eval.every`` set evaluates this way (:class:`gymllm.train.heldout.HeldOutHook`):
the policy just pushed to the run's engine plays ``multiagent.eval_games`` games against each of
``multiagent.eval_opponents`` (``random`` or ``MODULE:FN`` scripted players, which the run need never
have trained against), on the schedule of ``gymllm eval game`` (:func:`gymllm.suites.games.schedule`:
seeds from ``eval.seed_base``, each from both seats; the opponent's random draws depend only on the seed
and the game, so every evaluation step meets the same games and the curve's steps are paired), moving
as training plays (the run's agent, chat template and token buffer) at ``eval.temperature`` (greedy by
default). Past the engine's context a move is a random legal one, as in training (``overflow``
in the row: such moves a game). Each row goes to the step's record as ``eval/vs/<opponent>/win``, ``draw``, ``loss``,
``win_or_draw``, ``score`` (wins + draws / 2) and ``reward`` (the mean final reward, e.g. chips),
``<opponent>`` being ``random`` or the scripted function's name; ``gymllm view`` draws them.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any, Callable, Sequence

from gymllm.suites.game_play import play_game
from gymllm.suites.games import MatchConfig, Player, opponent_player, schedule

__all__ = ["GameEvaluator", "opponent_key"]

POLICY = "policy"


def opponent_key(spec: str) -> str:
    """The name an opponent's metrics carry: ``random``, or a scripted ``MODULE:FN``'s ``FN``."""
    return spec.rsplit(":", 1)[-1].replace("/", "_")


class GameEvaluator:
    """Evaluates a policy served by an engine against fixed players (module doc). ``make_game``: a
    zero-argument factory of two-seat text games; ``agent``: the run's :class:`~gymllm.rollout.ModelAgent`;
    ``opponents``: ``random`` / ``MODULE:FN`` specs; ``games``: per opponent (even); ``seed``: the first
    seed; ``temperature`` / ``max_tokens`` / ``max_moves``: as :class:`~gymllm.suites.games.MatchConfig`."""

    def __init__(
        self,
        make_game: Callable[[], Any],
        agent: Any,
        *,
        opponents: Sequence[str] = ("random",),
        games: int = 32,
        seed: int,
        temperature: float = 0.0,
        max_tokens: int = 16,
        max_moves: int = 200,
        max_concurrency: int = 64,
    ):
        self.make_game, self.agent = make_game, agent
        self.opponents = [opponent_player(spec, label=opponent_key(spec)) for spec in opponents]
        self.config = MatchConfig(
            games=games,
            seed=seed,
            temperature=temperature,
            max_tokens=max_tokens,
            max_moves=max_moves,
            max_concurrency=max_concurrency,
            move_timeout_s=None,
            overflow="random",
        )
        probe = make_game()
        self.seats = list(probe.possible_agents)
        probe.close()

    async def evaluate(self, engine: Any, step: int) -> list[dict[str, Any]]:
        """Play every opponent's games on ``engine`` (at policy ``step``); one row per opponent: ``step``,
        ``opponent``, ``games``, ``errors``, ``win``, ``draw``, ``loss``, ``win_or_draw``, ``score``,
        ``reward``, ``illegal`` (the policy's illegal moves per game) and ``overflow`` (its moves past the
        engine's context, played at random, per game)."""
        me = Player(
            label=POLICY, loaded=types.SimpleNamespace(tokenizer=None), make_engine=lambda: engine
        )
        gate = asyncio.Semaphore(self.config.max_concurrency)
        out = []
        for opp in self.opponents:
            players = {POLICY: me, opp.label: opp}

            async def one(item: dict[str, Any]) -> dict[str, Any]:
                async with gate:
                    return await play_game(
                        self.make_game,
                        item,
                        players,
                        {POLICY: engine},
                        {POLICY: self.agent},
                        self.config,
                    )

            items = schedule([POLICY, opp.label], self.config.games, self.config.seed, self.seats)
            rows = await asyncio.gather(*(one(i) for i in items))
            out.append(self.row(rows, opp.label, step))
        return out

    @staticmethod
    def row(rows: Sequence[dict[str, Any]], opponent: str, step: int) -> dict[str, Any]:
        """The summary row of one opponent's games (see :meth:`evaluate`)."""
        scored = [r for r in rows if r["scored"]]
        n = max(len(scored), 1)
        win = sum(r["winner"] == POLICY for r in scored) / n
        draw = sum(r["winner"] is None for r in scored) / n
        rewards = [r["rewards"][POLICY] for r in rows if POLICY in (r.get("rewards") or {})]
        return {
            "step": step,
            "opponent": opponent,
            "games": len(scored),
            "errors": sum(r["error"] is not None for r in rows),
            "win": win,
            "draw": draw,
            "loss": 1.0 - win - draw if scored else 0.0,
            "win_or_draw": win + draw,
            "score": win + draw / 2,
            "reward": sum(rewards) / len(rewards) if rewards else 0.0,
            "illegal": sum(r["invalid"].get(POLICY, 0) for r in rows) / max(len(rows), 1),
            "overflow": sum(r.get("overflow", {}).get(POLICY, 0) for r in rows) / max(len(rows), 1),
        }

    @staticmethod
    def metrics(row: dict[str, Any]) -> dict[str, float]:
        """The step record's ``eval/vs/<opponent>/...`` figures of one row."""
        keys = ("win", "draw", "loss", "win_or_draw", "score", "reward", "illegal", "overflow")
        return {f"eval/vs/{row['opponent']}/{k}": float(row[k]) for k in keys}

    def close(self) -> None:
        pass
