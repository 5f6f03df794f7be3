"""Writer names in a shared log directory: :func:`claim_writer_name` gives each concurrent writer (one
per sub-env, in any process) the lowest free ``<prefix>-<k>`` name, held by a pid lock file."""

from __future__ import annotations

import os
import pathlib

from gymllm.atomic import atomic_write_text
from gymllm.errors import GymLLMError, explain

__all__ = ["claim_writer_name"]


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
                atomic_write_text(lock, str(os.getpid()), fsync=False)  # take over the stale lock; re-read to see who won
                if lock.read_text().strip() == str(os.getpid()):
                    return name, lock
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return name, lock
    raise GymLLMError(explain("claim_writer_name", expected="a free writer name", received=str(root),
                              fix="remove stale .lock files"))
