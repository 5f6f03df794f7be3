"""Solvers behind :mod:`gymllm.envs.demos`: each env solving its own task, as a text policy.

A solver is ``solver(env, observation, info) -> policy``, called after ``env.reset(seed=...)``;
``policy(observation, info) -> action text`` is then called once per turn with the latest
observation and info, and writes exactly what the policy model should write. A solver raises
:class:`Unsolvable` for an episode it cannot solve (e.g. a FrozenLake map whose goal cannot be
reached): that episode is left out. A solver never reads the answer the env keeps for grading;
the env's reward checks every episode.

* Tic-tac-toe: full minimax (negamax over the 3x3 board, memoized), shortest win / longest loss,
  ties broken centre, corners, edges. Never loses.
* Connect four: depth-limited negamax with alpha-beta on bitboards (:data:`CONNECT_FOUR_DEPTH`
  plies). Heuristic at the horizon: (empty cells that would complete a four for the side to move)
  minus (those for the opponent); wins score ``WIN + plies left`` (sooner is better). Sound: a
  forced win or loss inside the horizon is always found.
* FrozenLake: breadth-first search over the map (``desc``) of the Gymnasium env from the current
  cell to the goal around the holes. Slippery maps are refused (a move's result is random, so no
  path is a solution; pass ``is_slippery=False``).
* Arithmetic: the expression of the prompt ("Compute 48 + 17.") evaluated exactly; the reply is
  ``\\boxed{value}``.
* Calculator math (ArithmeticTool, CalcMath): a calculator call with the problem's expression in the
  env's tool-call format (``gymllm.tools.parsers.format_tool_calls``, the env's ``parser``), then,
  on the tool's reply, ``\\boxed{result}``.
* Kuhn poker (TextArena, ``gymllm/ta-KuhnPoker-v0``): the closed-form Nash equilibrium (alpha = 1/3),
  a mixed strategy sampled per decision; its moves in TextArena's syntax (``[check]``, ``[bet]``...).

Not a solver: :func:`uniform_legal_player` plays a uniformly random legal move of any game seat
(``info["action_mask"]``), written as the game names it. Its demonstrations teach a model the
game's move syntax and which moves are legal, not a strategy: the warm start of a self-play run
whose strategy must come from the run itself.
"""

from __future__ import annotations

import collections
import functools
import re
from typing import Any, Callable

import numpy as np

from gymllm.errors import ConfigError, GymLLMError, explain
from gymllm.validation import require
from gymllm.tools.parsers import format_tool_calls
from gymllm.types import ToolCall

__all__ = [
    "Unsolvable",
    "Policy",
    "tictactoe_solver",
    "connect_four_solver",
    "frozenlake_solver",
    "arithmetic_solver",
    "calculator_solver",
    "tictactoe_best_move",
    "connect_four_best_move",
    "frozenlake_shortest_path",
    "CONNECT_FOUR_DEPTH",
    "kuhn_poker_solver",
    "uniform_legal_player",
]

Policy = Callable[[Any, dict], str]


class Unsolvable(GymLLMError):
    """The solver cannot solve this episode (it is left out of the demonstrations)."""


# ------------------------------------------------------------------------------------------ board games


def _seat_state(env: Any, info: dict) -> tuple[Any, str, np.ndarray, tuple[str, ...]]:
    """(the PettingZoo env, the learner's seat, its raw observation planes, the move names)."""
    view = env.unwrapped  # SingleAgentView -> TextAECEnv -> the PettingZoo env
    agent = info.get("agent") or view.learner
    aec = view.env
    planes = np.asarray(aec.env.observe(agent)["observation"])
    names = aec.config.move_names
    return aec, agent, planes, names


def _legal(info: dict, n: int) -> list[int]:
    mask = info.get("action_mask")
    if mask is None:
        raise Unsolvable(f"no action_mask in info (keys {sorted(info)})")
    legal = [i for i in range(n) if mask[i]]
    if not legal:
        raise Unsolvable("no legal move")
    return legal


def _move_text(names: tuple[str, ...] | None, move: int) -> str:
    return names[move] if names else str(move)


