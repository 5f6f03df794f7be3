"""One trajectory as a small state machine, shared by the async orchestrator and the sync baseline.

    ep = Episode(key, agent, params, ...)
    ep.begin(obs, info)                       # after env reset
    while not ep.done:
        prompt, params = ep.next_request()    # -> engine.generate
        action = ep.on_completion(completion, seconds)
        ep.on_step(obs, reward, terminated, truncated, info, seconds)   # after env step
    rows = ep.trajectories()

Both schedulers drive the same object, so for a deterministic engine the trajectories they produce
are identical; they differ only in *when* each call happens. Sampling seeds are derived from
``(base seed, group index, attempt, member, model call)``: members of a group share the env seed but
never the sampling stream.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from gymllm.rollout.agents import Agent
from gymllm.rollout.token_buffer import TokenBuffer
from gymllm.types import Trajectory


@dataclasses.dataclass(frozen=True)
class EpisodeKey:
    """Identity of one trajectory attempt inside a group."""

    group_index: int
    member: int
    attempt: int = 0
    env_seed: int | None = None
    task_id: str = ""

    @property
    def group_id(self) -> str:
        return f"g{self.group_index}"

    @property
    def trajectory_id(self) -> str:
        return f"g{self.group_index}/m{self.member}/a{self.attempt}"


def sampling_seed(base: int, key: EpisodeKey, call: int) -> int:
    """A 31-bit seed for model call ``call`` of one trajectory (independent of scheduling)."""
    state = np.random.SeedSequence(
        [base & 0xFFFFFFFF, key.group_index, key.attempt, key.member, call]
    )
    return int(state.generate_state(1)[0] & 0x7FFFFFFF)


def is_invalid_step(info: dict) -> bool:
    """Whether an env step refused the agent's reply: ``info["invalid_action"]`` is set (the Gymnasium
    and PettingZoo adapters: "retry"/"forfeit" or the reason) or the step is our own forfeit
    (``info["forfeit"] == info["agent"]``, a multi-agent seat)."""
    if info.get("invalid_action"):
        return True
    forfeit = info.get("forfeit")
    return forfeit is not None and forfeit == info.get("agent")


def _tool_seconds(info: dict) -> float:
    """Tool time of one env step: ``info["tool_time_s"]``, else the ToolUse wrapper's per-call
    ``info["tool_calls"][i]["duration_s"]``, else 0."""
    if "tool_time_s" in info:
        return float(info["tool_time_s"] or 0.0)
    calls = info.get("tool_calls")
    if isinstance(calls, list):
        return float(
            sum(float(c.get("duration_s", 0.0) or 0.0) for c in calls if isinstance(c, dict))
        )
    return 0.0


class Episode:
    """State of one trajectory between env and engine (see the module docstring)."""

    def __init__(
        self,
        key: EpisodeKey,
        agent: Agent,
        params: Any,
        *,
        base_seed: int = 0,
        max_model_calls: int = 16,
        prefix_preserving: bool = True,
        env_id: int = -1,
    ):
        self.key = key
        self.agent = agent
        self.params = params
        self.base_seed = base_seed
        self.max_model_calls = max_model_calls
        self.prefix_preserving = prefix_preserving
        self.env_id = env_id
        self.buffer: TokenBuffer | None = None
        self.calls = 0
        self.rewards: list[float] = []
        self.done = False
        self.terminated = False
        self.truncated = False
        self.last_finish = ""
        self.num_length_finishes = 0
        self.num_tool_calls = 0
        self.env_steps = 0
        self.invalid_actions = (
            0  # env steps that refused the reply (``info["invalid_action"]``, a forfeit by us)
        )
        self.turn_tool_calls = (
            0  # calls the agent parsed from the last completion (the env's own count otherwise)
        )
        self.context_exhausted = False
        self.task_id = key.task_id
        self.info: dict[str, Any] = {}
        self.timings = {
            "generation_s": 0.0,
            "env_s": 0.0,
            "tool_s": 0.0,
            "reward_s": 0.0,
            "ttft_s": 0.0,
            "queue_wait_s": 0.0,
        }
        self._started = time.perf_counter()

    # --- transitions ------------------------------------------------------------------------
    def begin(self, observation: Any, info: dict, *, reset_s: float = 0.0) -> list[int]:
        info = info or {}
        self.task_id = str(info.get("task_id", self.task_id) or self.task_id)
        self.timings["env_s"] += reset_s
        tools = self.agent.tools(info)
        self.buffer = TokenBuffer(
            self.agent.tokenizer,
            tools=tools,
            prefix_preserving=self.prefix_preserving,
            stop_token_ids=sorted(self.agent.stop_token_ids),
            trajectory_id=self.key.trajectory_id,
        )
        return self.buffer.start(self.agent.initial_messages(observation, info))

    def next_request(self) -> tuple[list[int], Any]:
        """The prompt ids and per-call sampling params of the next model call."""
        assert self.buffer is not None and not self.done
        params = self.params
        if getattr(params, "temperature", 0.0) > 0 and hasattr(params, "replace"):
            base = params.seed if getattr(params, "seed", None) is not None else self.base_seed
            params = params.replace(seed=sampling_seed(base, self.key, self.calls))
        return self.buffer.prompt_ids, params

    def fits(self, max_prompt_len: int | None) -> bool:
        """Whether the next prompt fits the engine's context; if not, the episode ends truncated."""
        assert self.buffer is not None
        if max_prompt_len is None or len(self.buffer.prompt_ids) <= max_prompt_len:
            return True
        self.done = self.truncated = True
        self.context_exhausted = True
        return False

    def on_completion(self, completion: Any, generation_s: float) -> str:
        """Record the sampled ids verbatim; returns the env action."""
        assert self.buffer is not None
        self.calls += 1
        self.timings["generation_s"] += generation_s
        ttft = getattr(completion, "ttft_s", float("nan"))
        if ttft == ttft:  # not NaN
            self.timings["ttft_s"] += float(ttft)
        ids = np.asarray(completion.token_ids, dtype=np.int32)
        message, action = self.agent.act(ids.tolist(), completion.finish_reason)
        self.buffer.add_sampled(
            ids.tolist(),
            np.asarray(completion.logprobs, dtype=np.float32).tolist(),
            np.asarray(completion.versions, dtype=np.int32).tolist(),
            message,
        )
        self.last_finish = completion.finish_reason
        self.num_length_finishes += completion.finish_reason == "length"
        self.turn_tool_calls = len(getattr(self.agent, "last_tool_calls", ()) or ())
        self.num_tool_calls += self.turn_tool_calls
        return action

    def on_step(
        self,
        observation: Any,
        reward: float,
        terminated: bool,
        truncated: bool,
        info: dict,
        env_s: float,
    ) -> bool:
        """Record an env step; appends the observation delta unless the episode ended. Returns ``done``."""
        assert self.buffer is not None
        info = info or {}
        self.rewards.append(float(reward))
        self.timings["env_s"] += env_s
        self.timings["tool_s"] += _tool_seconds(info)
        env_calls = info.get("tool_calls")
        if not self.turn_tool_calls and isinstance(env_calls, list):
            self.num_tool_calls += len(
                env_calls
            )  # the env (a ToolUse wrapper) parsed and ran the calls itself
        self.turn_tool_calls = 0
        self.env_steps += 1
        self.invalid_actions += is_invalid_step(info)
        ended = bool(terminated or truncated)
        if "reward_time_s" in info:
            self.timings["reward_s"] += float(info["reward_time_s"] or 0.0)
        elif ended:
            self.timings["reward_s"] += (
                env_s  # the terminal step is where outcome rewards are computed
            )
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        self.info = {k: v for k, v in info.items() if k in ("answer", "task_id", "outcome")}
        if not ended and self.calls >= self.max_model_calls:
            self.truncated = ended = True
        if ended:
            self.done = True
        else:
            self.buffer.add_observation(self.agent.observation_messages(observation))
        return self.done

    # --- result -----------------------------------------------------------------------------
    @property
    def finish_reason(self) -> str:
        if self.last_finish == "length":
            return "length"
        return "terminated" if self.terminated else "truncated"

    def trajectories(self) -> list[Trajectory]:
        """One Trajectory (or one per model call in the fallback), ``reward`` = sum of step rewards."""
        assert self.buffer is not None
        self.timings["total_s"] = time.perf_counter() - self._started
        rows = self.buffer.rows
        if len(rows) > 1:  # fallback: the last row may be an unsent prompt after a terminal step
            rows = [r for r in rows if r.turn_boundaries]
        out = []
        for i, row in enumerate(rows):
            out.append(
                Trajectory(
                    **row.arrays(),
                    reward=float(sum(self.rewards)),
                    rewards=list(self.rewards),
                    trajectory_id=self.key.trajectory_id,
                    group_id=self.key.group_id,
                    task_id=self.task_id,
                    env_id=self.env_id,
                    seed=self.key.env_seed,
                    turn_boundaries=list(row.turn_boundaries),
                    finish_reason=self.finish_reason,
                    row_index=i,
                    timings=dict(self.timings),
                    info={
                        **self.info,
                        "model_calls": self.calls,
                        "length_finishes": self.num_length_finishes,
                        "tool_calls": self.num_tool_calls,
                        "env_steps": self.env_steps,
                        "invalid_actions": self.invalid_actions,
                        "terminated": self.terminated,
                        "truncated": self.truncated,
                        "context_exhausted": self.context_exhausted,
                        "num_rows": len(rows),
                        "member": self.key.member,
                        "attempt": self.key.attempt,
                    },
                )
            )
        return out
