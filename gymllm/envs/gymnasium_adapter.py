"""``from_gymnasium``: any Gymnasium env with Discrete / MultiDiscrete / Box / Dict / Tuple spaces as a text env.

    env = from_gymnasium("FrozenLake-v1", is_slippery=False)
    obs, info = env.reset(seed=0)      # the ANSI board + "observation: 0" + the action menu
    env.step("RIGHT")                  # or "2", or "I move RIGHT": parsed back to the inner action

Observation text = the env's ANSI render (when it has one; colour escapes become ``[text:colour]``
markers, so e.g. the highlighted FrozenLake cell stays visible) + a structured description of the
raw observation (:func:`describe`) + the action menu (:func:`action_menu`, legal actions only when
the inner env reports an ``action_mask``).

Action text is parsed by :func:`parse_action`: a Discrete action by index or by name (names come
from ``action_names=``, from ``KNOWN_ACTION_NAMES`` for FrozenLake/Taxi/CliffWalking/Blackjack, or
from the env's ``get_action_meanings()``); MultiDiscrete / Box as numbers separated by spaces or
commas (or a JSON list); Dict / Tuple as JSON. When the whole reply is not an action, the last token
that is one counts ("I move LEFT" -> LEFT).

Invalid actions follow the declared policy: ``"retry"`` (reward ``invalid_penalty``, the episode
continues, the observation explains the mistake and repeats the menu; after ``max_invalid``
consecutive invalid replies the episode is forfeited) or ``"forfeit"`` (reward ``invalid_penalty``
and the episode terminates at once). ``info["invalid_action"]`` says which happened.

Seeding: ``reset(seed=s)`` seeds ``self.np_random``; the inner env and its action space are reseeded
from it at every reset, so the text env is deterministic per seed like its inner env.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces as gspaces

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, explain
from gymllm.validation import require, require_one_of
from gymllm.spaces import Text
from gymllm.space_text import (
    ActionParseError,
    action_menu,
    action_names_for,
    ansi_to_text,
    check_invalid_policy,
    describe,
    distinct_names,
    parse_action,
)

_SUPPORTED = (
    gspaces.Discrete,
    gspaces.MultiDiscrete,
    gspaces.MultiBinary,
    gspaces.Box,
    gspaces.Dict,
    gspaces.Tuple,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GymnasiumAdapterConfig:
    """How a Gymnasium env is turned into text.

    action_names: names of a Discrete action space's actions, in index order (None: known/none).
    invalid_action: "retry" (penalty, keep playing) or "forfeit" (penalty, terminate).
    invalid_penalty: reward given for an invalid reply.
    max_invalid: consecutive invalid replies that forfeit under "retry" (None: never).
    render: "auto" (ANSI render when available, plus the description), "ansi", or "describe".
    instructions: text put before the first observation (None: a generic one).
    max_turns: TextEnv turn limit on top of the inner env's own limits (None: none).
    """

    action_names: tuple[str, ...] | None = None
    invalid_action: Literal["retry", "forfeit"] = "retry"
    invalid_penalty: float = -0.1
    max_invalid: int | None = 3
    render: Literal["auto", "ansi", "describe"] = "auto"
    instructions: str | None = None
    max_turns: int | None = None

    def __post_init__(self) -> None:
        check_invalid_policy("GymnasiumAdapterConfig", self.invalid_action, self.max_invalid)
        require_one_of(
            self.render,
            ("auto", "ansi", "describe"),
            "GymnasiumAdapterConfig.render",
            fix="use render='auto'",
        )
        if self.action_names is not None:
            names = distinct_names(
                "GymnasiumAdapterConfig.action_names",
                self.action_names,
                "give one unique name per action",
            )
            object.__setattr__(self, "action_names", names)


class GymnasiumTextEnv(TextEnv):
    """A text view of a Gymnasium env (see module doc); ``self.inner`` is the wrapped env."""

    def __init__(self, inner: gym.Env, config: GymnasiumAdapterConfig | None = None):
        config = config or GymnasiumAdapterConfig()
        for what, space in (
            ("observation_space", inner.observation_space),
            ("action_space", inner.action_space),
        ):
            require(
                isinstance(space, _SUPPORTED),
                f"from_gymnasium: {what}",
                expected="Discrete, MultiDiscrete, MultiBinary, Box, Dict or Tuple",
                received=space,
                fix="wrap the env (e.g. FlattenObservation) first",
            )
        super().__init__(max_turns=config.max_turns)
        self.inner = inner
        self.config = config
        self.names = action_names_for(inner, config.action_names)
        self.observation_space = Text()
        self.action_space = Text()
        spec = getattr(inner, "spec", None)
        self.title = spec.id if spec is not None else type(inner.unwrapped).__name__
        self._use_ansi = (
            config.render != "describe" and getattr(inner, "render_mode", None) == "ansi"
        )

    def render_observation(self, obs: Any, info: dict[str, Any]) -> str:
        """Board (ANSI) + description + action menu for one inner observation."""
        parts = []
        if self._use_ansi:
            board = self.inner.render()
            if isinstance(board, str) and board.strip():
                parts.append(ansi_to_text(board))
        if self.config.render != "ansi" or not parts:
            parts.append(describe(obs, self.inner.observation_space))
        mask = info.get("action_mask") if isinstance(info, dict) else None
        parts.append(
            action_menu(
                self.inner.action_space, self.names, None if mask is None else np.asarray(mask)
            )
        )
        return "\n".join(parts)

    def _reset(self, *, seed, options):
        inner_seed = int(self.np_random.integers(0, 2**31 - 1))
        self.inner.action_space.seed(inner_seed)
        obs, info = self.inner.reset(seed=inner_seed, options=options)
        self._obs, self._info, self._invalid = obs, dict(info), 0
        head = self.config.instructions or (
            f"You are playing {self.title}. Each turn, reply with one action."
        )
        return head + "\n" + self.render_observation(obs, self._info), self._text_info(self._info)

    def _text_info(self, info: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy({**info, "raw_observation": self._obs})  # fresh objects on every call

    def _step(self, action: str):
        try:
            value = parse_action(action, self.inner.action_space, self.names)
        except ActionParseError as e:
            return self._invalid_reply(str(e))
        self._invalid = 0
        obs, reward, terminated, truncated, info = self.inner.step(value)
        self._obs, self._info = obs, dict(info)
        info = {**self._text_info(self._info), "invalid_action": False, "parsed_action": value}
        return (
            self.render_observation(obs, self._info),
            float(reward),
            bool(terminated),
            bool(truncated),
            info,
        )

    def _invalid_reply(self, why: str):
        self._invalid += 1
        forfeit = self.config.invalid_action == "forfeit" or (
            self.config.max_invalid is not None and self._invalid >= self.config.max_invalid
        )
        info = {**self._text_info(self._info), "invalid_action": "forfeit" if forfeit else "retry"}
        if forfeit:
            return (
                f"Invalid action, the episode is forfeited. {why}",
                self.config.invalid_penalty,
                True,
                False,
                info,
            )
        text = f"Invalid action ({self._invalid} in a row). {why}\n" + self.render_observation(
            self._obs, self._info
        )
        return text, self.config.invalid_penalty, False, False, info

    def close(self) -> None:
        self.inner.close()
        super().close()


def _make_inner(env_id: str, env_kwargs: dict[str, Any], render: str) -> gym.Env:
    env = gym.make(env_id, **env_kwargs)
    if (
        render != "describe"
        and "render_mode" not in env_kwargs
        and "ansi" in env.metadata.get("render_modes", [])
    ):
        env.close()
        env = gym.make(env_id, render_mode="ansi", **env_kwargs)
    return env


def from_gymnasium(
    env_or_id: gym.Env | str, *, env_kwargs: dict[str, Any] | None = None, **config: Any
) -> GymnasiumTextEnv:
    """A text env around a Gymnasium env (an instance, or an id made with ``env_kwargs``).

    Keyword arguments are :class:`GymnasiumAdapterConfig` fields (``action_names``,
    ``invalid_action``, ``invalid_penalty``, ``max_invalid``, ``render``, ``instructions``,
    ``max_turns``). Given an id, the env is made with ``render_mode="ansi"`` when it supports it.
    """
    cfg = GymnasiumAdapterConfig(**config)
    if isinstance(env_or_id, str):
        inner = _make_inner(env_or_id, dict(env_kwargs or {}), cfg.render)
    elif isinstance(env_or_id, gym.Env):
        require(
            not env_kwargs,
            "from_gymnasium(env_kwargs=...)",
            expected="an env id when env_kwargs is given",
            received=type(env_or_id).__name__,
            fix="pass the id, or build the env yourself",
        )
        inner = env_or_id
    else:
        raise ConfigError(
            explain(
                "from_gymnasium",
                expected="a gymnasium.Env or a registered id",
                received=env_or_id,
                fix="pass e.g. 'FrozenLake-v1'",
            )
        )
    return GymnasiumTextEnv(inner, cfg)


__all__ = ["from_gymnasium", "GymnasiumTextEnv", "GymnasiumAdapterConfig"]