# tic-tac-toe cells i = 3 * column + row (PettingZoo's order; names a1..c3)
_TTT_LINES = tuple(
    [(r, 3 + r, 6 + r) for r in range(3)]
    + [(3 * c, 3 * c + 1, 3 * c + 2) for c in range(3)]
    + [(0, 4, 8), (6, 4, 2)]
)
_TTT_ORDER = (4, 0, 2, 6, 8, 1, 3, 5, 7)


@functools.lru_cache(maxsize=None)
def _ttt_value(board: tuple[int, ...], player: int) -> int:
    """Negamax value for ``player`` (1 or 2) to move: +(1 + empty cells) for a win, 0 draw."""
    other = 3 - player
    if any(board[a] == board[b] == board[c] == other for a, b, c in _TTT_LINES):
        return -(1 + board.count(0))
    if 0 not in board:
        return 0
    return max(
        -_ttt_value(board[:i] + (player,) + board[i + 1 :], other)
        for i in _TTT_ORDER
        if board[i] == 0
    )


def tictactoe_best_move(board: tuple[int, ...], legal: list[int]) -> int:
    """The minimax move for player 1 on ``board`` (9 cells: 0 empty, 1 the mover, 2 the opponent)."""
    best, best_value = -1, -(10**9)
    for i in _TTT_ORDER:
        if i in legal:
            v = -_ttt_value(board[:i] + (1,) + board[i + 1 :], 2)
            if v > best_value:
                best, best_value = i, v
    return best


def tictactoe_solver(env: Any, observation: Any, info: dict) -> Policy:
    def policy(observation: Any, info: dict) -> str:
        _, _, planes, names = _seat_state(env, info)
        cells = planes.reshape(9, 2)  # [column, row, 2] -> cell 3 * column + row
        board = tuple(1 if cells[i, 0] else 2 if cells[i, 1] else 0 for i in range(9))
        return _move_text(names, tictactoe_best_move(board, _legal(info, 9)))

    return policy


# connect four on bitboards: bit 7 * column + height (height 0 = bottom; bit 6 of a column is a sentinel)
_H, _W = 6, 7
_BOTTOM = sum(1 << (c * (_H + 1)) for c in range(_W))
_FULL = _BOTTOM * ((1 << _H) - 1)
_C4_ORDER = (3, 2, 4, 1, 5, 0, 6)
CONNECT_FOUR_DEPTH = 4  # plies searched below each candidate move
_WIN = 1000


def _c4_won(pos: int) -> bool:
    for s in (1, _H + 1, _H, _H + 2):  # vertical, horizontal, both diagonals
        m = pos & (pos >> s)
        if m & (m >> (2 * s)):
            return True
    return False


def _c4_threats(pos: int, mask: int) -> int:
    """Empty cells that would complete a four for ``pos`` (Pons's winning-position bitmask)."""
    r = (pos << 1) & (pos << 2) & (pos << 3)
    for s in (_H + 1, _H, _H + 2):
        p = (pos << s) & (pos << 2 * s)
        r |= p & (pos << 3 * s)
        r |= p & (pos >> s)
        p = (pos >> s) & (pos >> 2 * s)
        r |= p & (pos << s)
        r |= p & (pos >> 3 * s)
    return r & (_FULL ^ mask)


def _c4_play(mask: int, column: int) -> int:
    """The new disc's bit when a disc is dropped in ``column``."""
    return (mask + (1 << (column * (_H + 1)))) & (((1 << _H) - 1) << (column * (_H + 1))) & ~mask


def _c4_open(mask: int, column: int) -> bool:
    return not mask & (1 << (column * (_H + 1) + _H - 1))


def _c4_negamax(me: int, mask: int, depth: int, alpha: int, beta: int) -> int:
    """Value for the side to move (``me`` = its discs, ``mask`` = all discs)."""
    moves = [c for c in _C4_ORDER if _c4_open(mask, c)]
    if not moves:
        return 0
    for c in moves:
        if _c4_won(me | _c4_play(mask, c)):
            return _WIN + depth
    if depth == 0:
        opp = me ^ mask
        return bin(_c4_threats(me, mask)).count("1") - bin(_c4_threats(opp, mask)).count("1")
    best = -(10**9)
    for c in moves:
        bit = _c4_play(mask, c)
        v = -_c4_negamax((me | bit) ^ (mask | bit), mask | bit, depth - 1, -beta, -alpha)
        if v > best:
            best = v
        alpha = max(alpha, v)
        if alpha >= beta:
            break
    return best


