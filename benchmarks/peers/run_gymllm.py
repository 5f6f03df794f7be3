"""gymllm side runner for ``benchmarks/peers.py``: the streaming GRPO learner + JaxEngine on the shared spec.

Runs in gymllm's own interpreter (a subprocess, like the peers, so every side starts from a fresh
process and compiles its own programs). The model is the ``tiny-qwen3`` preset with the spec's
sizes (random init, float32), the tokenizer is the same byte-level BPE the peers load, the env is
TinyRepeat-v0 (group k's env seed is k: the prompts the peers get, in the same order), GRPO with
the spec's beta (a reference forward every step), clip and AdamW settings. The engine and the
learner run the Quickstart's fixed program sets (``EngineConfig.shapes="fixed"``: one packed prefill
program and one decode chunk; ``LearnerConfig.fixed_shapes`` with the shared-prefix layout: a group's
prompt runs once for its rows, the same loss and gradients), which ``run.warmup`` compiles before the
first step; the first ``warmup_steps`` steps are left out of the mean all the same, as on the peers' side.

Starts itself again with malloc on transparent huge pages, as the ``gymllm`` command does
(:func:`gymllm.utils.host_memory.restart_with_hugepages`; ``GYMLLM_HUGEPAGES=0``: not).

Prints ``RESULT {json}``: ``step_s`` (each optimizer step's wall), ``mean_step_s``, ``reward_mean``,
``versions``, ``malloc_hugepages``; with the spec's ``gymllm_profile_steps`` (``"A:B"``, ``peers.py --profile-steps``) also
``profile``: those steps under ``jax.profiler`` (``run.profile_steps``), the device's ops summed by
``benchmarks/chip_profile.py``'s ``device_ops``: how much of the steps' span the device computed (the
rest it waited for the host), and the top ops.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

# JAX_PLATFORMS: as benchmarks/peers.py (or the user) gives it; peers.py --cpu pins the CPU
os.environ.setdefault("GYMLLM_KEEP_FREED_MEMORY", "1")


def train_config(spec: dict, run_dir: str):
    from gymllm.algos import config as C
    from gymllm.algos.learner_config import LearnerConfig
    from gymllm.algos.optim import OptimizerConfig
    from gymllm.inference.config import EngineConfig
    from gymllm.train.train_config import EnvSection, ModelSection, RunSection, TrainConfig
    from gymllm.rollout.config import RolloutConfig
    from gymllm.inference.params import SamplingParams

    m, s, o, a = spec["model"], spec["sampling"], spec["optimizer"], spec["algo"]
    rows = spec["num_prompts"] * spec["group_size"]
    micro = spec.get("learner_rows") or rows
    loss = C.grpo()
    loss = dataclasses_replace(
        loss,
        kl=dataclasses_replace(loss.kl, beta=a["beta"]),
        policy=dataclasses_replace(loss.policy, eps_low=a["epsilon"], eps_high=a["epsilon"]),
    )
    max_len = s["max_prompt_tokens"] + s["max_new_tokens"]
    engine = EngineConfig(
        num_slots=rows,
        max_len=max_len,
        min_bucket=64,
        idle_wait_s=0.002,
        decode_chunk=8,
        kv_write="chunk",
        shapes="fixed",  # the Quickstart's engine: one packed prefill program, one decode length
        prefill_tokens=256,
        decode_lengths=1,
        prefix_reuse=False,  # the peers keep no prefix cache: the same prefill work
    )
    # peers.py --gymllm-engine FIELD=VALUE: a sweep of the engine's settings on the accelerator
    engine = dataclasses_replace(engine, **spec.get("gymllm_engine", {}))
    return TrainConfig(
        model=ModelSection(
            name="tiny-qwen3",
            seed=spec["seed"],
            vocab_size=m["vocab_size"],
            hidden_size=m["hidden_size"],
            intermediate_size=m["intermediate_size"],
            num_layers=m["num_layers"],
            num_heads=m["num_heads"],
            num_kv_heads=m["num_kv_heads"],
        ),
        env=EnvSection(id="gymllm/TinyRepeat-v0", kwargs=dict(spec["task_kwargs"]), num_envs=rows),
        engine=engine,
        sampling=SamplingParams(temperature=s["temperature"], max_tokens=s["max_new_tokens"]),
        rollout=RolloutConfig(
            group_size=spec["group_size"],
            max_concurrency=rows,
            max_staleness=1,
            max_model_calls=1,
            queue_size=max(8, 2 * spec["num_prompts"]),
        ),
        loss=loss,
        optimizer=OptimizerConfig(
            learning_rate=o["learning_rate"],
            weight_decay=o["weight_decay"],
            max_grad_norm=o["max_grad_norm"],
        ),
        learner=LearnerConfig(
            groups_per_step=spec["num_prompts"],
            micro_batch_size=micro,  # same loss, fewer rows a pass
            num_steps=spec["steps"],
            max_len=max_len,
            fixed_shapes=True,  # the Quickstart's learner: one program set, compiled before step 1
            prefix_len=min(len(r["ids"]) for r in spec["prompts"]),  # a group's prompt runs once
            prefix_slots=-(-micro // spec["group_size"]),
        ),
        run=RunSection(
            run_dir=run_dir,
            profile_steps=spec.get("gymllm_profile_steps", ""),
            seed=spec["seed"],
            console=False,
            report=False,
            log_trajectories=False,
            resume=False,
            warmup=True,
        ),
    )


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def installed(md, name: str) -> str:
    """``name``'s installed version, or where it is imported from when it is on PYTHONPATH only (an
    offline accelerator machine runs gymllm from its checkout)."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed (from PYTHONPATH)"


