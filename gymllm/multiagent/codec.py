"""Text for PettingZoo envs: :class:`MultiAgentConfig` (invalid-move policy, move names, renderer),
the :class:`MoveText` action space, and :class:`TextCodec`, the per-agent observation/action text
conversion the AEC and Parallel wrappers share (see :mod:`gymllm.multiagent`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces as gspaces

from gymllm.validation import require
from gymllm.spaces import Text
from gymllm.space_text import check_invalid_policy, distinct_names

__all__ = ["MultiAgentConfig", "MoveText", "TextCodec", "move_texts", "raw_action_mask"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MultiAgentConfig:
    """How a PettingZoo env is turned into text.

    move_names: names of a Discrete action space's moves in index order (None: indices only).
    invalid_action: "retry" (penalty, the mover tries again) or "forfeit" (the game ends).
    invalid_penalty: reward for one invalid move under "retry".
    forfeit_reward: the forfeiting agent's reward when the game ends by forfeit.
    max_invalid: consecutive invalid moves that forfeit under "retry" (None: never).
    renderer: ``f(env, agent, raw_observation) -> str`` (None: the env's ANSI render if it has
        one, else a structured description of the raw observation).
    instructions: a line put before every observation (None: a generic one naming the seat).
    """

    move_names: tuple[str, ...] | None = None
    invalid_action: Literal["retry", "forfeit"] = "retry"
    invalid_penalty: float = -0.1
    forfeit_reward: float = -1.0
    max_invalid: int | None = 3
    renderer: Callable[[Any, str, Any], str] | None = None
    instructions: str | None = None

    def __post_init__(self) -> None:
        check_invalid_policy("MultiAgentConfig", self.invalid_action, self.max_invalid)
        if self.move_names is not None:
            names = distinct_names(
                "MultiAgentConfig.move_names", self.move_names, "give one unique name per move"
            )
            object.__setattr__(self, "move_names", names)


class MoveText(Text):
    """A text action space whose samples are legal moves: ``sample(action_mask)`` picks a masked-in move.

    Any ``str`` belongs to the space (unparsable text is the env's invalid-move policy's business);
    ``moves`` lists the canonical move texts of the inner action space (empty when it is not Discrete,
    then ``sample`` formats a sample of ``inner``).
    """

    def __init__(
        self, inner: gym.Space, moves: tuple[str, ...], max_length: int = 1 << 16, seed: Any = None
    ):
        super().__init__(max_length=max_length, seed=seed)
        self.inner = inner
        self.moves = tuple(moves)

    def sample(self, mask: Any = None, probability: Any = None) -> str:  # type: ignore[override]
        from gymllm.space_text import format_action

        if self.moves:
            legal = np.arange(len(self.moves)) if mask is None else np.flatnonzero(np.asarray(mask))
            if legal.size == 0:
                return self.moves[0]
            return self.moves[int(legal[int(self.np_random.integers(legal.size))])]
        self.inner.seed(int(self.np_random.integers(2**31 - 1)))
        return format_action(self.inner.sample(), self.inner)

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, MoveText) and self.moves == other.moves and self.inner == other.inner
        )

    def __hash__(self) -> int:
        return hash(("gymllm.MoveText", self.moves))

    def __repr__(self) -> str:
        return f"MoveText(moves={len(self.moves)})"


def move_texts(space: gym.Space, names: tuple[str, ...] | None) -> tuple[str, ...]:
    """The move texts of a Discrete action space: ``names`` (one per move) or the indices; ``()`` otherwise."""
    if not isinstance(space, gspaces.Discrete):
        return ()
    require(
        names is None or len(names) == space.n,
        "move_names",
        expected=f"{space.n} names (one per move)",
        received=names,
        fix="give exactly one name per move, in index order",
    )
    return tuple(names) if names else tuple(str(space.start + i) for i in range(space.n))


def raw_action_mask(raw_obs: Any, info: dict[str, Any] | None) -> np.ndarray | None:
    """The inner env's action mask (in its observation dict or its info), as int8; None when it has none."""
    if isinstance(raw_obs, dict) and "action_mask" in raw_obs:
        return np.asarray(raw_obs["action_mask"], dtype=np.int8)
    if info and "action_mask" in info:
        return np.asarray(info["action_mask"], dtype=np.int8)
    return None


