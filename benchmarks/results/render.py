"""Write the tables of ``docs/benchmarks.md`` from the records in ``benchmarks/results/*.jsonl``.

    python benchmarks/results/render.py            # rewrite the generated parts of docs/benchmarks.md
    python benchmarks/results/render.py --check    # exit 1 if the page is not what the records give

The page is prose written by hand with generated parts between markers, one per benchmark::

    <!-- BEGIN GENERATED: vector_env (python benchmarks/results/render.py) -->
    ...two tables: the figures by measurement, then each measurement's CPU, load, date, commit, command
    <!-- END GENERATED: vector_env -->

Figures are never typed into the page: a run records itself (``benchmarks/results/__init__.py``), this
script renders. Every measurement names its device (``results/device.py``: the record's ``device``, else
the RESULT's own ``device`` text, else the CPU, where JAX was pinned before devices were recorded); a
measurement on an accelerator is headed with its device in the figures table (a TPU column next to the
CPU ones). Records of the same benchmark, commit, CPU, device, command and notes are one measurement:
its figure is the median over the runs and the range (lo-hi) is theirs. A record imported from the
README text carries its own aggregate (``runs``, the value and its ``spread``) and is shown as given,
its values verbatim. Which RESULT keys a benchmark's table shows, and their goals, is ``FIGURES``;
a benchmark without an entry shows its top-level numeric keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import statistics
import sys
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
PAGE = REPO / "docs" / "benchmarks.md"
MARKER = re.compile(
    r"<!-- BEGIN GENERATED: (?P<name>[a-z0-9_]+)(?: [^>]*)? -->\n.*?<!-- END GENERATED: (?P=name) -->",
    flags=re.S,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Figure:
    """One row of a benchmark's table: a RESULT key (dotted for nested dicts), what it is, its goal,
    and optionally the key of a list in the same RESULT whose min-max is a single run's range."""

    key: str
    what: str
    goal: str = "-"
    range_key: str | None = None