def connect_four_best_move(
    me: int, mask: int, legal: list[int], depth: int = CONNECT_FOUR_DEPTH
) -> int:
    """The searched move (a column index 0-6) for the side owning ``me`` on bitboard ``mask``."""
    best, best_value = -1, -(10**9)
    for c in _C4_ORDER:
        if c not in legal:
            continue
        bit = _c4_play(mask, c)
        if _c4_won(me | bit):
            return c
        v = -_c4_negamax((me | bit) ^ (mask | bit), mask | bit, depth, -(10**9), -best_value)
        if v > best_value:
            best, best_value = c, v
    return best


def connect_four_solver(env: Any, observation: Any, info: dict) -> Policy:
    def policy(observation: Any, info: dict) -> str:
        _, _, planes, names = _seat_state(env, info)  # [row (0 = top), column, 2]
        me = opp = 0
        for r in range(_H):
            for c in range(_W):
                bit = 1 << (c * (_H + 1) + (_H - 1 - r))
                me |= bit if planes[r, c, 0] else 0
                opp |= bit if planes[r, c, 1] else 0
        return _move_text(names, connect_four_best_move(me, me | opp, _legal(info, _W)))

    return policy


# ------------------------------------------------------------------------------------------ FrozenLake

_FL_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # LEFT, DOWN, RIGHT, UP as (d_row, d_col)


def frozenlake_shortest_path(desc: list[str], start: int) -> list[int] | None:
    """Actions (0 LEFT, 1 DOWN, 2 RIGHT, 3 UP) of a shortest path from cell ``start`` to a ``G``
    that never enters an ``H`` (breadth-first search; moves into a wall are never shortest); None if
    no path exists."""
    rows, cols = len(desc), len(desc[0])
    prev: dict[int, tuple[int, int]] = {start: (-1, -1)}
    queue = collections.deque([start])
    while queue:
        s = queue.popleft()
        r, c = divmod(s, cols)
        if desc[r][c] == "G":
            path = []
            while prev[s][0] >= 0:
                s, a = prev[s]
                path.append(a)
            return path[::-1]
        if desc[r][c] == "H":
            continue
        for a, (dr, dc) in enumerate(_FL_MOVES):
            nr, nc = r + dr, c + dc
            if 0 <= nr < rows and 0 <= nc < cols and (nr * cols + nc) not in prev:
                prev[nr * cols + nc] = (s, a)
                queue.append(nr * cols + nc)
    return None


def frozenlake_solver(env: Any, observation: Any, info: dict) -> Policy:
    text_env = env.unwrapped  # GymnasiumTextEnv; .inner is the Gymnasium FrozenLake
    lake = text_env.inner.unwrapped
    if any(len(outcomes) > 1 for moves in lake.P.values() for outcomes in moves.values()):
        raise ConfigError(
            explain(
                "demonstrations(FrozenLake)",
                expected="a non-slippery map (every move lands where it points)",
                received="is_slippery=True (the Gymnasium default: a move slides sideways 2 times in 3)",
                fix="pass env_kwargs={'is_slippery': False} (CLI: --env-kwargs '{\"is_slippery\": false}')",
            )
        )
    desc = [
        "".join(ch.decode() if isinstance(ch, bytes) else str(ch) for ch in row)
        for row in lake.desc
    ]
    names = tuple(text_env.names) if text_env.names else None

    def policy(observation: Any, info: dict) -> str:
        path = frozenlake_shortest_path(desc, int(info["raw_observation"]))
        if not path:
            raise Unsolvable(
                f"no path to the goal from cell {info['raw_observation']} on map {desc}"
            )
        return _move_text(names, path[0])

    return policy


# ------------------------------------------------------------------------------------------ arithmetic

