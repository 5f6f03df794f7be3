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

Crash safety: every record is one ``write`` of a full line followed by ``flush`` (so a process killed
with SIGKILL loses at most the line being written); ``fsync`` per episode end by default. Token arrays
are written before the ``tokens`` record that points at them, so a pointer never dangles. Reopening an
existing log (resume) truncates a torn last line, marks unfinished episodes aborted and continues the
episode index and token offset: no episode is duplicated or lost, and :meth:`TrajectoryLogger.is_complete`
lets a runner skip (seed, task) pairs already logged.

Seeds: when ``reset`` is called without a seed and ``assign_seeds`` is on (default), the logger draws a
fresh seed from its own generator and passes it on, so every logged episode can be replayed exactly
(:func:`gymllm.wrappers.replay`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import sys
import time
import uuid
from typing import Any, Iterable, Literal

import gymnasium as gym
import numpy as np

from gymllm.errors import ConfigError, GymLLMError, explain
from gymllm.telemetry import span

FORMAT = "gymllm.trajectory/1"
TOKEN_FIELDS: dict[str, str] = {"token_ids": "int32", "loss_mask": "int8", "logprobs": "float32", "versions": "int32"}


# --------------------------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrajectoryLoggerConfig:
    """Where and how a :class:`TrajectoryLogger` writes.

    path: a directory (created) or a ``.jsonl`` file path (its tokens go to the sibling ``.zarr``).
    name: the writer's file stem inside a directory; give each concurrent writer its own name.
    env_id / env_kwargs: how replay rebuilds the env; default: the wrapped env's ``spec``.
    fsync: "never", "episode" (default: at each episode end) or "step" (every record).
    assign_seeds: draw a seed for ``reset(seed=None)`` so every episode is replayable.
    chunk_size: zarr chunk length (elements) of the token arrays.
    """

    path: str
    name: str = "episodes"
    env_id: str | None = None
    env_kwargs: dict[str, Any] | None = None
    fsync: Literal["never", "episode", "step"] = "episode"
    assign_seeds: bool = True
    chunk_size: int = 65536

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)) or not str(self.path):
            raise ConfigError(explain("TrajectoryLoggerConfig.path", expected="a directory or .jsonl path",
                                      received=self.path, fix="pass path='runs/log'"))
        object.__setattr__(self, "path", os.fspath(self.path))
        if self.fsync not in ("never", "episode", "step"):
            raise ConfigError(explain("TrajectoryLoggerConfig.fsync", expected="'never', 'episode' or 'step'",
                                      received=self.fsync, fix="use fsync='episode'"))
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ConfigError(explain("TrajectoryLoggerConfig.chunk_size", expected="a positive int",
                                      received=self.chunk_size, fix="use chunk_size=65536"))
        if not self.name or "/" in self.name:
            raise ConfigError(explain("TrajectoryLoggerConfig.name", expected="a plain file stem",
                                      received=self.name, fix="use name='episodes'"))

    @property
    def jsonl_path(self) -> pathlib.Path:
        p = pathlib.Path(self.path)
        return p if p.suffix == ".jsonl" else p / f"{self.name}.jsonl"

    @property
    def zarr_path(self) -> pathlib.Path:
        return self.jsonl_path.with_suffix(".zarr")


# --------------------------------------------------------------------------------------------- JSON


def to_jsonable(x: Any) -> Any:
    """A JSON-safe copy of ``x``: numpy values become Python numbers/lists, tuples lists, keys str."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return to_jsonable(dataclasses.asdict(x))
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    return repr(x)


def normalise(x: Any) -> Any:
    """``x`` as it reads back from the log (JSON round trip), for comparisons against logged values."""
    return json.loads(_dumps(to_jsonable(x)))


def _dumps(record: Any) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=True)


def _plain_json(x: Any) -> bool:
    """Whether ``x`` is made only of JSON-native values (so it rebuilds exactly from the log)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return True
    if isinstance(x, (list, tuple)):
        return all(_plain_json(v) for v in x)
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain_json(v) for k, v in x.items())
    return False