class TextCodec:
    """Per-agent observation/action text conversion shared by the AEC and Parallel wrappers."""

    def __init__(self, env: Any, config: MultiAgentConfig):
        self.env, self.config = env, config
        self._obs_spaces: dict[str, gym.Space] = {}
        self._act_spaces: dict[str, MoveText] = {}

    def action_space(self, agent: str) -> MoveText:
        if agent not in self._act_spaces:
            inner = self.env.action_space(agent)
            self._act_spaces[agent] = MoveText(inner, move_texts(inner, self.config.move_names))
        return self._act_spaces[agent]

    def observation_space(self, agent: str) -> gym.Space:
        if agent not in self._obs_spaces:
            moves = self.action_space(agent).moves
            parts: dict[str, gym.Space] = {"observation": Text()}
            if moves:
                parts["action_mask"] = gspaces.Box(0, 1, (len(moves),), np.int8)
            self._obs_spaces[agent] = gspaces.Dict(parts)
        return self._obs_spaces[agent]

    def mask(self, agent: str, raw_obs: Any, info: dict[str, Any] | None) -> np.ndarray | None:
        moves = self.action_space(agent).moves
        if not moves:
            return None
        m = raw_action_mask(raw_obs, info)
        return np.ones(len(moves), np.int8) if m is None else m

    def render(self, agent: str, raw_obs: Any, mask: np.ndarray | None, note: str = "") -> str:
        from gymllm.space_text import action_menu, ansi_to_text, describe

        cfg = self.config
        head = cfg.instructions or f"You are {agent}. Reply with one move."
        if cfg.renderer is not None:
            body = cfg.renderer(self.env, agent, raw_obs)
        elif getattr(self.env, "render_mode", None) == "ansi":
            body = ansi_to_text(str(self.env.render()))
        else:
            inner_space = self.env.observation_space(agent)
            if (
                isinstance(raw_obs, dict)
                and "observation" in raw_obs
                and isinstance(inner_space, gspaces.Dict)
            ):
                body = describe(raw_obs["observation"], inner_space["observation"])
            else:
                body = describe(raw_obs, inner_space)
        space = self.action_space(agent)
        if space.moves:
            legal = [
                m
                for m, ok in zip(
                    space.moves, mask if mask is not None else np.ones(len(space.moves))
                )
                if ok
            ]
            menu = f"Legal moves: {', '.join(legal)}."
        else:
            menu = action_menu(space.inner, None)
        return "\n".join(p for p in (note, head, body, menu) if p)

    def parse(self, agent: str, text: Any, mask: np.ndarray | None) -> tuple[Any, str | None]:
        """``(inner_action, None)`` for a legal move, ``(None, why)`` otherwise."""
        from gymllm.space_text import ActionParseError, parse_action

        space = self.action_space(agent)
        if not isinstance(text, str):
            return None, f"a move must be text (str), received {type(text).__name__}"
        try:
            value = parse_action(text, space.inner, space.moves or None)
        except ActionParseError as e:
            return None, str(e)
        if space.moves:
            idx = int(value) - space.inner.start
            if mask is not None and not mask[idx]:
                return None, f"move {space.moves[idx]!r} is not legal now"
        return value, None


def wrap_game(wrapper: Any, env: Any, config: MultiAgentConfig | None, **metadata: Any) -> None:
    """What :class:`~gymllm.multiagent.aec.TextAECEnv` and
    :class:`~gymllm.multiagent.parallel.TextParallelEnv` set up alike around a PettingZoo ``env``: the
    env, the config (default :class:`MultiAgentConfig`), the :class:`TextCodec`, the possible agents,
    the env's metadata named ``text_<name>`` (plus ``metadata``) and no render mode."""
    wrapper.env = env
    wrapper.config = config or MultiAgentConfig()
    wrapper.codec = TextCodec(env, wrapper.config)
    wrapper.possible_agents = list(env.possible_agents)
    wrapper.metadata = {
        **getattr(env, "metadata", {}),
        "name": f"text_{env.metadata.get('name', 'env')}",
        **metadata,
    }
    wrapper.render_mode = None
