"""Where the chip's time goes: the measured causes behind chip_limits' and the Quickstart's figures.

Its parts, each on whatever device JAX finds (``--dry`` rehearses them on the CPU with a tiny model):

* ``decode``: one engine decode run (SmolLM2-135M shape, random bf16 weights, ``--rows`` rows, ``--chunk``
  steps per device call: chip_limits' setting) under ``jax.profiler.trace``; the device's own op
  timeline (the Perfetto trace JAX writes) summed by op name: how much of the run the device was busy,
  and which ops take that time.
* ``host``: the same decode run without the profiler, its decode iterations split in two: the device
  call (``DeviceSteps.call_decode_chunk``: inputs in, the chunk's tokens back on the host) and the
  host's bookkeeping after it (``EngineLoop.decode``'s per-token accept: record, stop checks,
  scheduling), which the device waits for before the next chunk. Per chunk, per token, and as a share.
* ``learner``: one warm StreamingLearner step (4 groups x 8 x 256 tokens, chip_limits' first shape)
  under the same trace.
* ``layout``: the decode attention alone over a SmolLM2-shape cache (30 layers, ``--rows`` rows, 160
  slots, bf16) in three storage layouts: today's ``[L, W, S, K, D]``, heads-major ``[L, W, K, S, D]``
  and heads-flat ``[L, W, S, K*D]`` (scores by a block-diagonal query). For each: the cache's bytes on
  the device (``on_device_size_in_bytes``: a TPU tiles an array's last two dims, so K=3, D=64 pads)
  against its logical bytes, and one 30-layer pass timed against the logical bytes at the copy rate.
* ``forms``: the decode attention over a 30-layer bf16 cache (``--rows`` rows, each window of
  ``--form-slots``, rows' lengths spread over the window) in each form of
  ``gymllm.models.layers.decode_attention`` (batched dots; multiply-and-reduce in float32): one pass's
  time against the bytes bound of the slots attended.
* ``copy``: the engine's row compaction (``copy_rows``) over a SmolLM2-shape bf16 cache (30 layers,
  ``--copy-rows`` rows, ``--slots`` slots): each form's compiled memory (``memory_analysis``: temporaries and
  outputs not written in place) for today's row-by-row write and the single scatter it replaced, and
  the row-by-row form timed on the chip. The scatter asked for three caches of memory on the chip.
* ``io``: the pieces of loading a model directory and checkpointing a learner, at SmolLM2-135M's
  shape in float32 (what the Quickstart loads): writing the directory, reading its safetensors,
  assembling the stacked parameters, placing them on the device, one ``jax.device_put`` of the same
  bytes, and a learner checkpoint (Orbax, waited for). The Quickstart's trace shows its model load
  (11.6 s) and its final checkpoint (3.5 s) on the chip; this part says which piece takes it.

    python benchmarks/chip_profile.py --out DIR          # on the chip (about 2 minutes)
    python benchmarks/chip_profile.py --dry --out DIR    # the CPU rehearsal

Ends with ``RESULT {json}`` (recorded in ``benchmarks/results/`` with the device unless ``--dry``); each
part's top ops go to ``DIR/<part>_ops.json``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gzip
import json
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

TOP = 15  # op names listed per part


def device_ops(trace_dir: pathlib.Path) -> dict:
    """Sum the device's ops in the Perfetto trace under ``trace_dir`` by name.

    Returns the device-busy seconds (ops on the device's op threads), the span of the trace, and
    the top ops. On a CPU-only run there is no device process: only the host's span is given."""
    found = sorted(trace_dir.rglob("*.trace.json.gz")) + sorted(trace_dir.rglob("perfetto_trace*"))
    if not found:
        return {"error": f"no trace file under {trace_dir}"}
    path = found[0]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e["pid"]] = e["args"].get("name", "")
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"].get("name", "")
    dev = {p for p, n in procs.items() if "TPU" in n or "GPU" in n or "/device:" in n}
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        return {"error": f"no complete events in {path.name}"}
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e.get("dur", 0) for e in spans)
    by_thread: dict = collections.defaultdict(float)
    by_op: dict = collections.defaultdict(lambda: [0, 0.0])
    for e in spans:
        if e["pid"] not in dev:
            continue
        tname = threads.get((e["pid"], e["tid"]), "")
        by_thread[tname] += e.get("dur", 0) / 1e6
        if "Ops" in tname:  # "XLA Ops": the device's op timeline (not modules or steps)
            by_op[e["name"]][0] += 1
            by_op[e["name"]][1] += e.get("dur", 0) / 1e6
    if not by_op:  # no op timeline thread by that name: every device event, by name
        for e in spans:
            if e["pid"] in dev:
                by_op[e["name"]][0] += 1
                by_op[e["name"]][1] += e.get("dur", 0) / 1e6
    busy = sum(v[1] for v in by_op.values())
    top = sorted(by_op.items(), key=lambda kv: -kv[1][1])[:TOP]
    return {
        "trace": path.name,
        "span_s": (t1 - t0) / 1e6,
        "device_ops_s": busy,
        "device_threads_s": dict(by_thread),
        "top_ops": [
            {"op": n, "count": c, "s": s, "share": s / busy if busy else None} for n, (c, s) in top
        ],
    }


