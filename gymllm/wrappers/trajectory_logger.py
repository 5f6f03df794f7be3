"""TrajectoryLogger: write every step of every episode, incrementally and crash-safe.

Layout of a log (``path`` is a directory; ``name`` picks one writer's files inside it)::

    path/<name>.jsonl      one JSON record per line, human-readable, appended and flushed per record
    path/<name>.zarr/      token-level arrays (tensorstore zarr, chunked, appendable), one 1-D array
                           per field: token_ids int32, loss_mask int8, logprobs float32, versions int32

JSONL records (``"type"`` says which):

* ``header``  once per writer session: format, env id + kwargs, package versions, pid, time.
* ``reset``   an episode starts: ``episode`` id, ``index``, ``seed``, ``options``, ``observation``,
  ``info``, ``env_id``, ``env_kwargs``, ``wrappers`` (the wrapper stack from Gymnasium's spec, each
  with its constructor kwargs when they are plain JSON, so replay can rebuild it).
* ``step``    one env step: ``action``, ``observation``, ``reward``, ``terminated``, ``truncated``,
  ``info``, ``tool_calls``, ``timing`` (``step_s`` wall seconds).
* ``tokens``  token arrays attached to a step: ``offset`` and ``length`` into the zarr arrays.
* ``note``    extra data a caller attached to a step (:meth:`TrajectoryLogger.annotate`), e.g. the
  policy version and sampling parameters of the reply.
* ``end``     the episode finished: ``steps``, ``return``, ``terminated``, ``truncated``.
* ``abort``   the episode will never finish (reset before the end, close, or a writer restart after a
  crash); readers drop aborted episodes.

A trained trajectory outside an episode log (a run's ``trajectories.jsonl``, ``serve --groups-out``) is
one ``trajectory`` record (:func:`~gymllm.trajectories.format.trajectory_record`, written by
:class:`~gymllm.trajectories.writers.TrajectoryRecordWriter`, read by
:func:`~gymllm.trajectories.reader.read_trajectory_records`).

Crash safety: every record is one ``write`` of a full line followed by ``flush`` (so a process killed
with SIGKILL loses at most the line being written); ``fsync`` per episode end by default. Token arrays
are written before the ``tokens`` record that points at them, so a pointer never dangles. Reopening an
existing log (resume) truncates a torn last line, marks unfinished episodes aborted and continues the
episode index and token offset: no episode is duplicated or lost, and :meth:`TrajectoryLogger.is_complete`
lets a runner skip (seed, task) pairs already logged.

Seeds: when ``reset`` is called without a seed and ``assign_seeds`` is on (default), the logger draws a
fresh seed from its own generator and passes it on, so every logged episode can be replayed exactly
(:func:`gymllm.trajectories.replay`).

The pieces: :mod:`~gymllm.trajectories.format` (config, JSON conversion),
:mod:`~gymllm.trajectories.reader` (reading logs back), :mod:`~gymllm.trajectories.tokens`
(the zarr token store), :mod:`~gymllm.trajectories.writers` (writer names); this module holds
the wrapper and gathers their public names.
"""

from __future__ import annotations

import os
import pathlib
import time
import uuid
from typing import Any

import gymnasium as gym
import numpy as np

from gymllm.errors import ConfigError, GymLLMError, explain
from gymllm.telemetry import span
from gymllm.trajectories.format import (
    FORMAT,
    TOKEN_FIELDS,
    TrajectoryLoggerConfig,
    dumps_record,
    package_versions,
    to_jsonable,
    wrapper_stack,
)
from gymllm.trajectories.reader import episodes_from_records, scan_jsonl
from gymllm.trajectories.tokens import TokenStore
from gymllm.trajectories.writers import claim_writer_name