def wrapper_stack(env: gym.Env) -> list[dict[str, Any]]:
    """The wrappers around the registered env, innermost first, as Gymnasium's spec records them.

    ``kwargs`` is None for a wrapper that cannot be rebuilt from the log (it does not record its
    constructor arguments, or they are not plain JSON, e.g. a lambda).
    """
    spec = getattr(env, "spec", None)
    out = []
    for w in getattr(spec, "additional_wrappers", ()) or ():
        kwargs = w.kwargs if w.kwargs is not None and _plain_json(w.kwargs) else None
        out.append({"name": w.name, "entry_point": w.entry_point, "kwargs": to_jsonable(kwargs)})
    return out


def package_versions() -> dict[str, str]:
    """Versions that decide whether a replay should match: python, gymllm and the env libraries."""
    out = {"python": platform.python_version()}
    for mod in ("gymllm", "gymnasium", "numpy", "pettingzoo"):
        m = sys.modules.get(mod)
        if m is None and mod in ("gymllm", "gymnasium", "numpy"):
            m = __import__(mod)
        if m is not None:
            out[mod] = str(getattr(m, "__version__", "?"))
    return out


# --------------------------------------------------------------------------------------------- reading


def scan_jsonl(path: str | os.PathLike) -> tuple[list[dict[str, Any]], int, int]:
    """Read a JSONL log: ``(records, good_bytes, torn)``.

    ``good_bytes`` is the length of the prefix made of complete lines; ``torn`` counts lines that were
    cut by a crash (only the last line can be) or do not parse, and are skipped.
    """
    data = pathlib.Path(path).read_bytes() if pathlib.Path(path).exists() else b""
    records: list[dict[str, Any]] = []
    good, torn, pos = 0, 0, 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:  # a torn last line: the writer died mid-write
            torn += 1
            break
        line = data[pos:nl]
        pos = nl + 1
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "type" not in rec:
                raise ValueError("not a record")
            records.append(rec)
        except ValueError:
            torn += 1
        good = pos
    return records, good, torn


@dataclasses.dataclass
class LoggedEpisode:
    """One episode read back from a log: its reset, its steps, its end (None while incomplete)."""

    episode: str
    index: int
    env_id: str | None
    env_kwargs: dict[str, Any]
    seed: int | None
    options: Any
    observation: Any
    info: dict[str, Any]
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tokens: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    end: dict[str, Any] | None = None
    aborted: bool = False
    source: str = ""
    wrappers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.end is not None and not self.aborted

    @property
    def actions(self) -> list[Any]:
        return [s["action"] for s in self.steps]

    @property
    def rewards(self) -> list[float]:
        return [float(s["reward"]) for s in self.steps]

    @property
    def episode_return(self) -> float:
        return float(sum(self.rewards))

    @property
    def key(self) -> tuple[Any, Any]:
        """What identifies the task of an episode for resume: ``(seed, task_id)``."""
        return (self.seed, (self.info or {}).get("task_id"))

    def messages(self) -> list[dict[str, Any]]:
        """The conversation: observations as user (or their own) messages, actions as assistant ones."""
        msgs: list[dict[str, Any]] = []
        for obs, act in zip([self.observation] + [s["observation"] for s in self.steps],
                            [s["action"] for s in self.steps] + [None]):
            if isinstance(obs, list) and all(isinstance(m, dict) and "role" in m for m in obs):
                msgs.extend(obs)
            else:
                msgs.append({"role": "user", "content": obs if isinstance(obs, str) else _dumps(obs)})
            if act is not None:
                msgs.append({"role": "assistant", "content": act if isinstance(act, str) else _dumps(act)})
        return msgs


def log_files(path: str | os.PathLike) -> list[pathlib.Path]:
    """The JSONL files of a log: ``path`` itself if it is a file, else every ``*.jsonl`` inside it."""
    p = pathlib.Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        return sorted(p.glob("*.jsonl"))
    raise FileNotFoundError(explain("trajectory log", expected="a .jsonl file or a log directory",
                                    received=str(p), fix="pass the path given to TrajectoryLogger"))


