"""No benchmark pins the CPU: ``--cpu`` (or the user's JAX_PLATFORMS) does; every RESULT and record names
the device it ran on (benchmarks/results/device.py), and the benchmarks page shows it, a TPU run in a
column headed with its device."""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import device, render  # noqa: E402


def test_cpu_flag_pins_jax_and_leaves_the_parser_clean(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert device.choose_platform_args(["--quick"]) == ["--quick"]
    import os

    assert "JAX_PLATFORMS" not in os.environ  # nothing pinned without the flag
    assert device.choose_platform_args(["--quick", "--cpu"]) == ["--quick"]
    assert os.environ["JAX_PLATFORMS"] == "cpu"


def test_no_benchmark_pins_the_cpu_in_its_source():
    scripts = sorted((ROOT / "benchmarks").glob("*.py")) + sorted(
        (ROOT / "benchmarks" / "peers").glob("*.py")
    )
    for script in scripts:
        src = script.read_text()
        if script.name == "accelerator_check.py":  # its --dry rehearsal is the CPU by definition
            src = src.replace('if args.dry:\n        os.environ["JAX_PLATFORMS"] = "cpu"', "")
        assert not re.search(r"JAX_PLATFORMS[\"']?\s*[,=:]\s*[\"']cpu", src), (
            f"{script.name} pins the CPU"
        )


def test_device_info_reads_jax_and_describes_it():
    import jax

    info = device.device_info()
    assert info["platform"] == jax.devices()[0].platform and info["count"] == len(jax.devices())
    assert device.describe({"platform": "cpu", "kind": "cpu", "count": 1}) == "CPU"
    assert (
        device.describe({"platform": "tpu", "kind": "TPU v5 lite", "count": 1}) == "TPU v5 lite x1"
    )
    assert device.describe(None).startswith("CPU")
    assert (
        device.platform_of("NVIDIA H200 x1") == "gpu"
        and device.platform_of({"platform": "tpu"}) == "tpu"
    )


def test_page_shows_each_measurements_device_and_heads_a_tpu_column_with_it():
    base = {
        "benchmark": "x",
        "runs": 1,
        "cpu": "EPYC",
        "commit": "a" * 40,
        "command": "python benchmarks/x.py",
        "load": [1.0, 1.0, 1.0],
        "notes": None,
        "source": "run",
        "date": "2026-12-05T01:00:00Z",
    }
    recs = [
        {**base, "result": {"r": 1.0}},  # a record from before devices were recorded: the CPU
        {
            **base,
            "result": {"r": 9.0},
            "device": {"platform": "tpu", "kind": "TPU v5 lite", "count": 1},
        },
        {**base, "result": {"r": 2.0}, "device": {"platform": "cpu", "kind": "cpu", "count": 1}},
    ]
    section = render.render_section("x", recs)
    head = section.splitlines()[0]
    assert head.endswith(
        "| goal | A | B (TPU v5 lite x1) | C |"
    )  # only the accelerator's column says so
    rows = [ln for ln in section.splitlines() if re.match(r"\| [A-C] \|", ln)]
    assert len(rows) == 3  # same commit and command, different devices: three measurements
    assert sorted(r.split(" | ")[2] for r in rows) == sorted(
        ["TPU v5 lite x1", "CPU", "CPU (before device records)"]
    )


def test_a_child_process_reports_its_device_and_a_result_naming_one_is_read():
    import jax

    child = device.child_device_info()
    assert (
        child["platform"] == jax.devices()[0].platform and child["count"] >= 1
    )  # JAX_PLATFORMS=cpu here
    assert device.from_result({"platform": "tpu", "device_kind": "TPU v5 lite"}) == {
        "platform": "tpu",
        "kind": "TPU v5 lite",
        "count": 1,
    }
    assert device.from_result({"cpu": "EPYC"}) is None
