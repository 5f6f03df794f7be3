"""benchmarks/selfplay_learning.py records no figure from evaluation games that ended in an error: a game
that errored is scored as the failing side's loss, so its rates would measure the failure (a TPU run's
512 games a pairing all errored and read as 0.000 win-or-draw). It stops naming the most frequent error
and sets the games aside, so a rerun plays them again."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import selfplay_learning  # noqa: E402


def _row(seed: int, error: str | None) -> dict:
    return {
        "pairing": ["sft", "random"],
        "seed": seed,
        "players": {"player_1": "sft", "player_2": "random"},
        "winner": "random" if error else "sft",
        "scored": True,
        "error": error,
    }


def _done_eval(run_dir: pathlib.Path, rows: list[dict]) -> pathlib.Path:
    out = run_dir / "eval" / "sft"
    out.mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps({"config": {"games": len(rows)}}))
    (out / "games.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_rows_without_errors_are_returned_as_they_are(tmp_path):
    rows = [_row(i, None) for i in range(4)]
    _done_eval(tmp_path, rows)
    got = selfplay_learning.evaluate("tictactoe_selfplay", tmp_path, "sft", tmp_path / "sft", 4)
    assert got == rows
    assert selfplay_learning.errored(rows, "sft") is None


def test_errored_games_stop_the_benchmark_naming_the_most_frequent_error_and_are_set_aside(
    tmp_path,
):
    boom = "sft (player_1) failed: EngineError: the engine stopped"
    rows = [_row(0, None), _row(1, boom), _row(2, boom), _row(3, "sft (player_2) failed: other")]
    out = _done_eval(tmp_path, rows)
    with pytest.raises(SystemExit) as e:
        selfplay_learning.evaluate("tictactoe_selfplay", tmp_path, "sft", tmp_path / "sft", 4)
    msg = str(e.value)
    assert "3 of 4 evaluation games ended in an error" in msg
    assert f"2 with: {boom}" in msg and "checkpoint 'sft'" in msg
    assert not out.exists()  # a rerun evaluates again instead of reusing these rows
    failed = out.with_name("sft.failed")
    assert [json.loads(x) for x in (failed / "games.jsonl").read_text().splitlines()] == rows
    assert str(failed / "games.jsonl") in msg
