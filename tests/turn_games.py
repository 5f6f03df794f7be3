"""What the multi-agent tests share: the base of the tiny two-seat PettingZoo games they write (not
games of gymllm's) and :func:`take_groups`, which drains a group source.

:class:`CounterGame` owns the AEC bookkeeping (agents, spaces, rewards, terminations, the turn order,
``_was_dead_step``); a game fills in its seats, where the counter starts, its legal moves and what a move
does (gymnax's shape: the base holds the invariants, a subclass fills a hook). Every game has two moves
(0 and 1); the observation is ``{"observation": [count], "action_mask": legal}``; the mover whose move
ends the game wins (+1, the other seat -1).
"""

from __future__ import annotations

import asyncio

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils import AgentSelector

__all__ = ["CounterGame", "take_groups"]


class CounterGame(AECEnv):
    """seats: the two agents, in turn order; start: the counter at reset; high: the observation's upper
    bound. Subclasses implement :meth:`advance` and may narrow :meth:`legal`."""

    metadata = {"name": "counter_v0", "render_modes": [], "is_parallelizable": False}
    seats: tuple[str, str] = ("north", "south")
    start = 0
    high = 1

    def __init__(self):
        super().__init__()
        self.possible_agents = list(self.seats)
        self._obs = {
            a: spaces.Dict(
                {
                    "observation": spaces.Box(0, self.high, (1,), np.int64),
                    "action_mask": spaces.Box(0, 1, (2,), np.int8),
                }
            )
            for a in self.possible_agents
        }
        self._act = {a: spaces.Discrete(2) for a in self.possible_agents}
        self.render_mode = None

    def legal(self) -> np.ndarray:
        """The action mask of the seat to move (both moves by default)."""
        return np.ones(2, np.int8)

    def advance(self, action: int) -> bool:
        """Play ``action`` on ``self.count``; True when this move ends the game (the mover wins)."""
        raise NotImplementedError

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._act[agent]

    def observe(self, agent):
        return {"observation": np.array([self.count], np.int64), "action_mask": self.legal()}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.count = self.start
        self.rewards = {a: 0 for a in self.agents}
        self._cumulative_rewards = {a: 0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.next()

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            return self._was_dead_step(action)
        self._cumulative_rewards[agent] = 0
        won = self.advance(int(action))
        self.rewards = {a: 0 for a in self.agents}
        if won:
            other = [a for a in self.agents if a != agent][0]
            self.rewards[agent], self.rewards[other] = 1, -1
            self.terminations = {a: True for a in self.agents}
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()

    def render(self):
        return None

    def close(self):
        pass


async def take_groups(source, n: int, *, timeout_s: float = 20.0) -> list:
    """Start ``source``, collect at least ``n`` groups (each wait bounded by ``timeout_s``), close it."""
    await source.start()
    try:
        out: list = []
        while len(out) < n:
            out += await asyncio.wait_for(source.next_groups(), timeout_s)
        return out
    finally:
        await source.close()
