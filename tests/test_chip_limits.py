"""benchmarks/chip_limits.py's CPU rehearsal: every figure it promises is computed, and the bound follows
from the measured bandwidth by the module docstring's formula (checked here by hand)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow  # 46 s on a 2-core CPU; the script runs for real on the chip (scripts/tpu_run.sh limits)
@pytest.mark.timeout(600)
def test_dry_run_computes_every_figure_and_the_bound_by_its_formula():
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "chip_limits.py"),
            "--dry",
            "--shapes",
            "smollm2",
            "--kv-writes",  # one engine a row count: the figures checked here do not depend on the way
            "scatter",
            "--attentions",
            "dots",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    r = json.loads(line[len("RESULT ") :])
    assert r["dry"] is True and r["peak_bf16_tflops"] > 0 and r["hbm_gb_s"] > 0
    # the dry model: 2 layers, 2 kv heads of 16, bf16 K and V; prompts of 8 and 4 new tokens (mean context 10)
    kv_per_token = 2 * 2 * 2 * 16 * 2
    for rows in (2, 4):
        assert (
            r[f"decode_tok_s_smollm2_{rows}_chunk16_scatter"] == r[f"decode_tok_s_smollm2_{rows}"]
        )
        need = 2 * r["params_smollm2"] + rows * 10 * kv_per_token
        bound = rows * r["hbm_gb_s"] * 1e9 / need
        assert r[f"hbm_bound_tok_s_smollm2_{rows}"] == pytest.approx(bound)
        assert r[f"decode_vs_hbm_bound_{rows}"] == pytest.approx(
            r[f"decode_tok_s_smollm2_{rows}"] / bound
        )
    (run,) = r["learner_runs_smollm2"]
    assert run["tokens"] == 1 * 2 * 16 and 0 < run["mfu"] == r["learner_mfu_smollm2"]
    assert run["mfu"] == pytest.approx(run["model_tflops"] * 1e12 / (r["peak_bf16_tflops"] * 1e12))
