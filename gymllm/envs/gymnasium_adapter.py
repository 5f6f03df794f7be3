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
import json
import re
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces as gspaces

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, explain
from gymllm.spaces import Text

KNOWN_ACTION_NAMES: dict[str, tuple[str, ...]] = {
    "FrozenLake": ("LEFT", "DOWN", "RIGHT", "UP"),
    "CliffWalking": ("UP", "RIGHT", "DOWN", "LEFT"),
    "Taxi": ("SOUTH", "NORTH", "EAST", "WEST", "PICKUP", "DROPOFF"),
    "Blackjack": ("STICK", "HIT"),
}

_SUPPORTED = (gspaces.Discrete, gspaces.MultiDiscrete, gspaces.MultiBinary, gspaces.Box, gspaces.Dict, gspaces.Tuple)


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
        if self.invalid_action not in ("retry", "forfeit"):
            raise ConfigError(explain("GymnasiumAdapterConfig.invalid_action", expected="'retry' or 'forfeit'",
                                      received=self.invalid_action, fix="pick one of the two policies"))
        if self.render not in ("auto", "ansi", "describe"):
            raise ConfigError(explain("GymnasiumAdapterConfig.render", expected="'auto', 'ansi' or 'describe'",
                                      received=self.render, fix="use render='auto'"))
        if self.max_invalid is not None and (not isinstance(self.max_invalid, int) or self.max_invalid < 1):
            raise ConfigError(explain("GymnasiumAdapterConfig.max_invalid", expected="None or an int >= 1",
                                      received=self.max_invalid, fix="use max_invalid=3"))
        if self.action_names is not None:
            names = tuple(self.action_names)
            if not all(isinstance(n, str) and n.strip() for n in names) or len({n.lower() for n in names}) != len(names):
                raise ConfigError(explain("GymnasiumAdapterConfig.action_names", expected="distinct non-empty str",
                                          received=names, fix="give one unique name per action"))
            object.__setattr__(self, "action_names", names)


class ActionParseError(ValueError):
    """A reply that is not an action of the space (its message says what was expected)."""


# ------------------------------------------------------------------------------------------- rendering

_COLOURS = {30: "black", 31: "red", 32: "green", 33: "yellow", 34: "blue", 35: "magenta", 36: "cyan", 37: "white"}
_SGR = re.compile(r"\x1b\[([0-9;]*)m(.*?)\x1b\[0m", re.S)
_ANY_ESC = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _style(codes: str) -> str:
    out = []
    for c in (int(x) for x in codes.split(";") if x):
        if c in _COLOURS:
            out.append(_COLOURS[c])
        elif c - 10 in _COLOURS:
            out.append(f"{_COLOURS[c - 10]} background")
        elif c == 1:
            out.append("bold")
    return " ".join(out) or "highlight"


def ansi_to_text(s: str) -> str:
    """Replace colour-escaped segments with ``[text:colour]`` markers and drop other escapes."""
    s = _SGR.sub(lambda m: f"[{m.group(2)}:{_style(m.group(1))}]" if m.group(2) else "", s)
    return _ANY_ESC.sub("", s).strip("\n")


def _fmt(x: Any) -> str:
    if isinstance(x, np.ndarray):
        if np.issubdtype(x.dtype, np.floating):
            return np.array2string(x, precision=4, separator=", ", suppress_small=True, max_line_width=10**6)
        return "[" + ", ".join(str(int(v)) for v in x.reshape(-1)) + "]" if x.ndim <= 1 else str(x.tolist())
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.6g}"
    if isinstance(x, (int, np.integer, bool, np.bool_)):
        return str(int(x))
    return str(x)


def describe(obs: Any, space: gym.Space, name: str = "observation") -> str:
    """A structured, line-per-field description of an observation from any supported space."""
    if isinstance(space, gspaces.Dict):
        return "\n".join(describe(obs[k], sub, f"{name}.{k}") for k, sub in space.spaces.items())
    if isinstance(space, gspaces.Tuple):
        if all(isinstance(s, gspaces.Discrete) for s in space.spaces):
            return f"{name}: ({', '.join(_fmt(v) for v in obs)})"
        return "\n".join(describe(v, s, f"{name}[{i}]") for i, (v, s) in enumerate(zip(obs, space.spaces)))
    if isinstance(space, gspaces.Box):
        return f"{name}: {_fmt(np.asarray(obs))} (shape {tuple(space.shape)})"
    return f"{name}: {_fmt(obs)}"


