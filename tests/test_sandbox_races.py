"""The escape corpus, fourth pass (issue 43): races on the parent's own file access, one sandbox reaching
another, shared per-uid limits, the disk cap on files without names, undecodable text.

Every race is FORCED, not timed: ``gymllm.tools.sandbox_fs.race_hook`` runs the swap at the exact point
between the parent's path check and its open (or while the tree removal is inside a directory), and the
concurrent-use tests start a run, wait until it is going (``Sandbox.running``) and then act; their
assertions hold whatever the scheduling.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import os
import struct
import tempfile
import threading

import pytest

from gymllm.errors import ToolError
from gymllm.tools import Sandbox, SandboxConfig, sandbox_fs
from gymllm.tools.sandbox_workdir import INNER_UID

CFG = SandboxConfig(timeout_s=8, memory_mb=256, max_processes=24, max_output_bytes=4000)
LIBC = ctypes.CDLL(None, use_errno=True)
RENAME_EXCHANGE = 2
SECRET = "outside-secret-Zt8"


def _exchange(dir_fd: int, a: str, b: str) -> None:
    """``renameat2(RENAME_EXCHANGE)``: swap two names atomically, as hostile code would."""
    if LIBC.renameat2(dir_fd, a.encode(), dir_fd, b.encode(), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")


@pytest.fixture
def outside():
    d = tempfile.mkdtemp(prefix="gymllm-outside-")
    with open(os.path.join(d, "f.txt"), "w") as f:
        f.write(SECRET)
    yield d
    for name in os.listdir(d):
        os.remove(os.path.join(d, name))
    os.rmdir(d)


@pytest.fixture
def hook(monkeypatch):
    """Install a one-shot race hook for an event; returns the list of (event, name) it fired on."""
    fired: list[tuple[str, str]] = []

    def install(event: str, action):
        def race(ev, dir_fd, name):
            if ev == event and not fired:
                fired.append((ev, name))
                action(dir_fd, name)

        monkeypatch.setattr(sandbox_fs, "race_hook", race)

    install.fired = fired
    return install


@pytest.fixture(params=["openat2", "walk"])
def resolution(request, monkeypatch):
    if request.param == "openat2" and not sandbox_fs.openat2_available():
        pytest.skip("this kernel has no openat2 (Linux < 5.6)")
    monkeypatch.setattr(sandbox_fs, "USE_OPENAT2", request.param == "openat2")
    return request.param


def _swap_ready(box: Sandbox, outside: str) -> None:
    box.write_files({"d/f.txt": "inside"})
    res = box.run_shell(f"ln -s {outside} l && echo linked")
    assert "linked" in res.stdout, res.stderr


# -- class 2: read_file through a directory swapped for a link between check and open ---------------
def test_read_file_refuses_a_directory_swapped_for_a_link(outside, hook, resolution):
    with Sandbox(CFG) as box:
        _swap_ready(box, outside)
        assert box.read_file("d/f.txt") == "inside"  # control: no swap, the file is read
        hook("open", lambda dir_fd, name: _exchange(dir_fd, "d", "l"))
        with pytest.raises(ToolError, match="link"):
            box.read_file("d/f.txt")
        assert hook.fired == [("open", "d/f.txt")]
        # the swap did redirect a by-name open: the unguarded path reads the secret
        with open(f"/proc/self/fd/{box._dir.fd}/d/f.txt") as f:
            assert f.read() == SECRET


# -- class 3: write_files through the same swap (before the parents are made, and before the open) ---
@pytest.mark.parametrize("event", ["parents", "open"])
def test_write_files_refuses_a_directory_swapped_for_a_link(outside, hook, resolution, event):
    with Sandbox(CFG) as box:
        _swap_ready(box, outside)
        hook(event, lambda dir_fd, name: _exchange(dir_fd, "d", "l"))
        with pytest.raises(ToolError, match="link"):
            box.write_files({"d/f.txt": "overwritten"})
        assert hook.fired
        with open(os.path.join(outside, "f.txt")) as f:
            assert f.read() == SECRET
        assert sorted(os.listdir(outside)) == ["f.txt"]


def test_paths_leaving_the_work_dir_are_refused_before_any_open():
    with Sandbox(CFG) as box:
        for bad in ("../x", "a/../../x", "/etc/passwd", "", "."):
            with pytest.raises(ToolError):
                box.read_file(bad)
            with pytest.raises(ToolError):
                box.write_files({bad: "x"})


# -- class 1: close() while a run of the same sandbox goes on; the removal never climbs -------------
MOVER = """
import os
os.makedirs("a/b/c/d", exist_ok=True)
i = 0
while True:  # moves directories up and back down, as fast as it can, until killed
    try:
        os.rename("a/b/c", "c%d" % i)
        os.rename("c%d" % i, "a/b/c")
    except OSError:
        pass
    i += 1
