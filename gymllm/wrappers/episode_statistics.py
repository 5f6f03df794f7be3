"""Episode statistics: returns, lengths, tokens, tool calls, invalid actions, latencies; per env and per vector index.

``RecordEpisodeStatistics(env)`` wraps one env. At the end of an episode ``info["episode"]`` holds
(Gymnasium's keys ``r``, ``l``, ``t`` plus text-specific ones)::

    r return, l length (steps), t wall seconds since reset, tokens (action tokens; needs
    ``token_counter`` or ``info["num_tokens"]``), chars (action characters), tool_calls
    (``len(info["tool_calls"])`` summed), invalid_actions (steps whose info flags ``invalid_action``),
    step_latency_mean / step_latency_max (seconds inside the wrapped ``step``)

and the record is appended to ``env.episodes`` (a bounded deque of :class:`EpisodeStats`).
:func:`summarize` turns a list of records into means.

``RecordVectorEpisodeStatistics(vec)`` does the same for a :class:`gymllm.vector.VectorEnv` from
outside (no sub-env wrapping needed): it follows each vector index through ``send`` / ``recv`` /
``step`` (NEXT_STEP and SAME_STEP autoreset understood), times each sub-env from send to receive,
and keeps per-index records (``per_index()``).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable, Iterable, Sequence

import gymnasium as gym
import numpy as np

from gymllm.core import areset_env, astep_env
from gymllm.errors import ConfigError, explain
from gymllm.telemetry import counter
from gymllm.validation import check_range


@dataclasses.dataclass
class EpisodeStats:
    """One finished episode's figures (``env_index`` is the vector index, -1 for a single env)."""

    r: float = 0.0
    l: int = 0  # noqa: E741 - Gymnasium's key
    t: float = 0.0
    tokens: int = 0
    chars: int = 0
    tool_calls: int = 0
    invalid_actions: int = 0
    step_latency_mean: float = 0.0
    step_latency_max: float = 0.0
    env_index: int = -1
    _latency_sum: float = dataclasses.field(default=0.0, repr=False)

    def add_step(
        self,
        reward: float,
        latency: float,
        info: dict[str, Any],
        action: Any,
        token_counter: Callable[[str], int] | None,
    ) -> None:
        self.r += float(reward)
        self.l += 1
        self._latency_sum += latency
        self.step_latency_max = max(self.step_latency_max, latency)
        self.step_latency_mean = self._latency_sum / self.l
        if isinstance(action, str):
            self.chars += len(action)
            if token_counter is not None:
                self.tokens += int(token_counter(action))
        if isinstance(info, dict):
            if token_counter is None and "num_tokens" in info:
                self.tokens += int(info["num_tokens"])
            calls = info.get("tool_calls")
            if isinstance(calls, (list, tuple)):
                self.tool_calls += len(calls)
            if info.get("invalid_action"):
                self.invalid_actions += 1

    def as_info(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if not k.startswith("_")}


def summarize(episodes: Iterable[EpisodeStats]) -> dict[str, float]:
    """Means of every figure over ``episodes`` (plus ``episodes``: the count); empty -> count 0."""
    eps = list(episodes)
    out: dict[str, float] = {"episodes": float(len(eps))}
    if not eps:
        return out
    for key in (
        "r",
        "l",
        "t",
        "tokens",
        "chars",
        "tool_calls",
        "invalid_actions",
        "step_latency_mean",
    ):
        out[key] = float(np.mean([getattr(e, key) for e in eps]))
    out["step_latency_max"] = float(max(e.step_latency_max for e in eps))
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeStatisticsConfig:
    """buffer_length: finished episodes kept; token_counter: ``f(text) -> int`` (e.g. a tokenizer's)."""

    buffer_length: int = 100
    token_counter: Callable[[str], int] | None = None

    def __post_init__(self) -> None:
        check_range(
            "EpisodeStatisticsConfig",
            "buffer_length",
            self.buffer_length,
            lo=1,
            integer=True,
            fix="pass buffer_length=100",
        )
        if self.token_counter is not None and not callable(self.token_counter):
            raise ConfigError(
                explain(
                    "EpisodeStatisticsConfig.token_counter",
                    expected="None or f(text) -> int",
                    received=self.token_counter,
                    fix="pass lambda s: len(tok.encode(s))",
                )
            )