def action_names_for(env: gym.Env, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Names of a Discrete action space: given, known by env name, or from ``get_action_meanings``."""
    space = env.action_space
    if not isinstance(space, gspaces.Discrete):
        if names is not None:
            raise ConfigError(explain("action_names", expected="a Discrete action space", received=space,
                                      fix="drop action_names for this env"))
        return None
    spec = getattr(env, "spec", None)
    found = names or (KNOWN_ACTION_NAMES.get(spec.name) if spec is not None else None)
    meanings = getattr(env.unwrapped, "get_action_meanings", None)
    if found is None and callable(meanings):
        found = tuple(str(m) for m in meanings())
    if found is not None and len(found) != space.n:
        raise ConfigError(explain("action_names", expected=f"{space.n} names (one per action)", received=found,
                                  fix="give exactly one name per action, in index order"))
    return found


def action_menu(space: gym.Space, names: tuple[str, ...] | None, mask: np.ndarray | None = None) -> str:
    """What a valid reply looks like for ``space`` (legal actions only when a mask is given)."""
    if isinstance(space, gspaces.Discrete):
        idx = [space.start + i for i in range(space.n) if mask is None or mask[i]]
        items = [f"{i} ({names[i - space.start]})" if names else str(i) for i in idx]
        how = "one action index or name" if names else "one action index"
        return f"Actions: {', '.join(items)}. Reply with {how}."
    if isinstance(space, gspaces.MultiDiscrete):
        ranges = ", ".join(f"{s}..{s + n - 1}" for s, n in zip(space.start.reshape(-1), space.nvec.reshape(-1)))
        return f"Reply with {space.nvec.size} integers separated by spaces, in ranges {ranges}."
    if isinstance(space, gspaces.MultiBinary):
        return f"Reply with {int(np.prod(space.shape))} values 0 or 1 separated by spaces."
    if isinstance(space, gspaces.Box):
        lo, hi = _fmt(space.low.reshape(-1)), _fmt(space.high.reshape(-1))
        return f"Reply with {int(np.prod(space.shape))} numbers separated by spaces, between {lo} and {hi}."
    return f"Reply with a JSON value of the action space {space}."


# ------------------------------------------------------------------------------------------- parsing

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|-?\d+")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan", re.I)


def _discrete(text: str, space: gspaces.Discrete, names: tuple[str, ...] | None) -> int:
    lookup = {str(space.start + i): space.start + i for i in range(space.n)}
    if names:
        lookup.update({n.lower(): space.start + i for i, n in enumerate(names)})
    t = text.strip().strip(".!`'\"").lower()
    if t in lookup:
        return lookup[t]
    hits = [lookup[tok.lower()] for tok in _TOKEN.findall(text) if tok.lower() in lookup]
    if hits:
        return hits[-1]
    menu = action_menu(space, names).split(". Reply")[0].removeprefix("Actions: ")
    raise ActionParseError(explain("action", expected=f"one of {menu}", received=text[:80],
                                   fix="reply with one action index" + (" or name" if names else "")))


def _numbers(text: str, space: gym.Space) -> np.ndarray:
    t = text.strip()
    try:
        vals = np.asarray(json.loads(t), dtype=np.float64).reshape(-1)
    except (ValueError, TypeError):
        vals = np.asarray([float(m) for m in _NUMBER.findall(t)], dtype=np.float64)
    if vals.size != int(np.prod(space.shape)):
        raise ActionParseError(explain("action", expected=f"{int(np.prod(space.shape))} numbers",
                                       received=text[:80], fix=action_menu(space, None)))
    value = vals.reshape(space.shape)
    if np.issubdtype(space.dtype, np.integer):
        if not np.all(value == np.round(value)):
            raise ActionParseError(explain("action", expected="integers", received=text[:80], fix=action_menu(space, None)))
    value = value.astype(space.dtype)
    if not space.contains(value):
        raise ActionParseError(explain("action", expected="values inside the action space bounds",
                                       received=text[:80], fix=action_menu(space, None)))
    return value


def _from_json(value: Any, space: gym.Space, names: tuple[str, ...] | None) -> Any:
    if isinstance(space, gspaces.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            raise ActionParseError(explain("action", expected=f"a JSON object with keys {sorted(space.spaces)}",
                                           received=value, fix="reply with one JSON object"))
        return {k: _from_json(value[k], s, None) for k, s in space.spaces.items()}
    if isinstance(space, gspaces.Tuple):
        if not isinstance(value, list) or len(value) != len(space.spaces):
            raise ActionParseError(explain("action", expected=f"a JSON list of {len(space.spaces)} items",
                                           received=value, fix="reply with one JSON list"))
        return tuple(_from_json(v, s, None) for v, s in zip(value, space.spaces))
    return parse_action(json.dumps(value), space, names)


def parse_action(text: str, space: gym.Space, names: tuple[str, ...] | None = None) -> Any:
    """The inner action a reply names; raises :class:`ActionParseError` (a clear message) otherwise."""
    if isinstance(space, gspaces.Discrete):
        return _discrete(text, space, names)
    if isinstance(space, (gspaces.MultiDiscrete, gspaces.MultiBinary, gspaces.Box)):
        return _numbers(text, space)
    if isinstance(space, (gspaces.Dict, gspaces.Tuple)):
        m = re.search(r"[\[{].*[\]}]", text, re.S)
        try:
            value = json.loads(m.group(0) if m else text)
        except ValueError as e:
            raise ActionParseError(explain("action", expected="JSON", received=text[:80],
                                           fix=action_menu(space, None))) from e
        return _from_json(value, space, names)
    raise ConfigError(explain("action space", expected="Discrete, MultiDiscrete, MultiBinary, Box, Dict or Tuple",
                              received=space, fix="wrap the env so its action space is one of these"))


def format_action(value: Any, space: gym.Space, names: tuple[str, ...] | None = None) -> str:
    """The canonical text of an inner action (``parse_action(format_action(a)) == a``)."""
    if isinstance(space, gspaces.Discrete):
        return names[int(value) - space.start] if names else str(int(value))
    if isinstance(space, (gspaces.MultiDiscrete, gspaces.MultiBinary, gspaces.Box)):
        return " ".join(repr(float(v)) if np.issubdtype(space.dtype, np.floating) else str(int(v))
                        for v in np.asarray(value).reshape(-1))
    from gymllm.wrappers.trajectory_logger import to_jsonable

    return json.dumps(to_jsonable(value))


# ------------------------------------------------------------------------------------------- env


class GymnasiumTextEnv(TextEnv):
    """A text view of a Gymnasium env (see module doc); ``self.inner`` is the wrapped env."""

    def __init__(self, inner: gym.Env, config: GymnasiumAdapterConfig | None = None):
        config = config or GymnasiumAdapterConfig()
        for what, space in (("observation_space", inner.observation_space), ("action_space", inner.action_space)):
            if not isinstance(space, _SUPPORTED):
                raise ConfigError(explain(f"from_gymnasium: {what}", expected="Discrete, MultiDiscrete, "
                                          "MultiBinary, Box, Dict or Tuple", received=space,
                                          fix="wrap the env (e.g. FlattenObservation) first"))
        super().__init__(max_turns=config.max_turns)
        self.inner = inner
        self.config = config
        self.names = action_names_for(inner, config.action_names)
        self.observation_space = Text()
        self.action_space = Text()
        spec = getattr(inner, "spec", None)
        self.title = spec.id if spec is not None else type(inner.unwrapped).__name__
        self._use_ansi = config.render != "describe" and getattr(inner, "render_mode", None) == "ansi"

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
        parts.append(action_menu(self.inner.action_space, self.names, None if mask is None else np.asarray(mask)))
        return "\n".join(parts)

    def _reset(self, *, seed, options):
        inner_seed = int(self.np_random.integers(0, 2**31 - 1))
        self.inner.action_space.seed(inner_seed)
        obs, info = self.inner.reset(seed=inner_seed, options=options)
        self._obs, self._info, self._invalid = obs, dict(info), 0
        head = self.config.instructions or (f"You are playing {self.title}. Each turn, reply with one action.")
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
        return self.render_observation(obs, self._info), float(reward), bool(terminated), bool(truncated), info

    def _invalid_reply(self, why: str):
        self._invalid += 1
        forfeit = self.config.invalid_action == "forfeit" or (
            self.config.max_invalid is not None and self._invalid >= self.config.max_invalid)
        info = {**self._text_info(self._info), "invalid_action": "forfeit" if forfeit else "retry"}
        if forfeit:
            return f"Invalid action, the episode is forfeited. {why}", self.config.invalid_penalty, True, False, info
        text = f"Invalid action ({self._invalid} in a row). {why}\n" + self.render_observation(self._obs, self._info)
        return text, self.config.invalid_penalty, False, False, info

    def close(self) -> None:
        self.inner.close()
        super().close()


def _make_inner(env_id: str, env_kwargs: dict[str, Any], render: str) -> gym.Env:
    env = gym.make(env_id, **env_kwargs)
    if render != "describe" and "render_mode" not in env_kwargs and "ansi" in env.metadata.get("render_modes", []):
        env.close()
        env = gym.make(env_id, render_mode="ansi", **env_kwargs)
    return env


def from_gymnasium(env_or_id: gym.Env | str, *, env_kwargs: dict[str, Any] | None = None, **config: Any) -> GymnasiumTextEnv:
    """A text env around a Gymnasium env (an instance, or an id made with ``env_kwargs``).

    Keyword arguments are :class:`GymnasiumAdapterConfig` fields (``action_names``,
    ``invalid_action``, ``invalid_penalty``, ``max_invalid``, ``render``, ``instructions``,
    ``max_turns``). Given an id, the env is made with ``render_mode="ansi"`` when it supports it.
    """
    cfg = GymnasiumAdapterConfig(**config)
    if isinstance(env_or_id, str):
        inner = _make_inner(env_or_id, dict(env_kwargs or {}), cfg.render)
    elif isinstance(env_or_id, gym.Env):
        if env_kwargs:
            raise ConfigError(explain("from_gymnasium(env_kwargs=...)", expected="an env id when env_kwargs is given",
                                      received=type(env_or_id).__name__, fix="pass the id, or build the env yourself"))
        inner = env_or_id
    else:
        raise ConfigError(explain("from_gymnasium", expected="a gymnasium.Env or a registered id",
                                  received=env_or_id, fix="pass e.g. 'FrozenLake-v1'"))
    return GymnasiumTextEnv(inner, cfg)


__all__ = ["from_gymnasium", "GymnasiumTextEnv", "GymnasiumAdapterConfig", "parse_action", "format_action",
           "describe", "action_menu", "ansi_to_text", "ActionParseError", "KNOWN_ACTION_NAMES"]