_COMPUTE = re.compile(r"Compute (.+?)\.\s")


def _last_user(observation: Any) -> str:
    if isinstance(observation, str):
        return observation
    users = [m.get("content", "") for m in observation if m.get("role") == "user"]
    if not users:
        raise Unsolvable("no user message in the observation")
    return str(users[-1])


def _prompt_expression(observation: Any) -> str:
    text = _last_user(observation)
    m = _COMPUTE.search(text + " ")
    if not m:
        raise Unsolvable(f"no 'Compute <expression>.' in the prompt {text[:200]!r}")
    return m.group(1)


def _exact(expression: str) -> int:
    from gymllm.tools.calculator import evaluate

    value = evaluate(expression)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise Unsolvable(f"{expression!r} is not an integer ({value!r})")
    return value


def boxed(value: int | str) -> str:
    """The final-answer reply the demonstrations use: ``\\boxed{value}``."""
    return f"\\boxed{{{value}}}"


def arithmetic_solver(env: Any, observation: Any, info: dict) -> Policy:
    expression = _prompt_expression(observation)

    def policy(observation: Any, info: dict) -> str:
        return boxed(_exact(expression))

    return policy


# CalcMath's problems as calculator expressions, by template index (``info["task_id"]`` names the
# template and its numbers); a drift from gymllm.envs.calc_math shows as a wrong tool result.
_CALC_MATH = (
    "{a} * {b} - {c}",
    "{a} * {b} + {c}",
    "{d} * {a} + {b} * {c}",
    "{a} * {d} - {b}",
    "{a} * {b} - {c} * {d}",
    "{a} * {b} - {c}",
)
_CALC_MATH_SIMPLE = ("{x} * {d}", "{x} + {y}", "{x} - {y}", "{x} + {y}", "{x} - {y}", "{x} * {d}")


def _calc_expression(observation: Any, info: dict) -> str:
    task = str(info.get("task_id", ""))
    parts = task.split("-")
    if task.startswith("calcmath-simple-") and len(parts) == 6:
        k, x, y, d = (int(p) for p in parts[2:])
        return _CALC_MATH_SIMPLE[k].format(x=x, y=y, d=d)
    if task.startswith("calcmath-") and len(parts) == 6:
        k, a, b, c, d = (int(p) for p in parts[1:])
        return _CALC_MATH[k].format(a=a, b=b, c=c, d=d)
    return _prompt_expression(observation)  # ArithmeticTool: "Compute 48 + 17."


def _wrapper_attr(env: Any, name: str) -> Any:
    """``name`` of the outermost wrapper in ``env``'s chain that has it (e.g. ``ToolUse.parser``)."""
    while env is not None:
        if name in vars(env):
            return vars(env)[name]
        env = getattr(env, "env", None)
    return None


def calculator_solver(env: Any, observation: Any, info: dict) -> Policy:
    """First reply: the calculator call (in the env's ``ToolUse.parser`` format); on its ``tool``
    reply: ``\\boxed{result}``. A reply other than the tool's (e.g. ``max_tool_calls=0``) is refused."""
    expression = _calc_expression(observation, info)
    fmt = _wrapper_attr(env, "parser") or "hermes"
    call = format_tool_calls([ToolCall("calculator", {"expression": expression})], fmt)
    turn = {"n": 0}

    def policy(observation: Any, info: dict) -> str:
        turn["n"] += 1
        if turn["n"] == 1:
            return call
        tools = (
            [m for m in observation if m.get("role") == "tool"]
            if isinstance(observation, list)
            else []
        )
        if turn["n"] != 2 or len(tools) != 1:
            raise Unsolvable(f"expected the calculator's reply after the call, got {observation!r}")
        result = str(tools[0].get("content", "")).strip()
        if not re.fullmatch(r"-?\d+", result):
            raise Unsolvable(f"the calculator answered {result!r} for {expression!r}")
        return boxed(result)

    return policy


# ------------------------------------------------------------------------------------------ Kuhn poker