class TrajectoryLogger(gym.Wrapper):
    """Logs every reset and step of the wrapped env (any Gymnasium env, text or not); see module doc.

    ``TrajectoryLogger(env, "runs/log")`` or ``TrajectoryLogger(env, config=TrajectoryLoggerConfig(...))``.
    Token-level data for the current step: :meth:`record_tokens`; a whole :class:`~gymllm.types.Trajectory`:
    :meth:`log_trajectory`.
    """

    def __init__(
        self,
        env: gym.Env,
        path: str | os.PathLike | None = None,
        *,
        config: TrajectoryLoggerConfig | None = None,
        **overrides: Any,
    ):
        super().__init__(env)
        if config is None:
            if path is None:
                raise ConfigError(
                    explain(
                        "TrajectoryLogger",
                        expected="a path or a config",
                        received=None,
                        fix="TrajectoryLogger(env, 'runs/log')",
                    )
                )
            config = TrajectoryLoggerConfig(path=os.fspath(path), **overrides)
        self.config = config
        spec = getattr(env, "spec", None)
        self.env_id = config.env_id or (spec.id if spec is not None else None)
        self.env_kwargs = to_jsonable(
            config.env_kwargs
            if config.env_kwargs is not None
            else (dict(spec.kwargs) if spec is not None else {})
        )
        self.wrappers = wrapper_stack(env) if config.env_id is None else []
        self._seed_rng = np.random.default_rng()
        self._episode: str | None = None
        self._step = 0
        self._return = 0.0
        self._tokens: TokenStore | None = None
        self._file = None
        self._completed: set[Any] = set()
        self.lock_path: pathlib.Path | None = None  # a claimed writer-name lock, removed on close
        self._open()

    # -- file handling

    def _open(self) -> None:
        path = self.config.jsonl_path
        path.parent.mkdir(parents=True, exist_ok=True)
        records, good, torn = scan_jsonl(path)
        if path.exists() and good < path.stat().st_size:  # cut a torn tail so new lines start clean
            with open(path, "r+b") as f:
                f.truncate(good)
        # backslashreplace writes a lone surrogate as its JSON escape (\udc80), so any str round-trips
        self._file = open(path, "a", encoding="utf-8", errors="backslashreplace")
        episodes = episodes_from_records(records)
        self._index = len(episodes)
        self._token_cursor = max(
            (int(r["offset"]) + int(r["length"]) for r in records if r.get("type") == "tokens"),
            default=0,
        )
        self._completed = {ep.key for ep in episodes if ep.complete}
        self._write(
            {
                "type": "header",
                "format": FORMAT,
                "writer": self.config.name,
                "env_id": self.env_id,
                "env_kwargs": self.env_kwargs,
                "wrappers": self.wrappers,
                "versions": package_versions(),
                "pid": os.getpid(),
                "time": time.time(),
                "resumed": bool(records),
                "torn_lines": torn,
            }
        )
        for ep in episodes:
            if ep.end is None and not ep.aborted:
                self._write(
                    {
                        "type": "abort",
                        "episode": ep.episode,
                        "reason": "writer restarted before the episode ended",
                    }
                )
        self._sync()

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            raise GymLLMError(
                explain(
                    "TrajectoryLogger",
                    expected="an open log",
                    received="closed",
                    fix="create a new TrajectoryLogger to write more",
                )
            )
        with span("trajectory_log.write", track="env/logger", type=record.get("type")):
            self._file.write(dumps_record(record) + "\n")  # one write of a whole line, then flush
            self._file.flush()
        if self.config.fsync == "step":
            self._sync()

    def _sync(self) -> None:
        if self._file is not None and self.config.fsync != "never":
            os.fsync(self._file.fileno())

    # -- resume helpers

    def is_complete(self, seed: int | None, task_id: Any = None) -> bool:
        """Whether an episode with this seed (and task id) is already complete in the log."""
        return (seed, task_id) in self._completed

    @property
    def episode_id(self) -> str | None:
        return self._episode

    # -- gym API

    def _before_reset(self, seed: int | None) -> int | None:
        if self._episode is not None:
            self._write(
                {
                    "type": "abort",
                    "episode": self._episode,
                    "reason": "reset before the episode ended",
                }
            )
        if seed is None and self.config.assign_seeds:
            seed = int(self._seed_rng.integers(0, 2**31 - 1))
        return seed

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        seed = self._before_reset(seed)
        return self._after_reset(seed, options, *self.env.reset(seed=seed, options=options))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Async twin of :meth:`reset` (awaits the inner env's ``areset`` when it has one)."""
        from gymllm.core import areset_env

        seed = self._before_reset(seed)
        return self._after_reset(
            seed, options, *(await areset_env(self.env, seed=seed, options=options))
        )

    def _after_reset(self, seed: int | None, options: Any, obs: Any, info: Any):
        self._episode = f"{self.config.name}-{self._index:06d}-{uuid.uuid4().hex[:8]}"
        self._write(
            {
                "type": "reset",
                "episode": self._episode,
                "index": self._index,
                "seed": seed,
                "options": to_jsonable(options),
                "env_id": self.env_id,
                "env_kwargs": self.env_kwargs,
                "wrappers": self.wrappers,
                "observation": to_jsonable(obs),
                "info": to_jsonable(info),
                "time": time.time(),
            }
        )
        self._index += 1
        self._step = 0
        self._return = 0.0
        self._seed = seed
        self._task = (info or {}).get("task_id") if isinstance(info, dict) else None
        return obs, info

    def step(self, action: Any):
        t0 = time.perf_counter()
        result = self.env.step(action)
        return self._after_step(action, result, time.perf_counter() - t0)

    async def astep(self, action: Any):
        """Async twin of :meth:`step` (awaits the inner env's ``astep`` when it has one)."""
        from gymllm.core import astep_env

        t0 = time.perf_counter()
        result = await astep_env(self.env, action)
        return self._after_step(action, result, time.perf_counter() - t0)

    def _after_step(self, action: Any, result: tuple, dt: float):
        obs, reward, terminated, truncated, info = result
        if self._episode is None:  # the inner env accepted a step without reset; log it unattached
            return obs, reward, terminated, truncated, info
        self._step += 1
        self._return += float(reward)
        tool_calls = info.get("tool_calls", []) if isinstance(info, dict) else []
        self._write(
            {
                "type": "step",
                "episode": self._episode,
                "step": self._step,
                "action": to_jsonable(action),
                "observation": to_jsonable(obs),
                "reward": to_jsonable(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "info": to_jsonable(info),
                "tool_calls": to_jsonable(tool_calls),
                "timing": {"step_s": dt},
            }
        )
        if terminated or truncated:
            self._write(
                {
                    "type": "end",
                    "episode": self._episode,
                    "steps": self._step,
                    "return": self._return,
                    "terminated": bool(terminated),
                    "truncated": bool(truncated),
                    "time": time.time(),
                }
            )
            self._completed.add((self._seed, self._task))
            self._ended, self._episode = self._episode, None
            if self.config.fsync == "episode":
                self._sync()
        return obs, reward, terminated, truncated, info

    # -- token-level data

    def record_tokens(
        self,
        *,
        token_ids: Any,
        loss_mask: Any = None,
        logprobs: Any = None,
        versions: Any = None,
        episode: str | None = None,
        step: int | None = None,
    ) -> dict[str, Any]:
        """Append aligned token arrays ([T] each) for a step of the current (or named) episode.

        Missing fields default to mask 1, logprob 0 and version -1. Returns the ``tokens`` record.
        """
        ids = np.asarray(token_ids, dtype=np.int32).reshape(-1)
        n = ids.shape[0]
        arrays = {
            "token_ids": ids,
            "loss_mask": np.ones(n, np.int8)
            if loss_mask is None
            else np.asarray(loss_mask).reshape(-1),
            "logprobs": np.zeros(n, np.float32)
            if logprobs is None
            else np.asarray(logprobs).reshape(-1),
            "versions": np.full(n, -1, np.int32)
            if versions is None
            else np.asarray(versions).reshape(-1),
        }
        for field, arr in arrays.items():
            if arr.shape[0] != n:
                raise GymLLMError(
                    explain(
                        f"record_tokens: {field}",
                        expected=f"length {n} (len(token_ids))",
                        received=arr.shape[0],
                        fix="keep per-token arrays aligned",
                    )
                )
        if self._tokens is None:
            self._tokens = TokenStore(
                self.config.zarr_path, self.config.chunk_size, self._token_cursor
            )
        offset, length = self._tokens.append(
            arrays
        )  # arrays first, then the pointer: never dangling
        record = {
            "type": "tokens",
            "episode": episode or self._last_episode(),
            "step": self._step if step is None else step,
            "offset": offset,
            "length": length,
            "fields": list(TOKEN_FIELDS),
            "writer": self.config.name,
        }
        self._write(record)
        return record

    def annotate(self, **fields: Any) -> dict[str, Any]:
        """Attach extra data to the current step (e.g. ``policy_version=3, sampling={"temperature": 1.0}``)."""
        record = {
            "type": "note",
            "episode": self._last_episode(),
            "step": self._step,
            **to_jsonable(fields),
        }
        self._write(record)
        return record

    def log_trajectory(self, trajectory: Any, *, episode: str | None = None) -> dict[str, Any]:
        """Store a :class:`gymllm.types.Trajectory`'s token arrays for the current (or named) episode."""
        return self.record_tokens(
            token_ids=trajectory.token_ids,
            loss_mask=trajectory.loss_mask,
            logprobs=trajectory.behaviour_logprobs,
            versions=trajectory.versions,
            episode=episode,
        )

    def _last_episode(self) -> str | None:
        return self._episode if self._episode is not None else getattr(self, "_ended", None)

    def close(self) -> None:
        if self._file is not None:
            if self._episode is not None:
                self._write(
                    {
                        "type": "abort",
                        "episode": self._episode,
                        "reason": "closed before the episode ended",
                    }
                )
                self._episode = None
            self._sync()
            self._file.close()
            self._file = None
            if self.lock_path is not None:  # a writer name claimed by claim_writer_name: release it
                pathlib.Path(self.lock_path).unlink(missing_ok=True)
                self.lock_path = None
        super().close()


def vector_logger(path: str | os.PathLike, **fields: Any):
    """A wrapper factory for ``make_vec(..., wrappers=[vector_logger(path)])``.

    Each wrapped sub-env logs as the lowest free ``env-<k>`` in ``path`` (:func:`claim_writer_name`),
    in this process or in a sub-env's own process (``backend="process"``); names are released on
    close and reused by a resumed run, which then appends to the same files.
    """

    def wrap(env: gym.Env) -> TrajectoryLogger:
        name, lock = claim_writer_name(path)
        logger = TrajectoryLogger(env, path, name=name, **fields)
        logger.lock_path = lock
        return logger

    return wrap


__all__ = ["TrajectoryLogger", "vector_logger"]
