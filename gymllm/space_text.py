"""Text <-> Gymnasium space codec: describe observations and action menus in words, parse a
model's reply into an action of the space, format an action back as text.

Shared by the single-agent adapter (:mod:`gymllm.envs.gymnasium_adapter`) and the multi-agent
wrappers (:mod:`gymllm.multiagent`), so it lives in the wrapper layer that both may import.
"""

from __future__ import annotations

import json
import re
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces as gspaces

from gymllm.errors import ConfigError, explain
from gymllm.validation import check_range, require_one_of

KNOWN_ACTION_NAMES: dict[str, tuple[str, ...]] = {
    "FrozenLake": ("LEFT", "DOWN", "RIGHT", "UP"),
    "CliffWalking": ("UP", "RIGHT", "DOWN", "LEFT"),
    "Taxi": ("SOUTH", "NORTH", "EAST", "WEST", "PICKUP", "DROPOFF"),
    "Blackjack": ("STICK", "HIT"),
}


class ActionParseError(ValueError):
    """A reply that is not an action of the space (its message says what was expected)."""


# ------------------------------------------------------------------------------------------- rendering

_COLOURS = {
    30: "black",
    31: "red",
    32: "green",
    33: "yellow",
    34: "blue",
    35: "magenta",
    36: "cyan",
    37: "white",
}
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
            return np.array2string(
                x, precision=4, separator=", ", suppress_small=True, max_line_width=10**6
            )
        return (
            "[" + ", ".join(str(int(v)) for v in x.reshape(-1)) + "]"
            if x.ndim <= 1
            else str(x.tolist())
        )
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
        return "\n".join(
            describe(v, s, f"{name}[{i}]") for i, (v, s) in enumerate(zip(obs, space.spaces))
        )
    if isinstance(space, gspaces.Box):
        return f"{name}: {_fmt(np.asarray(obs))} (shape {tuple(space.shape)})"
    return f"{name}: {_fmt(obs)}"


def check_invalid_policy(cls: str, invalid_action: str, max_invalid: int | None) -> None:
    """The invalid-reply policy both text adapters take (``GymnasiumAdapterConfig``,
    ``MultiAgentConfig``): ``invalid_action`` "retry" or "forfeit", ``max_invalid`` None or an int >= 1."""
    require_one_of(
        invalid_action,
        ("retry", "forfeit"),
        f"{cls}.invalid_action",
        fix="pick one of the two policies",
    )
    check_range(
        cls, "max_invalid", max_invalid, lo=1, integer=True, optional=True, fix="use max_invalid=3"
    )


def distinct_names(what: str, names: Any, fix: str) -> tuple[str, ...]:
    """``names`` (action or move names) as a tuple of distinct (case-insensitive) non-empty str; else a
    :class:`~gymllm.errors.ConfigError` naming ``what``."""
    names = tuple(names)
    if not all(isinstance(n, str) and n.strip() for n in names) or len(
        {n.lower() for n in names}
    ) != len(names):
        raise ConfigError(explain(what, expected="distinct non-empty str", received=names, fix=fix))
    return names


def action_names_for(env: gym.Env, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Names of a Discrete action space: given, known by env name, or from ``get_action_meanings``."""
    space = env.action_space
    if not isinstance(space, gspaces.Discrete):
        if names is not None:
            raise ConfigError(
                explain(
                    "action_names",
                    expected="a Discrete action space",
                    received=space,
                    fix="drop action_names for this env",
                )
            )
        return None
    spec = getattr(env, "spec", None)
    found = names or (KNOWN_ACTION_NAMES.get(spec.name) if spec is not None else None)
    meanings = getattr(env.unwrapped, "get_action_meanings", None)
    if found is None and callable(meanings):
        found = tuple(str(m) for m in meanings())
    if found is not None and len(found) != space.n:
        raise ConfigError(
            explain(
                "action_names",
                expected=f"{space.n} names (one per action)",
                received=found,
                fix="give exactly one name per action, in index order",
            )
        )
    return found


def action_menu(
    space: gym.Space, names: tuple[str, ...] | None, mask: np.ndarray | None = None
) -> str:
    """What a valid reply looks like for ``space`` (legal actions only when a mask is given)."""
    if isinstance(space, gspaces.Discrete):
        idx = [space.start + i for i in range(space.n) if mask is None or mask[i]]
        items = [f"{i} ({names[i - space.start]})" if names else str(i) for i in idx]
        how = "one action index or name" if names else "one action index"
        return f"Actions: {', '.join(items)}. Reply with {how}."
    if isinstance(space, gspaces.MultiDiscrete):
        ranges = ", ".join(
            f"{s}..{s + n - 1}" for s, n in zip(space.start.reshape(-1), space.nvec.reshape(-1))
        )
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
    raise _action_error(
        f"one of {menu}", text[:80], "reply with one action index" + (" or name" if names else "")
    )


def _numbers(text: str, space: gym.Space) -> np.ndarray:
    t = text.strip()
    try:
        vals = np.asarray(json.loads(t), dtype=np.float64).reshape(-1)
    except (ValueError, TypeError):
        vals = np.asarray([float(m) for m in _NUMBER.findall(t)], dtype=np.float64)
    if vals.size != int(np.prod(space.shape)):
        raise _action_error(
            f"{int(np.prod(space.shape))} numbers", text[:80], action_menu(space, None)
        )
    value = vals.reshape(space.shape)
    if np.issubdtype(space.dtype, np.integer):
        if not np.all(value == np.round(value)):
            raise _action_error("integers", text[:80], action_menu(space, None))
    value = value.astype(space.dtype)
    if not space.contains(value):
        raise _action_error(
            "values inside the action space bounds", text[:80], action_menu(space, None)
        )
    return value


def _action_error(expected: str, received: Any, fix: str) -> ActionParseError:
    """The :class:`ActionParseError` for a reply that is not an action (``explain("action", ...)``)."""
    return ActionParseError(explain("action", expected=expected, received=received, fix=fix))


def _from_json(value: Any, space: gym.Space, names: tuple[str, ...] | None) -> Any:
    if isinstance(space, gspaces.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            raise _action_error(
                f"a JSON object with keys {sorted(space.spaces)}",
                value,
                "reply with one JSON object",
            )
        return {k: _from_json(value[k], s, None) for k, s in space.spaces.items()}
    if isinstance(space, gspaces.Tuple):
        if not isinstance(value, list) or len(value) != len(space.spaces):
            raise _action_error(
                f"a JSON list of {len(space.spaces)} items", value, "reply with one JSON list"
            )
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
            raise _action_error("JSON", text[:80], action_menu(space, None)) from e
        return _from_json(value, space, names)
    raise ConfigError(
        explain(
            "action space",
            expected="Discrete, MultiDiscrete, MultiBinary, Box, Dict or Tuple",
            received=space,
            fix="wrap the env so its action space is one of these",
        )
    )


def format_action(value: Any, space: gym.Space, names: tuple[str, ...] | None = None) -> str:
    """The canonical text of an inner action (``parse_action(format_action(a)) == a``)."""
    if isinstance(space, gspaces.Discrete):
        return names[int(value) - space.start] if names else str(int(value))
    if isinstance(space, (gspaces.MultiDiscrete, gspaces.MultiBinary, gspaces.Box)):
        return " ".join(
            repr(float(v)) if np.issubdtype(space.dtype, np.floating) else str(int(v))
            for v in np.asarray(value).reshape(-1)
        )
    from gymllm.trajectories.format import to_jsonable

    return json.dumps(to_jsonable(value))


# ------------------------------------------------------------------------------------------- env