def episodes_from_records(records: Iterable[dict[str, Any]], source: str = "") -> list[LoggedEpisode]:
    """Group records by episode id, in the order their resets appear."""
    eps: dict[str, LoggedEpisode] = {}
    for r in records:
        kind, eid = r.get("type"), r.get("episode")
        if kind == "reset":
            eps[eid] = LoggedEpisode(
                episode=eid, index=int(r.get("index", len(eps))), env_id=r.get("env_id"),
                env_kwargs=r.get("env_kwargs") or {}, seed=r.get("seed"), options=r.get("options"),
                observation=r.get("observation"), info=r.get("info") or {}, source=source,
                wrappers=r.get("wrappers") or [])
        elif eid in eps:
            ep = eps[eid]
            if kind == "step":
                ep.steps.append(r)
            elif kind == "tokens":
                ep.tokens.append(r)
            elif kind == "note":
                ep.notes.append(r)
            elif kind == "end":
                ep.end = r
            elif kind == "abort":
                ep.aborted = True
    return list(eps.values())


def read_log(path: str | os.PathLike, *, include_incomplete: bool = False, dedupe: bool = True) -> list[LoggedEpisode]:
    """Every episode of a log (a file or a directory of writers' files).

    Incomplete (crashed or aborted) episodes are left out unless ``include_incomplete``; with
    ``dedupe`` only the first complete episode per (file, seed, task) key is kept.
    """
    out: list[LoggedEpisode] = []
    for f in log_files(path):
        records, _, _ = scan_jsonl(f)
        seen: set[Any] = set()
        for ep in episodes_from_records(records, source=str(f)):
            if not ep.complete and not include_incomplete:
                continue
            if dedupe and ep.complete and ep.seed is not None:
                if ep.key in seen:
                    continue
                seen.add(ep.key)
            out.append(ep)
    return out


def read_tokens(path: str | os.PathLike, record: dict[str, Any]) -> dict[str, np.ndarray]:
    """The token arrays a ``tokens`` record points at, read from the writer's zarr store."""
    import tensorstore as ts

    p = pathlib.Path(path)
    jsonl = p if p.suffix == ".jsonl" else p / f"{record.get('writer', 'episodes')}.jsonl"
    root = jsonl.with_suffix(".zarr")
    lo, n = int(record["offset"]), int(record["length"])
    out = {}
    for field in record["fields"]:
        arr = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(root / field)}}).result()
        out[field] = np.asarray(arr[lo:lo + n].read().result())
    return out


# --------------------------------------------------------------------------------------------- token store


class TokenStore:
    """Appendable, chunked 1-D arrays (one per field) in a tensorstore zarr directory."""

    def __init__(self, root: pathlib.Path, chunk_size: int, cursor: int):
        try:
            import tensorstore as ts
        except ImportError as e:  # pragma: no cover - tensorstore is a core dependency
            from gymllm.errors import MissingExtraError

            raise MissingExtraError("tensorstore", "test") from e
        self._ts = ts
        self.root = root
        self.cursor = cursor
        self.arrays: dict[str, Any] = {}
        for field, dtype in TOKEN_FIELDS.items():
            spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(root / field)}}
            if (root / field).exists():
                arr = ts.open(spec).result()
            else:
                arr = ts.open(spec, create=True, dtype=getattr(ts, dtype), shape=[0],
                              chunk_layout=ts.ChunkLayout(write_chunk_shape=[chunk_size])).result()
            self.arrays[field] = arr

    def append(self, arrays: dict[str, np.ndarray]) -> tuple[int, int]:
        """Write aligned arrays at the cursor; return ``(offset, length)``."""
        n = len(next(iter(arrays.values())))
        lo, hi = self.cursor, self.cursor + n
        for field, values in arrays.items():
            arr = self.arrays[field]
            if arr.domain.exclusive_max[0] < hi:
                arr = arr.resize(exclusive_max=[hi], expand_only=True).result()
                self.arrays[field] = arr
            arr[lo:hi].write(np.asarray(values, dtype=TOKEN_FIELDS[field])).result()
        self.cursor = hi
        return lo, n


# --------------------------------------------------------------------------------------------- wrapper


