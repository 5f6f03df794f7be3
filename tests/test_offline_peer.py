"""scripts/offline_peer.py without a network or pip runs: the requirement and conflict parsing of
pip's output, the download-then-resolve loop of ``build --peer`` (pip stood in for), the manifest over
fake wheels, a missing or corrupt wheel named with the fix, and ``install-peer``'s pins from the
manifest's resolution (never the machine's JAX) and marker (a second call is a no-op)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import offline_bundle as ob  # noqa: E402
import offline_peer as op  # noqa: E402

CONFLICT = """ERROR: Cannot install google-tunix and google-tunix==0.1.7 because these package versions
have conflicting dependencies.

The conflict is caused by:
    google-tunix 0.1.7 depends on safetensors<0.8
    transformers 5.17.0 depends on safetensors>=0.8.0

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/...
"""


def test_the_tunix_requirements_are_pinned_and_jax_is_never_installed():
    reqs = op.peer_requirements("tunix")
    assert "google-tunix==0.1.7" in reqs and all("==" in r for r in reqs)
    assert {"jax", "jaxlib"} <= {ob.requirement_name(r) for r in reqs} and "jax" in ob.PREINSTALLED
    with pytest.raises(ob.BundleError, match="expected a peer among"):
        op.peer_requirements("verl")


def test_pip_output_parsing_names_the_missing_and_the_conflicting():
    out = (
        "ERROR: Could not find a version that satisfies the requirement dm-tree (from versions: none)\n"
        "ERROR: No matching distribution found for dm-tree"
    )
    assert op.missing_requirement(out) == "dm-tree"
    assert (
        op.missing_requirement("No matching distribution found for qwix>=0.1.6\n") == "qwix>=0.1.6"
    )
    assert op.missing_requirement(CONFLICT) is None
    assert op.conflicting_names(CONFLICT) == ["google-tunix", "safetensors", "transformers"]
    assert op.conflicting_names("ERROR: something else\n") == []


def _fake_wheel(d: pathlib.Path, name: str, version: str) -> pathlib.Path:
    p = d / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    p.write_bytes(f"{name} {version}".encode())
    return p


def test_build_fetches_until_it_resolves_then_writes_the_manifest(tmp_path, monkeypatch):
    """The index lacks google-tunix, then a conflict needs the public index's transformers: both are
    fetched, then the resolution's manifest lists the wheels with their sha256."""
    calls: list[str] = []

    def fake_resolve(requirements, *, index, links):
        names = {p.name.split("-")[0] for p in links.glob("*.whl")}
        if index == op.PUBLIC_INDEX:
            return {"google-tunix": "0.1.7", "transformers": "2.3.0", "safetensors": "0.7.0"}, ""
        if "google_tunix" not in names:
            return None, "ERROR: No matching distribution found for google-tunix==0.1.7"
        if "transformers" not in names:
            return None, CONFLICT
        return {"google-tunix": "0.1.7", "transformers": "2.3.0", "jax": "0.10.2"}, ""

    def fake_fetch(req, dest):
        calls.append(req)
        name, version = req.split("==")
        _fake_wheel(dest, name, version)

    monkeypatch.setattr(op, "resolve", fake_resolve)
    monkeypatch.setattr(op, "fetch_wheel", fake_fetch)
    m = op.build_peer("tunix", tmp_path, "file:///nowhere")
    # the conflict's packages at the public resolution's versions, one a round, those carried skipped
    assert calls == ["google-tunix==0.1.7", "safetensors==0.7.0", "transformers==2.3.0"]
    on_disk = json.loads((tmp_path / "peer-tunix" / op.MANIFEST).read_text())
    assert on_disk == m and m["peer"] == "tunix" and m["preinstalled"] == list(ob.PREINSTALLED)
    assert sorted(m["wheels"]) == [
        "google_tunix-0.1.7-py3-none-any.whl",
        "safetensors-0.7.0-py3-none-any.whl",
        "transformers-2.3.0-py3-none-any.whl",
    ]
    assert m["requirements"] == op.peer_requirements("tunix")


def test_build_stops_with_pips_message_when_nothing_can_be_fetched(tmp_path, monkeypatch):
    monkeypatch.setattr(op, "resolve", lambda *a, **k: (None, "ERROR: pip broke differently"))
    with pytest.raises(ob.BundleError, match="pip broke differently"):
        op.build_peer("tunix", tmp_path, "file:///nowhere")


def _bundle(tmp_path: pathlib.Path) -> pathlib.Path:
    b = tmp_path / "peer-tunix"
    b.mkdir()
    _fake_wheel(b, "google-tunix", "0.1.7")
    resolution = {"google-tunix": "0.1.7", "jax": "0.10.2", "grain": "0.2"}
    m = op.wheel_manifest("tunix", ["google-tunix==0.1.7", "jax==0.10.2"], b, resolution)
    (b / op.MANIFEST).write_text(json.dumps(m))
    return b


def test_a_missing_or_corrupt_wheel_is_named_with_the_fix(tmp_path):
    b = _bundle(tmp_path)
    assert op.read_peer_manifest(b)["peer"] == "tunix"
    wheel = b / "google_tunix-0.1.7-py3-none-any.whl"
    wheel.write_bytes(b"corrupt")
    with pytest.raises(ob.BundleError, match="google_tunix-0.1.7.*build --peer tunix"):
        op.read_peer_manifest(b)
    wheel.unlink()
    with pytest.raises(ob.BundleError, match="received absent"):
        op.read_peer_manifest(b)
    with pytest.raises(ob.BundleError, match="expected a peer manifest"):
        op.read_peer_manifest(tmp_path / "nowhere")


def test_install_peer_pins_all_but_jax_and_a_second_call_is_a_no_op(tmp_path, monkeypatch):
    b = _bundle(tmp_path)
    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(op, "pip", lambda *args: ran.append(args))
    target = tmp_path / "site"
    assert op.install_peer(b, target, "file:///idx") == ["google-tunix==0.1.7", "grain==0.2"]
    args = ran[0]
    assert "--no-deps" in args and args[args.index("--target") + 1] == str(target)
    assert args[args.index("--find-links") + 1] == str(b) and "jax==0.10.2" not in args
    assert args[args.index("--index-url") + 1] == "file:///idx" and "--isolated" in args
    assert (target / op.MARKER).is_file()
    assert op.install_peer(b, target, "file:///idx") == [] and len(ran) == 1
    # a different bundle installs again
    _fake_wheel(b, "qwix", "0.1.8")
    m = op.wheel_manifest("tunix", ["google-tunix==0.1.7"], b, {"qwix": "0.1.8"})
    (b / op.MANIFEST).write_text(json.dumps(m))
    assert op.install_peer(b, target, "file:///idx") == ["qwix==0.1.8"] and len(ran) == 2


def test_install_peer_whose_pins_the_index_lacks_says_rebuild(tmp_path, monkeypatch):
    b = _bundle(tmp_path)

    def failing_pip(*args):
        raise subprocess.CalledProcessError(1, ["pip", *args])

    monkeypatch.setattr(op, "pip", failing_pip)
    with pytest.raises(ob.BundleError, match="rebuild the bundle against this index"):
        op.install_peer(b, tmp_path / "site", "file:///idx")
    assert not (tmp_path / "site" / op.MARKER).exists()


def test_the_command_line_reports_a_missing_peer_bundle(tmp_path, capsys):
    rc = ob.main(
        ["install-peer", "--bundle", str(tmp_path / "none"), "--target", str(tmp_path / "t")]
    )
    assert rc == 2 and "build --peer tunix" in capsys.readouterr().err
