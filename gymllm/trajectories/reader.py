"""Reading trajectory logs back: :func:`read_log` (episodes of a file or a directory of writers),
:func:`scan_jsonl` (records of one file, torn lines skipped), :class:`LoggedEpisode`, :func:`read_tokens`;
trained-trajectory records (a run's ``trajectories.jsonl``, ``serve --groups-out``):
:func:`read_trajectory_records`, :func:`as_trajectory_record`, :func:`trajectory_from_record`."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Iterable

import numpy as np

from gymllm.errors import explain
from gymllm.trajectories.format import FORMAT, TRAJECTORY, dumps_record, mask_spans

__all__ = [
    "scan_jsonl",
    "LoggedEpisode",
    "log_files",
    "episodes_from_records",
    "read_log",
    "read_tokens",
    "read_trajectory_records",
    "as_trajectory_record",
    "trajectory_from_record",
]


def scan_jsonl(
    path: str | os.PathLike, *, typed: bool = True
) -> tuple[list[dict[str, Any]], int, int]:
    """Read a JSONL log: ``(records, good_bytes, torn)``.

    ``good_bytes`` is the length of the prefix made of complete lines; ``torn`` counts lines that were
    cut by a crash (only the last line can be) or do not parse, and are skipped. With ``typed`` a
    record must be an object with a ``"type"``; without, any JSON object is one.
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
            if not isinstance(rec, dict) or (typed and "type" not in rec):
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
        for obs, act in zip(
            [self.observation] + [s["observation"] for s in self.steps],
            [s["action"] for s in self.steps] + [None],
        ):
            if isinstance(obs, list) and all(isinstance(m, dict) and "role" in m for m in obs):
                msgs.extend(obs)
            else:
                msgs.append(
                    {"role": "user", "content": obs if isinstance(obs, str) else dumps_record(obs)}
                )
            if act is not None:
                msgs.append(
                    {
                        "role": "assistant",
                        "content": act if isinstance(act, str) else dumps_record(act),
                    }
                )
        return msgs


def log_files(path: str | os.PathLike) -> list[pathlib.Path]:
    """The JSONL files of a log: ``path`` itself if it is a file, else every ``*.jsonl`` inside it."""
    p = pathlib.Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        return sorted(p.glob("*.jsonl"))
    raise FileNotFoundError(
        explain(
            "trajectory log",
            expected="a .jsonl file or a log directory",
            received=str(p),
            fix="pass the path given to TrajectoryLogger",
        )
    )


def episodes_from_records(
    records: Iterable[dict[str, Any]], source: str = ""
) -> list[LoggedEpisode]:
    """Group records by episode id, in the order their resets appear."""
    eps: dict[str, LoggedEpisode] = {}
    for r in records:
        kind, eid = r.get("type"), r.get("episode")
        if kind == "reset":
            eps[eid] = LoggedEpisode(
                episode=eid,
                index=int(r.get("index", len(eps))),
                env_id=r.get("env_id"),
                env_kwargs=r.get("env_kwargs") or {},
                seed=r.get("seed"),
                options=r.get("options"),
                observation=r.get("observation"),
                info=r.get("info") or {},
                source=source,
                wrappers=r.get("wrappers") or [],
            )
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


def read_log(
    path: str | os.PathLike, *, include_incomplete: bool = False, dedupe: bool = True
) -> list[LoggedEpisode]:
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
        arr = ts.open(
            {"driver": "zarr", "kvstore": {"driver": "file", "path": str(root / field)}}
        ).result()
        out[field] = np.asarray(arr[lo : lo + n].read().result())
    return out


# --------------------------------------------------------------------------------------------- trajectory records


def as_trajectory_record(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` in today's ``trajectory`` layout (:func:`~gymllm.trajectories.format.trajectory_record`).

    Also reads the layouts written before it: a run's record without ``type`` (the same fields), and
    a ``serve --groups-out`` record (per-token ``loss_mask``, ``behaviour_logprobs`` and ``versions``
    become ``sampled_spans``, ``logprobs`` and ``token_versions``; ``versions`` the sampled ones)."""
    if rec.get("type") == TRAJECTORY:
        return rec
    out = {"type": TRAJECTORY, "format": FORMAT, **rec}
    if (
        "loss_mask" in rec and "sampled_spans" not in rec
    ):  # serve --groups-out, before the one format
        mask = np.asarray(out.pop("loss_mask"), bool)
        token_versions = [int(v) for v in out.pop("versions", [])]
        out["sampled_spans"] = mask_spans(mask)
        out["num_tokens"], out["num_sampled"] = len(out.get("token_ids", [])), int(mask.sum())
        out["versions"] = sorted({v for v, m in zip(token_versions, mask) if m})
        out["logprobs"] = [float(x) for x in out.pop("behaviour_logprobs", [0.0] * len(mask))]
        out["token_versions"] = token_versions
    return out


def read_trajectory_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The trajectory records of a JSONL file (a run's ``trajectories.jsonl``, a run directory, or a
    ``serve --groups-out`` file), in file order, in today's layout (:func:`as_trajectory_record`);
    a torn last line (a writer killed mid-line) is skipped."""
    p = pathlib.Path(path)
    if p.is_dir():
        p = p / "trajectories.jsonl"
    if not p.is_file():
        raise FileNotFoundError(
            explain(
                "trajectory records",
                expected="a trajectories.jsonl file or a run directory holding one",
                received=str(p),
                fix="pass the run directory of `gymllm train` "
                "(run.log_trajectories) or the --groups-out file of `gymllm serve`",
            )
        )
    records, _, _ = scan_jsonl(p, typed=False)
    return [as_trajectory_record(r) for r in records if r.get("type", TRAJECTORY) == TRAJECTORY]


def trajectory_from_record(rec: dict[str, Any]) -> Any:
    """The :class:`~gymllm.types.Trajectory` of a record (any layout :func:`as_trajectory_record` reads).
    Per-token log-probs and versions not in the record are 0.0 and -1 (the version of every sampled
    token when the record names exactly one)."""
    from gymllm.types import Trajectory

    rec = as_trajectory_record(rec)
    ids = np.asarray(rec["token_ids"], np.int32)
    mask = np.zeros(len(ids), np.int8)
    for a, b in rec.get("sampled_spans", []):
        mask[a:b] = 1
    if "token_versions" in rec:
        versions = np.asarray(rec["token_versions"], np.int32)
    else:
        only = rec.get("versions") or []
        versions = np.where(mask == 1, only[0] if len(only) == 1 else -1, -1).astype(np.int32)
    logprobs = np.asarray(rec.get("logprobs", np.zeros(len(ids))), np.float32)
    return Trajectory(
        token_ids=ids,
        loss_mask=mask,
        behaviour_logprobs=logprobs,
        versions=versions,
        reward=float(rec.get("reward", 0.0)),
        trajectory_id=rec.get("trajectory_id", ""),
        group_id=rec.get("group_id", ""),
        task_id=rec.get("task_id", ""),
        turn_boundaries=[tuple(b) for b in rec.get("turn_boundaries", [])],
        finish_reason=rec.get("finish_reason", "terminated"),
        row_index=int(rec.get("row_index", 0)),
        info=dict(rec.get("info") or {}),
    )