def traced(out: pathlib.Path, name: str, fn) -> tuple[object, dict]:
    """Run ``fn`` under ``jax.profiler.trace`` into ``out/name``; (its result, the op summary)."""
    import jax

    d = out / f"trace_{name}"
    t = time.perf_counter()
    with jax.profiler.trace(str(d), create_perfetto_trace=True):
        result = fn()
    wall = time.perf_counter() - t
    ops = device_ops(d)
    ops["wall_s"] = wall
    (out / f"{name}_ops.json").write_text(json.dumps(ops, indent=1))
    return result, ops


def host_part(lm, rows: int, dry: bool, chunk: int, kv_write: str) -> dict:
    """The decode run of chip_limits (warm-up included) with each decode iteration timed: the device
    call and the host's bookkeeping after it (see the module doc). The two methods are wrapped for
    the run and restored after it."""
    import chip_limits
    from gymllm.inference.device_cache import DeviceSteps
    from gymllm.inference.loop import EngineLoop

    if chunk < 2:
        raise SystemExit(
            f"host part: expected --chunk >= 2 (the chunked decode call), received {chunk}"
        )
    acc = {"decode_s": 0.0, "call_s": 0.0, "chunks": 0, "in_decode": False}
    call, decode = DeviceSteps.call_decode_chunk, EngineLoop.decode

    def timed_call(self, *args, **kw):
        t = time.perf_counter()
        try:
            return call(self, *args, **kw)
        finally:
            if acc["in_decode"]:  # not the engine's warm-up, which compiles the call outside decode
                acc["call_s"] += time.perf_counter() - t
                acc["chunks"] += 1

    def timed_decode(self):
        t = time.perf_counter()
        acc["in_decode"] = True
        try:
            return decode(self)
        finally:
            acc["in_decode"] = False
            acc["decode_s"] += time.perf_counter() - t

    DeviceSteps.call_decode_chunk, EngineLoop.decode = timed_call, timed_decode
    try:
        d = chip_limits.decode(lm, rows, dry, chunk, kv_write)
    finally:
        DeviceSteps.call_decode_chunk, EngineLoop.decode = call, decode
    host = acc["decode_s"] - acc["call_s"]
    tokens = (
        acc["chunks"] and rows * chunk * acc["chunks"]
    )  # an upper bound: short chunks count whole
    return {
        "rows": rows,
        "chunk": chunk,
        "kv_write": kv_write,
        "tok_s": d["tok_s"],
        "chunks": acc["chunks"],
        "call_s": acc["call_s"],
        "host_s": host,
        "host_ms_per_chunk": 1e3 * host / max(acc["chunks"], 1),
        "host_us_per_token_at_least": 1e6 * host / max(tokens, 1),
        "host_share": host / acc["decode_s"] if acc["decode_s"] else None,
    }


