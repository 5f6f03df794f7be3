"""gymllm.atomic: the one tmp-then-rename helper. A reader sees the old content or the new one, never a
torn file: after a clean write, after an exception in the block, and after a SIGKILL mid-write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from gymllm.atomic import atomic_directory, atomic_write, atomic_write_text


def test_write_replaces_the_content_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "sub" / "state.json"  # parent created
    atomic_write_text(p, "old")
    with atomic_write(p) as f:
        f.write("new")
        assert p.read_text() == "old"  # not visible before the block ends
    assert p.read_text() == "new"
    with atomic_write(p, "wb") as f:
        f.write(b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    assert sorted(x.name for x in p.parent.iterdir()) == ["state.json"]


def test_an_exception_in_the_block_keeps_the_old_content(tmp_path):
    p = tmp_path / "state.json"
    atomic_write_text(p, "old")
    with pytest.raises(RuntimeError, match="boom"), atomic_write(p) as f:
        f.write("half of the new")
        raise RuntimeError("boom")
    assert p.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["state.json"]


def test_a_process_killed_mid_write_leaves_the_old_content(tmp_path):
    p = tmp_path / "state.json"
    atomic_write_text(p, json.dumps({"step": 1}))
    code = f"""
        import os, signal
        from gymllm.atomic import atomic_write
        with atomic_write({str(p)!r}) as f:
            f.write('{{"step": 2')
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL
    assert json.loads(p.read_text()) == {"step": 1}


def test_concurrent_writers_never_tear_the_file(tmp_path):
    p = tmp_path / "shared.txt"
    barrier = threading.Barrier(8)

    def writer(k: int) -> None:
        barrier.wait()
        for _ in range(20):
            atomic_write_text(p, str(k) * 1000, fsync=False)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = p.read_text()
    assert len(text) == 1000 and len(set(text)) == 1  # one writer's whole content
    assert sorted(x.name for x in tmp_path.iterdir()) == ["shared.txt"]


def test_mode_must_write_a_whole_file(tmp_path):
    with (
        pytest.raises(ValueError, match="expected 'w' or 'wb', received 'a'"),
        atomic_write(tmp_path / "x", "a"),
    ):
        pass


def test_directory_appears_whole_and_a_finished_one_is_kept(tmp_path):
    d = tmp_path / "cache" / "hf"
    with atomic_directory(d) as tmp:
        (tmp / "config.json").write_text("{}")
        assert not d.exists()
    assert (d / "config.json").read_text() == "{}"
    with atomic_directory(d) as tmp:  # another writer finished first: its copy stands
        (tmp / "config.json").write_text('{"late": 1}')
    assert (d / "config.json").read_text() == "{}"
    with atomic_directory(d, replace=True) as tmp:
        (tmp / "config.json").write_text('{"new": 1}')
    assert json.loads((d / "config.json").read_text()) == {"new": 1}
    with pytest.raises(OSError), atomic_directory(tmp_path / "failed") as tmp:
        raise OSError("disk full")
    assert (
        sorted(x.name for x in (tmp_path / "cache").iterdir()) == ["hf"]
        and not (tmp_path / "failed").exists()
    )
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cache"]
    assert os.listdir(tmp_path / "cache" / "hf") == ["config.json"]
