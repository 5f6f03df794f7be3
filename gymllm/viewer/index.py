"""An incremental, byte-offset index of a trajectory log, so the viewer pages a table of 100,000
trajectories without reading the whole log per request.

Two log formats are indexed:

* ``train``: a training run's ``trajectories.jsonl`` (one JSON object per trained trajectory, written
  by :mod:`gymllm.train.run`: ``step``, ``group_id``, ``trajectory_id``, ``reward``, ``token_ids``,
  ``sampled_spans``, ``versions`` ...): one line is one row.
* ``episodes``: a :class:`~gymllm.wrappers.TrajectoryLogger` log (``gymllm.trajectory/1``: ``header``,
  ``reset``, ``step``, ``tokens``, ``note``, ``end``, ``abort`` records): one episode is one row, made
  of the byte ranges of its records; :func:`gymllm.trajectories.reader.episodes_from_records`
  turns those records back into a :class:`~gymllm.trajectories.reader.LoggedEpisode`.

The project's reader (:func:`~gymllm.trajectories.reader.scan_jsonl`) reads a whole file per
call; the index instead remembers how far it has read (only complete lines: a half-written last line
waits for its newline) and reads only what was appended since, in chunks, under a lock, so a request
for the first page is answered as soon as that page's rows are indexed while the rest is read on.
Lines that do not parse are kept as errors (file, line number, reason) for the page to show.
"""

from __future__ import annotations

import json
import pathlib
import threading
import time
from typing import Any, Callable, Iterator

from gymllm.trajectories.format import FORMAT

__all__ = ["LogIndex", "detect_format", "Filters", "CHUNK_BYTES"]

CHUNK_BYTES = 1 << 18  # bytes read per locked step: a page request never waits for a whole big log


def detect_format(path: pathlib.Path) -> str | None:
    """``"train"``, ``"episodes"`` or None (not a trajectory log), from the file's first line."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 16)
    except OSError:
        return None
    if not first.strip():
        return "train" if path.name == "trajectories.jsonl" else None
    try:
        rec = json.loads(first)
    except ValueError:
        return "train" if path.name == "trajectories.jsonl" else None
    if isinstance(rec, dict) and rec.get("type") == "header" and rec.get("format") == FORMAT:
        return "episodes"
    if isinstance(rec, dict) and "trajectory_id" in rec:
        return "train"
    return None


class Filters:
    """The table's filters, parsed from query parameters; ``None`` fields do not filter."""

    def __init__(
        self,
        *,
        env: str | None = None,
        seat: str | None = None,
        reward_min: float | None = None,
        reward_max: float | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
        version: int | None = None,
        error: bool | None = None,
        text: str | None = None,
    ):
        self.env, self.seat, self.text = env or None, seat or None, (text or "").lower() or None
        self.reward_min, self.reward_max, self.step_min, self.step_max = (
            reward_min,
            reward_max,
            step_min,
            step_max,
        )
        self.version, self.error = version, error

    @property
    def empty(self) -> bool:
        return all(v is None for v in vars(self).values())

    def __call__(self, row: dict[str, Any]) -> bool:
        if self.env is not None and row.get("env") != self.env:
            return False
        if self.seat is not None and str(row.get("seat")) != self.seat:
            return False
        r = row.get("reward")
        if self.reward_min is not None and (r is None or r < self.reward_min):
            return False
        if self.reward_max is not None and (r is None or r > self.reward_max):
            return False
        s = row.get("step")
        if self.step_min is not None and (s is None or s < self.step_min):
            return False
        if self.step_max is not None and (s is None or s > self.step_max):
            return False
        if self.version is not None and self.version not in (row.get("versions") or ()):
            return False
        if self.error is not None and bool(row.get("error")) != self.error:
            return False
        if (
            self.text is not None
            and self.text not in str(row.get("id", "")).lower()
            and self.text not in str(row.get("task", "")).lower()
        ):
            return False
        return True