F = Figure
FIGURES: dict[str, tuple[Figure, ...]] = {
    "serve_load": (
        F(
            key="serve_p99_ms",
            what="p99 latency of a streamed completion, concurrent clients on loopback (ms)",
        ),
        F(key="serve_p50_ms", what="p50 latency (ms)"),
        F(key="serve_errors", what="failed requests", goal="0"),
        F(key="serve_rss_growth", what="server RSS at the end / after warm-up", goal="< 1.2"),
    ),
    "viewer": (
        F(
            key="viewer_page_ms",
            what="trajectory table's first page, 100,000 trajectories, HTTP included (ms)",
            goal="< 200",
        ),
        F(key="full_read_page_ms", what="the same page parsing the whole log per request (ms)"),
        F(key="filtered_page_ms", what="a filtered page (ms)"),
    ),
    "learner_profile": (
        F(
            key="full.shares_of_step.reference_forward",
            what="medium learner step, full replies: share in the reference forward",
        ),
        F(key="full.shares_of_step.policy_fwd_bwd", what="share in the policy forward + backward"),
        F(
            key="full.shares_of_step.attention_fwd_bwd_policy",
            what="of the step, attention fwd + bwd",
        ),
        F(key="full.shares_of_step.optimizer", what="share in the optimizer update"),
        F(key="full.shares_of_step.host_device_transfers", what="share in host <-> device copies"),
        F(
            key="full.learner.grad_program_compiles",
            what="gradient-program compiles in steady steps",
            goal="0",
        ),
        F(key="full.padding_share", what="padded positions / all, full replies"),
        F(key="mixed.padding_share", what="padded positions / all, mixed reply lengths"),
        F(key="full.learner.median_step_s", what="whole learner step, full replies (s)"),
        F(
            key="mixed.packed_grad_speedup",
            what="gradient program packed vs padded, mixed reply lengths (x)",
        ),
        F(
            key="smollm2_shaped_head_loss_positions_vs_all.speedup",
            what="SmolLM2-shaped Quickstart learner step, "
            "LM head on the loss positions only vs on every position (x)",
        ),
        F(
            key="smollm2_shaped_head_loss_positions_vs_all.grad_program.speedup_min",
            what="its gradient program alone, the same A/B, fastest of the interleaved calls (x)",
        ),
        F(
            key="smollm2_shaped_head_loss_positions_vs_all.model.layers",
            what="its layers (of SmolLM2's 30)",
        ),
        F(
            key="smollm2_shaped_head_loss_positions_vs_all.b_step_s",
            what="its step, head on the loss positions (s)",
        ),
        F(
            key="full.head_loss_positions_vs_all.speedup",
            what="medium learner step, full replies: the same A/B (x)",
        ),
        F(
            key="mixed.head_loss_positions_vs_all.speedup",
            what="medium, mixed reply lengths: the same A/B (x)",
        ),
    ),
    "suite": (
        F(
            key="suite_vs_per_env",
            what="one shared engine, every env in flight, vs one engine per env in turn, warm (x)",
            goal=">= 2",
        ),
        F(key="cold_suite_vs_per_env", what="the same with compilation included (x)"),
    ),
    "selfplay": (
        F(
            key="selfplay_vs_lockstep",
            what="self-play games/s, barrier-free games on one engine vs lock-step turns, "
            "tic-tac-toe + connect-four (x)",
            goal=">= 2",
        ),
        F(key="barrier_free_games_per_s", what="barrier-free games/s (both games)"),
        F(key="lockstep_games_per_s", what="lock-step games/s (both games)"),
        F(key="per_game.tic-tac-toe.ratio", what="tic-tac-toe: barrier-free vs lock-step (x)"),
        F(key="per_game.connect-four.ratio", what="connect-four: barrier-free vs lock-step (x)"),
        F(
            key="per_game.tic-tac-toe.barrier_free_decode_steps",
            what="tic-tac-toe: engine decode steps, barrier-free",
        ),
        F(
            key="per_game.tic-tac-toe.lockstep_decode_steps",
            what="tic-tac-toe: engine decode steps, lock-step",
        ),
        F(key="games_match", what="games whose seats' rewards agree on both sides (share)"),
    ),
    "vector_env": (
        F(
            key="barrier_free_vs_gym_async",
            what="env-steps/s, barrier-free recv vs Gymnasium AsyncVectorEnv, 64 envs, "
            "lognormal latency (x)",
            goal=">= 5",
        ),
        F(
            key="barrier_free_vs_ours_step",
            what="barrier-free vs our own step() on the same envs (x)",
        ),
        F(
            key="ours_step_vs_gym_async",
            what="our step() vs Gymnasium async: the transport part (x)",
        ),
        F(
            key="overhead_vs_gym_sync",
            what="per-step time vs Gymnasium SyncVectorEnv, zero latency",
            goal="< 1",
        ),
    ),
    "models": (
        F(key="prefill_tok_s", what="SmolLM2-135M prefill 16x128, best dtype (tok/s)", goal="315"),
        F(key="decode_tok_s_b16", what="decode at batch 16, best dtype (tok/s)", goal="100"),
        F(key="fwd_bwd_s", what="fwd+bwd 8x128, best dtype (s)", goal="9"),
        F(key="bf16.prefill_tok_s", what="prefill in bf16 (tok/s)"),
        F(key="bf16.decode_tok_s_b16", what="decode b16 in bf16 (tok/s)"),
        F(key="bf16.fwd_bwd_s", what="fwd+bwd in bf16 (s)"),
        F(key="mixed.fwd_bwd_s", what="fwd+bwd mixed: fp32 masters, bf16 compute (s)"),
        F(
            key="decode_vs_bandwidth",
            what="bf16 decode step / max(weight-streaming copy, FLOPs at the run's matmul rate)",
            goal="<= 1.5",
        ),
        F(key="fp32.decode_vs_bandwidth", what="the same in float32"),
        F(
            key="fwd_bwd_vs_roofline",
            what="fwd+bwd (bf16 compute) as a fraction of the run's bf16 matmul rate",
            goal=">= 0.5",
        ),
        F(key="fp32.fwd_bwd_vs_roofline", what="the same in float32, over the fp32 rate"),
        F(key="forward_vs_roofline", what="forward as a fraction of the run's fastest matmul rate"),
        F(key="bf16.forward_vs_roofline", what="forward in bf16 over the bf16 matmul rate"),
        F(key="fp32.forward_vs_roofline", what="forward in float32 over the fp32 matmul rate"),
    ),
    "engine": (
        F(
            key="models.tiny.continuous_vs_static",
            what="tiny: continuous vs static batching, heavy-tailed lengths (x)",
            goal=">= 2",
        ),
        F(
            key="models.smollm2-135m-instruct.continuous_vs_static",
            what="SmolLM2: continuous vs static batching (x)",
            goal=">= 2",
        ),
        F(
            key="models.tiny.continuous_vs_static_compacted",
            what="tiny: the same waves on the compacting engine (x)",
        ),
        F(
            key="models.smollm2-135m-instruct.continuous_vs_static_compacted",
            what="SmolLM2: the same waves on the compacting engine (x)",
        ),
        F(
            key="models.tiny.continuous_vs_sequential",
            what="tiny: continuous vs one-at-a-time, 32 concurrent (x)",
        ),
        F(
            key="models.smollm2-135m-instruct.continuous_vs_sequential",
            what="SmolLM2: continuous vs one-at-a-time, 32 concurrent (x)",
            goal=">= 8",
        ),
        F(
            key="models.tiny.ttft_ms_p50",
            what="tiny: time to first token p50 under overload (ms)",
            goal="reported",
        ),
        F(
            key="models.smollm2-135m-instruct.ttft_ms_p50",
            what="SmolLM2: time to first token p50 (ms)",
            goal="reported",
        ),
        F(
            key="models.smollm2-135m-instruct.ttft_ms_idle",
            what="SmolLM2: time to first token on an idle engine (ms)",
        ),
    ),
    "engine_shapes": (
        F(key="programs.buckets", what="Quickstart engine, bucketed shapes: programs compiled"),
        F(
            key="programs.fixed_128",
            what="the fixed set (128-token packed prefill): programs compiled",
            goal="<= 5",
        ),
        F(
            key="compile_s.buckets",
            what="bucketed shapes: compile seconds (backend compile events)",
        ),
        F(key="compile_s.fixed_128", what="the fixed set: compile seconds"),
        F(key="tps.buckets", what="bucketed shapes: tokens/s, GRPO-like burst and second turns"),
        F(key="tps.fixed_128", what="the fixed set: tokens/s, same burst"),
        F(
            key="fixed_vs_buckets_tps",
            what="best fixed budget over bucketed shapes, tokens/s (x)",
            goal="~1 (CPU)",
        ),
    ),
    "rollout": (
        F(
            key="async_vs_sync",
            what="async orchestrator vs synchronous baseline, trajectories/s (x)",
            goal=">= 3",
        ),
        F(key="async_vs_ceiling", what="async vs its zero-latency ceiling", goal=">= 0.8"),
        F(key="engine_busy_fraction", what="engine busy, async run"),
        F(
            key="models.tiny.ceiling_vs_sync",
            what="the zero-latency ceiling vs the synchronous loop (x)",
        ),
        F(key="async_narrow_vs_sync", what="equal widths: 64 in flight vs 64 per batch (x)"),
        F(
            key="models.tiny.async_drained_vs_sync",
            what="drained: exactly 4 batches, timed to the last trajectory (x)",
        ),
        F(key="models.smollm2.async_vs_sync", what="SmolLM2: async vs sync (x)"),
        F(key="models.smollm2.async_vs_ceiling", what="SmolLM2: async vs its ceiling"),
    ),
    "train": (
        F(
            key="barrier_free_vs_sync",
            what="barrier-free vs synchronous GRPO end to end, equal widths (x)",
            goal=">= 1.5",
        ),
        F(
            key="trainer_idle_fraction_steady",
            what="trainer idle fraction, barrier-free, after step 1",
            goal="< 0.2",
        ),
        F(key="trainer_idle_fraction", what="trainer idle fraction, whole run"),
        F(
            key="tunix_config_step_s",
            what="seconds per step on Tunix's CPU config (absolute; peers below)",
            goal="see peers",
        ),
        F(
            key="learner_vs_roofline",
            what="Quickstart learner step: executed FLOP/s over this CPU's matmul roofline "
            "on the model's shapes (faster of fp32 and bf16)",
            goal=">= 0.6",
            range_key="learner_roofline.learner_vs_roofline_rounds",
        ),
        F(
            key="learner_roofline.learner_vs_roofline_fp32",
            what="the same against the float32 matmul alone",
        ),
        F(
            key="learner_roofline.learner_tokens_per_s",
            what="Quickstart learner positions trained per second",
        ),
        F(
            key="learner_roofline.learner_vs_roofline_6nt",
            what="Quickstart learner tokens/s over the tokens/s of a "
            "flat full-head step at the matmul roofline (6 N T + attention)",
            goal=">= 0.6",
        ),
        F(
            key="learner_vs_plain_fwd_bwd",
            what="a plain fwd+bwd of a micro-batch's tokens (s) over the learner's "
            "seconds per micro-batch, optimizer included",
            goal=">= 0.6",
        ),
    ),
    "quickstart": (
        F(
            key="quickstart_train_s",
            what="the README's Quickstart (gymllm train): 12 steps' training time (s)",
            goal="<= 115",
        ),
        F(
            key="quickstart_wall_s",
            what="the whole command (load, compiles, checkpoints, report) (s)",
        ),
        F(key="reward_first3", what="reward over every rollout, steps 1-3", goal="about 0.3"),
        F(key="reward_last3", what="reward over every rollout, steps 10-12", goal="> 0.6"),
        F(key="engine_busy", what="engine busy share (step-weighted)"),
        F(key="trainer_idle", what="trainer idle share (step-weighted)"),
    ),
    "compile": (
        F(
            key="programs",
            what="model programs compiled, cold cache (eager single ops apart)",
            goal="reported",
        ),
        F(key="programs_all", what="compiles in all, eager ops included, cold"),
        F(key="compile_s", what="seconds compiling, cold (threads summed)"),
        F(key="quickstart_train_s", what="training time, cold cache (s)"),
        F(key="first_step_s", what="first step's wall, cold (s)"),
        F(key="quickstart_train_s_warm", what="training time, warm cache (s)"),
        F(key="first_step_s_warm", what="first step's wall, warm (s)"),
        F(key="programs_warm", what="model programs the warm run compiled", goal="0"),
        F(key="programs_loaded_warm", what="model programs the warm run loaded from the cache"),
        F(key="compile_s_warm", what="seconds compiling or loading, warm"),
        F(key="quickstart_train_s_tpu", what="TPU: training time, cold (s)"),
        F(key="quickstart_train_s_tpu_warm", what="TPU: training time, warm (s)"),
    ),
    "compile_anatomy": (
        F(
            key="prefill.backend_s",
            what="engine prefill program (4 x 64, sampling in it): XLA backend compile (s)",
        ),
        F(key="prefill_no_sample.backend_s", what="the same prefill without sampling (s)"),
        F(key="sample.backend_s", what="the sampler alone, [4, 49152] logits (s)"),
        F(key="sample_sort.backend_s", what="the sampler with the former sort filter (s)"),
        F(key="sample_no_filter.backend_s", what="the sampler with no filter (s)"),
        F(key="decode.backend_s", what="one decode step over 12 rows, 160 slots (s)"),
        F(
            key="prefill_2_layers.backend_s",
            what="prefill on a 2-layer model of the same width (s)",
        ),
        F(
            key="prefill_effort_low.backend_s",
            what="prefill at exec_time_optimization_effort -1 (s)",
        ),
        F(key="grad.backend_s", what="a learner gradient, 6 x 160 tokens (s)"),
    ),
    "chip_limits": (
        F(key="peak_bf16_tflops", what="measured bf16 matmul rate, 8192^3 (TFLOP/s)"),
        F(key="hbm_gb_s", what="measured memory bandwidth, a pass over 1 GiB (GB/s)"),
        F(
            key="decode_vs_hbm_bound_256",
            what="SmolLM2 shape: decode at 256 rows / bandwidth bound",
            goal=">= 0.5",
        ),
        F(key="decode_vs_hbm_bound_64", what="SmolLM2 shape: decode at 64 rows / bandwidth bound"),
        F(
            key="decode_vs_hbm_bound_512",
            what="SmolLM2 shape: decode at 512 rows / bandwidth bound",
        ),
        F(
            key="learner_mfu_smollm2",
            what="learner model-FLOPs utilisation, SmolLM2 shape, bf16",
            goal=">= 0.45",
        ),
        F(
            key="learner_mfu_0p5b",
            what="learner model-FLOPs utilisation, Qwen2.5-0.5B shape, bf16",
            goal=">= 0.55",
        ),
    ),
    "chip_profile": (
        F(key="decode.tok_s", what="decode, 256 rows, 16 steps a call (tok/s)"),
        F(key="decode.wall_s", what="decode run under the trace, compiles included (s)"),
        F(key="decode.device_ops_s", what="decode: the device's ops, summed (s)"),
        F(key="learner.step_s", what="learner step, 4 x 8 x 256 tokens (s)"),
        F(key="learner.device_ops_s", what="learner run: the device's ops, summed (s)"),
        F(key="io.read_safetensors_s", what="SmolLM2 float32: read the safetensors (s)"),
        F(key="io.assemble_s", what="SmolLM2 float32: stack the layers (s)"),
        F(key="io.to_device_s", what="SmolLM2 float32: parameters onto the device (s)"),
        F(key="io.device_put_gb_s", what="one device_put of the same bytes (GB/s)"),
        F(key="io.checkpoint_on_disk_s", what="a learner checkpoint, written (s)"),
    ),
    "compile_cache": (
        F(
            key="warm_vs_cold",
            what="tiny config: whole run wall, cold cache / warm cache (x)",
            goal="reported",
        ),
        F(key="cold_s", what="tiny: cold run wall (s)"),
        F(key="warm_s", what="tiny: warm run wall (s)"),
        F(key="step_s_cold", what="tiny: step after warm-up, cold run (s)"),
        F(key="step_s_warm", what="tiny: step after warm-up, warm run (s)"),
        F(key="cache_mb", what="tiny: compiled programs on disk (MB)"),
        F(key="warm_vs_cold_medium", what="medium config: cold / warm (x)", goal="reported"),
        F(key="cold_s_medium", what="medium: cold run wall (s)"),
        F(key="warm_s_medium", what="medium: warm run wall (s)"),
        F(key="step_s_cold_medium", what="medium: step after warm-up, cold run (s)"),
        F(key="step_s_warm_medium", what="medium: step after warm-up, warm run (s)"),
        F(key="cache_mb_medium", what="medium: compiled programs on disk (MB)"),
    ),
    "telemetry": (
        F(
            key="overhead_fraction",
            what="tracing cost / step time, wall, median of paired A/B differences",
            goal="< 0.01",
        ),
        F(key="overhead_fraction_cpu", what="the same on the process's CPU time", goal="< 0.01"),
        F(
            key="overhead_fraction_modelled",
            what="modelled: events a step x cost of a span / step time",
        ),
    ),
    "scale": (
        F(
            key="scaling_efficiency_8",
            what="EnginePool by simulation: throughput at 8 replicas / (8 x at 1)",
            goal=">= 0.9",
        ),
        F(key="scaling_efficiency_16", what="the same at 16 replicas", goal=">= 0.8"),
        F(
            key="pool_request_overhead_ms",
            what="per request, a Ray replica over the engine in process (ms)",
        ),
        F(
            key="inproc_pool_request_overhead_ms",
            what="per request, an in-process pool over the engine (ms)",
        ),
        F(
            key="ray_env_step_overhead_ms",
            what="per env step, Ray vector env over threads, one env per actor (ms)",
            goal="<= 2",
        ),
        F(key="ray_env_step_overhead_ms_sharded", what="the same with 8 envs per actor (ms)"),
    ),
    "remote_env": (
        F(
            key="remote_step_overhead_ms",
            what="OpenEnv env over loopback vs in process, p50 (ms)",
            goal="<= 2",
        ),
        F(
            key="remote_scaling_4",
            what="make_vec over 4 server processes vs 1, CPU-bound env (x)",
            goal=">= 1.6",
        ),
    ),
    "proxy_overhead": (
        F(
            key="proxy_overhead_ms",
            what="training proxy (HTTP chat request + reward) vs the engine directly (ms)",
            goal="reported",
        ),
        F(key="direct_ms_p50", what="engine called directly, p50 (ms)"),
        F(key="proxy_ms_p50", what="through the proxy, p50 (ms)"),
    ),
    "drill_crash": (
        F(
            key="kills",
            what="SIGKILLs (at rollouts, after a step, mid checkpoint write, mid log write)",
            goal=">= 20",
        ),
        F(key="lost_groups", what="groups lost", goal="0"),
        F(key="duplicated_groups", what="groups trained twice", goal="0"),
        F(key="torn_records", what="torn log records", goal="0"),
        F(key="max_weight_diff", what="final weights vs the uninterrupted run's, max abs diff"),
    ),
    "drill_faults": (
        F(
            key="faults_ok",
            what="faults finished or stopped clearly within their bound",
            goal="all",
        ),
        F(key="faults_total", what="faults injected"),
    ),
    "lora_push": (
        F(
            key="adapter_bytes",
            what="bytes pushed per weight update, LoRA rank 8 on wq, wv (SmolLM2 shape)",
        ),
        F(key="merged_bytes", what="bytes pushed per update, full weights"),
        F(key="push_s_adapters", what="push time, adapters (s)"),
        F(key="push_s_merged", what="push time, full weights (s)"),
    ),
    "peers": (
        F(key="sides.gymllm.step_s", what="tiny: gymllm step (s)"),
        F(key="sides.tunix_batch.step_s", what="tiny: Tunix batch GRPO step (s)"),
        F(
            key="vs_tunix_batch",
            what="tiny: Tunix batch / gymllm (x)",
            goal="2",
            range_key="vs_tunix_batch_rounds",
        ),
        F(key="sides.tunix_agentic.step_s", what="tiny: Tunix agentic GRPO step (s)"),
        F(
            key="vs_tunix_agentic",
            what="tiny: Tunix agentic / gymllm (x)",
            goal="10",
            range_key="vs_tunix_agentic_rounds",
        ),
        F(key="sides.trl.step_s", what="tiny: TRL GRPOTrainer step (s)"),
        F(key="vs_trl", what="tiny: TRL / gymllm (x)", goal="3", range_key="vs_trl_rounds"),
        F(key="sides_medium.gymllm.step_s", what="medium: gymllm step (s)"),
        F(key="sides_medium.tunix_batch.step_s", what="medium: Tunix batch step (s)"),
        F(
            key="vs_tunix_batch_medium",
            what="medium: Tunix batch / gymllm (x)",
            range_key="vs_tunix_batch_medium_rounds",
        ),
        F(key="sides_medium.tunix_agentic.step_s", what="medium: Tunix agentic step (s)"),
        F(
            key="vs_tunix_agentic_medium",
            what="medium: Tunix agentic / gymllm (x)",
            range_key="vs_tunix_agentic_medium_rounds",
        ),
        F(key="sides_medium.trl.step_s", what="medium: TRL step (s)"),
        F(key="vs_trl_medium", what="medium: TRL / gymllm (x)", range_key="vs_trl_medium_rounds"),
        F(key="sides_smollm2.gymllm.step_s", what="smollm2: gymllm step (s)"),
        F(key="sides_smollm2.tunix_batch.step_s", what="smollm2: Tunix batch step (s)"),
        F(
            key="vs_tunix_batch_smollm2",
            what="smollm2: Tunix batch / gymllm (x)",
            goal="2",
            range_key="vs_tunix_batch_smollm2_rounds",
        ),
        F(key="sides_smollm2.tunix_agentic.step_s", what="smollm2: Tunix agentic step (s)"),
        F(key="vs_tunix_agentic_smollm2", what="smollm2: Tunix agentic / gymllm (x)", goal="2"),
        F(key="sides_smollm2.trl.step_s", what="smollm2: TRL step (s)"),
        F(key="vs_trl_smollm2", what="smollm2: TRL / gymllm (x)", goal="2"),
    ),
}


