"""The keeper of a sandbox's work dir: run as a script (``python -I -S -B _sandbox_keeper.py SPEC``), stdlib only.

It enters a new user + mount namespace, maps ``inner_uid`` (and the same gid) to the caller's own uid and
gid (the one mapping an unprivileged process may write; ``setgroups`` denied first), makes every mount
private, mounts a tmpfs on ``workdir`` (``size=<size_mb>m``, ``nr_inodes=<inodes>``, mode 0700, owned by
``inner_uid``, ``nosuid,nodev``), prints ``ready`` and waits for its stdin to close. Meanwhile the parent
(:class:`gymllm.tools.sandbox_workdir.WorkDir`) opens the namespaces and the tmpfs's root through
``/proc/<pid>/``; those descriptors keep both alive after this process exits. Any failure is printed as
one line (``error: ...``) instead of ``ready``.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 16384, 1 << 18


def _fail(what: str) -> None:
    err = ctypes.get_errno()
    sys.stdout.write(f"error: {what}: {os.strerror(err) if err else 'failed'}\n")
    sys.stdout.flush()
    os._exit(1)


def main() -> None:
    spec = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid, inner = os.geteuid(), os.getegid(), int(spec["inner_uid"])
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        _fail("unshare(CLONE_NEWUSER | CLONE_NEWNS)")
    try:
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{inner} {uid} 1"),
            ("gid_map", f"{inner} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError as e:
        sys.stdout.write(f"error: writing the id maps: {e}\n")
        sys.stdout.flush()
        os._exit(1)
    if libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None) != 0:
        _fail("making the mounts private")
    options = f"size={int(spec['size_mb'])}m,nr_inodes={int(spec['inodes'])},mode=0700,uid={inner},gid={inner}"
    if (
        libc.mount(
            b"tmpfs",
            os.fsencode(spec["workdir"]),
            b"tmpfs",
            ctypes.c_ulong(MS_NOSUID | MS_NODEV),
            options.encode(),
        )
        != 0
    ):
        _fail("mounting the tmpfs")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.buffer.read()


if __name__ == "__main__":
    main()
