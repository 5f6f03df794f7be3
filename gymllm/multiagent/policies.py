"""Scripted seats for multi-agent text games: a policy is ``f(observation: dict, rng) -> str``;
:func:`advance_game` plays the scripted seats of a :class:`TextAECEnv` until a learning seat is due.

A PettingZoo-style scripted player (``--multiagent.opponent MODULE:FN``, ``gymllm eval game --opponent
MODULE:FN``) is ``fn(observation, agent) -> action``; one that sets ``fn.takes_context = True`` is called
``fn(observation, agent, context)`` with a :class:`ScriptedContext` (the game's seeded RNG, so its random
choices replay with the seed, and the wrapped PettingZoo env, for a game whose observation does not hold
what the player may know, e.g. its own card in Kuhn poker): :func:`call_scripted` makes the call."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from gymllm.multiagent.aec import TextAECEnv

__all__ = [
    "Policy",
    "ScriptedContext",
    "call_scripted",
    "random_legal_policy",
    "policy_move",
    "advance_game",
]

Policy = Callable[[dict[str, Any], np.random.Generator], str]


@dataclasses.dataclass(frozen=True)
class ScriptedContext:
    """What a ``takes_context`` scripted player gets besides its observation: ``rng`` (the game's seeded
    generator) and ``env`` (the wrapped PettingZoo env; read only what the seat may know)."""

    rng: np.random.Generator
    env: Any


def call_scripted(
    fn: Callable[..., Any], observation: Any, agent: str, env: Any, rng: np.random.Generator
) -> Any:
    """``fn(observation, agent)``, or ``fn(observation, agent, ScriptedContext(rng, env))`` when
    ``fn.takes_context`` (module doc)."""
    if getattr(fn, "takes_context", False):
        return fn(observation, agent, ScriptedContext(rng, env))
    return fn(observation, agent)


def random_legal_policy(
    observation: dict[str, Any], rng: np.random.Generator, moves: tuple[str, ...] = ()
) -> str:
    """A scripted opponent: a uniformly random legal move (drawn from the given RNG)."""
    mask = observation.get("action_mask")
    legal = np.flatnonzero(mask) if mask is not None else np.arange(len(moves))
    return (
        moves[int(legal[int(rng.integers(legal.size))])]
        if legal.size
        else (moves[0] if moves else "0")
    )


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


def advance_game(
    env: TextAECEnv,
    stop: Callable[[str], bool],
    opponents: dict[str, Policy | None],
    rng: np.random.Generator,
) -> None:
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