def load_records(directory: pathlib.Path = HERE) -> dict[str, list[dict[str, Any]]]:
    """Every record, by benchmark, in file order; a line that is not a record with the required fields
    is an error naming its file and line."""
    from results import RECORD_FIELDS

    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path.name}:{n}: expected one JSON record a line, received {line[:80]!r} ({e})"
                )
            missing = [k for k in RECORD_FIELDS if k not in rec]
            if missing or not isinstance(rec.get("result"), dict):
                raise ValueError(
                    f"{path.name}:{n}: a record needs {list(RECORD_FIELDS)} with result a dict; "
                    f"missing {missing}"
                )
            if rec["benchmark"] != path.stem:
                raise ValueError(
                    f"{path.name}:{n}: benchmark {rec['benchmark']!r} belongs in {rec['benchmark']}.jsonl"
                )
            out.setdefault(path.stem, []).append(rec)
    return out


def lookup(result: dict[str, Any], key: str) -> Any:
    """``result["a"]["b"]`` for ``key == "a.b"`` (a top-level key holding the dots wins); None if absent."""
    if key in result:
        return result[key]
    node: Any = result
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def num(v: Any) -> str:
    """A measured number as the page shows it (4 significant digits); text verbatim."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def span(lo: Any, hi: Any) -> str:
    lo_s, hi_s = num(lo), num(hi)
    if lo_s == hi_s:
        return lo_s
    return f"{lo_s} to {hi_s}" if lo_s.startswith("-") or hi_s.startswith("-") else f"{lo_s}-{hi_s}"


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measurement:
    """One column of a benchmark's table: one imported record, or the runs of one recorded setting."""

    records: tuple[dict[str, Any], ...]

    @property
    def first(self) -> dict[str, Any]:
        return self.records[0]

    def device(self) -> str:
        """Where it was measured, as the page says it (:func:`device_of`)."""
        return device_of(self.first)

    def header(self, label: str) -> str:
        """The figures table's column head: the label, with the device for an accelerator's run."""
        return (
            label
            if platform_of_record(self.first) in ("cpu", "other")
            else f"{label} ({self.device()})"
        )

    @property
    def imported(self) -> bool:
        return self.first["source"] != "run"

    def cell(self, fig: Figure) -> str:
        if self.imported:
            v = lookup(self.first["result"], fig.key)
            if v is None:
                return ""
            rng = (self.first.get("spread") or {}).get(fig.key)
            return num(v) + (f" ({span(*rng)})" if rng else "")
        vals = [lookup(r["result"], fig.key) for r in self.records]
        vals = [v for v in vals if v is not None]
        if not vals:
            return ""
        if not all(_is_num(v) for v in vals):
            return ", ".join(dict.fromkeys(num(v) for v in vals))
        if len(vals) == 1:
            rounds = lookup(self.first["result"], fig.range_key) if fig.range_key else None
            ok = isinstance(rounds, list) and len(rounds) > 1 and all(_is_num(x) for x in rounds)
            return num(vals[0]) + (f" ({span(min(rounds), max(rounds))} over rounds)" if ok else "")
        return f"{num(statistics.median(vals))} ({span(min(vals), max(vals))})"

    def runs(self) -> str:
        if not self.imported:
            return str(len(self.records))
        return str(self.first["runs"]) if self.first.get("runs") is not None else "not stated"

    def date(self) -> str:
        if self.imported:
            return str(self.first["date"])
        dates = sorted(str(r["date"]) for r in self.records)
        d = [
            x.replace("T", " ").rstrip("Z")[:16] + (" UTC" if x.endswith("Z") else "")
            for x in (dates[0], dates[-1])
        ]
        return d[0] if d[0] == d[-1] else f"{d[0]} to {d[-1]}"

    def load(self) -> str:
        if self.imported:
            return str(self.first["load"]) if self.first["load"] is not None else "not stated"
        ones = [r["load"][0] for r in self.records if isinstance(r.get("load"), list) and r["load"]]
        return span(min(ones), max(ones)) if ones else "not recorded"

    def commit(self) -> str:
        c = self.first["commit"]
        text = f"`{c[:7]}`" if c else "not named"
        if not self.imported and any(r.get("dirty") for r in self.records):
            text += " + local changes"
        return text

    @property
    def lead(self) -> bool:
        """Whether it leads its table: a recorded run does; an imported record if marked ``lead``."""
        return bool(self.first.get("lead", not self.imported))

    def sort_key(self) -> str:
        """The latest ISO date, with its time where given, in the records' dates ("2026-12-01 20:25",
        "2026-12-06T15:40:34Z", "by 2026-12-02", ...): newest first, and on one day the later run first."""
        found = [
            m.replace("T", " ")
            for r in self.records
            for m in re.findall(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2})?", str(r["date"]))
        ]
        return max(found, default="0000-00-00")


