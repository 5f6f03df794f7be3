"""Scripted seats for multi-agent text games: a policy is ``f(observation: dict, rng) -> str``;
:func:`advance_game` plays the scripted seats of a :class:`TextAECEnv` until a learning seat is due."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from gymllm.multiagent.aec import TextAECEnv

__all__ = ["Policy", "random_legal_policy", "policy_move", "advance_game"]

Policy = Callable[[dict[str, Any], np.random.Generator], str]


def random_legal_policy(observation: dict[str, Any], rng: np.random.Generator, moves: tuple[str, ...] = ()) -> str:
    """A scripted opponent: a uniformly random legal move (drawn from the given RNG)."""
    mask = observation.get("action_mask")
    legal = np.flatnonzero(mask) if mask is not None else np.arange(len(moves))
    return moves[int(legal[int(rng.integers(legal.size))])] if legal.size else (moves[0] if moves else "0")


def policy_move(policy: Policy | None, env: Any, agent: str, rng: np.random.Generator) -> str:
    """``agent``'s move by ``policy`` (None: a random legal move, or a random reply for free text)."""
    obs = env.observe(agent)
    if policy is not None:
        return policy(obs, rng)
    space = env.action_space(agent)
    moves = getattr(space, "moves", ())
    if moves or "action_mask" in obs:
        return random_legal_policy(obs, rng, moves)
    space.seed(int(rng.integers(0, 2**31 - 1)))  # free-text games: a random reply, reproducibly
    return space.sample()


def advance_game(env: TextAECEnv, stop: Callable[[str], bool], opponents: dict[str, Policy | None],
             rng: np.random.Generator) -> None:
    """Step dead agents and scripted seats until ``stop(agent)`` or the game has no agents left."""
    while env.agents:
        agent = env.agent_selection
        if env.terminations[agent] or env.truncations[agent]:
            if stop(agent):
                return
            env.step(None)
            continue
        if stop(agent):
            return
        env.step(policy_move(opponents.get(agent), env, agent, rng))
