"""The directories and files ``gymllm view`` shows: :class:`ViewedRun` (a ``gymllm train`` run
directory, a suite evaluation's directory or ``summary.json``, or a ``gymllm eval env --out`` table).

What a run directory holds (see :mod:`gymllm.train.trainer`): ``config.json``, ``metrics.jsonl`` (one
object per optimizer step), ``summary.txt``, ``trajectories.jsonl``, ``trace.json`` (Chrome/Perfetto
format), ``compiles.jsonl`` (every XLA compile; its figures are shown while the run goes on), the report PNGs, ``tensorboard/``, ``checkpoints/``. Any ``gymllm.trajectory/1`` log
(:class:`~gymllm.wrappers.TrajectoryLogger`) inside it, up to two folders down, is shown as well.

Everything is read on request and never written; a file that does not parse becomes an error
message for the page (what was expected, what was found, where), not an exception.
"""

from __future__ import annotations

import json
import pathlib
import threading
from typing import Any

from gymllm.viewer.index import LogIndex, detect_format

__all__ = ["ViewedRun", "load_runs", "read_metrics", "SERVED_SUFFIXES", "TRACE_NAMES"]

TRACE_NAMES = ("trace.json", "trace.json.gz")
#: the run files served as they are (the trace, the report's plots, the config and summaries)
SERVED_SUFFIXES = (".png", ".json", ".gz", ".txt")
SUITE_NAMES = ("summary.json", "results.json", "eval.json")


def read_metrics(path: pathlib.Path, offset: int = 0) -> dict[str, Any]:
    """The records of ``metrics.jsonl`` from byte ``offset``: ``records``, the next ``offset`` (after
    the last complete line), ``errors`` (lines that are not JSON objects) and ``torn`` (a last line
    still without its newline: the run may be writing it)."""
    out: dict[str, Any] = {"records": [], "offset": offset, "errors": [], "torn": False}
    try:
        size = path.stat().st_size
    except OSError:
        return out
    if size < offset:  # rewound by a resumed run: read from the start
        offset = 0
        out["reset"] = True
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(size - offset)
    last = data.rfind(b"\n")
    out["torn"] = last < len(data) - 1
    pos = 0
    while pos <= last:
        nl = data.index(b"\n", pos)
        raw = data[pos:nl]
        if raw.strip():
            try:
                rec = json.loads(raw)
                if not isinstance(rec, dict):
                    raise ValueError(f"expected a JSON object, received {type(rec).__name__}")
                out["records"].append(rec)
            except ValueError as e:
                out["errors"].append(
                    f"metrics.jsonl at byte {offset + pos}: not a JSON record ({e}): "
                    f"{raw[:80].decode('utf-8', 'replace')!r}"
                )
        pos = nl + 1
    out["offset"] = offset + last + 1
    return out


def _read_json(path: pathlib.Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text()), None
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{path.name}: cannot be read ({e})"
    except ValueError as e:
        return (
            None,
            f"{path.name}: expected JSON, but it does not parse ({e}); the file may be half-written",
        )


