"""Crash safety of a run directory: rewinding step-indexed logs at resume (unit), and a short crash drill
(real `gymllm train` processes SIGKILLed at a checkpoint write and at a log write, then resumed): every
trained group logged once, steps contiguous, nothing torn, final weights equal to an uninterrupted run's.
The full drill (>= 20 kills) is `python benchmarks/drill_crash.py` and the slow test below."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from gymllm.telemetry.run_log import read_jsonl, rewind_jsonl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import drill_crash  # noqa: E402


def _write(p: pathlib.Path, rows: list[dict], tail: str = "") -> None:
    p.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_rewind_keeps_the_restored_lineage_and_sets_the_rest_aside(tmp_path):
    p = tmp_path / "metrics.jsonl"
    rows = [
        {"step": s, "loss": s / 10} for s in (1, 2, 3, 4, 3)
    ]  # a killed run had logged 3 and 4, then 3 again
    _write(p, rows, tail='{"step": 5, "lo')  # torn by the kill
    rep = rewind_jsonl(p, step=2)
    assert (rep.kept, rep.lost, rep.torn) == (2, 3, 1)
    kept, torn = read_jsonl(p)
    assert [r["step"] for r in kept] == [1, 2] and torn == []
    lost, _ = read_jsonl(tmp_path / "metrics.lost.jsonl")
    assert [r.get("step") for r in lost] == [3, 4, 3, None] and all(
        r["rewound_to"] == 2 for r in lost
    )
    assert lost[-1]["torn"] == '{"step": 5, "lo'  # nothing is deleted
    assert rewind_jsonl(p, step=2).lost == 0  # idempotent
    assert (
        rewind_jsonl(tmp_path / "absent.jsonl", step=0).kept == 0
        and not (tmp_path / "absent.jsonl").exists()
    )


def test_rewind_to_zero_after_a_kill_before_the_first_checkpoint(tmp_path):
    p = tmp_path / "trajectories.jsonl"
    _write(p, [{"step": 1, "trajectory_id": "g0/m0"}])
    assert rewind_jsonl(p, step=0).lost == 1 and read_jsonl(p) == ([], [])


def _check(result: dict) -> None:
    assert (
        result["lost_groups"] == 0
        and result["duplicated_groups"] == 0
        and result["torn_records"] == 0
    ), result
    assert result["steps_ok"] and result["short_groups"] == 0, result
    assert result["weights_match"], result


@pytest.mark.slow  # a drill: kills a process or a node
def test_short_crash_drill_kills_at_a_checkpoint_write_and_a_log_write(tmp_path, monkeypatch):
    monkeypatch.setattr(drill_crash, "KINDS", ("checkpoint", "log"))
    result = drill_crash.run_drill(tmp_path, kills=2, steps=4, seed=1, log=lambda *_: None)
    assert result["kills"] == 2 and set(result["kill_kinds"]) <= {"checkpoint", "log", "finished"}
    _check(result)


@pytest.mark.slow
def test_full_crash_drill(tmp_path):
    _check(drill_crash.run_drill(tmp_path, kills=20, steps=40, seed=0, log=lambda *_: None))
