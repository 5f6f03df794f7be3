"""Which ``env.id`` names a multi-agent game: :func:`game_factory` turns ``MODULE:FACTORY`` (a factory
returning a PettingZoo AEC or Parallel env, raw or already text) or a registered game name
(:data:`GAMES`) into a zero-argument factory of :class:`~gymllm.multiagent.TextAECEnv`; anything else
(a Gymnasium id, a single-agent factory) is not a game (None).

    make = game_factory("my_games:rock_paper_scissors", {})
    game = make()                           # a TextAECEnv over the game

Parallel envs are played turn by turn through PettingZoo's ``parallel_to_aec`` (each agent's move is
collected in turn, the Parallel step runs when every agent has moved); numeric observations and
actions go through the text codec (:class:`~gymllm.multiagent.TextCodec`).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from pettingzoo import AECEnv, ParallelEnv

from gymllm.errors import ConfigError, explain
from gymllm.multiagent.aec import TextAECEnv
from gymllm.multiagent.codec import MultiAgentConfig
from gymllm.multiagent.parallel import TextParallelEnv

__all__ = ["GAMES", "GameFactory", "game_factory", "as_text_aec"]

#: registered multi-agent games: name -> ``MODULE:FACTORY`` (a PettingZoo text env factory)
GAMES = {
    "tic-tac-toe": "gymllm.envs.games:tictactoe",
    "connect-four": "gymllm.envs.games:connect_four",
    "kuhn-poker": "gymllm.envs.kuhn_poker:kuhn_poker",
}


def as_text_aec(env: Any) -> TextAECEnv | None:
    """``env`` as a :class:`TextAECEnv` (raw AEC wrapped, Parallel turned AEC first); None if not PettingZoo."""
    from pettingzoo.utils.conversions import parallel_to_aec

    if isinstance(env, TextAECEnv):
        return env
    if isinstance(env, TextParallelEnv):
        return TextAECEnv(parallel_to_aec(env.env), env.config)
    if isinstance(env, ParallelEnv):
        return TextAECEnv(parallel_to_aec(env), MultiAgentConfig())
    if isinstance(env, AECEnv):
        return TextAECEnv(env, MultiAgentConfig())
    return None


class GameFactory:
    """A zero-argument factory of :class:`TextAECEnv`: ``fn(**kwargs)`` wrapped by :func:`as_text_aec`."""

    def __init__(self, spec: str, fn: Callable[..., Any], kwargs: dict[str, Any]):
        self.spec, self.fn, self.kwargs = spec, fn, dict(kwargs)

    def __call__(self) -> TextAECEnv:
        env = as_text_aec(self.fn(**self.kwargs))
        if env is None:
            raise ConfigError(
                explain(
                    f"env.id {self.spec!r}",
                    expected="a factory returning a PettingZoo AEC or Parallel env every call",
                    received="something else on a later call",
                    fix="return the same kind of env every time",
                )
            )
        return env

    def __repr__(self) -> str:
        return f"GameFactory({self.spec!r})"


def game_factory(env_id: str, kwargs: dict[str, Any] | None = None) -> GameFactory | None:
    """A :class:`GameFactory` when ``env_id`` names a multi-agent game, else None (see the module doc).

    A ``MODULE:FACTORY`` id is imported and called once with ``kwargs`` to see what it returns."""
    kwargs = dict(kwargs or {})
    spec = GAMES.get(env_id, env_id)
    if ":" not in spec or "/" in spec.split(":", 1)[0]:
        return None
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None  # not a module path we can import: let the single-agent resolution report it
    if not callable(fn) or isinstance(fn, type) and not issubclass(fn, (AECEnv, ParallelEnv)):
        return None
    try:
        probe = fn(**kwargs)
    except TypeError as e:
        raise ConfigError(
            explain(
                f"env.id {env_id!r}",
                expected=f"a factory that accepts env.kwargs {kwargs}",
                received=f"TypeError: {e}",
                fix="pass the factory's own arguments with --env-kwargs '{...}' ('{}' for none)",
            )
        ) from e
    try:
        if as_text_aec(probe) is None:
            return None
    finally:
        close = getattr(probe, "close", None)
        if close is not None:
            close()
    return GameFactory(spec, fn, kwargs)
