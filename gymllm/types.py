"""Small records shared across layers: chat messages, tool calls, trajectories, groups.

Arrays in a :class:`Trajectory` are aligned with ``token_ids`` ([T] each): the learner never
re-tokenizes text, it trains on exactly the ids that were sampled (token-in, token-out).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, TypedDict

import numpy as np


class ToolCallDict(TypedDict, total=False):
    id: str
    type: str  # "function"
    function: dict[str, Any]  # {"name": str, "arguments": dict | str}


class Message(TypedDict, total=False):
    """A chat message in the Hugging Face / OpenAI shape."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: list[ToolCallDict]
    tool_call_id: str
    name: str


def as_messages(observation: Any) -> list[Message] | None:
    """The messages an observation adds to a conversation: a ``str`` is one user message, a list of
    message dicts (each with a ``"role"``) is taken as is (copied); anything else: None, for the
    caller to refuse in its own words."""
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    if isinstance(observation, (list, tuple)) and all(
        isinstance(m, dict) and "role" in m for m in observation
    ):
        return [dict(m) for m in observation]  # type: ignore[misc]
    return None


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed tool call: a tool name and its keyword arguments."""

    name: str
    arguments: dict[str, Any]
    id: str = ""

    def to_message_dict(self) -> ToolCallDict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


FinishReason = Literal["terminated", "truncated", "length", "error", "abort"]


@dataclasses.dataclass
class Trajectory:
    """One training row built token-in, token-out.

    ``token_ids`` = prompt ids ++ sampled ids ++ observation deltas ++ sampled ids ...
    ``loss_mask[t] == 1`` exactly where ``token_ids[t]`` was sampled by the policy;
    ``behaviour_logprobs[t]`` is the sampler's log-probability of ``token_ids[t]`` (0 where the mask
    is 0) and ``versions[t]`` the policy version that produced it (-1 where the mask is 0).
    """

    token_ids: np.ndarray  # [T] int32
    loss_mask: np.ndarray  # [T] int8
    behaviour_logprobs: np.ndarray  # [T] float32
    versions: np.ndarray  # [T] int32
    reward: float  # the scalar outcome reward used for the advantage
    rewards: list[float] = dataclasses.field(default_factory=list)  # per env step
    trajectory_id: str = ""
    group_id: str = ""
    task_id: str = ""
    env_id: int = -1
    seed: int | None = None
    turn_boundaries: list[tuple[int, int]] = dataclasses.field(
        default_factory=list
    )  # sampled spans
    finish_reason: str = "terminated"
    row_index: int = 0  # > 0 only in the one-row-per-model-call fallback
    timings: dict[str, float] = dataclasses.field(
        default_factory=dict
    )  # generation, env, tool, ...
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        for name in ("loss_mask", "behaviour_logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Trajectory.{name}: expected length {n} (len(token_ids)), "
                    f"received {len(getattr(self, name))}. Fix: keep every per-token array aligned with token_ids."
                )

    @property
    def num_sampled(self) -> int:
        return int(np.sum(self.loss_mask))

    @property
    def min_version(self) -> int:
        v = self.versions[self.loss_mask.astype(bool)]
        return int(v.min()) if v.size else -1


@dataclasses.dataclass
class Group:
    """G trajectories of the same task and env seed, released only when all are done."""

    group_id: str
    task_id: str
    trajectories: list[Trajectory]
    admitted_version: int = 0  # policy version when the group was admitted
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def rewards(self) -> np.ndarray:
        return np.array([t.reward for t in self.trajectories], dtype=np.float32)

    @property
    def min_version(self) -> int:
        vs = [t.min_version for t in self.trajectories if t.num_sampled]
        return min(vs) if vs else self.admitted_version
