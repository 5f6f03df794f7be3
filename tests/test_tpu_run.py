"""scripts/tpu_run.sh on the CPU, with a small stand-in bundle (no wheels: the test environment has
gymllm's dependencies already): call 1 stashes its piece, call 2 reassembles the file from its own
piece and the stashed one into $GYMLLM_CACHE; an unknown part fails with the list of parts."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import offline_bundle as ob  # noqa: E402


def _run(tmp: pathlib.Path, bundle: pathlib.Path, *parts: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OUT": str(tmp / "out"),
        "GYMLLM_BUNDLE": str(bundle),
        "GYMLLM_STASH": str(tmp / "stash"),
        "GYMLLM_CACHE": str(tmp / "cache"),
        "GYMLLM_SITE": str(tmp / "site"),
        "GYMLLM_TUNIX_SITE": str(tmp / "tunix-site"),
    }
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "tpu_run.sh"), *parts],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_two_calls_stash_then_reassemble_and_a_bad_part_is_named(tmp_path):
    src = tmp_path / "m.gguf"
    src.write_bytes(os.urandom(5000))
    whole = tmp_path / "whole"
    m = ob.split_file(src, whole, max_piece_bytes=3000, target="models/m/m.gguf")
    calls = []
    for piece in m["pieces"]:  # each call carries the manifest and one piece
        d = tmp_path / f"call-{piece['file']}" / "model"
        d.mkdir(parents=True)
        for name in ("manifest.json", piece["file"]):
            (d / name).write_bytes((whole / name).read_bytes())
        calls.append(d.parent)
    # the first call holds one piece: setup (no model) still succeeds, the model is not there yet
    first = _run(tmp_path, calls[0], "stash", "setup")
    assert first.returncode == 0, first.stdout + first.stderr
    assert (tmp_path / "stash" / m["pieces"][0]["file"]).is_file()
    assert not (tmp_path / "cache" / "models/m/m.gguf").exists()
    second = _run(tmp_path, calls[1], "setup", "model")
    assert second.returncode == 0, second.stdout + second.stderr
    assert (tmp_path / "cache" / "models/m/m.gguf").read_bytes() == src.read_bytes()
    log = (tmp_path / "out" / "setup.log").read_text()
    assert "importable already" in log and "devices: cpu" in log and "setup: exit 0" in log
    bad = _run(tmp_path, calls[1], "setup", "bogus")
    assert (
        bad.returncode == 1
        and "unknown part 'bogus': expected stash, setup, model, tests" in bad.stdout
    )


def test_the_peers_part_is_listed_and_without_a_peer_bundle_says_what_to_carry(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    usage = _run(tmp_path, bundle)
    assert usage.returncode == 2 and "peers        gymllm against Tunix" in usage.stdout
    done = _run(tmp_path, bundle, "setup", "peers")
    assert done.returncode == 1, done.stdout + done.stderr
    log = (tmp_path / "out" / "peers.log").read_text()
    assert "no " + str(bundle / "peer-tunix") in log and "build --peer tunix" in log
    assert "peers: exit 1" in (tmp_path / "out" / "setup.log").read_text()
    bad = _run(tmp_path, bundle, "bogus")
    assert "profile, limits or peers" in bad.stdout


def test_the_suite_and_lockstep_parts_run_their_benchmarks_with_the_given_args(
    tmp_path, monkeypatch
):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    usage = _run(tmp_path, bundle)
    assert "suite        benchmarks/suite.py" in usage.stdout
    assert "lockstep     benchmarks/selfplay.py" in usage.stdout
    monkeypatch.setenv("SUITE_ARGS", "--help")
    monkeypatch.setenv("LOCKSTEP_ARGS", "--help")
    done = _run(tmp_path, bundle, "suite", "lockstep")
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "out"
    assert "--full-sizes" in (out / "suite.log").read_text()  # suite.py's own help
    assert "--piggyback-tokens" in (out / "lockstep.log").read_text()  # selfplay.py's own help
    log = (out / "setup.log").read_text()
    assert "suite: exit 0" in log and "lockstep: exit 0" in log
