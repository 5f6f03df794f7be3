"""benchmarks/accelerator_check.py: its ``--dry`` CPU rehearsal runs end to end in a subprocess and prints
every RESULT key, well typed (a figure or null with its reason), so a TPU or GPU session can run the
real check blind; without ``--dry`` and without an accelerator it stops at once with a clear message;
a part past its time guard is killed and the figures it finished are kept."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "accelerator_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("accelerator_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("accelerator_check", mod)  # its dataclasses resolve their module
    spec.loader.exec_module(mod)
    return mod


def _result_keys() -> dict[str, type]:
    return _module().RESULT_KEYS


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


@pytest.mark.slow  # 21 s on a 2-core CPU; the script runs for real on the chip (scripts/tpu_run.sh accel)
def test_dry_run_prints_every_result_key_well_typed():
    proc = _run("--dry", timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-2000:]
    res = json.loads(lines[0][len("RESULT ") :])
    keys = _result_keys()
    assert set(res) == set(keys)
    assert res["dry"] is True and res["errors"] == {}
    for key, typ in keys.items():
        value = res[key]
        if value is None:  # not measured: only with its reason
            assert isinstance(res["skipped"].get(key), str) and res["skipped"][key], key
            continue
        if typ is float:
            assert isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0, (
                key,
                value,
            )
        else:
            assert isinstance(value, typ), (key, value)
    # what runs on the CPU is measured, not skipped
    for key in (
        "jax_decode_tok_s_64",
        "jax_decode_tok_s_256",
        "continuous_vs_static",
        "learner_step_s",
        "jax_generate_tok_s",
        "jax_push_s",
        "jax_logprob_gap_mean",
        "jax_logprob_gap_p99",
    ):
        assert res[key] is not None, key
        assert res[key] > 0 or key.startswith("jax_logprob"), key
    # the weight pushes landed mid-flight: tokens of both versions
    assert set(res["jax_push_versions"]) == {"0", "1"}
    # a bf16-computing engine against the float32 recomputation: a small gap, p99 >= mean
    assert 0 <= res["jax_logprob_gap_mean"] <= res["jax_logprob_gap_p99"] < 0.5
    if res["vllm_backend"] != "absent":
        assert set(res["vllm_push_versions"]) == {"0", "1"}
        assert res["vllm_generate_tok_s"] > 0


@pytest.mark.skipif(
    any(d.platform != "cpu" for d in jax.devices()), reason="an accelerator is visible"
)
def test_without_dry_and_without_an_accelerator_it_fails_loudly():
    proc = _run(timeout=120)
    assert proc.returncode == 2
    assert "expected a TPU or GPU visible to JAX" in proc.stderr and "--dry" in proc.stderr
    assert "RESULT" not in proc.stdout


def test_a_part_past_its_time_guard_is_killed_and_keeps_what_it_measured(tmp_path):
    mod = _module()
    args = mod.argparse.Namespace(
        model="m", big_model="", compute_dtype="bfloat16", dry=True, budget_s=60.0
    )
    out, why = mod.spawn(
        "stall", args, timeout=6.0, workdir=str(tmp_path)
    )  # one figure, then it hangs
    assert out["values"] == {"stall_first": 1.0} and out["rc"] == -9
    assert why.startswith("exceeded its time guard of 6 s") and "killed" in why


def test_vllm_rows_are_skipped_on_a_tpu_with_the_reason():
    mod = _module()
    args = mod.argparse.Namespace(big_model="", parts="decode,vllm", dry=False)
    assert "GPU only" in mod.part_skip_reason("vllm", {"decode", "vllm"}, args, "tpu")
    assert mod.part_skip_reason("decode", {"decode", "vllm"}, args, "tpu") == ""
    assert mod.part_skip_reason("learner", {"decode", "vllm"}, args, "tpu").startswith(
        "not in --parts"
    )
