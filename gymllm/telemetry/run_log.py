"""A run directory's step-indexed JSONL logs after a crash: each step once, nothing torn, nothing lost.

A run killed at any moment and resumed from its latest checkpoint redoes the steps after that
checkpoint. The records the killed process wrote for those steps belong to a lost lineage: readers
(plots, ``gymllm replay``, SFT from a run's log) must see each step once. At resume,
:func:`rewind_jsonl` keeps the records of steps up to the restored one, moves the others to
``<name>.lost.jsonl`` (tagged with the step they were rewound to, so nothing is deleted), and drops a
torn last line (a kill in the middle of a write) into the same file. The file is rewritten through a
temporary file and an atomic rename, so a kill during the rewind leaves either the old or the new file.

    report = rewind_jsonl(run_dir / "metrics.jsonl", step=resumed_step)   # before appending again
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

from gymllm.atomic import atomic_write

__all__ = ["RewindReport", "rewind_jsonl", "read_jsonl"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewindReport:
    """What :func:`rewind_jsonl` did: records kept, moved to the lost lineage, torn lines dropped."""

    kept: int = 0
    lost: int = 0
    torn: int = 0


def read_jsonl(path: str | os.PathLike) -> tuple[list[dict], list[str]]:
    """Complete records of a JSONL file and its torn lines (not JSON, or no closing newline)."""
    p = pathlib.Path(path)
    if not p.exists():
        return [], []
    data = p.read_bytes()
    records: list[dict] = []
    torn: list[str] = []
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline; else a record cut by a kill
    for raw in lines:
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            torn.append(raw.decode("utf-8", "replace"))
            continue
        if isinstance(rec, dict):
            records.append(rec)
        else:
            torn.append(raw.decode("utf-8", "replace"))
    if tail.strip():
        torn.append(tail.decode("utf-8", "replace"))
    return records, torn


def rewind_jsonl(path: str | os.PathLike, *, step: int, key: str = "step") -> RewindReport:
    """Keep the records of ``path`` whose ``key`` is <= ``step``; move the rest (and torn lines) to
    ``<stem>.lost.jsonl`` beside it. A missing file is left missing (report of zeros)."""
    p = pathlib.Path(path)
    if not p.exists():
        return RewindReport()
    records, torn = read_jsonl(p)
    keep = [r for r in records if isinstance(r.get(key), int) and r[key] <= step]
    lost = [r for r in records if not (isinstance(r.get(key), int) and r[key] <= step)]
    if not lost and not torn:
        return RewindReport(kept=len(keep))
    lost_path = p.with_name(p.stem + ".lost.jsonl")
    with open(lost_path, "a", encoding="utf-8") as f:
        for r in lost:
            f.write(json.dumps({"rewound_to": step, **r}) + "\n")
        for line in torn:
            f.write(json.dumps({"rewound_to": step, "torn": line}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    with atomic_write(p) as f:
        for r in keep:
            f.write(json.dumps(r) + "\n")
    return RewindReport(kept=len(keep), lost=len(lost), torn=len(torn))
