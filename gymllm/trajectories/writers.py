"""Writers: :func:`claim_writer_name` gives each concurrent episode-log writer in a shared log directory
(one per sub-env, in any process) the lowest free ``<prefix>-<k>`` name, held by a pid lock file;
:class:`TrajectoryRecordWriter` appends trained-trajectory records (a run's ``trajectories.jsonl``,
``gymllm serve --groups-out``) in the one record format."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Iterable

from gymllm.atomic import atomic_write_text
from gymllm.errors import GymLLMError, explain
from gymllm.trajectories.format import dumps_record, trajectory_record

__all__ = ["claim_writer_name", "TrajectoryRecordWriter"]


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
                atomic_write_text(
                    lock, str(os.getpid()), fsync=False
                )  # take over the stale lock; re-read to see who won
                if lock.read_text().strip() == str(os.getpid()):
                    return name, lock
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return name, lock
    raise GymLLMError(
        explain(
            "claim_writer_name",
            expected="a free writer name",
            received=str(root),
            fix="remove stale .lock files",
        )
    )


class TrajectoryRecordWriter:
    """Appends one :func:`~gymllm.trajectories.format.trajectory_record` line per trajectory to a
    JSONL file (created with its parents), one whole-line write each, flushed after every :meth:`write`
    (a kill loses at most the line being written; the reader skips it).

        with TrajectoryRecordWriter(run_dir / "trajectories.jsonl", tokenizer=tok) as w:
            w.write(group.trajectories, step=3)
    """

    def __init__(self, path: str | os.PathLike, *, tokenizer: Any = None, per_token: bool = False):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tokenizer, self.per_token = tokenizer, per_token
        self._file = open(self.path, "a", encoding="utf-8")

    def write(
        self, trajectories: Iterable[Any], *, step: int | None = None
    ) -> list[dict[str, Any]]:
        """Append the records of ``trajectories`` (trained at optimizer ``step``); returns them."""
        if self._file is None:
            raise GymLLMError(
                explain(
                    "TrajectoryRecordWriter.write",
                    expected="an open writer",
                    received="closed",
                    fix="create a new TrajectoryRecordWriter to append more",
                )
            )
        recs = [
            trajectory_record(t, step=step, tokenizer=self.tokenizer, per_token=self.per_token)
            for t in trajectories
        ]
        for rec in recs:
            self._file.write(dumps_record(rec) + "\n")
        self._file.flush()
        return recs

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "TrajectoryRecordWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