class ViewedRun:
    """One directory (or JSON file) given to ``gymllm view``, and the indexes of its trajectory logs."""

    def __init__(self, path: str | pathlib.Path, name: str):
        self.path = pathlib.Path(path).resolve()
        self.name = name
        self._lock = threading.Lock()
        self._logs: dict[pathlib.Path, LogIndex] = {}
        self.tokenizer_cache: dict[str, Any] = {}

    @property
    def root(self) -> pathlib.Path:
        return self.path if self.path.is_dir() else self.path.parent

    def config(self) -> tuple[dict[str, Any] | None, str | None]:
        p = self.root / "config.json"
        if not self.path.is_dir() or not p.is_file():
            return None, None
        conf, err = _read_json(p)
        if err is None and not isinstance(conf, dict):
            return None, f"config.json: expected a JSON object, received {type(conf).__name__}"
        return conf, err

    @property
    def env_id(self) -> str | None:
        conf, _ = self.config()
        env = (conf or {}).get("env")
        return env.get("id") if isinstance(env, dict) else None

    def suite_file(self) -> pathlib.Path | None:
        if self.path.is_file():
            return self.path
        for n in SUITE_NAMES:
            if (self.path / n).is_file():
                return self.path / n
        return None

    def kind(self) -> str:
        if self.path.is_dir() and (
            (self.path / "metrics.jsonl").exists() or (self.path / "config.json").exists()
        ):
            return "train"
        return "suite" if self.suite_file() is not None else "unknown"

    def files(self) -> list[str]:
        if not self.path.is_dir():
            return []
        return sorted(
            p.name for p in self.path.iterdir() if p.is_file() and p.suffix in SERVED_SUFFIXES
        )

    def trace(self) -> str | None:
        return (
            next((n for n in TRACE_NAMES if (self.root / n).is_file()), None)
            if self.path.is_dir()
            else None
        )

    def overview(self) -> dict[str, Any]:
        """What the run page shows first: kind, config, summary, compiles (the figures of ``compiles.jsonl``,
        :func:`gymllm.telemetry.compiles.summarize` without ``by_name``; None without the file), plots,
        trace, logs, problems."""
        from gymllm.telemetry.compiles import read_compiles, summarize

        conf, conf_err = self.config()
        summary = self.root / "summary.txt"
        errors = [conf_err] if conf_err else []
        if self.kind() == "unknown":
            errors.append(
                f"{self.path}: expected a run directory (metrics.jsonl, config.json) or a suite "
                "summary.json / `gymllm eval env --out` table, found neither"
            )
        recs = read_compiles(self.root / "compiles.jsonl") if self.path.is_dir() else []
        compiles = {k: v for k, v in summarize(recs).items() if k != "by_name"} if recs else None
        return {
            "name": self.name,
            "path": str(self.path),
            "kind": self.kind(),
            "config": conf,
            "compiles": compiles,
            "summary": summary.read_text(errors="replace")
            if self.path.is_dir() and summary.is_file()
            else None,
            "plots": [f for f in self.files() if f.endswith(".png")],
            "trace": self.trace(),
            "logs": [
                {"file": str(p.relative_to(self.root)), "format": ix.format}
                for p, ix in self.logs().items()
            ],
            "suite": self.suite_file() is not None,
            "errors": errors,
        }

    def metrics(self, offset: int = 0) -> dict[str, Any]:
        if not self.path.is_dir():
            return {"records": [], "offset": 0, "errors": [], "torn": False}
        return read_metrics(self.path / "metrics.jsonl", offset)

    def suite(self) -> dict[str, Any]:
        """The suite summary (``summary.json`` with ``suite``/``results``/``comparisons``) or a
        ``gymllm eval env --out`` table (a list of rows), as ``{"format", "data", "errors"}``."""
        p = self.suite_file()
        if p is None:
            return {"format": None, "data": None, "errors": []}
        data, err = _read_json(p)
        if err:
            return {"format": None, "data": None, "errors": [err], "file": p.name}
        if isinstance(data, list) and all(isinstance(r, dict) for r in data):
            return {"format": "eval_rows", "data": data, "errors": [], "file": p.name}
        if isinstance(data, dict) and isinstance(data.get("results"), list):
            return {"format": "suite", "data": data, "errors": [], "file": p.name}
        return {
            "format": None,
            "data": None,
            "file": p.name,
            "errors": [
                f"{p.name}: expected a `gymllm eval env --out` list of rows or a suite summary with a "
                f"`results` list, received {type(data).__name__} with keys "
                f"{sorted(data)[:8] if isinstance(data, dict) else '-'}"
            ],
        }

    # --------------------------------------------------------------------------- trajectory logs

    def logs(self) -> dict[pathlib.Path, LogIndex]:
        """Every trajectory log under the run (found once; new files are picked up on the next call)."""
        if not self.path.is_dir():
            return {}
        with self._lock:
            candidates = [
                p
                for pattern in ("*.jsonl", "*/*.jsonl", "*/*/*.jsonl")
                for p in self.path.glob(pattern)
                if p.name != "metrics.jsonl"
                and p not in self._logs
                and "checkpoints" not in p.parts
            ]
            for p in sorted(candidates):
                fmt = detect_format(p)
                if fmt is not None:
                    self._logs[p] = LogIndex(p, fmt, env=self.env_id)
            return dict(self._logs)

    def find(self, trajectory_id: str) -> tuple[LogIndex, dict[str, Any]] | None:
        for ix in self.logs().values():
            ix.refresh()
            i = ix.by_id.get(trajectory_id)
            if i is not None:
                return ix, ix.rows[i]
        return None


def load_runs(paths: list[str]) -> dict[str, ViewedRun]:
    """``{name: ViewedRun}`` for the paths given to ``gymllm view`` (names: the folder's or file's
    name, made unique with ``-2``, ``-3`` ...).

    Raises:
        FileNotFoundError: a path does not exist.
    """
    runs: dict[str, ViewedRun] = {}
    for raw in paths:
        p = pathlib.Path(raw)
        if not p.exists():
            raise FileNotFoundError(
                f"gymllm view: expected a run directory or a suite summary.json, received "
                f"{raw!r}, which does not exist. Fix: pass the --run-dir of `gymllm train`"
            )
        base = p.resolve().name if p.is_dir() else p.stem
        name, k = base, 2
        while name in runs:
            name, k = f"{base}-{k}", k + 1
        runs[name] = ViewedRun(p, name)
    return runs
