"""Registered text games: Gymnasium toy-text envs through ``from_gymnasium`` and PettingZoo board games.

Ids (all under ``gymllm/``; importing this module only registers them, it builds nothing):

* ``FrozenLake-v0`` (4x4, slippery unless ``is_slippery=False``), ``FrozenLake8x8-v0``, ``Taxi-v0``,
  ``CliffWalking-v0``, ``Blackjack-v0``: multi-turn text versions of the Gymnasium envs, no per-env
  code beyond the action names (``gymllm.space_text.KNOWN_ACTION_NAMES``).
* ``TicTacToe-v0`` and ``ConnectFour-v0``: the PettingZoo classic games as single-agent text envs
  against a scripted opponent (random legal moves from the env's ``np_random``, or ``opponent=``);
  self-play of two policies goes through :func:`tictactoe` / :func:`connect_four` (PettingZoo AEC
  text envs) and :class:`gymllm.multiagent.AgentVectorEnv`.

Keyword arguments given to ``gymllm.make`` reach the inner env (e.g. ``is_slippery=False``) except
:class:`~gymllm.envs.gymnasium_adapter.GymnasiumAdapterConfig` fields, which configure the adapter.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from gymllm.registration import register

_GYM_GAMES: dict[str, tuple[str, dict[str, Any]]] = {
    "FrozenLake-v0": ("FrozenLake-v1", {}),
    "FrozenLake8x8-v0": ("FrozenLake-v1", {"map_name": "8x8"}),
    "Taxi-v0": ("Taxi-v4", {}),
    "CliffWalking-v0": ("CliffWalking-v1", {}),
    "Blackjack-v0": ("Blackjack-v1", {}),
}


def _split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    from gymllm.envs.gymnasium_adapter import GymnasiumAdapterConfig

    fields = {f.name for f in dataclasses.fields(GymnasiumAdapterConfig)}
    return (
        {k: v for k, v in kwargs.items() if k in fields},
        {k: v for k, v in kwargs.items() if k not in fields},
    )


def make_gym_game(*, gym_id: str, defaults: dict[str, Any] | None = None, **kwargs: Any):
    """Entry point of the toy-text ids: ``from_gymnasium(gym_id)`` with adapter/env kwargs split."""
    from gymllm.envs.gymnasium_adapter import from_gymnasium

    render_mode = kwargs.pop(
        "render_mode", None
    )  # the text env's own render mode, not the inner env's
    config, env_kwargs = _split(kwargs)
    env = from_gymnasium(gym_id, env_kwargs={**(defaults or {}), **env_kwargs}, **config)
    env.render_mode = render_mode
    return env


for _id, (_gym_id, _defaults) in _GYM_GAMES.items():
    register(
        _id,
        entry_point="gymllm.envs.games:make_gym_game",
        kwargs={"gym_id": _gym_id, "defaults": _defaults},
    )


# ---------------------------------------------------------------------------------- PettingZoo board games


# PettingZoo tic-tac-toe numbers cells column-major (0 3 6 / 1 4 7 / 2 5 8); names are column letter + row.
TICTACTOE_MOVES = tuple(f"{'abc'[i // 3]}{i % 3 + 1}" for i in range(9))
CONNECT_FOUR_MOVES = tuple(str(c) for c in range(1, 8))


def render_tictactoe(env: Any, agent: str, raw: Any) -> str:
    """The board from ``agent``'s view: X = its marks, O = the opponent's, empty cells show their name."""
    planes = raw["observation"]  # [col, row, 2]: plane 0 = the observer's marks, 1 = the opponent's
    rows = []
    for r in range(3):
        cells = [
            "X" if planes[c, r, 0] else "O" if planes[c, r, 1] else TICTACTOE_MOVES[3 * c + r]
            for c in range(3)
        ]
        rows.append(" | ".join(f"{x:>2}" for x in cells))
    return "Board (you are X):\n" + "\n".join(rows)


def render_connect_four(env: Any, agent: str, raw: Any) -> str:
    """The grid from ``agent``'s view (X = its discs, O = the opponent's), columns numbered 1-7."""
    planes = raw["observation"]  # [row (0 = top), col, 2]
    lines = [
        " ".join("X" if planes[r, c, 0] else "O" if planes[r, c, 1] else "." for c in range(7))
        for r in range(6)
    ]
    return (
        "Board (you are X; drop a disc in a column):\n"
        + "\n".join(lines)
        + "\n"
        + " ".join(CONNECT_FOUR_MOVES)
    )


def tictactoe(**kwargs: Any):
    """Tic-tac-toe (PettingZoo ``tictactoe_v3``) as a PettingZoo AEC text env (see ``from_pettingzoo``)."""
    from pettingzoo.classic import tictactoe_v3

    from gymllm.envs.pettingzoo_adapter import from_pettingzoo

    return from_pettingzoo(
        tictactoe_v3.env(),
        **{"move_names": TICTACTOE_MOVES, "renderer": render_tictactoe, **kwargs},
    )


def connect_four(**kwargs: Any):
    """Connect four (PettingZoo ``connect_four_v3``) as a PettingZoo AEC text env; moves are columns 1-7."""
    from pettingzoo.classic import connect_four_v3

    from gymllm.envs.pettingzoo_adapter import from_pettingzoo

    return from_pettingzoo(
        connect_four_v3.env(),
        **{"move_names": CONNECT_FOUR_MOVES, "renderer": render_connect_four, **kwargs},
    )


TICTACTOE_LINES = (
    (0, 1, 2),
    (3, 4, 5),
    (6, 7, 8),
    (0, 3, 6),
    (1, 4, 7),
    (2, 5, 8),
    (0, 4, 8),
    (2, 4, 6),
)


def tictactoe_one_ply(observation: Any, agent: str, context: Any = None) -> int:
    """A scripted tic-tac-toe player one ply deep (``--opponent gymllm.envs.games:tictactoe_one_ply``):
    take a winning cell if there is one, else block the opponent's winning cell, else a uniformly random
    legal cell from the game's seeded RNG (``context.rng``; the first legal cell without a context).
    ``observation`` is PettingZoo ``tictactoe_v3``'s own (planes of the mover's and the opponent's marks,
    cell ``i`` at ``[i // 3, i % 3]``, and the ``action_mask``); returns the cell index."""
    import numpy as np

    planes = np.asarray(observation["observation"])
    mine, theirs = planes[..., 0].reshape(9), planes[..., 1].reshape(9)
    legal = [int(i) for i in np.flatnonzero(observation["action_mask"])]
    for marks in (mine, theirs):  # a win first, then a block
        for cell in legal:
            if any(
                cell in line and sum(marks[j] for j in line if j != cell) == 2
                for line in TICTACTOE_LINES
            ):
                return cell
    if context is None:
        return legal[0]
    return legal[int(context.rng.integers(len(legal)))]


tictactoe_one_ply.takes_context = True  # type: ignore[attr-defined]  # gymllm.multiagent.policies.call_scripted


def _board_game(game: str) -> Callable[..., Any]:
    """The two-player game :func:`make_board_game` seats a player in."""
    if game == "kuhn_poker":
        from gymllm.envs.kuhn_poker import kuhn_poker  # TextArena's: the catalogue extra

        return kuhn_poker
    return {"tictactoe": tictactoe, "connect_four": connect_four}[game]


def make_board_game(
    *,
    game: str,
    opponent: Any = None,
    learner: str | None = None,
    max_turns: int | None = None,
    render_mode: str | None = None,
    **kwargs: Any,
):
    """Entry point of ``TicTacToe-v0`` / ``ConnectFour-v0`` / ``ta-KuhnPoker-v0``: one seat (drawn each
    reset unless ``learner``) against ``opponent`` (None: random legal moves); ``kwargs`` go to the
    game (:func:`tictactoe`, :func:`connect_four`, :func:`gymllm.envs.kuhn_poker.kuhn_poker`)."""
    from gymllm.multiagent import SingleAgentView

    return SingleAgentView(
        _board_game(game)(**kwargs),
        learner=learner,
        opponent=opponent,
        max_turns=max_turns,
        render_mode=render_mode,
    )


register(
    "TicTacToe-v0", entry_point="gymllm.envs.games:make_board_game", kwargs={"game": "tictactoe"}
)
register(
    "ConnectFour-v0",
    entry_point="gymllm.envs.games:make_board_game",
    kwargs={"game": "connect_four"},
)

__all__ = ["make_gym_game", "make_board_game", "tictactoe", "connect_four", "tictactoe_one_ply"]