class TrajectoryLogger(gym.Wrapper):
    """Logs every reset and step of the wrapped env (any Gymnasium env, text or not); see module doc.

    ``TrajectoryLogger(env, "runs/log")`` or ``TrajectoryLogger(env, config=TrajectoryLoggerConfig(...))``.
    Token-level data for the current step: :meth:`record_tokens`; a whole :class:`~gymllm.types.Trajectory`:
    :meth:`log_trajectory`.
    """

    def __init__(self, env: gym.Env, path: str | os.PathLike | None = None, *,
                 config: TrajectoryLoggerConfig | None = None, **overrides: Any):
        super().__init__(env)
        if config is None:
            if path is None:
                raise ConfigError(explain("TrajectoryLogger", expected="a path or a config", received=None,
                                          fix="TrajectoryLogger(env, 'runs/log')"))
            config = TrajectoryLoggerConfig(path=os.fspath(path), **overrides)
        self.config = config
        spec = getattr(env, "spec", None)
        self.env_id = config.env_id or (spec.id if spec is not None else None)
        self.env_kwargs = to_jsonable(config.env_kwargs if config.env_kwargs is not None
                                      else (dict(spec.kwargs) if spec is not None else {}))
        self.wrappers = wrapper_stack(env) if config.env_id is None else []
        self._seed_rng = np.random.default_rng()
        self._episode: str | None = None
        self._step = 0
        self._return = 0.0
        self._tokens: TokenStore | None = None
        self._file = None
        self._completed: set[Any] = set()
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
        self._token_cursor = max((int(r["offset"]) + int(r["length"]) for r in records if r.get("type") == "tokens"),
                                 default=0)
        self._completed = {ep.key for ep in episodes if ep.complete}
        self._write({"type": "header", "format": FORMAT, "writer": self.config.name, "env_id": self.env_id,
                     "env_kwargs": self.env_kwargs, "wrappers": self.wrappers, "versions": package_versions(), "pid": os.getpid(),
                     "time": time.time(), "resumed": bool(records), "torn_lines": torn})
        for ep in episodes:
            if ep.end is None and not ep.aborted:
                self._write({"type": "abort", "episode": ep.episode, "reason": "writer restarted before the episode ended"})
        self._sync()

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            raise GymLLMError(explain("TrajectoryLogger", expected="an open log", received="closed",
                                      fix="create a new TrajectoryLogger to write more"))
        with span("trajectory_log.write", track="env/logger", type=record.get("type")):
            self._file.write(_dumps(record) + "\n")  # one write of a whole line, then flush
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
            self._write({"type": "abort", "episode": self._episode, "reason": "reset before the episode ended"})
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
        return self._after_reset(seed, options, *(await areset_env(self.env, seed=seed, options=options)))

    def _after_reset(self, seed: int | None, options: Any, obs: Any, info: Any):
        self._episode = f"{self.config.name}-{self._index:06d}-{uuid.uuid4().hex[:8]}"
        self._write({"type": "reset", "episode": self._episode, "index": self._index, "seed": seed,
                     "options": to_jsonable(options), "env_id": self.env_id, "env_kwargs": self.env_kwargs,
                     "wrappers": self.wrappers,
                     "observation": to_jsonable(obs), "info": to_jsonable(info), "time": time.time()})
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
        self._write({"type": "step", "episode": self._episode, "step": self._step, "action": to_jsonable(action),
                     "observation": to_jsonable(obs), "reward": to_jsonable(reward),
                     "terminated": bool(terminated), "truncated": bool(truncated), "info": to_jsonable(info),
                     "tool_calls": to_jsonable(tool_calls), "timing": {"step_s": dt}})
        if terminated or truncated:
            self._write({"type": "end", "episode": self._episode, "steps": self._step, "return": self._return,
                         "terminated": bool(terminated), "truncated": bool(truncated), "time": time.time()})
            self._completed.add((self._seed, self._task))
            self._ended, self._episode = self._episode, None
            if self.config.fsync == "episode":
                self._sync()
        return obs, reward, terminated, truncated, info

    # -- token-level data

    def record_tokens(self, *, token_ids: Any, loss_mask: Any = None, logprobs: Any = None,
                      versions: Any = None, episode: str | None = None, step: int | None = None) -> dict[str, Any]:
        """Append aligned token arrays ([T] each) for a step of the current (or named) episode.

        Missing fields default to mask 1, logprob 0 and version -1. Returns the ``tokens`` record.
        """
        ids = np.asarray(token_ids, dtype=np.int32).reshape(-1)
        n = ids.shape[0]
        arrays = {"token_ids": ids,
                  "loss_mask": np.ones(n, np.int8) if loss_mask is None else np.asarray(loss_mask).reshape(-1),
                  "logprobs": np.zeros(n, np.float32) if logprobs is None else np.asarray(logprobs).reshape(-1),
                  "versions": np.full(n, -1, np.int32) if versions is None else np.asarray(versions).reshape(-1)}
        for field, arr in arrays.items():
            if arr.shape[0] != n:
                raise GymLLMError(explain(f"record_tokens: {field}", expected=f"length {n} (len(token_ids))",
                                          received=arr.shape[0], fix="keep per-token arrays aligned"))
        if self._tokens is None:
            self._tokens = TokenStore(self.config.zarr_path, self.config.chunk_size, self._token_cursor)
        offset, length = self._tokens.append(arrays)  # arrays first, then the pointer: never dangling
        record = {"type": "tokens", "episode": episode or self._last_episode(), "step": self._step if step is None else step,
                  "offset": offset, "length": length, "fields": list(TOKEN_FIELDS), "writer": self.config.name}
        self._write(record)
        return record

    def annotate(self, **fields: Any) -> dict[str, Any]:
        """Attach extra data to the current step (e.g. ``policy_version=3, sampling={"temperature": 1.0}``)."""
        record = {"type": "note", "episode": self._last_episode(), "step": self._step, **to_jsonable(fields)}
        self._write(record)
        return record

    def log_trajectory(self, trajectory: Any, *, episode: str | None = None) -> dict[str, Any]:
        """Store a :class:`gymllm.types.Trajectory`'s token arrays for the current (or named) episode."""
        return self.record_tokens(token_ids=trajectory.token_ids, loss_mask=trajectory.loss_mask,
                                  logprobs=trajectory.behaviour_logprobs, versions=trajectory.versions,
                                  episode=episode)

    def _last_episode(self) -> str | None:
        return self._episode if self._episode is not None else getattr(self, "_ended", None)

    def close(self) -> None:
        if self._file is not None:
            if self._episode is not None:
                self._write({"type": "abort", "episode": self._episode, "reason": "closed before the episode ended"})
                self._episode = None
            self._sync()
            self._file.close()
            self._file = None
            lock = self.__dict__.pop("_lock", None)
            if lock is not None:
                pathlib.Path(lock).unlink(missing_ok=True)
        super().close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_writer_name(path: str | os.PathLike, prefix: str = "env") -> tuple[str, pathlib.Path]:
    """The lowest free ``<prefix>-<k>`` writer name in a log directory, claimed with a lock file.

    A lock holds the owner's pid; a lock whose process is gone (a crashed run) is taken over, so a
    resumed run reuses the same names and appends to the same files. Works across processes.
    """
    root = pathlib.Path(path)
    root.mkdir(parents=True, exist_ok=True)
    for k in range(1 << 20):
        name = f"{prefix}-{k:03d}"
        lock = root / f"{name}.lock"
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                owner = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                continue
            if owner and not _alive(owner):
                tmp = root / f".{name}.{os.getpid()}.lock"
                tmp.write_text(str(os.getpid()))
                os.replace(tmp, lock)  # take over the stale lock; re-read to see who won
                if lock.read_text().strip() == str(os.getpid()):
                    return name, lock
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return name, lock
    raise GymLLMError(explain("claim_writer_name", expected="a free writer name", received=str(root),
                              fix="remove stale .lock files"))


def vector_logger(path: str | os.PathLike, **fields: Any):
    """A wrapper factory for ``make_vec(..., wrappers=[vector_logger(path)])``.

    Each wrapped sub-env logs as the lowest free ``env-<k>`` in ``path`` (:func:`claim_writer_name`),
    in this process or in a sub-env's own process (``backend="process"``); names are released on
    close and reused by a resumed run, which then appends to the same files.
    """

    def wrap(env: gym.Env) -> TrajectoryLogger:
        name, lock = claim_writer_name(path)
        logger = TrajectoryLogger(env, path, name=name, **fields)
        logger._lock = lock
        return logger

    return wrap


__all__ = ["TrajectoryLogger", "vector_logger", "claim_writer_name", "wrapper_stack", "TrajectoryLoggerConfig", "LoggedEpisode", "read_log", "read_tokens",
           "scan_jsonl", "to_jsonable", "normalise", "package_versions", "TokenStore", "FORMAT"]
