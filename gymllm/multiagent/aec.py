""":class:`TextAECEnv`: a PettingZoo AEC env with text observations and text actions (the rules are
in :mod:`gymllm.multiagent`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv

from gymllm.multiagent.codec import MoveText, MultiAgentConfig, wrap_game
from gymllm.validation import require_instance

__all__ = ["TextAECEnv"]


class TextAECEnv(AECEnv):
    """A PettingZoo AEC env with text observations and text actions around an AEC env (module doc)."""

    def __init__(self, env: AECEnv, config: MultiAgentConfig | None = None):
        super().__init__()
        require_instance(
            env,
            AECEnv,
            "TextAECEnv(env)",
            expected="a pettingzoo.AECEnv",
            fix="use TextParallelEnv for Parallel envs (or from_pettingzoo)",
        )
        wrap_game(self, env, config, render_modes=["ansi"])
        self._forfeited = False
        self._notes: dict[str, str] = {}
        self._invalid: dict[str, int] = {}

    def __str__(self) -> str:
        return f"TextAECEnv<{self.env}>"

    # spaces (cached: the same object every call, as api_test demands)
    def observation_space(self, agent: str) -> gym.Space:
        return self.codec.observation_space(agent)

    def action_space(self, agent: str) -> MoveText:
        return self.codec.action_space(agent)

    # state mirroring
    def _sync(self) -> None:
        e = self.env
        self.agents = list(e.agents)
        self.rewards = {a: float(e.rewards[a]) for a in self.agents}
        self.terminations = {a: bool(e.terminations[a]) for a in self.agents}
        self.truncations = {a: bool(e.truncations[a]) for a in self.agents}
        self.infos = {a: dict(e.infos[a]) for a in self.agents}
        self._cumulative_rewards = {a: float(e._cumulative_rewards[a]) for a in self.agents}
        self.agent_selection = e.agent_selection

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.env.reset(seed=seed, options=options)
        self._forfeited = False
        self._notes, self._invalid = {}, {}
        self._sync()

    def _raw(self, agent: str) -> Any:
        return self.env.observe(agent)

    def observe(self, agent: str) -> dict[str, Any]:
        raw = self._raw(agent) if not self._forfeited else None
        mask = self.codec.mask(agent, raw, self.infos.get(agent))
        if self._forfeited:
            mask = None if mask is None else np.zeros_like(mask)  # the game is over: no legal move
            text = self._notes.get(agent, "The game is over.")
        else:
            text = self.codec.render(agent, raw, mask, self._notes.get(agent, ""))
        out: dict[str, Any] = {"observation": text}
        if mask is not None:
            out["action_mask"] = mask
        return out

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations.get(agent) or self.truncations.get(agent):
            return self._step_dead(agent, action)
        raw = self._raw(agent)
        mask = self.codec.mask(agent, raw, self.infos.get(agent))
        value, why = self.codec.parse(agent, action, mask)
        if why is not None:
            return self._invalid_move(agent, action, why)
        self._invalid[agent] = 0
        self._notes.pop(agent, None)
        self.env.step(value)
        self._sync()

    def _step_dead(self, agent: str, action: Any) -> None:
        if self._forfeited:
            # our own bookkeeping after a forfeit: remove the agent as PettingZoo's _was_dead_step does
            for d in (
                self.rewards,
                self.terminations,
                self.truncations,
                self.infos,
                self._cumulative_rewards,
            ):
                d.pop(agent, None)
            self.agents.remove(agent)
            if self.agents:
                self.agent_selection = self.agents[0]
            self.rewards = {a: 0.0 for a in self.agents}
            return
        self.env.step(None)
        self._sync()

    def _invalid_move(self, agent: str, action: Any, why: str) -> None:
        n = self._invalid[agent] = self._invalid.get(agent, 0) + 1
        cfg = self.config
        if cfg.invalid_action == "forfeit" or (
            cfg.max_invalid is not None and n >= cfg.max_invalid
        ):
            return self._forfeit(agent, why)
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        self.rewards[agent] = cfg.invalid_penalty
        self.infos[agent] = {**self.infos[agent], "invalid_action": why}
        self._notes[agent] = f"Invalid move ({n} in a row): {why}"
        self._accumulate_rewards()

    def _forfeit(self, agent: str, why: str) -> None:
        self._forfeited = True
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        self.rewards[agent] = self.config.forfeit_reward
        self.terminations = {a: True for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        for a in self.agents:
            self.infos[a] = {**self.infos[a], "forfeit": agent}
            self._notes[a] = f"The game is over: {agent} forfeited ({why})."
        self._accumulate_rewards()
        self.agent_selection = agent

    def render(self) -> str:
        agent = self.agent_selection
        return self.observe(agent)["observation"] if agent else ""

    def state(self) -> Any:
        return self.env.state()

    def close(self) -> None:
        self.env.close()
