"""A run's own recorded steps replayed through its learner and through variants of its learner settings,
side by side in one run: what a layout setting (``prefix_len``, ``micro_batch_size``, ...) saves on the
rows that run really trained on.

    python benchmarks/learner_replay.py --run runs/kuhn_poker_selfplay \\
        --variant 'prefix256:learner.prefix_len=256,learner.micro_batch_size=8'

The run directory is one ``gymllm train`` wrote: ``config.json`` (the whole config) and ``trajectories.jsonl``
(every trained trajectory, its step and group). Each side is a learner built as the run builds it
(:func:`gymllm.train.wiring.learner_kwargs`: the run's loss, optimizer and shared values) from the run's
model (its checkpoint, e.g. the SFT warm start), the variant's values applied on top (``SECTION.KEY=VALUE``,
values in TOML). Each side is warmed up (its programs compiled, timed), then the recorded steps are submitted
in order, the sides alternating within each step (the machine's load falls on both alike), each step's wall
timed. The groups keep their tokens, rewards and behaviour log-probs; their versions are set to the learner's
current one (no token is stale, so both sides train on every row). Both sides start from the same weights, so
after the same steps their weights agree up to float summation order (``max_weight_diff_vs_run``, beside
``max_weight_change_run``, how far the steps moved the run's weights: the layouts compute the same gradients, and
Adam's normalised step magnifies a float difference in a near-zero gradient); the losses agree too.

Reported per side (``run``, then each variant by its name): ``warmup_s``, ``step_s`` (each step),
``median_step_s``, ``positions_per_row`` (the model's positions a row costs in the fixed shared-prefix layout,
else ``max_len``), ``counts`` (the learner's counts of micro-batches and passes by layout); and ``speedup`` (the run's median step over the variant's), also at the top level as ``speedup_<variant>``
and ``median_step_s_<side>``.

    python benchmarks/learner_replay.py --run RUN --quick     # 2 steps: 5-10 minutes for SmolLM2-135M here
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from gymllm.algos.learner import StreamingLearner  # noqa: E402
from gymllm.errors import ConfigError, explain  # noqa: E402
from gymllm.train.components import load_model  # noqa: E402
from gymllm.train.train_config import TrainConfig, from_tables  # noqa: E402
from gymllm.train.wiring import learner_kwargs  # noqa: E402
from gymllm.trajectories.reader import trajectory_from_record  # noqa: E402
from gymllm.types import Group  # noqa: E402


def parse_variant(text: str) -> tuple[str, dict[str, dict]]:
    """``NAME:SECTION.KEY=VALUE,...`` as ``(NAME, {section: {key: value}})`` (values in TOML; a deeper key,
    ``loss.kl.beta=0.1``, nests: ``{"loss": {"kl": {"beta": 0.1}}}``). ``run`` names the run's own side."""
    name, sep, body = text.partition(":")
    if not sep or not name or not body or name == "run":
        raise ConfigError(
            explain(
                "--variant",
                expected="NAME:SECTION.KEY=VALUE[,SECTION.KEY=VALUE...] with NAME other than run",
                received=text,
                fix="e.g. --variant 'prefix256:learner.prefix_len=256,learner.micro_batch_size=8'",
            )
        )
    tables: dict[str, dict] = {}
    for item in body.split(","):
        key, eq, value = item.partition("=")
        path = [p.strip() for p in key.split(".")]
        if not eq or len(path) < 2 or not all(path):
            raise ConfigError(
                explain(
                    "--variant item",
                    expected="SECTION.KEY=VALUE",
                    received=item,
                    fix="name the section: learner.prefix_len=256",
                )
            )
        table = tables
        for part in path[:-1]:
            table = table.setdefault(part, {})
        table[path[-1]] = tomllib.loads(f"v = {value.strip()}")["v"]
    return name, tables


def recorded_steps(run: pathlib.Path) -> list[list[Group]]:
    """The run's trained groups, step by step (``trajectories.jsonl``: each record's ``step`` and
    ``group_id``), in the order they were recorded."""
    steps: dict[int, dict[str, list]] = collections.defaultdict(dict)
    with open(run / "trajectories.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type", "trajectory") != "trajectory":
                continue
            t = trajectory_from_record(rec)
            steps[int(rec["step"])].setdefault(t.group_id, []).append(t)
    return [
        [
            Group(group_id=g, task_id=ts[0].task_id, trajectories=ts, admitted_version=0)
            for g, ts in steps[s].items()
        ]
        for s in sorted(steps)
    ]


