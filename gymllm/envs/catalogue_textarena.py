"""TextArena through the catalogue (optional extra ``gymllm[catalogue]``): the ``gymllm/ta-*`` ids.

:func:`textarena_env` gives any TextArena game as a PettingZoo AEC env; :func:`register_textarena`
registers ``gymllm/ta-<Game>[-<variant>]-v0`` for the offline single-player games
(:data:`TEXTARENA_SINGLE_PLAYER`, one seat through :class:`~gymllm.multiagent.SingleAgentView`), and
``gymllm/ta-KuhnPoker-v0`` is a seat of :mod:`gymllm.envs.kuhn_poker`'s game
(:func:`gymllm.envs.games.make_board_game`). Every call into TextArena runs
inside :class:`~gymllm.envs.catalogue.PrivateGlobalRandom` (:mod:`gymllm.envs.catalogue` says why).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from gymllm.envs.catalogue import PrivateGlobalRandom, import_extra
from gymllm.errors import ConfigError, explain
from gymllm.registration import register


# TextArena 0.7.4 single-player games that reset and step offline here (probed; raw = no default wrappers).
# Left out: games needing an API key or nltk downloads, games that fail to import, and Sokoban-v0-medium
# (its level generator takes minutes per reset).
TEXTARENA_SINGLE_PLAYER: tuple[str, ...] = (
    "2048-v0-ultra-easy-raw",
    "2048-v0-mega-easy-raw",
    "2048-v0-super-easy-raw",
    "2048-v0-very-easy-raw",
    "2048-v0-easy-raw",
    "2048-v0-raw",
    "2048-v0-hard-raw",
    "2048-v0-very-hard-raw",
    "2048-v0-extreme-raw",
    "2048-v0-3x3-raw",
    "2048-v0-5x5-raw",
    "2048-v0-6x6-raw",
    "2048-v0-8x8-raw",
    "2048-v0-10x10-raw",
    "Bandit-v0-raw",
    "Bandit-v0-hard-raw",
    "Blackjack-v0-raw",
    "Blackjack-v0-long-raw",
    "Countdown-v0-raw",
    "Crosswords-v0-raw",
    "Crosswords-v0-hardcore-raw",
    "Cryptarithm-v0-raw",
    "FifteenPuzzle-v0-raw",
    "FrozenLake-v0-raw",
    "FrozenLake-v0-random-raw",
    "FrozenLake-v0-hardcore-raw",
    "GuessTheNumber-v0-raw",
    "GuessTheNumber-v0-hardcore-raw",
    "LightsOut-v0-raw",
    "LogicPuzzle-v0-raw",
    "LogicPuzzle-v0-hard-raw",
    "Mastermind-v0-raw",
    "Mastermind-v0-hard-raw",
    "Mastermind-v0-extreme-raw",
    "Minesweeper-v0-raw",
    "Minesweeper-v0-small-raw",
    "Minesweeper-v0-medium-raw",
    "Minesweeper-v0-hard-raw",
    "PegJump-v0-raw",
    "RushHour-v0-raw",
    "Secretary-v0-raw",
    "Secretary-v0-long-raw",
    "Set-v0-raw",
    "Slitherlink-v0-raw",
    "Sokoban-v0-raw",
    "Sudoku-v0-very-easy-raw",
    "Sudoku-v0-easy-raw",
    "Sudoku-v0-raw",
    "Sudoku-v0-medium-raw",
    "ThreeCardMonte-v0-raw",
    "TowerOfHanoi-v0-raw",
    "TowerOfHanoi-v0-medium-raw",
    "TowerOfHanoi-v0-hard-raw",
    "TowerOfHanoi-v0-hardcore-raw",
    "TowerOfHanoi-v0-extreme-raw",
)


def format_textarena_observation(obs: Any) -> str:
    """TextArena observations (a list of ``(from_id, message, type)`` or already a str) as one text."""
    if isinstance(obs, str):
        return obs
    lines = []
    for item in obs or ():
        sender, message = item[0], item[1]
        who = "GAME" if sender == -1 else f"Player {sender}"
        lines.append(f"[{who}] {message}")
    return "\n".join(lines)


INVALID_MOVE_REWARD = -1.0  # TextArena's own default reward for a losing invalid move


def _numeric_reward(r: Any) -> tuple[float, str | None]:
    """``(reward, None)``, or ``(INVALID_MOVE_REWARD, repr)`` when a game hands back a non-number.

    Some TextArena 0.7.4 games call ``set_invalid_move(0.0, "message")`` with the arguments swapped,
    so the "reward" is the message; it is kept in ``info["textarena_bad_reward"]``, not hidden.
    """
    if r is None:
        return 0.0, None
    try:
        return float(r), None
    except (TypeError, ValueError):
        return INVALID_MOVE_REWARD, repr(r)


def textarena_pull(env: Any) -> None:
    """The AEC env ``env`` (fields ``ta``, ``_rng``, ``_texts``) takes TextArena's next observation: its
    player becomes ``agent_selection`` and the text is that agent's observation."""
    with env._rng.active():
        pid, obs = env.ta.get_observation()
    agent = f"player_{pid}"
    env.agent_selection = agent
    env._texts[agent] = format_textarena_observation(obs)


