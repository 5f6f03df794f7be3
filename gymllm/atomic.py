"""Atomic file and directory writes: a reader sees the old content or the new, never a torn write.

The one tmp-then-rename helper of gymllm (a base layer: it imports only the standard library and
:mod:`gymllm.errors`, so every layer can use it, telemetry included)::

    with atomic_write(path) as f:          # text; mode="wb" for bytes
        f.write(...)
    atomic_write_text(path, json.dumps(state))
    with atomic_directory(dest) as tmp:    # fill tmp; it becomes dest
        save_files(tmp)

How: the content goes to a uniquely named temporary sibling (``.<name>.<random>.tmp``, same
directory, so the same filesystem), is flushed and ``fsync``-ed, and replaces the target with
``os.replace`` (atomic on POSIX and Windows). On an exception inside the block the temporary is
removed and the target is left as it was. Concurrent writers of one path never share a temporary;
the last rename wins.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from typing import IO, Iterator

__all__ = ["atomic_write", "atomic_write_text", "atomic_directory"]


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8", fsync: bool = True
) -> Iterator[IO]:
    """A file object to write ``path``'s new content into; on a clean exit it replaces ``path``.

    Args:
        path: The target (its parent directory is created when missing).
        mode: ``"w"`` (text) or ``"wb"`` (bytes).
        encoding: Text encoding (ignored for ``"wb"``).
        fsync: Flush the content to disk before the rename (a crash then leaves the old or the
            new file, never an empty one).
    """
    if mode not in ("w", "wb"):
        raise ValueError(
            f"atomic_write mode: expected 'w' or 'wb', received {mode!r}. "
            "Fix: write the whole new content (appending is not atomic)"
        )
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(
    path: str | os.PathLike, text: str, *, encoding: str = "utf-8", fsync: bool = True
) -> pathlib.Path:
    """Replace ``path``'s content with ``text`` atomically; returns the path."""
    with atomic_write(path, "w", encoding=encoding, fsync=fsync) as f:
        f.write(text)
    return pathlib.Path(path)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, *, replace: bool = False) -> Iterator[pathlib.Path]:
    """An empty temporary directory beside ``path`` to fill; on a clean exit it is renamed to ``path``.

    When ``path`` already exists (another process finished first) the new one is discarded, unless
    ``replace`` is True, when the old one is removed first (not atomic as a whole: a reader may
    briefly find no directory). On an exception the temporary directory is removed.
    """
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(
        tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    )
    try:
        yield tmp
        if replace and target.exists():
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # lost the race: the other writer's copy stands
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