class RecordEpisodeStatistics(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Per-episode figures in ``info["episode"]`` at the end and in ``self.episodes`` (module doc)."""

    def __init__(self, env: gym.Env, config: EpisodeStatisticsConfig | None = None, **fields: Any):
        self.config = config or EpisodeStatisticsConfig(**fields)
        # replay rebuilds it from these (the token counter only changes statistics, not the episode)
        gym.utils.RecordConstructorArgs.__init__(self, buffer_length=self.config.buffer_length)
        super().__init__(env)
        self.episodes: collections.deque[EpisodeStats] = collections.deque(
            maxlen=self.config.buffer_length
        )
        self._cur = EpisodeStats()
        self._t0 = time.perf_counter()
        spec = getattr(env, "spec", None)
        self._track = f"env/{spec.id if spec is not None else type(env.unwrapped).__name__}"

    @property
    def return_queue(self) -> list[float]:
        return [e.r for e in self.episodes]

    @property
    def length_queue(self) -> list[int]:
        return [e.l for e in self.episodes]

    def summary(self) -> dict[str, float]:
        return summarize(self.episodes)

    def _on_reset(self, result: tuple) -> tuple:
        self._cur, self._t0 = EpisodeStats(), time.perf_counter()
        return result

    def _on_step(self, action: Any, result: tuple, latency: float) -> tuple:
        obs, reward, terminated, truncated, info = result
        self._cur.add_step(reward, latency, info, action, self.config.token_counter)
        if terminated or truncated:
            self._cur.t = time.perf_counter() - self._t0
            self.episodes.append(self._cur)
            info = {**info, "episode": self._cur.as_info()}
            counter("episode_return", self._cur.r, track=self._track)
            counter("episode_length", self._cur.l, track=self._track)
            self._cur = EpisodeStats()
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._on_reset(self.env.reset(seed=seed, options=options))

    def step(self, action: Any):
        t0 = time.perf_counter()
        result = self.env.step(action)
        return self._on_step(action, result, time.perf_counter() - t0)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._on_reset(await areset_env(self.env, seed=seed, options=options))

    async def astep(self, action: Any):
        t0 = time.perf_counter()
        result = await astep_env(self.env, action)
        return self._on_step(action, result, time.perf_counter() - t0)


def _info_at(infos: dict[str, Any], j: int) -> dict[str, Any]:
    """The j-th sub-env's info out of Gymnasium-style batched infos (``_key`` masks respected)."""
    out = {}
    for k, v in infos.items():
        if k.startswith("_"):
            continue
        mask = infos.get("_" + k)
        if mask is not None and not mask[j]:
            continue
        out[k] = v[j] if isinstance(v, (np.ndarray, list)) else v
    return out


class RecordVectorEpisodeStatistics:
    """Per-vector-index episode statistics around a gymllm ``VectorEnv`` (module doc).

    Every other attribute is the vector env's. ``episodes`` holds finished records (bounded),
    ``per_index()`` groups them by vector index.
    """

    def __init__(self, vec: Any, config: EpisodeStatisticsConfig | None = None, **fields: Any):
        self.vec = vec
        self.config = config or EpisodeStatisticsConfig(**fields)
        self.num_envs = vec.num_envs
        self.episodes: collections.deque[EpisodeStats] = collections.deque(
            maxlen=self.config.buffer_length
        )
        self._cur = [EpisodeStats(env_index=i) for i in range(self.num_envs)]
        self._t0 = [time.perf_counter()] * self.num_envs
        self._sent_at: dict[int, float] = {}
        self._actions: dict[int, Any] = {}
        self._ended = [False] * self.num_envs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.vec, name)

    def _mode(self) -> str:
        mode = getattr(self.vec, "metadata", {}).get("autoreset_mode")
        return str(getattr(mode, "name", mode) or "NEXT_STEP").upper()

    def _start(self, i: int) -> None:
        self._cur[i], self._t0[i], self._ended[i] = (
            EpisodeStats(env_index=i),
            time.perf_counter(),
            False,
        )

    def reset(self, *args: Any, **kwargs: Any):
        out = self.vec.reset(*args, **kwargs)
        for i in range(self.num_envs):
            self._start(i)
        return out

    def reset_env(self, env_id: int, *args: Any, **kwargs: Any):
        out = self.vec.reset_env(env_id, *args, **kwargs)
        self._start(int(env_id))
        return out

    def send(self, actions: Sequence[Any], env_ids: Sequence[int] | None = None) -> None:
        ids = list(range(self.num_envs)) if env_ids is None else [int(i) for i in env_ids]
        now = time.perf_counter()
        for a, i in zip(actions, ids):
            self._sent_at[i], self._actions[i] = now, a
        self.vec.send(actions, env_ids)

    def _observe(
        self, rewards: Any, terms: Any, truncs: Any, infos: dict[str, Any], env_ids: Iterable[int]
    ) -> None:
        now, same_step = time.perf_counter(), self._mode() == "SAME_STEP"
        for j, i in enumerate(int(x) for x in env_ids):
            latency = now - self._sent_at.pop(i, now)
            action = self._actions.pop(i, None)
            if self._ended[i]:  # NEXT_STEP: this result is the autoreset, not a step
                self._start(i)
                continue
            info = _info_at(infos, j) if isinstance(infos, dict) else {}
            self._cur[i].add_step(rewards[j], latency, info, action, self.config.token_counter)
            if terms[j] or truncs[j]:
                self._cur[i].t = time.perf_counter() - self._t0[i]
                self.episodes.append(self._cur[i])
                if same_step:
                    self._start(i)
                else:
                    self._ended[i] = True

    def recv(self, *args: Any, **kwargs: Any):
        obs, rewards, terms, truncs, infos, env_ids = self.vec.recv(*args, **kwargs)
        self._observe(rewards, terms, truncs, infos, env_ids)
        return obs, rewards, terms, truncs, infos, env_ids

    def step(self, actions: Sequence[Any]):
        now = time.perf_counter()
        for i, a in enumerate(actions):
            self._sent_at[i], self._actions[i] = now, a
        obs, rewards, terms, truncs, infos = self.vec.step(actions)
        self._observe(rewards, terms, truncs, infos, range(self.num_envs))
        return obs, rewards, terms, truncs, infos

    def per_index(self) -> dict[int, list[EpisodeStats]]:
        out: dict[int, list[EpisodeStats]] = {i: [] for i in range(self.num_envs)}
        for e in self.episodes:
            out[e.env_index].append(e)
        return out

    def summary(self) -> dict[str, float]:
        return summarize(self.episodes)

    def close(self, *args: Any, **kwargs: Any) -> None:
        self.vec.close(*args, **kwargs)


__all__ = [
    "RecordEpisodeStatistics",
    "RecordVectorEpisodeStatistics",
    "EpisodeStats",
    "EpisodeStatisticsConfig",
    "summarize",
]