def run(spec: dict) -> dict:
    import importlib.metadata as md

    import numpy as np

    from gymllm.train.trainer import train

    with tempfile.TemporaryDirectory(prefix="gymllm-peers-") as tmp:
        res = train(train_config(spec, tmp))
        profile = device_profile(res.profile_dir) if res.profile_dir else None
        keep_run(tmp, os.environ.get("GYMLLM_PEERS_KEEP", ""))
    step_s = [float(h["step_wall_s"]) for h in res.history]
    w = spec["warmup_steps"]
    # where a step's wall goes (steady steps): learner busy, learner waiting for groups, weight push
    parts = {
        k: float(np.mean([h[k] for h in res.history[w:]])) if len(res.history) > w else None
        for k in ("train_busy_s", "trainer_wait_s", "weight_sync_s", "engine_busy_fraction")
    }
    return {
        "side": "gymllm",
        "steps": len(step_s),
        "step_s": step_s,
        "breakdown": parts,
        "mean_step_s": float(np.mean(step_s[w:])) if len(step_s) > w else None,
        "reward_mean": float(np.mean(res.rewards())),
        "versions": {p: installed(md, p) for p in ("gymllm", "jax", "jaxlib", "flax", "optax")},
        "engine_overrides": spec.get("gymllm_engine", {}),
        **({"profile": profile} if profile is not None else {}),
    }


def keep_run(run_dir: str, dest: str) -> None:
    """Copy the run's telemetry (``trace.json(.gz)``, ``metrics.jsonl``, ``summary.txt``) and its
    ``jax.profiler`` capture (``*.trace.json.gz``) to ``dest`` (``GYMLLM_PEERS_KEEP``; ``""``: keep
    nothing), to read the host's side of a step where the run happened (an accelerator machine)."""
    import pathlib
    import shutil

    if not dest:
        return
    out = pathlib.Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    src = pathlib.Path(run_dir)
    for pattern in ("trace.json*", "metrics.jsonl", "summary.txt", "**/*.trace.json.gz"):
        for f in src.glob(pattern):
            if f.is_file():
                shutil.copy2(f, out / f.name)


def device_profile(profile_dir) -> dict:
    """The captured steps' device ops (``chip_profile.device_ops``) and the share of the trace's span
    the device spent in them."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from chip_profile import device_ops

    ops = device_ops(pathlib.Path(profile_dir))
    if "error" not in ops and ops.get("span_s"):
        ops["device_busy_share"] = ops["device_ops_s"] / ops["span_s"]
        ops["top_ops"] = ops["top_ops"][:8]
    return ops


def main() -> None:
    from gymllm.utils.host_memory import malloc_on_hugepages, restart_with_hugepages

    restart_with_hugepages()  # as the `gymllm` command starts: malloc on transparent huge pages
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="spec JSON written by benchmarks/peers.py")
    ap.add_argument("--mode", default="streaming", choices=("streaming",))
    args = ap.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    result = run(spec)
    result["malloc_hugepages"] = malloc_on_hugepages()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