"""


@pytest.fixture
def temp_parent(monkeypatch):
    """The work dir's parent is a directory of the test's, holding a canary the removal must leave alone."""
    parent = tempfile.mkdtemp(prefix="gymllm-parent-")
    with open(os.path.join(parent, "canary"), "w") as f:
        f.write("alive")
    monkeypatch.setattr(tempfile, "tempdir", parent)
    yield parent
    os.remove(os.path.join(parent, "canary"))
    os.rmdir(parent)


@pytest.mark.parametrize("namespaces", [True, False])
def test_close_during_a_run_kills_it_first_and_waits(temp_parent, namespaces):
    box = Sandbox(SandboxConfig(timeout_s=60, namespaces=namespaces))
    out = {}
    runner = threading.Thread(
        target=lambda: out.setdefault("res", box.run_python(MOVER)), daemon=True
    )
    runner.start()
    assert _wait_for(box), "the run never started"
    workdir = box.workdir
    box.close()
    runner.join(timeout=30)
    assert not runner.is_alive() and "closed during the run" in out["res"].stderr, out
    assert not out["res"].timed_out
    assert sorted(os.listdir(temp_parent)) == ["canary"] and not os.path.exists(workdir)
    with open(os.path.join(temp_parent, "canary")) as f:
        assert f.read() == "alive"
    with pytest.raises(ToolError, match="closed"):
        box.read_file("a")


def _wait_for(box: Sandbox) -> bool:
    """Wait until a run of ``box`` is going (its process started); no assertion depends on how long."""
    for _ in range(3000):
        if box.running:
            return True
        threading.Event().wait(0.01)
    return False


def test_the_removal_never_climbs_out_of_a_directory_moved_up_while_inside(
    temp_parent, monkeypatch
):
    """Plain-directory work dir (no tmpfs): the tree is emptied by descriptors. Moving the directory being
    emptied up to the top, at the moment the removal is inside it, neither stops the removal nor takes it
    past the work dir (a walk climbing back by ``..`` would land in the work dir's parent)."""
    box = Sandbox(SandboxConfig(timeout_s=8, namespaces=False))
    res = box.run_shell(
        "mkdir -p a/b/c/d/e && touch a/b/c/d/e/f a/b/c/g && chmod 0 a/b/c/d && echo made"
    )
    assert "made" in res.stdout, res.stderr
    root, fired = box._dir.fd, []

    def race(event, dir_fd, name):
        if event == "descend" and name == "c" and not fired:
            fired.append(os.fstat(dir_fd).st_ino)
            os.rename(
                "a/b/c", "moved", src_dir_fd=root, dst_dir_fd=root
            )  # what the hostile code did
            assert (
                os.fstat(dir_fd).st_ino == fired[0]
            )  # the removal holds c itself, wherever it now is

    monkeypatch.setattr(sandbox_fs, "race_hook", race)
    workdir = box.workdir
    box.close()
    assert fired, "the removal never entered a/b/c"
    assert sorted(os.listdir(temp_parent)) == ["canary"] and not os.path.exists(workdir)


def test_empty_dir_handles_any_depth_with_bounded_descriptors():
    with Sandbox(SandboxConfig(timeout_s=20, namespaces=False)) as box:
        depth = 4 * sandbox_fs.MAX_DEPTH + 3
        code = f"import os\nfor i in range({depth}):\n    os.mkdir('d')\n    os.chdir('d')\nos.chmod('.', 0)"
        res = box.run_argv(["python", "-I", "-S", "-c", code])
        assert res.ok, res.stderr
        box.clear()
        assert box.listdir() == []


def test_runs_and_file_helpers_of_one_sandbox_never_overlap():
    with Sandbox(SandboxConfig(timeout_s=20)) as box:
        code = "import time\nopen('log', 'a').write('start ')\ntime.sleep(0.1)\nopen('log', 'a').write('end ')"
        threads = [
            threading.Thread(target=box.run_python, args=(code,), daemon=True) for _ in range(3)
        ]
        for t in threads:
            t.start()
        assert _wait_for(box)
        late = "import time\ntime.sleep(0.2)\nopen('late', 'w').write('written at the end')"

        async def cancelled():
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(box.arun_python(late), 0.05)  # the run goes on in its thread

        asyncio.run(cancelled())
        for t in threads:
            t.join(timeout=30)
        # the helper waits for every run in progress: it never sees the file missing or half the log
        assert box.read_file("late") == "written at the end"
        assert box.read_file("log") == "start end " * 3


# -- classes 4 and 5: locks, inotify and names between sandboxes; the shared per-uid inotify limit -----
LOCKS = """
import ctypes, errno, fcntl, os, struct
lib = ctypes.CDLL(None, use_errno=True)
def code(e):
    return errno.errorcode.get(e.errno, str(e.errno))
out = []
fd = os.open({path!r}, os.O_RDONLY)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); out.append("flock-ok")
except OSError as e:
    out.append("flock-" + code(e))
for name, cmd, kind in (("setlk", fcntl.F_SETLK, fcntl.F_RDLCK), ("getlk", fcntl.F_GETLK, fcntl.F_WRLCK),
                        ("ofdgetlk", 36, fcntl.F_WRLCK), ("lease", 1024, fcntl.F_RDLCK), ("notify", 1026, 0)):
    try:
        arg = struct.pack("hhqqi", kind, 0, 0, 0, 0) if name != "lease" and name != "notify" else kind
        fcntl.fcntl(fd, cmd, arg); out.append(name + "-ok")
    except OSError as e:
        out.append(name + "-" + code(e))
for name in ("inotify_init1", "fanotify_init"):
    r = getattr(lib, name)(0, 0) if name == "fanotify_init" else lib.inotify_init1(0)
    out.append(name + ("-ok" if r >= 0 else "-" + errno.errorcode.get(ctypes.get_errno(), "?")))
n = sum(1 for _ in range(200) if lib.inotify_init1(0) >= 0)
out.append("instances-%d" % n)
print("RESULT", " ".join(out))
"""


@pytest.mark.parametrize("mode", ["python", "shell"])
def test_locks_notifications_and_inotify_carry_nothing_between_sandboxes(mode):
    shared = tempfile.mkdtemp(prefix="gymllm-shared-")
    path = os.path.join(shared, "stdlib-like.py")
    with open(path, "w") as f:
        f.write("x = 1\n")
    held = os.open(path, os.O_RDWR)
    try:  # the host (standing in for another sandbox) holds every kind of lock on a file both can read
        fcntl.flock(held, fcntl.LOCK_EX)
        fcntl.fcntl(held, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
        with Sandbox(SandboxConfig(timeout_s=8, read_paths=(shared,))) as box:
            code = LOCKS.format(path=path)
            res = (
                box.run_python(code)
                if mode == "python"
                else box.run_argv(["python", "-I", "-S", "-c", code])
            )
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
        assert line, res.stderr
        got = line[0].split()[1:]
        # a real lock would answer EWOULDBLOCK / EAGAIN and F_GETLK would describe the host's lock
        assert got == [
            "flock-ok",
            "setlk-ok",
            "getlk-ENOLCK",
            "ofdgetlk-ENOLCK",
            "lease-EPERM",
            "notify-EPERM",
            "inotify_init1-EPERM",
            "fanotify_init-EPERM",
            "instances-0",
        ], got
    finally:
        os.close(held)
        os.remove(path)
        os.rmdir(shared)
    host = LIBC.inotify_init1(os.O_CLOEXEC)  # the parent's own inotify still works (class 5)
    assert host >= 0, os.strerror(ctypes.get_errno())
    os.close(host)


def test_the_code_runs_as_its_own_unprivileged_uid_without_capabilities():
    with Sandbox(CFG) as box:
        if box._dir.kind != "tmpfs":
            pytest.skip(f"no user namespace for the work dir here ({box._dir.reason})")
        code = (
            "import os\nst = open('/proc/self/status').read()\n"
            "print(os.getuid(), os.getgid(), st.split('CapEff:')[1].split()[0])"
        )
        for res in (box.run_python(code), box.run_argv(["python", "-I", "-S", "-c", code])):
            assert res.stdout.split() == [str(INNER_UID), str(INNER_UID), "0000000000000000"], (
                res.stderr
            )


def test_another_sandboxs_work_dir_and_names_are_invisible():
    with Sandbox(CFG, files={"marker-b": "b"}) as b, Sandbox(CFG) as a:
        if b._dir.kind != "tmpfs":
            pytest.skip(f"no private tmpfs here ({b._dir.reason})")
        assert os.listdir(b.workdir) == []  # on the host, B's path is an empty directory
        fd = LIBC.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        assert fd >= 0
        try:  # nothing of the parent opens the host path while B runs (no disk poll by name)
            assert (
                LIBC.inotify_add_watch(fd, b.workdir.encode(), 0x20 | 0x01) >= 0
            )  # IN_OPEN | IN_ACCESS
            assert b.run_shell("ls; cat marker-b").stdout == "marker-b\nb"
            with pytest.raises(BlockingIOError):
                os.read(fd, 4096)
        finally:
            os.close(fd)
        code = (
            f"import os\ntry:\n    os.stat({b.workdir!r} + '/marker-b'); print('SEEN')\nexcept OSError as e:\n"
            f"    print('hidden', e.errno)\ntry:\n    print(os.listdir({b.workdir!r}))\nexcept OSError as e:\n"
            f"    print('refused', e.errno)"
        )
        res = a.run_python(code)
        assert "SEEN" not in res.stdout and "marker-b" not in res.stdout, res.stdout
        assert f"hidden {errno.ENOENT}" in res.stdout, (res.stdout, res.stderr)


# -- class 6: the disk cap counts what the code holds, named or not ------------------------------------
HOLD = """
import os
fd = {opener}
n = 0
try:
    for _ in range(48):
        os.write(fd, b"x" * (1 << 20))
        n += 1
    print("RESULT", n, "none")
except OSError as e:
    print("RESULT", n, e.errno)
"""


@pytest.mark.parametrize(
    "how,opener",
    [
        ("unlinked", 'os.open("x", os.O_CREAT | os.O_RDWR, 0o600); os.unlink("x")'),
        ("tmpfile", 'os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)'),
        (
            "sparse",
            '(lambda f: (os.ftruncate(f, 60 << 20), f)[1])(os.open("s", os.O_CREAT | os.O_RDWR, 0o600))',
        ),
    ],
)
def test_files_without_names_count_against_the_disk_cap(how, opener):
    cfg = SandboxConfig(timeout_s=20, max_file_mb=64, max_disk_mb=16)
    with Sandbox(cfg) as box:
        if box._dir.kind != "tmpfs":
            pytest.skip(
                f"no private tmpfs here ({box._dir.reason}): the cap is a poll of named files"
            )
        res = box.run_python(HOLD.format(opener=opener))
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
        assert line, res.stderr
        _, written, err = line[0].split()
        assert int(written) <= 16 and err == str(errno.ENOSPC), (how, line)
        assert res.isolation["disk_cap"] == "tmpfs (kernel)"
        if (
            how == "sparse"
        ):  # named and 60 MiB long: the written pages hold the tmpfs full, and the run says so
            assert box.disk_usage() <= 16 << 20 and "max_disk_mb=16" in res.stderr, res.stderr
        else:
            assert (
                box.disk_usage() < 1 << 20
            )  # the pages went with the last descriptor: nothing named is left


# -- class 7: read_file on bytes that are not UTF-8 --------------------------------------------------------
def test_read_file_returns_bytes_on_request_and_refuses_undecodable_text():
    with Sandbox(CFG, files={"bin": b"\xff\xfe\x00ok", "text": "héllo"}) as box:
        assert box.read_file("bin", binary=True) == b"\xff\xfe\x00ok"
        assert (
            box.read_file("text") == "héllo"
            and box.read_file("text", binary=True) == "héllo".encode()
        )
        with pytest.raises(ToolError, match="binary=True"):
            box.read_file("bin")
        with pytest.raises(ToolError, match="str or bytes"):
            box.write_files({"n": 3})


def test_write_files_past_the_disk_cap_is_a_clear_error():
    with Sandbox(SandboxConfig(timeout_s=8, max_disk_mb=2)) as box:
        if box.run_shell("true").isolation["disk_cap"] != "tmpfs (kernel)":
            pytest.skip("no private tmpfs here: the cap is a poll during runs")
        with pytest.raises(ToolError, match="max_disk_mb=2"):
            box.write_files({"big": b"x" * (3 << 20)})