def kuhn_poker_solver(env: Any, observation: Any, info: dict, alpha: float = 1.0 / 3.0) -> Policy:
    """Kuhn poker (``gymllm/ta-KuhnPoker-v0``): the closed-form Nash equilibrium
    (:func:`gymllm.envs.kuhn_poker.kuhn_equilibrium`, ``alpha`` = 1/3 by default: a K is always bet
    first), a mixed strategy drawn from a generator seeded by the env's ``np_random`` after reset
    (so an episode's seed fixes its demo). The move is written in TextArena's syntax (``[bet]``)."""
    from gymllm.envs.kuhn_poker import KUHN_MOVES, kuhn_equilibrium

    view = env.unwrapped  # SingleAgentView -> TextAECEnv -> KuhnPokerAEC
    game = view.env.env
    require(
        hasattr(game, "decision_state"),
        "demonstrations(Kuhn poker)",
        expected="the gymllm/ta-KuhnPoker-v0 env",
        received=type(game).__name__,
        fix="make the env with gymllm.make('gymllm/ta-KuhnPoker-v0')",
    )
    rng = np.random.default_rng(int(view.np_random.integers(2**63 - 1)))

    def policy(observation: Any, info: dict) -> str:
        card, history = game.decision_state(info.get("agent") or view.learner)
        probs = kuhn_equilibrium(card, history, alpha)
        mask = info.get("action_mask")
        if mask is not None and any(
            not mask[KUHN_MOVES.index(m)] for m, p in probs.items() if p > 0
        ):
            raise Unsolvable(
                f"the equilibrium's moves {probs} are not all legal under the mask {list(mask)}"
            )
        moves = list(probs)
        return moves[int(rng.choice(len(moves), p=[probs[m] for m in moves]))]

    return policy


# ------------------------------------------------------------------------------------------ any game seat


def first_legal_player(env: Any, observation: Any, info: dict) -> Policy:
    """The first legal move in the game's move order at every decision of a game seat (Kuhn poker's
    ``[check]``, else ``[call]``; tic-tac-toe's first free square): one fixed move whatever the cards or
    the board, so its demos teach the move syntax and a strategy blind to the state, which a self-play run
    then has to improve on. Needs ``info["action_mask"]``, as :func:`uniform_legal_player`; draws nothing."""
    names = _seat_move_names(env, info, "first")

    def policy(observation: Any, info: dict) -> str:
        return _move_text(names, _legal(info, len(info["action_mask"]))[0])

    return policy


def _seat_move_names(env: Any, info: dict, policy: str) -> tuple[str, ...] | None:
    """The move names of the game seat ``env`` (None: moves are indices); a ConfigError for an env
    whose reset info has no action mask (a player of legal moves needs them)."""
    mask = info.get("action_mask") if isinstance(info, dict) else None
    require(
        mask is not None,
        f"demonstrations(policy={policy!r})",
        expected="a game seat whose info holds an action_mask (a gymllm/TicTacToe-v0-style one-seat env)",
        received=f"reset info keys {sorted(info) if isinstance(info, dict) else type(info).__name__}",
        fix="use policy='solver', or a game env (gymllm/TicTacToe-v0, gymllm/ta-KuhnPoker-v0...)",
    )
    config = getattr(getattr(env.unwrapped, "env", None), "config", None)
    return getattr(config, "move_names", None)


def uniform_legal_player(env: Any, observation: Any, info: dict) -> Policy:
    """A uniformly random legal move at every decision of a game seat (a :mod:`gymllm.multiagent`
    one-seat view: ``info["action_mask"]``), written with the game's move names (``b2``, ``[bet]``;
    the index where the game has none). The moves are drawn from a generator seeded by the env's
    ``np_random`` after reset, so an episode's seed fixes its demo. Raises ``ConfigError`` for an
    env whose reset info has no action mask (the player needs the legal moves)."""
    names = _seat_move_names(env, info, "uniform")
    rng = np.random.default_rng(int(env.unwrapped.np_random.integers(2**63 - 1)))

    def policy(observation: Any, info: dict) -> str:
        legal = _legal(info, len(info["action_mask"]))
        return _move_text(names, legal[int(rng.integers(len(legal)))])

    return policy