def textarena_reset(env: Any, seed: int | None, num_players: int) -> None:
    """Reset the TextArena game of the AEC env ``env`` (``ta``, ``_rng``, ``_seed_rng``) and its
    per-agent fields: ``seed`` (None: the next draw of the last seed's generator) decides TextArena's
    own seed and the private ``random`` state it runs under. The caller pulls the first observation."""
    if seed is not None:
        env._seed_rng = np.random.default_rng(seed)
    ta_seed = int(env._seed_rng.integers(0, 2**31 - 1))
    env._rng.seed(ta_seed)
    with env._rng.active():
        env.ta.reset(num_players=num_players, seed=ta_seed)
    env.agents = list(env.possible_agents)
    env.rewards = {a: 0.0 for a in env.agents}
    env._cumulative_rewards = {a: 0.0 for a in env.agents}
    env.terminations = {a: False for a in env.agents}
    env.truncations = {a: False for a in env.agents}
    env.infos = {a: {} for a in env.agents}
    env._texts = {a: "" for a in env.agents}


def textarena_env(env_id: str, *, num_players: int | None = None, **kwargs: Any):
    """A TextArena game as a PettingZoo AEC env with text observations and free-text actions.

    Agents are ``player_0 .. player_{n-1}``; each agent's observation is the messages it received
    since its previous move; rewards arrive when the game ends (TextArena's ``close``).
    """
    return _textarena_aec_class()(env_id, num_players=num_players, **kwargs)


_AEC_CLASS = None


