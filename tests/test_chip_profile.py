"""benchmarks/chip_profile.py: the device-op summary of a trace, checked on a hand-made trace, and the
io part's pieces on the CPU with a tiny model."""

from __future__ import annotations

import gzip
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import chip_profile  # noqa: E402


def write_trace(d: pathlib.Path, events: list[dict]) -> None:
    p = d / "plugins" / "profile" / "run"
    p.mkdir(parents=True)
    with gzip.open(p / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_device_ops_sums_the_op_thread_by_name(tmp_path):
    meta = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:TPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "XLA Ops"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "XLA Modules"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "python"}},
    ]
    x = [
        {"ph": "X", "pid": 1, "tid": 1, "name": "fusion.1", "ts": 0, "dur": 3000},
        {"ph": "X", "pid": 1, "tid": 1, "name": "fusion.1", "ts": 5000, "dur": 1000},
        {"ph": "X", "pid": 1, "tid": 1, "name": "copy.2", "ts": 7000, "dur": 2000},
        {"ph": "X", "pid": 1, "tid": 2, "name": "jit_decode", "ts": 0, "dur": 9000},
        {"ph": "X", "pid": 2, "tid": 1, "name": "host work", "ts": 0, "dur": 20000},
    ]
    write_trace(tmp_path, meta + x)
    r = chip_profile.device_ops(tmp_path)
    assert r["span_s"] == pytest.approx(0.02)
    assert r["device_ops_s"] == pytest.approx(0.006)  # the op thread only: 3 + 1 + 2 ms
    assert r["device_threads_s"] == pytest.approx({"XLA Ops": 0.006, "XLA Modules": 0.009})
    top = r["top_ops"]
    assert [o["op"] for o in top] == ["fusion.1", "copy.2"]
    assert top[0]["count"] == 2 and top[0]["s"] == pytest.approx(0.004)
    assert top[0]["share"] == pytest.approx(4 / 6)


def test_device_ops_without_a_trace_says_so(tmp_path):
    assert "no trace file" in chip_profile.device_ops(tmp_path)["error"]


def test_io_part_times_every_piece_on_a_tiny_model(tmp_path):
    r = chip_profile.io_part(True, tmp_path)
    for key in (
        "write_dir_s",
        "read_safetensors_s",
        "assemble_s",
        "to_device_s",
        "device_put_one_array_s",
        "checkpoint_returns_s",
        "checkpoint_on_disk_s",
    ):
        assert r[key] >= 0.0, key
    assert r["dir_bytes"] > 0 and r["checkpoint_on_disk_s"] >= r["checkpoint_returns_s"]


def test_layout_attention_agrees_across_cache_layouts():
    """The three layouts timed by the layout part compute the same attention (float32) as a plain
    softmax over the visible slots: the timing compares equal work."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    w, s, kh, g, d = 3, 10, 3, 2, 8
    key = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(key[0], (w, kh, g, d))
    k = jax.random.normal(key[1], (w, s, kh, d))
    v = jax.random.normal(key[2], (w, s, kh, d))
    visible = jnp.arange(s)[None, :] < jnp.array([[4], [7], [10]])
    got = {
        "wskd": chip_profile.layout_attention("wskd", q, k, v, visible, 0.3),
        "wksd": chip_profile.layout_attention(
            "wksd", q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), visible, 0.3
        ),
        "flat": chip_profile.layout_attention(
            "flat", q, k.reshape(w, s, kh * d), v.reshape(w, s, kh * d), visible, 0.3
        ),
    }
    ref_logits = jnp.einsum("wkgd,wskd->wkgs", q, k) * 0.3
    ref_logits = jnp.where(visible[:, None, None], ref_logits, -jnp.inf)
    plain = jnp.einsum("wkgs,wskd->wkgd", jax.nn.softmax(ref_logits, -1), v)
    for kind, out in got.items():
        np.testing.assert_allclose(np.asarray(out), np.asarray(plain), atol=1e-5, err_msg=kind)


def test_copy_part_reports_every_forms_memory_and_its_whole_cache_ops():
    r = chip_profile.copy_part(True, 8, 16)
    assert r["cache_bytes"] == 2 * 2 * 8 * 16 * 2 * 16 * 2
    forms = ("rows_loop", "scatter", "flat_loops", "gather_only", "read_only")
    assert set(forms) <= set(r)
    for form in forms:
        assert r[form]["temp_bytes"] >= 0 and r[form]["output_not_aliased_bytes"] >= 0, r[form]
    assert any(op.startswith("parameter 2,8,16,2,16") for op in r["rows_loop"]["big_ops"])


def test_big_ops_counts_the_instructions_that_hold_a_whole_cache():
    hlo = (
        "  %copy.1 = bf16[30,128,1024,3,64]{4,3,2,1,0:T(8,128)} copy(%p0)\n"
        "  %t = bf16[128,30,1024,3,64]{4,3,2,1,0} transpose(%p0), dimensions={1,0,2,3,4}\n"
        "  %small = bf16[30,16,1024,3,64]{4,3,2,1,0} gather(%p0, %i)\n"
    )
    got = chip_profile.big_ops(hlo, 30 * 128 * 1024 * 3 * 64)
    assert got == {
        "copy 30,128,1024,3,64{4,3,2,1,0:T(8,128)}": 1,
        "transpose 128,30,1024,3,64{4,3,2,1,0}": 1,
    }


def test_host_part_splits_decode_into_the_device_call_and_the_bookkeeping_and_restores_both():
    import chip_limits
    from gymllm.inference.device_cache import DeviceSteps
    from gymllm.inference.loop import EngineLoop

    call, decode = DeviceSteps.call_decode_chunk, EngineLoop.decode
    r = chip_profile.host_part(chip_limits.model("smollm2", True), 4, True, 2, "chunk")
    assert (DeviceSteps.call_decode_chunk, EngineLoop.decode) == (call, decode)
    assert r["chunks"] >= 2 and r["call_s"] > 0 and r["host_s"] >= 0
    assert 0 <= r["host_share"] <= 1
    assert r["host_ms_per_chunk"] == pytest.approx(1e3 * r["host_s"] / r["chunks"])
    with pytest.raises(SystemExit, match="--chunk >= 2"):
        chip_profile.host_part(None, 4, True, 1, "chunk")
