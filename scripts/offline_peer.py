"""A benchmark peer (Tunix) for an offline machine: its wheels the machine's index lacks, built here,
installed there into a directory of its own (``benchmarks/peers.py --peer-site tunix=DIR``).

The peer cannot share gymllm's site: Tunix's omegaconf needs antlr4-python3-runtime 4.9, gymllm's
math-verify 4.13. So ``build --peer tunix`` resolves ``benchmarks/peers/requirements-tunix.txt``
against the machine's index (the same ``/opt/pypi/simple`` as here) with ``pip install --dry-run``,
downloads whatever is missing (a wheel; a pure-Python sdist is built into one), and repeats until
it resolves; ``.offline/peer-tunix/`` then holds those wheels and ``manifest.json`` (the
requirements, each wheel's sha256, and the full resolution for the record). ``install-peer`` on the
machine checks the wheels and installs every package of that resolution but the preinstalled JAX,
each pinned and ``--no-deps`` (pip never resolves there, never replaces JAX), from its index and the
carried wheels into the target; a marker file makes a second call a no-op.

The machine side (:func:`install_peer`) uses only the standard library and pip.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from offline_bundle import PREINSTALLED, REPO, BundleError, pip, requirement_name, sha256_of

PEERS_DIR = REPO / "benchmarks" / "peers"
PEERS = ("tunix",)  # the peers an offline machine can run (TRL needs CUDA or a CPU torch build)
MANIFEST = "manifest.json"
MARKER = ".gymllm-peer-installed"
#: the most rounds of download-then-resolve ``build`` does before it gives up
MAX_ROUNDS = 40
_MISSING = re.compile(r"No matching distribution found for (\S+)")
_CAUSE = re.compile(r"^\s+(\S+) \S+ depends on ([A-Za-z0-9][A-Za-z0-9._-]*)", re.M)
PUBLIC_INDEX = "https://pypi.org/simple"


def peer_requirements(peer: str, directory: pathlib.Path = PEERS_DIR) -> list[str]:
    """The pins of ``requirements-<peer>.txt`` (comments and blank lines dropped)."""
    if peer not in PEERS:
        raise BundleError(f"expected a peer among {PEERS}, received {peer!r}. Fix: --peer tunix")
    path = directory / f"requirements-{peer}.txt"
    lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return [ln for ln in lines if ln]


def missing_requirement(pip_output: str) -> str | None:
    """The requirement pip could not find (``No matching distribution found for X``), or None."""
    m = _MISSING.search(pip_output)
    return m.group(1) if m else None


def conflicting_names(pip_output: str) -> list[str]:
    """The packages in pip's ``The conflict is caused by:`` lines (``a 1.0 depends on b<2``: a, b)."""
    names: list[str] = []
    for a, b in _CAUSE.findall(pip_output):
        for n in (requirement_name(a), requirement_name(b)):
            if n not in names:
                names.append(n)
    return names


def resolve_cmd(
    requirements: list[str], *, index: str, links: pathlib.Path, report: pathlib.Path
) -> list[str]:
    """``pip install --dry-run`` of ``requirements`` against ``index`` plus the wheels in ``links``,
    Python 3.11 binaries only, its resolution written to ``report`` (pip's JSON install report)."""
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--isolated",
        "--disable-pip-version-check",
        "--dry-run",
        "--ignore-installed",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--index-url",
        index,
        "--find-links",
        str(links),
        "--target",
        str(report.parent / "target"),
        "--report",
        str(report),
        *requirements,
    ]


def resolved(report: dict[str, Any]) -> dict[str, str]:
    """name -> version of every package in a pip install report."""
    return {
        requirement_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]
    }


def resolve(
    requirements: list[str], *, index: str, links: pathlib.Path
) -> tuple[dict[str, str] | None, str]:
    """One dry-run resolution: (name -> version, "") when it resolves, else (None, pip's output)."""
    with tempfile.TemporaryDirectory(prefix="gymllm-resolve-") as tmp:
        report = pathlib.Path(tmp) / "report.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = "/dev/null"  # the machine's index only, as there
        proc = subprocess.run(
            resolve_cmd(requirements, index=index, links=links, report=report),
            capture_output=True,
            text=True,
            env=env,
        )
        if proc.returncode != 0:
            return None, proc.stdout + proc.stderr
        return resolved(json.loads(report.read_text())), ""


def fetch_wheel(requirement: str, dest: pathlib.Path) -> None:
    """A Python 3.11 wheel of ``requirement`` from the public index into ``dest``; where only an
    sdist exists (antlr4-python3-runtime 4.9.3), a wheel built from it."""
    try:
        pip(
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "-d",
            str(dest),
            requirement,
        )
    except subprocess.CalledProcessError:
        pip("wheel", "--no-deps", "-w", str(dest), requirement)


