"""The Quickstart's learner with a fixed program set (``LearnerConfig.fixed_shapes``) against today's
length buckets and first-use shared-prefix shapes, side by side in one run.

The workload is ``learner_profile.quickstart_groups`` (SmolLM2-135M's exact architecture, random
weights, ``--layers`` of its 30 layers; 2 groups of 6 rows a step: a 97-token prompt, reply, tool
observation, reply: 159 tokens). Three learners, each with programs of its own (``num_steps`` keys them):

* ``today``: the preset's learner before this change (buckets 160 and 256, shared prefix at first use);
* ``fixed_shared``: ``fixed_shapes`` with one 96-token prompt slot and 6 continuations of 64 (max_len 160);
* ``fixed_flat``: ``fixed_shapes`` with the rows padded to 160 (shared prefix off).

Each is warmed up (``warmup(group_size=6)``: timed, programs counted with a ``jax.monitoring`` listener on
the backend-compile event), then the steps run round-robin (the order rotating each round) so that the
machine's load falls on all three alike: per step its wall time and compiles. Reported: ``warmup_s``,
``first_step_s`` (compiles a first-use shape for ``today``), ``steady_step_s`` (median of the rest),
``programs`` (weight-taking XLA programs compiled: warmup + steps), ``positions`` the model runs per
micro-batch, and the weights' agreement after the run (float32 would agree to ~1e-6; ``compute_dtype``
"auto" is bfloat16 on AMX CPUs).

    python benchmarks/learner_fixed_shapes.py --quick      # 4 layers, 3 steps: about two minutes here
    python benchmarks/learner_fixed_shapes.py --layers 30 --steps 4 --variants today,fixed_shared  # ~8 GB
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from gymllm.algos import config as C  # noqa: E402
from gymllm.algos.batching import row_from_trajectory, shared_prefix_layout  # noqa: E402
from gymllm.algos.learner import StreamingLearner  # noqa: E402
from learner_profile import model, optimizer, quickstart_groups, quickstart_learner_config  # noqa: E402

WEIGHT_PROGRAMS = ("jit(grad)", "jit(apply)", "jit(ref_logp)")
VARIANTS = {
    "today": dict(num_steps=12),
    "fixed_shared": dict(
        num_steps=13, max_len=160, fixed_shapes=True, prefix_len=96, prefix_slots=1
    ),
    "fixed_flat": dict(num_steps=14, max_len=160, fixed_shapes=True, shared_prefix=False),
}


class Compiles:
    """XLA backend compiles (``fun_name``) while on."""

    def __init__(self):
        self.names: list[str] = []
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event: str, duration: float, fun_name: str = "", **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.names.append(fun_name)

    def take(self) -> list[str]:
        out, self.names = self.names, []
        return out


def positions(ln: StreamingLearner) -> int:
    """Positions the model runs for one 6-row micro-batch of the workload (the layout the learner picks)."""
    c = ln.config
    if c.fixed_shapes:
        return (
            ln.prefix_slots * ln.prefix_len + c.micro_batch_size * (c.max_len - ln.prefix_len)
            if c.shared_prefix
            else c.micro_batch_size * c.max_len
        )
    g = quickstart_groups(seed=0)[0]
    rows = [
        row_from_trajectory(t, advantage=0.0, group_tokens=1.0, sample_id="")
        for t in g.trajectories
    ]
    sp = shared_prefix_layout(rows, c.micro_batch_size, 160, ln.prefix_table)
    return sp["sp_prefix_tokens"].size + sp["sp_suffix_tokens"].size  # today's first-use layout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 layers, 3 steps")
    ap.add_argument(
        "--layers", type=int, default=None, help="SmolLM2-135M layers (30: the whole model)"
    )
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="which learners (comma list; fewer: less memory)",
    )
    args = ap.parse_args()
    layers, steps = args.layers or (4 if args.quick else 30), args.steps or (3 if args.quick else 4)
    cfg, params = model("smollm2", layers)
    counter = Compiles()
    learners, out = {}, {}
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    for name in names:
        kw = VARIANTS[name]
        ln = StreamingLearner(
            cfg,
            params,
            loss=C.async_agentic(),
            optimizer=optimizer(),
            config=quickstart_learner_config(**kw),
        )
        counter.take()
        t = time.perf_counter()
        ln.warmup(group_size=6)
        warm = counter.take()
        learners[name] = ln
        out[name] = {
            "warmup_s": time.perf_counter() - t,
            "warmup_programs": [n for n in warm if n in WEIGHT_PROGRAMS],
            "step_s": [],
            "step_programs": [],
            "positions": positions(ln),
            "program_shapes": (
                [n for n, _ in ln.program_shapes()] if ln.config.fixed_shapes else None
            ),
        }
    for s in range(steps):
        groups = quickstart_groups(seed=s, version=s)
        for name in names[s % len(names) :] + names[: s % len(names)]:
            counter.take()
            t = time.perf_counter()
            learners[name].submit(groups)
            out[name]["step_s"].append(time.perf_counter() - t)
            out[name]["step_programs"].append([n for n in counter.take() if n in WEIGHT_PROGRAMS])
    ref = learners[names[0]].trainable
    for name, r in out.items():
        r["first_step_s"], r["steady_step_s"] = (
            r["step_s"][0],
            statistics.median(r["step_s"][1:] or r["step_s"]),
        )
        r["programs"] = len(r["warmup_programs"]) + sum(len(p) for p in r["step_programs"])
        r[f"max_weight_diff_vs_{names[0]}"] = max(
            float(jnp.max(jnp.abs(learners[name].trainable[k] - ref[k]))) for k in ref
        )
        r["counts"] = {
            k: v for k, v in learners[name].counts.items() if "micro_batches" in k or "passes" in k
        }
    result = {
        "layers": layers,
        "steps": steps,
        "compute_dtype": learners[names[0]].config.compute_dtype,
        "load_avg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        **out,
    }
    from results import emit_result

    emit_result("learner_fixed_shapes", result)


if __name__ == "__main__":
    main()