def _device_field(rec: dict[str, Any]) -> Any:
    """The record's device: its ``device`` field, else a text ``device`` in its RESULT, else None."""
    if rec.get("device") is not None:
        return rec["device"]
    dev = rec["result"].get("device")
    return dev if isinstance(dev, str) else None


def device_of(rec: dict[str, Any]) -> str:
    from results.device import describe

    return describe(_device_field(rec))


def platform_of_record(rec: dict[str, Any]) -> str:
    from results.device import platform_of

    return platform_of(_device_field(rec))


def measurements(records: list[dict[str, Any]]) -> list[Measurement]:
    """The records as measurements: the leading ones first (a recorded run, or an imported figure the
    README led its row with), each part newest first; ties keep file order."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for i, rec in enumerate(records):
        key = (
            ("run", rec["commit"], rec["cpu"], device_of(rec), rec["command"], rec.get("notes"))
            if rec["source"] == "run"
            else ("imported", i)
        )
        groups.setdefault(key, []).append(rec)
    ms = [Measurement(records=tuple(g)) for g in groups.values()]
    order = {id(m): i for i, m in enumerate(ms)}
    return sorted(ms, key=lambda m: (m.lead, m.sort_key(), -order[id(m)]), reverse=True)


def figures_for(name: str, records: list[dict[str, Any]]) -> tuple[Figure, ...]:
    if name in FIGURES:
        return FIGURES[name]
    keys = dict.fromkeys(
        k
        for r in records
        for k, v in r["result"].items()
        if _is_num(v) or (r["source"] != "run" and isinstance(v, str))
    )  # imported: figures only
    return tuple(Figure(key=k, what="") for k in keys)


def cell_text(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render_section(name: str, records: list[dict[str, Any]]) -> str:
    """The generated part of one benchmark's section: figures by measurement, then the measurements."""
    if not records:
        return (
            f"No recorded run of `{name}.py` yet: `python benchmarks/{name}.py` records one, "
            "`python benchmarks/results/render.py` shows it here.\n"
        )
    ms = measurements(records)
    labels = [chr(ord("A") + i) if i < 26 else f"A{i}" for i in range(len(ms))]
    figs = [f for f in figures_for(name, records) if any(m.cell(f) for m in ms)]
    lines = [
        "| figure (RESULT key) | goal | "
        + " | ".join(cell_text(m.header(x)) for x, m in zip(labels, ms))
        + " |",
        "|---|---|" + "---|" * len(ms),
    ]
    for f in figs:
        what = f"{f.what}: `{f.key}`" if f.what else f"`{f.key}`"
        cells = [m.cell(f) for m in ms]
        first = next(i for i, c in enumerate(cells) if c)
        cells[first] = f"**{cells[first]}**"
        lines.append("| " + " | ".join(cell_text(c) for c in [what, f.goal, *cells]) + " |")
    lines += [
        "",
        "| | CPU | device | runs | load | date | commit | command | source and notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, m in zip(labels, ms):
        src = "recorded by the run" if not m.imported else m.first["source"]
        if m.first.get("reported_in"):
            src += f" (first reported in `{m.first['reported_in']}`)"
        notes = "; ".join(dict.fromkeys(r["notes"] for r in m.records if r.get("notes")))
        row = [
            label,
            m.first["cpu"],
            m.device(),
            m.runs(),
            m.load(),
            m.date(),
            m.commit(),
            f"`{m.first['command']}`",
            src + (f". {notes}" if notes else ""),
        ]
        lines.append("| " + " | ".join(cell_text(str(c)) for c in row) + " |")
    return "\n".join(lines) + "\n"


def render_page(text: str, records: dict[str, list[dict[str, Any]]]) -> str:
    """``text`` with every generated part rewritten from ``records``."""

    def repl(m: re.Match) -> str:
        name = m.group("name")
        return (
            f"<!-- BEGIN GENERATED: {name} (python benchmarks/results/render.py; do not edit) -->\n"
            + render_section(name, records.get(name, []))
            + f"<!-- END GENERATED: {name} -->"
        )

    return MARKER.sub(repl, text)


def sections(text: str) -> list[str]:
    """The benchmarks the page has a generated part for."""
    return [m.group("name") for m in MARKER.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--check", action="store_true", help="exit 1 if docs/benchmarks.md differs from the records"
    )
    p.add_argument("--page", default=str(PAGE))
    a = p.parse_args(argv)
    page = pathlib.Path(a.page)
    text = page.read_text()
    new = render_page(text, load_records())
    if a.check:
        if new != text:
            print(
                f"{page}: not what the records give; run python benchmarks/results/render.py",
                file=sys.stderr,
            )
            return 1
        return 0
    page.write_text(new)
    print(f"wrote {page} ({len(sections(new))} generated parts)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    sys.exit(main())