class LogIndex:
    """The rows of one trajectory log file, read incrementally (see module doc).

    ``env``: the env id rows of a ``train`` log get (the run's ``config.json`` ``env.id``).
    """

    def __init__(self, path: str | pathlib.Path, fmt: str, *, env: str | None = None):
        if fmt not in ("train", "episodes"):
            raise ValueError(
                f"LogIndex: expected format 'train' or 'episodes', received {fmt!r}. "
                "Fix: use detect_format(path) to tell the format"
            )
        self.path, self.format, self.env = pathlib.Path(path), fmt, env
        self.lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.by_id: dict[str, int] = {}
        self.errors: list[dict[str, Any]] = []
        self.pos = 0  # bytes consumed (complete lines only)
        self.line_no = 0
        self.torn_tail = False  # the file ends in a line without its newline (still being written?)
        self._facets: dict[str, set[Any]] = {"env": set(), "seat": set(), "version": set()}

    # ------------------------------------------------------------------------------------ reading

    def file_size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def step(self) -> bool:
        """Index up to :data:`CHUNK_BYTES` more of the file; False when nothing complete is left."""
        with self.lock:
            size = self.file_size()
            if size < self.pos:  # the file was rewound (a resumed run rewrote it): start over
                self._reset()
            if size <= self.pos:
                self.torn_tail = False
                return False
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(min(CHUNK_BYTES, size - self.pos))
            last = data.rfind(b"\n")
            if last < 0:
                if self.pos + len(data) >= size:  # one line without its newline: the tail is torn
                    self.torn_tail = True
                    return False
                # a single line longer than a chunk: read it whole
                with open(self.path, "rb") as f:
                    f.seek(self.pos)
                    data = f.readline()
                if not data.endswith(b"\n"):
                    self.torn_tail = True
                    return False
                last = len(data) - 1
            start = 0
            while start <= last:
                nl = data.index(b"\n", start)
                self._line(data[start:nl], self.pos + start, nl - start)
                start = nl + 1
            self.pos += last + 1
            self.torn_tail = False
            return self.pos < size

    def refresh(self, until: Callable[[], bool] | None = None, *, pause_s: float = 0.0) -> None:
        """Read what was appended since the last call (stop early once ``until()`` holds).

        ``pause_s``: sleep between chunks (the background indexer passes a little, so a page
        request waiting for the lock gets it between two chunks)."""
        while self.step():
            if until is not None and until():
                return
            if pause_s:
                time.sleep(pause_s)

    def _line(self, raw: bytes, offset: int, length: int) -> None:
        self.line_no += 1
        if not raw.strip():
            return
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict):
                raise ValueError(f"expected a JSON object, received {type(rec).__name__}")
        except ValueError as e:
            self.errors.append(
                {
                    "file": self.path.name,
                    "line": self.line_no,
                    "offset": offset,
                    "message": f"line {self.line_no} of {self.path.name} is not a JSON record: {e}",
                }
            )
            return
        if self.format == "train":
            self._train_row(rec, offset, length)
        else:
            self._episode_record(rec, offset, length)

    def _add(self, row: dict[str, Any]) -> None:
        if row["id"] not in self.by_id:
            self.by_id[row["id"]] = len(self.rows)
        self.rows.append(row)
        self._facet(row)

    def _facet(self, row: dict[str, Any]) -> None:
        if row.get("env") is not None:
            self._facets["env"].add(str(row["env"]))
        if row.get("seat") is not None:
            self._facets["seat"].add(str(row["seat"]))
        self._facets["version"].update(int(v) for v in row.get("versions") or ())

    def _train_row(self, rec: dict[str, Any], offset: int, length: int) -> None:
        tid = rec.get("trajectory_id")
        if tid is None:
            self.errors.append(
                {
                    "file": self.path.name,
                    "line": self.line_no,
                    "offset": offset,
                    "message": f"line {self.line_no} of {self.path.name} has no trajectory_id "
                    f"(keys: {', '.join(sorted(rec)[:8])})",
                }
            )
            return
        finish = rec.get("finish_reason")
        error = rec.get("error") or (
            f"finish_reason={finish}" if finish in ("error", "timeout", "aborted") else None
        )
        self._add(
            {
                "id": str(tid),
                "step": rec.get("step"),
                "group": rec.get("group_id"),
                "task": rec.get("task_id"),
                "env": rec.get("env_id") or self.env,
                "seat": rec.get("seat", rec.get("agent")),
                "reward": _num(rec.get("reward")),
                "versions": list(rec.get("versions") or []),
                "tokens": rec.get("num_tokens"),
                "finish": finish,
                "error": error,
                "ranges": [(offset, length)],
            }
        )

    def _episode_record(self, rec: dict[str, Any], offset: int, length: int) -> None:
        kind, eid = rec.get("type"), rec.get("episode")
        if kind == "reset":
            info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
            row = {
                "id": str(eid),
                "step": None,
                "index": rec.get("index"),
                "group": None,
                "task": info.get("task_id"),
                "env": rec.get("env_id") or self.env,
                "seat": info.get("seat", info.get("agent")),
                "reward": 0.0,
                "versions": [],
                "tokens": 0,
                "finish": "running",
                "error": None,
                "ranges": [(offset, length)],
            }
            self._add(row)
            return
        i = self.by_id.get(
            str(eid)
        )  # records may follow the end (tokens and notes of the last step)
        if i is None:
            return
        row = self.rows[i]
        row["ranges"].append((offset, length))
        if kind == "step":
            row["reward"] = (row["reward"] or 0.0) + (_num(rec.get("reward")) or 0.0)
            info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
            if info.get("error"):
                row["error"] = str(info["error"])[:200]
        elif kind == "tokens":
            row["tokens"] += int(rec.get("length") or 0)
        elif kind == "note":
            if isinstance(rec.get("train_step"), int):  # the training step a writer attached
                row["step"] = rec["train_step"]
            v = rec.get("policy_version", rec.get("version"))
            if isinstance(v, int) and v not in row["versions"]:
                row["versions"].append(v)
                self._facets["version"].add(v)
        elif kind == "end":
            row["finish"] = "truncated" if rec.get("truncated") else "terminated"
            row["reward"] = _num(rec.get("return"))
        elif kind == "abort":
            row["finish"] = "aborted"
            row["error"] = row["error"] or str(rec.get("reason") or "aborted")

    # ------------------------------------------------------------------------------------ queries

    def at_end(self) -> bool:
        """Whether every complete line of the file is indexed."""
        return self.pos >= self.file_size() or self.torn_tail

    def count_ready(self) -> int:
        return len(self.rows)

    def select(self, filters: Filters) -> Iterator[dict[str, Any]]:
        """The indexed rows that pass ``filters``, in log order (a snapshot: rows added later are left out)."""
        n = len(self.rows)
        for i in range(n):
            row = self.rows[i]
            if filters(row):
                yield row

    def read_records(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The JSON records of one row, read by byte range."""
        out = []
        with open(self.path, "rb") as f:
            for offset, length in row["ranges"]:
                f.seek(offset)
                raw = f.read(length)
                try:
                    rec = json.loads(raw)
                except ValueError as e:
                    raise ValueError(
                        f"{self.path.name} at byte {offset}: not a JSON record ({e})"
                    ) from e
                out.append(rec)
        return out

    def facets(self) -> dict[str, list[Any]]:
        """The distinct envs, seats and versions of the indexed rows (for the filter menus)."""
        return {k: sorted(v) for k, v in self._facets.items()}


def _num(x: Any) -> float | None:
    try:
        return None if x is None else float(x)
    except (TypeError, ValueError):
        return None
