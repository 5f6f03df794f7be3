""":class:`TextParallelEnv`: a PettingZoo Parallel env with text observations and actions (the rules
are in :mod:`gymllm.multiagent`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

from gymllm.multiagent.codec import MoveText, MultiAgentConfig, wrap_game
from gymllm.validation import require_instance

__all__ = ["TextParallelEnv"]


class TextParallelEnv(ParallelEnv):
    """A PettingZoo Parallel env with text observations and actions around a Parallel env (module doc)."""

    def __init__(self, env: ParallelEnv, config: MultiAgentConfig | None = None):
        require_instance(
            env,
            ParallelEnv,
            "TextParallelEnv(env)",
            expected="a pettingzoo.ParallelEnv",
            fix="use TextAECEnv for AEC envs (or from_pettingzoo)",
        )
        wrap_game(self, env, config)
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> gym.Space:
        return self.codec.observation_space(agent)

    def action_space(self, agent: str) -> MoveText:
        return self.codec.action_space(agent)

    def _text(
        self, raw: dict[str, Any], infos: dict[str, dict], notes: dict[str, str]
    ) -> dict[str, dict[str, Any]]:
        out = {}
        for a, o in raw.items():
            mask = self.codec.mask(a, o, infos.get(a))
            out[a] = {"observation": self.codec.render(a, o, mask, notes.get(a, ""))}
            if mask is not None:
                out[a]["action_mask"] = mask
        return out

    def reset(self, seed: int | None = None, options: dict | None = None):
        raw, infos = self.env.reset(seed=seed, options=options)
        self.agents = list(self.env.agents)
        self._raw, self._infos = raw, infos
        return self._text(raw, infos, {}), {a: dict(i) for a, i in infos.items()}

    def step(self, actions: dict[str, Any]):
        inner, notes, penalties, forfeit = {}, {}, {}, None
        for a in self.agents:
            mask = self.codec.mask(a, self._raw.get(a), self._infos.get(a))
            value, why = self.codec.parse(a, actions.get(a), mask)
            if why is not None:
                if self.config.invalid_action == "forfeit":
                    forfeit = forfeit or (a, why)
                    continue
                space = self.codec.action_space(a)
                legal = np.flatnonzero(mask) if mask is not None else [0]
                value = space.inner.start + int(legal[0]) if space.moves else space.inner.sample()
                penalties[a], notes[a] = (
                    self.config.invalid_penalty,
                    f"Invalid move, the first legal move was played: {why}",
                )
            inner[a] = value
        if forfeit is not None:
            return self._forfeit(*forfeit)
        raw, rewards, terms, truncs, infos = self.env.step(inner)
        rewards = {a: float(r) + penalties.get(a, 0.0) for a, r in rewards.items()}
        infos = {
            a: {**i, **({"invalid_action": notes[a]} if a in notes else {})}
            for a, i in infos.items()
        }
        self._raw, self._infos = raw, infos
        self.agents = list(self.env.agents)
        return self._text(raw, infos, notes), rewards, dict(terms), dict(truncs), infos

    def _forfeit(self, agent: str, why: str):
        agents = list(self.agents)
        note = f"The game is over: {agent} forfeited ({why})."
        obs = {
            a: {
                "observation": note,
                **(
                    {"action_mask": np.zeros(len(self.codec.action_space(a).moves), np.int8)}
                    if self.codec.action_space(a).moves
                    else {}
                ),
            }
            for a in agents
        }
        rewards = {a: (self.config.forfeit_reward if a == agent else 0.0) for a in agents}
        self.agents = []
        return (
            obs,
            rewards,
            {a: True for a in agents},
            {a: False for a in agents},
            {a: {"forfeit": agent} for a in agents},
        )

    def render(self) -> Any:
        return self.env.render()

    def state(self) -> Any:
        return self.env.state()

    def close(self) -> None:
        self.env.close()
