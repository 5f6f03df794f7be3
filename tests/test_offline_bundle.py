"""scripts/offline_bundle.py without a network or a chip: the lists agree with pyproject.toml, a file
split into pieces reassembles byte for byte into the cache (pieces from several directories, as from
several calls), and a missing or corrupt piece is a clear error naming it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import offline_bundle as ob  # noqa: E402


def test_the_offline_lists_agree_with_pyproject():
    deps = ob.runtime_dependencies()
    assert ob.check_against_pyproject(deps) == []
    names = {ob.requirement_name(d) for d in deps}
    asked = {ob.requirement_name(r) for r in ob.index_requirements(deps)}
    assert not asked & (set(ob.NOT_ON_INDEX) | set(ob.PREINSTALLED))  # never asked of the index
    assert names - set(ob.CARRIED) - set(ob.PREINSTALLED) <= asked  # every other dependency is
    # the check can fail: a dependency gymllm dropped, and a pin outside pyproject's range
    assert any(
        "no longer list" in p
        for p in ob.check_against_pyproject([d for d in deps if not d.startswith("tyro")])
    )
    bumped = [("tyro>=99" if d.startswith("tyro") else d) for d in deps]
    assert any("outside pyproject" in p for p in ob.check_against_pyproject(bumped))


@pytest.fixture
def blob(tmp_path):
    data = os.urandom(10_000) + b"tail"
    src = tmp_path / "model.gguf"
    src.write_bytes(data)
    return src, data


def test_split_then_reassemble_from_two_calls_is_byte_exact(tmp_path, blob):
    src, data = blob
    m = ob.split_file(src, tmp_path / "bundle", max_piece_bytes=4096, target="models/m/model.gguf")
    assert [p["size"] for p in m["pieces"]] == [3335, 3335, 3334] and m["size"] == len(data)
    assert json.loads((tmp_path / "bundle" / "manifest.json").read_text()) == m
    # call 1 carries piece 0 and stashes it; call 2 carries the others
    call1, call2, stash_dir = tmp_path / "c1", tmp_path / "c2", tmp_path / "stash"
    for d, names in (
        (call1, [m["pieces"][0]["file"]]),
        (call2, [p["file"] for p in m["pieces"][1:]]),
    ):
        d.mkdir()
        for n in ["manifest.json", *names]:
            (d / n).write_bytes((tmp_path / "bundle" / n).read_bytes())
    assert ob.stash(call1 / "manifest.json", call1, stash_dir) == [m["pieces"][0]["file"]]
    cache = tmp_path / "cache"
    out = ob.reassemble(call2 / "manifest.json", [call2, stash_dir], cache)
    assert out == cache / "models/m/model.gguf" and out.read_bytes() == data
    assert (
        ob.reassemble(call2 / "manifest.json", [], cache) == out
    )  # in place already: no pieces needed


def test_a_missing_or_corrupt_piece_is_named(tmp_path, blob):
    src, _ = blob
    m = ob.split_file(src, tmp_path / "b", max_piece_bytes=6000, target="models/m/model.gguf")
    first, second = (tmp_path / "b" / p["file"] for p in m["pieces"])
    second.unlink()
    with pytest.raises(ob.BundleError, match=rf"missing \['{second.name}'\].*Fix: carry"):
        ob.reassemble(tmp_path / "b" / "manifest.json", [tmp_path / "b"], tmp_path / "cache")
    first.write_bytes(b"x" + first.read_bytes()[1:])  # one byte flipped
    with pytest.raises(
        ob.BundleError, match=rf"piece .*{first.name}: expected 5002 bytes with sha256"
    ):
        ob.reassemble(tmp_path / "b" / "manifest.json", [tmp_path / "b"], tmp_path / "cache")
    assert not (tmp_path / "cache" / "models/m/model.gguf").exists()


def test_the_command_line_reports_a_missing_manifest_with_the_fix(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "offline_bundle.py"),
            "reassemble",
            "--manifest",
            str(tmp_path / "none.json"),
            "--cache",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert (
        "expected a manifest (JSON)" in proc.stderr
        and "Fix: carry .offline/model/manifest.json" in proc.stderr
    )