def at_version(groups: list[Group], version: int) -> list[Group]:
    """``groups`` with every sampled token at ``version`` (the learner's current one: nothing stale)."""
    return [
        dataclasses.replace(
            g,
            admitted_version=version,
            trajectories=[
                dataclasses.replace(
                    t, versions=np.where(t.loss_mask > 0, version, -1).astype(np.int32)
                )
                for t in g.trajectories
            ],
        )
        for g in groups
    ]


def positions_per_row(ln: StreamingLearner) -> float:
    """The model positions one row costs: the fixed shared-prefix pass's (prefix slots + continuations)
    over its rows, else ``max_len`` (the longest padded row)."""
    c = ln.config
    if c.fixed_shapes and c.shared_prefix:
        ts = c.max_len - ln.layout.prefix_len
        return (ln.layout.prefix_slots * ln.layout.prefix_len + c.micro_batch_size * ts) / (
            c.micro_batch_size
        )
    return float(c.max_len)


def build(cfg: TrainConfig, lm) -> StreamingLearner:
    return StreamingLearner(
        lm.config,
        lm.model.flat_params(),
        lora=cfg.lora,
        pad_id=int(lm.tokenizer.pad_token_id or 0),
        **learner_kwargs(cfg),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="a gymllm train run directory")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:SECTION.KEY=VALUE,... (repeatable; the run's own settings are side 'run')",
    )
    ap.add_argument("--steps", type=int, default=None, help="recorded steps replayed (default 4)")
    ap.add_argument("--quick", action="store_true", help="2 steps")
    args = ap.parse_args()
    run = pathlib.Path(args.run)
    base = from_tables(json.loads((run / "config.json").read_text()), where=str(run))
    variants = {"run": base}
    for text in args.variant:
        name, tables = parse_variant(text)
        variants[name] = from_tables(tables, base, where=f"--variant {name}")
    steps = recorded_steps(run)[: args.steps or (2 if args.quick else 4)]
    lm = load_model(base.model)
    learners, out = {}, {}
    for name, cfg in variants.items():
        t = time.perf_counter()
        ln = build(cfg, lm)
        ln.warmup(group_size=cfg.rollout.group_size)
        learners[name] = ln
        out[name] = {
            "warmup_s": time.perf_counter() - t,
            "learner": {
                k: getattr(ln.config, k)
                for k in (
                    "micro_batch_size",
                    "max_len",
                    "fixed_shapes",
                    "prefix_len",
                    "prefix_slots",
                )
            },
            "positions_per_row": positions_per_row(ln),
            "step_s": [],
            "loss": [],
        }
    names = list(variants)
    for s, groups in enumerate(steps):
        for name in names[s % len(names) :] + names[: s % len(names)]:
            ln = learners[name]
            batch = at_version(groups, ln.version)
            t = time.perf_counter()
            results = ln.submit(batch)
            out[name]["step_s"].append(time.perf_counter() - t)
            out[name]["loss"] += [float(r.metrics["loss"]) for r in results]
    ref = learners["run"].trainable
    start = lm.model.flat_params()
    moved = max(float(jnp.max(jnp.abs(ref[k] - start[k].astype(ref[k].dtype)))) for k in ref)
    for name, r in out.items():
        ln = learners[name]
        r["median_step_s"] = statistics.median(r["step_s"])
        r["max_weight_diff_vs_run"] = max(
            float(jnp.max(jnp.abs(ln.trainable[k].astype(jnp.float32) - ref[k]))) for k in ref
        )
        r["counts"] = {k: v for k, v in ln.counts.items() if "micro_batches" in k or "passes" in k}
        r["speedup"] = out["run"]["median_step_s"] / r["median_step_s"]
    headline = {f"speedup_{n}": out[n]["speedup"] for n in names if n != "run"}
    headline.update({f"median_step_s_{n}": out[n]["median_step_s"] for n in names})
    result = {
        **headline,
        "run_dir": str(run),
        "model": base.model.name,
        "steps": len(steps),
        "rows": [sum(len(g.trajectories) for g in gs) for gs in steps],
        "max_weight_change_run": moved,
        "compute_dtype": learners["run"].config.compute_dtype,
        "load_avg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        **out,
    }
    from results import emit_result

    emit_result("learner_replay", result)


if __name__ == "__main__":
    main()