def io_part(dry: bool, out: pathlib.Path) -> dict:
    """The pieces of a model load and of a learner checkpoint, timed one by one."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import chip_limits
    from gymllm.algos.checkpoint import Checkpointer
    from gymllm.algos.learner import StreamingLearner
    from gymllm.algos.learner_config import LearnerConfig
    from gymllm.models.checkpoint import assemble_params
    from gymllm.models.hf_io import read_safetensors, save_hf_dir
    from gymllm.models.transformer import Transformer

    family, sizes = chip_limits.DRY_SHAPE if dry else chip_limits.SHAPES["smollm2"]
    from gymllm.models import make_tiny

    lm = make_tiny(family, std=0.02, dtype=jnp.float32, **sizes)
    r: dict = {}
    with tempfile.TemporaryDirectory(dir=str(out)) as tmp:
        d = pathlib.Path(tmp) / "model"
        t = time.perf_counter()
        save_hf_dir(lm, d)
        r["write_dir_s"] = time.perf_counter() - t
        r["dir_bytes"] = sum(p.stat().st_size for p in d.iterdir())
        t = time.perf_counter()
        shard_of, get = read_safetensors(d)
        host = {n: np.asarray(get(n)) for n in shard_of}
        r["read_safetensors_s"] = time.perf_counter() - t
        t = time.perf_counter()
        params = assemble_params(lm.config, lambda n: host[n], list(host), "hf", source=str(d))
        r["assemble_s"] = time.perf_counter() - t
        t = time.perf_counter()
        model = Transformer.from_params(lm.config, params, dtype=jnp.float32)
        jax.block_until_ready(model.flat_params())
        r["to_device_s"] = time.perf_counter() - t
        blob = np.ones(sum(int(np.asarray(v).size) for v in params.values()), np.float32)
        t = time.perf_counter()
        jax.block_until_ready(jax.device_put(blob))
        r["device_put_one_array_s"] = time.perf_counter() - t
        r["device_put_gb_s"] = blob.nbytes / r["device_put_one_array_s"] / 1e9
        learner = StreamingLearner(
            lm.config, model.flat_params(), config=LearnerConfig(groups_per_step=1)
        )
        ck = Checkpointer(pathlib.Path(tmp) / "ckpt")
        t = time.perf_counter()
        ck.save(1, learner, wait=False)
        r["checkpoint_returns_s"] = time.perf_counter() - t
        ck.wait()
        r["checkpoint_on_disk_s"] = time.perf_counter() - t
        ck.close()
    return r


def layout_attention(kind: str, q, keys, values, visible, scale: float):
    """One layer's decode attention (no own token) with the cache in layout ``kind``; q [W, K, G, D].
    keys/values: [W, S, K, D] ("wskd"), [W, K, S, D] ("wksd") or [W, S, K*D] ("flat")."""
    import jax
    import jax.numpy as jnp

    w, kh, g, d = q.shape
    f32 = jnp.float32
    if kind == "flat":  # scores over the flat rows by a block-diagonal query: no [K, D] relayout
        qbd = jnp.einsum("wkgd,kj->wkdjg", q, jnp.eye(kh, dtype=q.dtype)).reshape(w, kh * d, kh * g)
        sc = jnp.einsum("wsc,wcj->wjs", keys, qbd, preferred_element_type=f32) * scale
    else:
        spec = "wkgd,wskd->wkgs" if kind == "wskd" else "wkgd,wksd->wkgs"
        sc = jnp.einsum(spec, q, keys, preferred_element_type=f32).reshape(w, kh * g, -1) * scale
    sc = jnp.where(visible[:, None, :], sc, -1e30)
    p = jax.nn.softmax(sc, axis=-1).astype(q.dtype)  # [W, K*G, S]
    if kind == "flat":
        full = jnp.einsum("wjs,wsc->wjc", p, values, preferred_element_type=f32)
        full = full.reshape(w, kh, g, kh, d)
        return jnp.einsum("wkgld,kl->wkgd", full, jnp.eye(kh, dtype=f32))
    spec = "wkgs,wskd->wkgd" if kind == "wskd" else "wkgs,wksd->wkgd"
    return jnp.einsum(spec, p.reshape(w, kh, g, -1), values, preferred_element_type=f32)


def layout_part(dry: bool, rows: int, hbm_gb_s: float) -> dict:
    """Bytes on the device and one 30-layer attention pass for each cache layout (module docstring)."""
    import jax
    import jax.numpy as jnp

    import chip_limits

    n_l, w, s, kh, g, d = (2, 4, 16, 2, 2, 16) if dry else (30, rows, 160, 3, 3, 64)
    dt = jnp.bfloat16
    shapes = {"wskd": (n_l, w, s, kh, d), "wksd": (n_l, w, kh, s, d), "flat": (n_l, w, s, kh * d)}
    q = jax.random.normal(jax.random.key(0), (w, kh, g, d), dt)
    visible = jnp.arange(s)[None, :] < (s * 3 // 5)  # [1, S]: 96 of 160 slots, as chip_limits
    logical = 2 * n_l * w * s * kh * d * 2  # K and V, bf16
    out: dict = {"shape": {"layers": n_l, "rows": w, "slots": s, "kv_heads": kh, "head_dim": d}}
    for kind, shape in shapes.items():
        k = jax.random.normal(jax.random.key(1), shape, dt)
        v = jax.random.normal(jax.random.key(2), shape, dt)

        def one_pass(q, k, v, kind=kind):
            def body(acc, kv):
                o = layout_attention(kind, q, kv[0], kv[1], visible, 0.125)
                return acc + o.sum(), None

            return jax.lax.scan(body, jnp.float32(0), (k, v))[0]

        secs = chip_limits.timed(functools.partial(jax.jit(one_pass), q, k, v), 10)
        on_device = k.on_device_size_in_bytes() + v.on_device_size_in_bytes()
        out[kind] = {
            "bytes_on_device": on_device,
            "padding": on_device / logical,
            "pass_ms": secs * 1e3,
            "vs_logical_bytes_bound": (logical / (hbm_gb_s * 1e9)) / secs,
        }
        del k, v
    out["logical_bytes"] = logical
    return out


def forms_part(dry: bool, rows: int, slots_list: str, hbm_gb_s: float) -> dict:
    """The decode attention over a 30-layer bf16 cache in each of its forms
    (:func:`gymllm.models.layers.decode_attention`'s ``form``: batched dots, or multiply-and-reduce
    in float32) at each window of ``slots_list``, rows' lengths spread over the window (mean 0.6 of
    it): one 30-layer pass each, against the bytes bound of the slots attended (K and V read once at
    the measured copy rate), and the elementwise form's gap to the dots'."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import chip_limits
    from gymllm.models.layers import decode_attention

    out: dict = {}
    for s in (int(x) for x in slots_list.split(",")):
        n_l, w, kh, g, d = (2, 16, 2, 2, 16) if dry else (30, rows, 3, 3, 64)
        dt = jnp.bfloat16
        keys = jax.random.split(jax.random.key(s), 3)
        k = jax.random.normal(keys[0], (n_l, w, s, kh, d), dt)
        v = jax.random.normal(keys[1], (n_l, w, s, kh, d), dt)
        q = jax.random.normal(keys[2], (w, kh * g, d), dt)
        lens = jnp.asarray(np.random.default_rng(0).integers(s // 5, s, size=w), jnp.int32)
        bound_s = 2 * n_l * int(lens.sum()) * kh * d * 2 / (hbm_gb_s * 1e9)
        own = jnp.zeros((w, kh, d), dt)
        visible = jnp.arange(s)[None, :] < lens[:, None]

        def one_pass(q, k, v, form, own=own, visible=visible):
            def body(acc, i):
                o = decode_attention(q, k[i], v[i], own, own, visible, scale=0.125, form=form)
                return acc + o.astype(jnp.float32), None

            return jax.lax.scan(
                body, jnp.zeros(q.shape[:1] + (q[0].size,), jnp.float32), jnp.arange(k.shape[0])
            )[0]

        row: dict = {"mean_len": float(lens.mean()), "bytes_bound_ms": bound_s * 1e3}
        results = {}
        for form in ("dots", "elementwise"):
            fn = jax.jit(functools.partial(one_pass, form=form))
            secs = chip_limits.timed(functools.partial(fn, q, k, v), 10)
            results[form] = np.asarray(fn(q, k, v))
            row[form] = {"pass_ms": secs * 1e3, "vs_bound": bound_s / secs}
        row["gap"] = float(np.abs(results["dots"] - results["elementwise"]).max())
        row["elementwise_speedup"] = row["dots"]["pass_ms"] / row["elementwise"]["pass_ms"]
        out[str(s)] = row
        print(
            f"forms {s} slots: dots {row['dots']['pass_ms']:.2f} ms "
            f"({row['dots']['vs_bound']:.2f} of the bound), elementwise "
            f"{row['elementwise']['pass_ms']:.2f} ms ({row['elementwise']['vs_bound']:.2f}), "
            f"gap {row['gap']:.1e}",
            flush=True,
        )
        del k, v
    return out


def big_ops(hlo: str, elems: int) -> dict[str, int]:
    """Instructions of a compiled module whose result holds at least half ``elems`` elements, counted by
    ``opcode shape{layout}``: where a program holds whole-cache copies."""
    import re

    out: dict[str, int] = collections.Counter()
    for m in re.finditer(r"= (?:bf16|f32|s32)\[([\d,]+)\](\{[^}]*\})? ([\w-]+)\(", hlo):
        dims = [int(x) for x in m.group(1).split(",") if x]
        n = 1
        for x in dims:
            n *= x
        if n * 2 >= elems:
            out[f"{m.group(3)} {m.group(1)}{m.group(2) or ''}"] += 1
    return dict(out)


def copy_forms() -> dict:
    """The row-copy forms compared by the copy part, each ``(cache, src, dst) -> cache`` (jitted, the cache
    donated), beside today's ``copy_rows``."""
    import jax
    import jax.numpy as jnp

    from gymllm.inference.device_cache import copy_rows, read_rows, write_rows

    def scatter(cache, src, dst):  # the form before: one scatter into the rows axis
        return jax.tree.map(
            lambda c: c.at[:, dst].set(jnp.take(c, src, axis=1), mode="drop"), cache
        )

    def flat_loops(cache, src, dst):  # copy_rows' loops over a [L, W, S*K*D] view
        def one(c):
            f = c.reshape(c.shape[0], c.shape[1], -1)
            return write_rows(f, read_rows(f, src), dst).reshape(c.shape)

        return jax.tree.map(one, cache)

    def gather_only(cache, src, dst):  # reads alone: the rows, no write
        return jax.tree.map(lambda c: jnp.take(c, src, axis=1), cache)

    def read_only(cache, src, dst):
        return jax.tree.map(lambda c: read_rows(c, src), cache)

    forms = {"rows_loop": copy_rows}
    for name, fn in (("scatter", scatter), ("flat_loops", flat_loops)):
        forms[name] = jax.jit(fn, donate_argnums=(0,))
    forms["gather_only"] = jax.jit(gather_only)
    forms["read_only"] = jax.jit(read_only)
    return forms


def copy_part(dry: bool, rows: int, slots: int) -> dict:
    """Compiled memory of each row-copy form (:func:`copy_forms`) and where a whole-cache temporary is
    (:func:`big_ops`); each form that holds none, timed."""
    import jax
    import jax.numpy as jnp

    import chip_limits
    from gymllm.models.cache import KVCache, init_cache

    n_l, w, s, kh, d = (2, 8, 16, 2, 16) if dry else (30, rows, slots, 3, 64)
    spec = jax.ShapeDtypeStruct((n_l, w, s, kh, d), jnp.bfloat16)
    cache_spec = KVCache(k=spec, v=spec)
    moved = min(16, w // 2)
    idx = jax.ShapeDtypeStruct((moved,), jnp.int32)
    cache_bytes = 2 * n_l * w * s * kh * d * 2
    out: dict = {"shape": {"layers": n_l, "rows": w, "slots": s}, "cache_bytes": cache_bytes}
    src = jnp.arange(w - moved, w, dtype=jnp.int32)
    dst = jnp.arange(moved, dtype=jnp.int32)
    for name, fn in copy_forms().items():
        try:
            compiled = fn.lower(cache_spec, idx, idx).compile()
            mem = compiled.memory_analysis()
            out[name] = {
                "temp_bytes": int(mem.temp_size_in_bytes),
                "output_not_aliased_bytes": int(mem.output_size_in_bytes - mem.alias_size_in_bytes),
                "big_ops": big_ops(compiled.as_text(), n_l * w * s * kh * d),
            }
        except Exception as e:  # noqa: BLE001 - a form that does not compile is the measurement
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"copy {name}: {out[name]}", flush=True)
            continue
        if out[name]["temp_bytes"] < cache_bytes // 4 and name not in ("gather_only", "read_only"):
            state = {"c": init_cache(n_l, w, s, kh, d, jnp.bfloat16)}

            def once(fn=fn, state=state):
                state["c"] = fn(state["c"], src, dst)
                return state["c"]

            out[name]["call_ms"] = chip_limits.timed(once, 5) * 1e3
            del state
        print(f"copy {name}: {out[name]} (cache {cache_bytes / 1e9:.2f} GB)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry", action="store_true", help="the CPU rehearsal (tiny model)")
    ap.add_argument("--out", type=pathlib.Path, required=True, help="where traces and op tables go")
    ap.add_argument(
        "--parts",
        default="decode,learner,io",
        help="comma-separated: decode, host, learner, io, layout, copy, forms",
    )
    ap.add_argument("--rows", type=int, default=256, help="decode rows")
    ap.add_argument("--copy-rows", type=int, default=128, help="cache rows (the copy part)")
    ap.add_argument("--slots", type=int, default=1024, help="cache slots a row (the copy part)")
    ap.add_argument(
        "--form-slots", default="128,256,384,512,1024", help="windows the forms part measures"
    )
    ap.add_argument("--chunk", type=int, default=16, help="decode steps per device call")
    ap.add_argument(
        "--kv-write", default="scatter", help="EngineConfig.kv_write: scatter, select or chunk"
    )
    a = ap.parse_args()
    if a.dry:
        import os

        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    import chip_limits
    from gymllm.utils.host import describe_cpu

    a.out.mkdir(parents=True, exist_ok=True)
    dev = jax.devices()[0]
    res: dict = {"device": dev.device_kind, "platform": dev.platform, "cpu": describe_cpu()}
    parts = set(a.parts.split(","))
    lm = chip_limits.model("smollm2", a.dry) if parts & {"decode", "host", "learner"} else None
    if "host" in parts:
        res["host"] = h = host_part(lm, 4 if a.dry else a.rows, a.dry, a.chunk, a.kv_write)
        print(
            f"host: {h['chunks']} chunks, device calls {h['call_s']:.3f} s, host bookkeeping "
            f"{h['host_s']:.3f} s ({h['host_ms_per_chunk']:.2f} ms a chunk, share {h['host_share']:.2f})",
            flush=True,
        )
    if "decode" in parts:
        rows = 4 if a.dry else a.rows
        chip_limits.decode(lm, rows, a.dry, a.chunk, a.kv_write)  # compiled before the trace
        d, ops = traced(
            a.out, "decode", lambda: chip_limits.decode(lm, rows, a.dry, a.chunk, a.kv_write)
        )
        res["decode"] = {
            "rows": rows,
            "chunk": a.chunk,
            "kv_write": a.kv_write,
            "tok_s": d["tok_s"],
            **ops,
        }
    if "learner" in parts:
        shape = (1, 2, 16, 2) if a.dry else (4, 8, 256, 8)
        ok, ops = traced(
            a.out, "learner", lambda: chip_limits.learner_mfu(lm, *shape, peak_flops=1.0)
        )
        res["learner"] = {"step_s": ok["step_s"], "shape": list(shape), **ops}
    if "io" in parts:
        res["io"] = io_part(a.dry, a.out)
    if "copy" in parts:
        res["copy"] = copy_part(a.dry, a.copy_rows, a.slots)
    if "forms" in parts:
        bw = chip_limits.limits(a.dry)["hbm_gb_s"]
        res["forms"] = forms_part(a.dry, 4 if a.dry else a.rows, a.form_slots, bw)
    if "layout" in parts:
        bw = chip_limits.limits(a.dry)["hbm_gb_s"]
        res["layout"] = layout_part(a.dry, 4 if a.dry else a.rows, bw)
        for kind in ("wskd", "wksd", "flat"):
            r = res["layout"][kind]
            print(
                f"layout {kind}: {r['bytes_on_device'] / 1e6:.0f} MB on device (x{r['padding']:.2f}), "
                f"pass {r['pass_ms']:.2f} ms, {r['vs_logical_bytes_bound']:.2f} of the bytes bound",
                flush=True,
            )
    for part in ("decode", "learner"):
        if part in res:
            p = res[part]
            print(
                f"{part}: wall {p.get('wall_s', 0):.2f} s, device ops {p.get('device_ops_s', 0):.3f} s; "
                + "; ".join(f"{o['op'][:40]} {o['s']:.3f}s" for o in p.get("top_ops", [])[:6]),
                flush=True,
            )
    if "io" in res:
        print("io: " + ", ".join(f"{k} {v:.3g}" for k, v in res["io"].items()), flush=True)
    from results import emit_result

    emit_result("chip_profile", res, record=not a.dry)


if __name__ == "__main__":
    main()
