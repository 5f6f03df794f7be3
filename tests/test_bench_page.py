"""docs/benchmarks.md is generated from the benchmarks' records: the committed page is what
``benchmarks/results/render.py`` renders from ``benchmarks/results/*.jsonl``; every benchmark prints its
RESULT line through ``results.emit_result``, which appends the run's record (CPU, date, commit, command,
load); the renderer aggregates runs (median, range) and shows imported figures verbatim."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import results  # noqa: E402
from results import render  # noqa: E402

# wired by their owners at merge (their RESULT print is theirs to change)
NOT_YET_WIRED: set[str] = set()


def test_committed_page_is_what_the_records_render():
    text = render.PAGE.read_text()
    assert render.render_page(text, render.load_records()) == text, (
        "docs/benchmarks.md differs from the records: run python benchmarks/results/render.py (never edit the tables)"
    )


def test_render_script_check_mode_agrees(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# x\n\n<!-- BEGIN GENERATED: vector_env -->\nhand-typed 99x\n<!-- END GENERATED: vector_env -->\n"
    )

    def run(*a):
        return subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "results" / "render.py"),
                "--page",
                str(page),
                *a,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run("--check").returncode == 1  # a hand-typed figure is caught
    assert run().returncode == 0 and "hand-typed" not in page.read_text()
    assert run("--check").returncode == 0
    assert "`barrier_free_vs_gym_async`" in page.read_text()


def test_every_benchmark_emits_through_the_helper_and_has_a_section():
    page_sections = set(render.sections(render.PAGE.read_text()))
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        src = script.read_text()
        if script.stem in NOT_YET_WIRED:
            assert "emit_result" not in src, (
                f"{script.name} is wired now: take it out of NOT_YET_WIRED"
            )
            continue
        if "RESULT" not in src:
            continue
        assert re.search(rf'emit_result\(\s*"{script.stem}",', src), (
            f"{script.name}: print RESULT through results.emit_result"
        )
        assert not re.search(r'^\s*print\("RESULT ', src, flags=re.M), (
            f"{script.name}: a RESULT print bypasses the record"
        )
        assert script.stem in page_sections, (
            f"docs/benchmarks.md has no generated part for {script.stem}"
        )
    assert page_sections <= {s.stem for s in (ROOT / "benchmarks").glob("*.py")} | NOT_YET_WIRED


def test_records_are_well_formed_and_imported_ones_say_so():
    recs = render.load_records()
    assert {"vector_env", "models", "engine", "rollout", "train", "peers"} <= set(recs)
    for name, rs in recs.items():
        assert (ROOT / "benchmarks" / f"{name}.py").exists() or name in NOT_YET_WIRED
        for r in rs:
            assert r["source"] in (
                "run",
                "imported from the README text of commit 0a52cdd",
                "read from the log of a run stopped by its time limit",
            ) or re.fullmatch(
                r"copied from the output of a development run on branch [\w-]+", r["source"]
            ), r["source"]
            assert r["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", r["commit"])
            for key, rng in (r.get("spread") or {}).items():
                assert render.lookup(r["result"], key) is not None and len(rng) == 2, (name, key)
    # every figure spec'd for a benchmark is reachable by some record (no dead rows)
    for name, figs in render.FIGURES.items():
        if name in recs:
            shown = [
                f.key
                for f in figs
                if any(render.lookup(r["result"], f.key) is not None for r in recs[name])
            ]
            assert shown, name


def test_emit_result_prints_the_line_and_appends_a_record(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GYMLLM_BENCH_RECORDS", str(tmp_path))
    monkeypatch.setenv("GYMLLM_BENCH_NOTES", "two other jobs running")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "vector_env.py"), "--quick"])
    tpu = {"platform": "tpu", "kind": "TPU v5 lite", "count": 1}
    monkeypatch.setattr(results.device, "device_info", lambda: dict(tpu))
    line = results.emit_result("vector_env", {"barrier_free_vs_gym_async": 11.5})
    out = capsys.readouterr().out
    want = 'RESULT {"barrier_free_vs_gym_async": 11.5, "device": ' + json.dumps(tpu) + "}\n"
    assert out == want == line + "\n"  # the line gymllm bench parses, with the device it ran on
    results.emit_result("vector_env", {"barrier_free_vs_gym_async": 12.5})
    results.emit_result(
        "vector_env", {"barrier_free_vs_gym_async": 99.0}, record=False
    )  # a dry rehearsal
    recs = [json.loads(x) for x in (tmp_path / "vector_env.jsonl").read_text().splitlines()]
    assert len(recs) == 2
    r = recs[0]
    assert set(results.RECORD_FIELDS) <= set(r)
    assert (
        r["result"] == {"barrier_free_vs_gym_async": 11.5, "device": tpu}
        and r["source"] == "run"
        and r["runs"] == 1
    )
    assert r["device"] == tpu
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert r["commit"] == (head or None)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["date"])
    assert (
        r["command"] == "python benchmarks/vector_env.py --quick"
        and r["notes"] == "two other jobs running"
    )
    assert r["cpu"] and isinstance(r["load"], list) and len(r["load"]) == 3
    # two runs of one setting render as one measurement: the median and the range, with its provenance
    section = render.render_section("vector_env", recs)
    assert "**12 (11.5-12.5)**" in section and "| A | " in section and "| 2 |" in section
    assert f"`{head[:7]}`" in section and "two other jobs running" in section


def test_nothing_is_recorded_inside_pytest_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("GYMLLM_BENCH_RECORDS", raising=False)
    assert os.environ.get("PYTEST_CURRENT_TEST") and results.records_dir() is None
    monkeypatch.setenv("GYMLLM_BENCH_RECORDS", "off")
    assert results.records_dir() is None
    monkeypatch.setenv("GYMLLM_BENCH_RECORDS", str(tmp_path))
    assert results.records_dir() == tmp_path


def test_render_orders_leads_first_then_newest_and_shows_imported_values_verbatim():
    base = {
        "benchmark": "x",
        "runs": 3,
        "cpu": "EPYC",
        "commit": None,
        "command": "python benchmarks/x.py",
        "load": "quiet",
        "notes": None,
        "source": "imported from the README text of commit 0a52cdd",
    }
    recs = [
        {
            **base,
            "result": {"r": "1.00"},
            "spread": {"r": ["1.002", "1.003"]},
            "date": "2026-11-29",
        },
        {**base, "result": {"r": "0.90"}, "date": "2026-12-03"},
        {**base, "result": {"r": "2.10"}, "date": "2026-12-01", "lead": True},
    ]
    section = render.render_section("x", recs)
    row = next(ln for ln in section.splitlines() if ln.startswith("| `r`"))
    assert row == "| `r` | - | **2.10** | 0.90 | 1.00 (1.002-1.003) |"
    assert "not named" in section and "imported from the README text" in section
    # on one day the later run leads, whichever line of the file it is on
    runs = [
        {
            **base,
            "source": "run",
            "command": "a",
            "result": {"r": 1.0},
            "date": "2026-12-06T15:44:00Z",
        },
        {
            **base,
            "source": "run",
            "command": "b",
            "result": {"r": 2.0},
            "date": "2026-12-06T12:57:00Z",
        },
        {
            **base,
            "source": "run",
            "command": "c",
            "result": {"r": 3.0},
            "date": "2026-12-06T15:46:00Z",
        },
    ]
    row = next(ln for ln in render.render_section("x", runs).splitlines() if ln.startswith("| `r`"))
    assert row == "| `r` | - | **3** | 1 | 2 |"


def test_a_bad_record_is_a_clear_error(tmp_path):
    (tmp_path / "engine.jsonl").write_text('{"benchmark": "engine", "result": {}}\n')
    with pytest.raises(ValueError, match=r"engine.jsonl:1: a record needs .*missing \['runs'"):
        render.load_records(tmp_path)
    (tmp_path / "engine.jsonl").write_text("not json\n")
    with pytest.raises(ValueError, match="expected one JSON record a line"):
        render.load_records(tmp_path)


def test_a_tpu_run_also_reports_the_issues_tpu_keys(capsys):
    tpu = {"platform": "tpu", "kind": "TPU v5 lite", "count": 1}
    cpu = {"platform": "cpu", "kind": "cpu", "count": 1}
    keys = {"speedup": "speedup_tpu"}
    on_tpu = results.emit_result("suite", {"speedup": 1.5}, record=False, device=tpu, tpu_keys=keys)
    on_cpu = results.emit_result("suite", {"speedup": 1.5}, record=False, device=cpu, tpu_keys=keys)
    assert json.loads(on_tpu.removeprefix("RESULT "))["speedup_tpu"] == 1.5
    assert "speedup_tpu" not in json.loads(on_cpu.removeprefix("RESULT "))