def wheel_manifest(
    peer: str, requirements: list[str], wheels: pathlib.Path, resolution: dict[str, str]
) -> dict[str, Any]:
    """What ``install-peer`` reads: the peer, its requirements, each carried wheel's sha256, the
    resolution found here, and the packages never installed (the machine's own JAX)."""
    return {
        "peer": peer,
        "requirements": list(requirements),
        "wheels": {p.name: sha256_of(p) for p in sorted(wheels.glob("*.whl"))},
        "resolution": dict(sorted(resolution.items())),
        "preinstalled": list(PREINSTALLED),
    }


def build_peer(peer: str, out: pathlib.Path, index: str) -> dict[str, Any]:
    """``out/peer-<peer>/``: the wheels the index lacks for the peer's requirements (download, resolve,
    repeat) and the manifest. Returns the manifest."""
    requirements = peer_requirements(peer)
    dest = out / f"peer-{peer}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    public: dict[str, str] | None = None  # the public index's resolution, once a conflict needs it
    for _ in range(MAX_ROUNDS):
        resolution, log = resolve(requirements, index=index, links=dest)
        if resolution is not None:
            manifest = wheel_manifest(peer, requirements, dest, resolution)
            (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            return manifest
        req = missing_requirement(log)
        if req is None and conflicting_names(log):
            # the index's only version of a dependency conflicts (transformers 5.17 needs safetensors
            # >= 0.8, Tunix < 0.8): carry the versions the public index resolves to (a peer venv's)
            if public is None:
                public, why = resolve(requirements, index=PUBLIC_INDEX, links=dest)
                if public is None:
                    raise BundleError(
                        f"build --peer {peer}: the public index does not resolve it: {why[-1500:]}"
                    )
            have = {
                requirement_name(w.name.split("-")[0]) + "==" + w.name.split("-")[1]
                for w in dest.glob("*.whl")
            }
            new = [f"{n}=={public[n]}" for n in conflicting_names(log) if n in public]
            req = next(
                (r for r in new if requirement_name(r) + "==" + r.split("==")[1] not in have), None
            )
        if req is None:
            raise BundleError(
                f"build --peer {peer}: expected pip to resolve {requirements} or name a missing "
                f"distribution; it failed otherwise: {log[-1500:]}"
            )
        print(f"build --peer {peer}: the index lacks {req}; fetching a wheel", flush=True)
        fetch_wheel(req, dest)
    raise BundleError(
        f"build --peer {peer}: still unresolved after {MAX_ROUNDS} downloads. Fix: raise MAX_ROUNDS"
    )


def read_peer_manifest(bundle: pathlib.Path) -> dict[str, Any]:
    """The bundle's manifest, with every wheel it names present and matching its sha256."""
    path = bundle / MANIFEST
    fix = "Fix: carry .offline/peer-tunix (python scripts/offline_bundle.py build --peer tunix writes it)"
    try:
        m = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BundleError(
            f"expected a peer manifest at {path}, could not read it ({e}). {fix}"
        ) from None
    keys = ("peer", "requirements", "wheels", "resolution", "preinstalled")
    missing = [k for k in keys if k not in m]
    if missing:
        raise BundleError(f"{path}: expected {', '.join(keys)}; missing {missing}")
    for name, digest in m["wheels"].items():
        p = bundle / name
        got = sha256_of(p) if p.is_file() else "absent"
        if got != digest:
            raise BundleError(f"{p}: expected a wheel with sha256 {digest}, received {got}. {fix}")
    return m


def install_peer(bundle: pathlib.Path, target: pathlib.Path, index: str) -> list[str]:
    """Every package of the manifest's resolution (made here against the same index) but the
    preinstalled ones, each pinned and ``--no-deps``, from the machine's index and the carried wheels
    into ``target``; a second call with the same manifest is a no-op. Returns the pins installed
    (empty when there was nothing to do)."""
    m = read_peer_manifest(bundle)
    marker = target / MARKER
    stamp = hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()
    if marker.is_file() and marker.read_text().strip() == stamp:
        print(f"install-peer: {target} already holds this {m['peer']} bundle", flush=True)
        return []
    skip = {requirement_name(n) for n in m["preinstalled"]}
    pins = [f"{n}=={v}" for n, v in sorted(m["resolution"].items()) if n not in skip]
    target.mkdir(parents=True, exist_ok=True)
    try:
        pip(
            "install",
            "--isolated",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "--no-deps",
            "--only-binary=:all:",
            "--index-url",
            index,
            "--find-links",
            str(bundle),
            "--target",
            str(target),
            *pins,
        )
    except subprocess.CalledProcessError as e:
        raise BundleError(
            f"install-peer: expected {index} and {bundle} to hold every pin of the manifest's "
            f"resolution, pip exited {e.returncode} (its message is above). Fix: rebuild the bundle "
            f"against this index (python scripts/offline_bundle.py build --peer {m['peer']} --index "
            f"{index}) and carry it"
        ) from None
    marker.write_text(stamp + "\n")
    return pins