def _textarena_aec_class():
    global _AEC_CLASS
    if _AEC_CLASS is not None:
        return _AEC_CLASS
    import gymnasium.spaces as gspaces
    from pettingzoo import AECEnv

    from gymllm.spaces import Text

    class TextArenaAEC(AECEnv):
        """A TextArena game as a PettingZoo AEC env (see :func:`textarena_env`)."""

        def __init__(
            self, env_id: str, *, num_players: int | None = None, default_num_players: int = 2
        ):
            super().__init__()
            ta = import_extra("textarena", "textarena")
            self.env_id = env_id
            with PrivateGlobalRandom(0).active():
                self.ta = ta.make(env_id)
            self.num_players_ = num_players or self._probe_players(default_num_players)
            self.possible_agents = [f"player_{i}" for i in range(self.num_players_)]
            self.metadata = {
                "name": f"textarena_{env_id}",
                "render_modes": ["ansi"],
                "is_parallelizable": False,
            }
            self.render_mode = None
            self._rng = PrivateGlobalRandom(0)
            self._obs_spaces = {
                a: gspaces.Dict({"observation": Text()}) for a in self.possible_agents
            }
            self._act_spaces = {a: Text(max_length=1 << 16) for a in self.possible_agents}
            self._seed_rng = np.random.default_rng()

        def _probe_players(self, default: int) -> int:
            for n in (default, 1, 2, 3, 4, 5, 6):
                try:
                    with PrivateGlobalRandom(0).active():
                        self.ta.reset(num_players=n, seed=0)
                    return n
                except (AssertionError, ValueError, TypeError):
                    continue
            raise ConfigError(
                explain(
                    f"textarena_env({self.env_id!r})",
                    expected="a game that resets with 1-6 players",
                    received="none worked",
                    fix="pass num_players=",
                )
            )

        def observation_space(self, agent):
            return self._obs_spaces[agent]

        def action_space(self, agent):
            return self._act_spaces[agent]

        def _pull(self) -> None:
            textarena_pull(self)

        def reset(self, seed: int | None = None, options: dict | None = None) -> None:
            textarena_reset(self, seed, self.num_players_)
            self._pull()

        def observe(self, agent: str) -> dict[str, Any]:
            return {"observation": self._texts.get(agent, "")}

        def step(self, action: Any) -> None:
            agent = self.agent_selection
            if self.terminations[agent] or self.truncations[agent]:
                return self._was_dead_step(action)
            self._cumulative_rewards[agent] = 0.0
            with self._rng.active():
                done, info = self.ta.step(str(action))
            self.rewards = {a: 0.0 for a in self.agents}
            if done:
                with self._rng.active():
                    rewards, game_info = self.ta.close()
                for a in self.agents:
                    pid = int(a.split("_")[1])
                    reward, bad = _numeric_reward((rewards or {}).get(pid, 0.0))
                    self.rewards[a] = reward
                    self.terminations[a] = True
                    gi = (game_info or {}).get(pid, {})
                    self.infos[a] = {
                        k: v for k, v in gi.items() if isinstance(v, (str, int, float, bool))
                    }
                    if bad is not None:
                        self.infos[a]["textarena_bad_reward"] = bad
                    self._texts[a] = f"The game is over. {gi.get('reason', '')}".strip()
            else:
                self._pull()
            self._accumulate_rewards()

        def render(self) -> str:
            return self._texts.get(self.agent_selection, "")

        def close(self) -> None:
            pass

    _AEC_CLASS = TextArenaAEC
    return _AEC_CLASS


def ta_gym_id(ta_id: str) -> str:
    """``"Sudoku-v0-easy-raw"`` -> ``"ta-Sudoku-easy-v0"`` (a valid Gymnasium id)."""
    m = re.fullmatch(
        r"(?P<name>.+?)-v(?P<ver>\d+)(?P<variant>(?:-[\w.]+)*)", ta_id.removesuffix("-raw")
    )
    if m is None:
        raise ConfigError(
            explain(
                "TextArena id",
                expected="'<Name>-v<N>[-variant][-raw]'",
                received=ta_id,
                fix="pass an id from textarena's registry",
            )
        )
    return f"ta-{m['name']}{m['variant']}-v{m['ver']}"


def make_textarena_single(
    *, ta_id: str, max_turns: int | None = None, render_mode: str | None = None
):
    """Entry point of the ``gymllm/ta-*`` ids: the single seat of a one-player TextArena game."""
    from gymllm.multiagent import SingleAgentView

    return SingleAgentView(
        textarena_env(ta_id, num_players=1),
        learner="player_0",
        max_turns=max_turns,
        render_mode=render_mode,
    )


def register_textarena(ta_ids: tuple[str, ...] = TEXTARENA_SINGLE_PLAYER) -> list[str]:
    """Register ``gymllm/ta-*`` ids for single-player TextArena games; returns the ids."""
    ids = []
    for ta_id in ta_ids:
        gid = ta_gym_id(ta_id)
        register(
            gid,
            entry_point="gymllm.envs.catalogue_textarena:make_textarena_single",
            kwargs={"ta_id": ta_id},
        )
        ids.append(f"gymllm/{gid}")
    return ids


TEXTARENA_IDS = register_textarena()


register(
    "ta-KuhnPoker-v0",
    entry_point="gymllm.envs.games:make_board_game",
    kwargs={"game": "kuhn_poker"},
)
KUHN_POKER_ID = "gymllm/ta-KuhnPoker-v0"

__all__ = [
    "textarena_env",
    "register_textarena",
    "format_textarena_observation",
    "ta_gym_id",
    "textarena_pull",
    "textarena_reset",
    "make_textarena_single",
    "TEXTARENA_SINGLE_PLAYER",
    "TEXTARENA_IDS",
    "KUHN_POKER_ID",
]
