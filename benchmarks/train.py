"""Benchmark the trainer: barrier-free streaming GRPO vs a synchronous loop, and the Tunix CPU config.

One process, the same tiny model (Qwen3-like, 2 layers, d 64) and the same task with seeded
heavy-tailed env latency (lognormal, median 0.1 s, p99 1.5 s, like a tool or sandbox call) and heavy-tailed trajectory lengths
(TinyRepeat-v0 episodes continue with probability 0.4, up to 4 replies):

* (a) barrier-free: the rollout orchestrator streams complete groups (eta = 4) into the streaming
  learner, which trains in a worker thread while rollouts continue;
* (b) synchronous: roll out a whole batch of groups (a barrier per turn), then train, then push. The
  batch fills every env and engine row the schedule is given (64 envs, 64 rows, G 4: 16 groups,
  ``gymllm.rollout.sync_baseline.sync_batch_groups``), as a synchronous trainer oversamples; the
  learner trains on *all* of them (zero-variance groups are filtered, ~40% here, the rest fill one
  step and carry into the next, as a generation batch spans optimizer steps in TRL): none of the
  rollout work is thrown away, and the carried groups are at most one version stale (reported as
  ``sync_staleness_max``). Cutting the batch to ``groups_per_step`` groups would discard the surplus
  and, after the filter, leave each step short so that it needs a second batch anyway.

Both sides run 64 trajectories wide (async: 64 in flight; sync: 64 per batch), so
``barrier_free_vs_sync`` is the equal-width figure; the async side trains on data up to eta = 4
versions stale (``barrier_free_staleness_mean`` / ``_max``, token-weighted, as trained). Both sides
report the mean reward of the groups each step trained on (``reward_per_step``), printed side by side.

Both run N optimizer steps; every engine and learner shape is compiled before the first rollout
(``run.warmup``; compiled programs are shared within the process) and the step walls start with the
rollouts, so the walls compare schedules, not compilers. Reported: wall
time for N steps, trainer-idle fraction (the telemetry's ``pipeline/trainer_idle_fraction``: the share
of each step's window with no trainer span open, weighted by step wall) for each, over
the whole run (step 1 includes the pipeline fill: nothing to train before the first groups) and
after step 1 (``trainer_idle_fraction_steady``). Both schedules get the same rollout resources
(see ``pipeline_config`` for how the rollout supply is sized against the learner).

Tunix CPU config (``../shared/notes/anchors.md``): tiny Qwen3 (2 layers, d 64, ffn 128, 4 heads of
16, 2 kv heads, vocab 512), 4 prompts x G 4, 32 new tokens, GRPO with beta 0.04 (a reference-model
forward every step), AdamW 1e-4: steady seconds per optimizer step = mean after the first two steps,
reported as an absolute time (``tunix_config_step_s``). The peers on the same config, run side by
side in one invocation, are ``benchmarks/peers.py``'s (no figure typed into this script).

The Quickstart's learner against this CPU's matmul roofline (issue 35; ``learner_vs_roofline``, goal
>= 0.6): the learner of the README's Quickstart run (``gymllm train``'s default preset: SmolLM2-135M-Instruct,
its real weights, ``LearnerConfig`` as the trainer builds the learner (``wiring.learner_kwargs``): 6-row micro-batches, bucket 160,
bf16 compute where native, response budget 48, the async-agentic loss without a reference model)
trains on 2 groups of 6 trajectories of the Quickstart's shape (97-token prompt, two 24-token replies
around a 14-token tool observation: 159 tokens, the bucket's rows full; synthetic tokens, the same
shapes) for ``--roofline-steps`` timed steps after one settling (compiling) step. After each step
the roofline is measured on the model's own matmul shapes (each step and its roofline see about the
same load on a shared machine; the figure is the median of the per-step ratios): every projection
of a layer ([960, 576] x [576, 576 | 192 | 1536], [960, 1536] x [1536, 576]) and the LM head ([M, 576] x [576, 49152]), each a
jitted matmul timed best of several, weighted by how often a forward runs it, in float32 and in the
learner's compute dtype (bf16 x bf16 -> f32); the roofline is the faster of the two. FLOPs of a
step (executed, counted per micro-batch of B x T positions)::

    3 x [ B T (L (2 E (H D + 2 K D) + 2 H D E + 6 E F) + L 4 H D T) + 2 E V P ]

(3 = forward + backward's two matmuls; attention dense over T keys, as the kernel runs it; the LM head
on the P = B x min(T, budget) loss positions the learner projects, ``LearnerConfig.loss_positions_only``;
with ``LearnerConfig.shared_prefix`` the trunk term counts what runs: each group's prompt once over its own
keys and each continuation over the prompt's and its own keys, :func:`step_flops`).
``learner_vs_roofline`` = executed FLOP/s / roofline FLOP/s (``learner_vs_roofline_fp32``: against the
float32 matmul alone, which flatters a bf16 learner on a CPU whose bf16 matmul is faster);
``learner_vs_roofline_6nt`` uses the textbook ``6 N T + attention`` (N all matmul weights, the head at
every position, T the rows' positions) for the same step time, i.e. the learner's tokens/s against the
tokens/s of a flat full-head step at the roofline (the figure that credits the FLOPs the learner skips:
the head off the loss positions, the shared prompts);
``learner_tokens_per_s`` = positions trained per second. ``learner_vs_plain_fwd_bwd`` (issue 35's goal
>= 0.6): a plain jitted forward + backward over the same ``B x T`` tokens in the same compute dtype
(``benchmarks/models.py``'s, on the micro-batch's shape; best of ``reps``) over the learner's seconds per
micro-batch (its fastest step / micro-batches, the optimizer update included).
``--roofline-only`` runs just this part.

Ends with ``RESULT {json}``: ``barrier_free_vs_sync`` (sync wall / barrier-free wall, equal width),
``trainer_idle_fraction`` (barrier-free, whole run), ``trainer_idle_fraction_steady``,
``barrier_free_staleness_mean`` / ``_max``, ``reward_per_step`` (both sides), ``tunix_config_step_s``,
``learner_vs_roofline`` (and its parts under ``learner_roofline``), ``cpu`` and ``loadavg``.
(``async_vs_sync`` and ``async_narrow_vs_sync``, the rollout-only ratios,
are ``benchmarks/rollout.py``'s.)

    python benchmarks/train.py --quick
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time

from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device
os.environ.setdefault(
    "GYMLLM_KEEP_FREED_MEMORY", "1"
)  # its figures were measured with malloc kept (gymllm.utils.host_memory)

import numpy as np  # noqa: E402

from gymllm.algos import config as C  # noqa: E402
from gymllm.algos.learner_config import LearnerConfig  # noqa: E402
from gymllm.algos.optim import OptimizerConfig  # noqa: E402
from gymllm.train.trainer import train  # noqa: E402
from gymllm.inference.config import EngineConfig  # noqa: E402
from gymllm.train.train_config import EnvSection, ModelSection, RunSection, TrainConfig  # noqa: E402
from gymllm.rollout.config import RolloutConfig  # noqa: E402
from gymllm.inference.params import SamplingParams  # noqa: E402
from gymllm.utils.host import describe_cpu, loadavg  # noqa: E402


def pipeline_config(
    run_dir: str, *, mode: str, steps: int, eta: int = 4, latency_scale: float = 1.0
) -> TrainConfig:
    """The barrier-free vs sync workload; both modes get the same rollout resources (64 envs, 64
    trajectories in flight, 64 engine slots) and the same step (8 groups of G 4).

    Sized so that rollouts keep up with the learner (trainer idle < 20%): with 32 in flight, eta 2
    and 4 groups per step, the learner (about 0.1 s per 16-row step on the idle machine) outran
    the rollouts, which are bound by the tool latency (a group waits for the slowest of its 4
    multi-turn members, about a second) and lose ~40% of their groups to the zero-variance filter:
    whole-run idle 0.32-0.38. At most (eta + 1) * groups_per_step accepted groups are in flight or
    queued, so the supply per learner step grows with eta and with the step's size: eta 4 (the
    bound is enforced: older groups are dropped and counted; staleness is reported), 8 groups per
    step (the learner also starts on the first two groups of a step while the rest arrive) and 64
    trajectories in flight. ``latency_scale`` multiplies the env latency (a slower tool; on a
    loaded machine, the CPU slowdown factor reproduces the idle machine's ratio of learner to tool time)."""
    env_kw = {
        "num_letters": 2,
        "latency_median_s": 0.1 * latency_scale,
        "latency_p99_s": 1.5 * latency_scale,
        "continue_prob": 0.4,
        "max_replies": 4,
    }
    return TrainConfig(
        model=ModelSection(
            name="tiny-qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2
        ),
        env=EnvSection(id="gymllm/TinyRepeat-v0", kwargs=env_kw, num_envs=64),
        engine=EngineConfig(
            num_slots=64, max_len=256, min_bucket=64, idle_wait_s=0.002, decode_chunk=8
        ),  # decode_chunk 8: a turn's 8 tokens per call
        sampling=SamplingParams(max_tokens=8),
        rollout=RolloutConfig(
            group_size=4,
            max_concurrency=64,
            max_staleness=eta,
            max_model_calls=4,
            queue_size=16,
            mode=mode,
        ),
        loss=C.async_agentic(),
        optimizer=OptimizerConfig(learning_rate=1e-3),
        learner=LearnerConfig(
            groups_per_step=8, micro_batch_size=8, num_steps=steps, max_len=256, min_bucket=64
        ),
        run=RunSection(
            run_dir=run_dir,
            console=False,
            report=False,
            log_trajectories=False,
            resume=False,
            warmup=True,
        ),
    )


def tunix_config(run_dir: str, *, steps: int) -> TrainConfig:
    return TrainConfig(
        model=ModelSection(
            name="tiny-qwen3",
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
        ),
        env=EnvSection(id="gymllm/TinyRepeat-v0", kwargs={"num_letters": 4}, num_envs=16),
        engine=EngineConfig(
            num_slots=16, max_len=128, min_bucket=64, idle_wait_s=0.002, decode_chunk=8
        ),
        sampling=SamplingParams(max_tokens=32),
        rollout=RolloutConfig(group_size=4, max_concurrency=16, max_staleness=1, max_model_calls=1),
        loss=C.grpo(),
        optimizer=OptimizerConfig(learning_rate=1e-4),
        learner=LearnerConfig(
            groups_per_step=4,
            micro_batch_size=16,
            num_steps=steps,
            max_len=128,
            min_bucket=64,
            buckets_per_octave=4,
        ),  # rows are 45 prompt + 32 sampled tokens: bucket 80, not 128
        run=RunSection(
            run_dir=run_dir,
            console=False,
            report=False,
            log_trajectories=False,
            resume=False,
            warmup=True,
        ),
    )


def measure(cfg: TrainConfig) -> dict[str, float]:
    """Walls, trainer idle (whole run, and steady: after step 1, whose wall includes the pipeline fill)."""
    res = train(cfg)
    walls = np.array([h["step_wall_s"] for h in res.history])
    waits = np.array([h["trainer_wait_s"] for h in res.history])
    # trainer idle is measured once, by the telemetry (1 - the trainer spans' union over each step's
    # window, ``pipeline/trainer_idle_fraction``); the run's figure weights the steps by their wall time
    idle = np.array([h.get("pipeline/trainer_idle_fraction") or 0.0 for h in res.history]) * walls
    return {
        "steps": res.steps,
        "wall_s": float(walls.sum()),
        "trainer_idle_fraction": float(idle.sum() / walls.sum()),
        "trainer_idle_fraction_steady": float(idle[1:].sum() / max(walls[1:].sum(), 1e-9)),
        "fill_wait_s": float(waits[0]),
        "step_s": walls.tolist(),
        "reward_mean": float(np.mean(res.rewards())),
        "engine_busy_fraction": float(np.mean([h["engine_busy_fraction"] for h in res.history])),
        "weight_sync_s_mean": float(np.mean([h["weight_sync_s"] for h in res.history])),
        "train_busy_s_mean": float(np.mean([h["train_busy_s"] for h in res.history])),
        "staleness_mean": float(np.mean([h["staleness_mean"] for h in res.history])),
        "staleness_max": float(max(h["staleness_max"] for h in res.history)),
        "stale_groups_dropped": float(
            res.counts.get("stale_dropped", 0) + res.counts.get("stale_groups", 0)
        ),
        "reward_per_step": [float(h["reward_mean"]) for h in res.history],
        "staleness_mean_per_step": [float(h["staleness_mean"]) for h in res.history],
    }


@functools.lru_cache(maxsize=None)
def _matmul_case(m: int, k: int, n: int, dtype):
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (m, k), dtype)
    b = jax.random.normal(jax.random.key(1), (k, n), dtype)
    f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    jax.block_until_ready(f(a, b))  # compiled once
    return f, a, b


def matmul_seconds(m: int, k: int, n: int, dtype, reps: int) -> float:
    """Best seconds of a jitted [m, k] x [k, n] matmul (float32 accumulation, as the model's ``dense``)."""
    import jax

    f, a, b = _matmul_case(m, k, n, dtype)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(a, b))
        best = min(best, time.perf_counter() - t)
    return best


def model_matmuls(cfg, positions: int, head_positions: int) -> list[tuple[int, int, int, int]]:
    """(m, k, n, count per forward) of every weight matmul of a forward over ``positions`` tokens."""
    e, f, v, layers = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    hd, kd = cfg.num_heads * cfg.resolved_head_dim, cfg.num_kv_heads * cfg.resolved_head_dim
    return [
        (positions, e, hd, layers),
        (positions, e, kd, 2 * layers),
        (positions, hd, e, layers),
        (positions, e, f, 2 * layers),
        (positions, f, e, layers),
        (head_positions, e, v, 1),
    ]


def step_flops(
    cfg,
    rows: int,
    length: int,
    head_positions: int,
    shared: tuple[int, int, int, int] | None = None,
) -> float:
    """Executed matmul FLOPs of one micro-batch's forward + backward (see the module docstring). With
    ``shared`` = (Gp, Tp, S, Ts), the shared-prefix layout the learner ran instead of ``rows x length``:
    Gp prompts of Tp positions (attending over Tp keys) and Gp x S continuations of Ts positions
    (attending over Tp + Ts keys)."""
    e, f, v, layers = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    h, d, k = cfg.num_heads, cfg.resolved_head_dim, cfg.num_kv_heads
    proj = layers * (2 * e * (h * d + 2 * k * d) + 2 * h * d * e + 6 * e * f)  # per position
    attn = layers * 4 * h * d  # per position and key
    if shared is None:
        trunk = rows * length * (proj + attn * length)
    else:
        gp, tp, s, ts = shared
        trunk = gp * tp * (proj + attn * tp) + gp * s * ts * (proj + attn * (tp + ts))
    return 3.0 * (trunk + 2 * e * v * head_positions)


def shared_layout(ln, groups: list, rows: int, length: int) -> tuple[int, int, int, int] | None:
    """(Gp, Tp, S, Ts) of the shared-prefix layout the learner ``ln`` runs for one micro-batch of one
    group of ``groups`` (the learner's own :func:`~gymllm.algos.batching.shared_prefix_layout`), or None
    when it runs the flat rows."""
    from gymllm.algos.batching import row_from_trajectory, shared_prefix_layout

    if not ln.config.shared_prefix:
        return None
    batch = [
        row_from_trajectory(t, advantage=0.0, group_tokens=1.0, sample_id="")
        for t in groups[0].trajectories
    ]
    sp = shared_prefix_layout(batch[:rows], rows, length, ln.prefix_table)
    if sp is None:
        return None
    gp, tp = sp["sp_prefix_tokens"].shape
    return gp, tp, sp["sp_suffix_tokens"].shape[1], sp["sp_suffix_tokens"].shape[2]


def roofline_rates(cfg, rows: int, head: int, dtypes: dict, reps: int) -> dict[str, float]:
    """FLOP/s of the model's own weight matmuls (one forward's mix, each shape best of ``reps``) per dtype."""
    rates = {}
    for name, dt in dtypes.items():
        total_f = total_t = 0.0
        for m, k, n, c in model_matmuls(cfg, rows, head):
            total_f += c * 2.0 * m * k * n
            total_t += c * matmul_seconds(m, k, n, dt, reps)
        rates[name] = total_f / total_t
    return rates


def plain_fwd_bwd_seconds(cfg, params, rows: int, length: int, compute_dtype, reps: int) -> float:
    """Best seconds of a plain jitted forward + backward (mean token log-prob, every position, no loss
    machinery, no optimizer) over ``rows x length`` tokens in ``compute_dtype``: ``benchmarks/models.py``'s
    fwd+bwd on the learner's own micro-batch shape."""
    import jax
    import jax.numpy as jnp

    from gymllm.models.logprobs import token_logprobs
    from gymllm.models.transformer import forward

    rng = np.random.default_rng(0)
    toks = jnp.asarray(rng.integers(3, cfg.vocab_size, (rows, length + 1)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (rows, length))

    def loss(p):
        logits, _ = forward(cfg, p, toks[:, :-1], pos, compute_dtype=compute_dtype)
        return -jnp.mean(token_logprobs(logits, toks[:, 1:]))

    grad = jax.jit(jax.value_and_grad(loss))
    jax.block_until_ready(grad(params))  # compile
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(grad(params))
        best = min(best, time.perf_counter() - t)
    return best


def learner_roofline(steps: int, reps: int) -> dict:
    """The Quickstart's learner step against the matmul roofline of this CPU (module docstring). The
    roofline is measured after every timed step (so each step and its roofline see about the same
    load on a shared machine); the figure is the median of the per-step ratios."""
    import statistics

    import jax.numpy as jnp

    from gymllm.algos.learner import StreamingLearner
    from gymllm.train.train_config import preset
    from gymllm.train.wiring import learner_kwargs
    from gymllm.models import load
    from learner_profile import quickstart_groups

    qs = preset("default")
    lm = load(qs.model.name)  # float32 master weights, as the trainer loads them
    cfg = lm.config
    ln = StreamingLearner(
        cfg, lm.model.flat_params(), **learner_kwargs(qs)
    )  # as the trainer builds it
    lc = ln.config
    rows, length = lc.micro_batch_size, 160  # every row is 159 tokens: the 160 bucket
    budget = (
        lc.max_response_len
        if lc.loss_positions_only and 0 < lc.max_response_len < length
        else length
    )
    head = rows * budget
    dtypes = {"float32": jnp.float32}
    if lc.compute_dtype not in (None, "float32"):
        dtypes[lc.compute_dtype] = getattr(jnp, lc.compute_dtype)
    t0 = time.perf_counter()
    ln.submit(
        quickstart_groups(seed=100, vocab=cfg.vocab_size)
    )  # settle: compiles the step's programs
    settle_s = time.perf_counter() - t0
    walls, rounds = [], []
    for s in range(steps):
        gs = quickstart_groups(seed=s, version=ln.version, vocab=cfg.vocab_size)
        t = time.perf_counter()
        rep = ln.submit(gs)[0]
        walls.append(time.perf_counter() - t)
        rounds.append(roofline_rates(cfg, rows * length, head, dtypes, reps))
    micro_batches = int(rep.metrics["micro_batches"])
    shared = shared_layout(ln, gs, rows, length)
    flops = micro_batches * step_flops(cfg, rows, length, head, shared)
    positions = (
        micro_batches * rows * length
    )  # the rows' positions trained (what the learner computes once
    executed = (
        positions
        if shared is None
        else micro_batches * shared[0] * (shared[1] + shared[2] * shared[3])
    )
    n_matmul = sum(
        k * n * c for _, k, n, c in model_matmuls(cfg, 1, 1)
    )  # every weight a position multiplies
    attn = (
        3 * cfg.num_layers * 4 * cfg.num_heads * cfg.resolved_head_dim * length
    )  # per position, fwd + bwd
    flops_6nt = positions * (6.0 * n_matmul + attn)
    ratios = [flops / w / max(r.values()) for w, r in zip(walls, rounds)]
    step_s = statistics.median(walls)
    rates = {k: statistics.median(r[k] for r in rounds) for k in dtypes}
    roof = max(rates.values())
    achieved = flops / step_s
    dt = None if lc.compute_dtype in (None, "float32") else getattr(jnp, lc.compute_dtype)
    plain_s = plain_fwd_bwd_seconds(cfg, lm.model.flat_params(), rows, length, dt, reps)
    per_micro_batch = min(walls) / micro_batches  # the fastest step, optimizer update included
    return {
        "learner_vs_roofline": statistics.median(ratios),
        "learner_vs_roofline_rounds": ratios,
        "learner_vs_roofline_6nt": statistics.median(
            flops_6nt / w / max(r.values()) for w, r in zip(walls, rounds)
        ),
        "learner_vs_roofline_fp32": statistics.median(
            flops / w / r["float32"] for w, r in zip(walls, rounds)
        ),
        "learner_vs_plain_fwd_bwd": plain_s / per_micro_batch,
        "plain_fwd_bwd_s": plain_s,
        "learner_s_per_micro_batch": per_micro_batch,
        "learner_tokens_per_s": positions / step_s,
        "step_s": step_s,
        "step_s_all": walls,
        "settle_s": settle_s,
        "executed_tflops_per_step": flops / 1e12,
        "achieved_gflops": achieved / 1e9,
        "roofline_gflops": roof / 1e9,
        "matmul_gflops_by_dtype": {k: v / 1e9 for k, v in rates.items()},
        "positions_per_step": positions,
        "executed_positions_per_step": executed,
        "shared_prefix_layout": shared,
        "micro_batches": micro_batches,
        "head_positions_per_micro_batch": head,
        "compute_dtype": lc.compute_dtype,
        "model": qs.model.name,
        "params_matmul": n_matmul,
        "loss_positions_only": lc.loss_positions_only,
        "flops_formula": "3 x [B T (L (2 E (H D + 2 K D) + 2 H D E + 6 E F) + 4 L H D T) + 2 E V P] "
        "per micro-batch (shared prefix: the prompts' Gp Tp positions over Tp keys and the "
        "continuations' Gp S Ts positions over Tp + Ts keys in place of B T over T)",
    }


def reward_table(a: list[float], b: list[float]) -> str:
    """The two reward curves side by side, one step a line."""
    lines = ["step  reward barrier-free  reward sync"]
    for i in range(max(len(a), len(b))):
        ra = f"{a[i]:.3f}" if i < len(a) else "-"
        rb = f"{b[i]:.3f}" if i < len(b) else "-"
        lines.append(f"{i + 1:4d}  {ra:>20s}  {rb:>11s}")
    return "\n".join(lines)


def print_roofline(r: dict) -> None:
    print(
        f"Quickstart learner ({r['model']}, {r['compute_dtype']}): {r['step_s']:.2f}s a step, "
        f"{r['learner_tokens_per_s']:.0f} positions/s, {r['achieved_gflops']:.1f} GFLOP/s executed against a "
        f"{r['roofline_gflops']:.1f} GFLOP/s matmul roofline ({r['matmul_gflops_by_dtype']}): "
        f"learner_vs_roofline {r['learner_vs_roofline']:.2f} (6NT formula: {r['learner_vs_roofline_6nt']:.2f}); "
        f"a micro-batch {r['learner_s_per_micro_batch']:.2f}s against a plain fwd+bwd of the same positions "
        f"{r['plain_fwd_bwd_s']:.2f}s: learner_vs_plain_fwd_bwd {r['learner_vs_plain_fwd_bwd']:.2f}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="fewer steps (about two minutes on an idle 2-core CPU)"
    )
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per schedule")
    ap.add_argument(
        "--latency-scale",
        type=float,
        default=1.0,
        help="multiply the env latency (diagnostic: on a loaded machine, its CPU slowdown factor "
        "reproduces the idle machine's learner/tool time ratio); RESULT figures are for 1.0",
    )
    ap.add_argument(
        "--roofline-steps",
        type=int,
        default=None,
        help="timed Quickstart learner steps (3 quick, 5)",
    )
    ap.add_argument(
        "--roofline-only",
        action="store_true",
        help="only the Quickstart learner against the matmul roofline (learner_vs_roofline)",
    )
    args = ap.parse_args()
    roof_steps = args.roofline_steps or (3 if args.quick else 5)
    if args.roofline_only:
        cpu, load0 = describe_cpu(), loadavg()
        print(f"CPU: {cpu}; load average {load0}", flush=True)
        roof = learner_roofline(roof_steps, 2 if args.quick else 3)
        print_roofline(roof)
        from results import emit_result

        emit_result(
            "train",
            {
                "learner_vs_roofline": roof["learner_vs_roofline"],
                "learner_vs_plain_fwd_bwd": roof["learner_vs_plain_fwd_bwd"],
                "learner_roofline": roof,
                "cpu": cpu,
                "loadavg": {"start": load0, "end": loadavg()},
            },
        )
        return
    steps = args.steps or (6 if args.quick else 20)
    tunix_steps = 6 if args.quick else 12
    tmp = tempfile.mkdtemp(prefix="gymllm-bench-train-")
    cpu, load0 = describe_cpu(), loadavg()
    print(f"CPU: {cpu}; load average {load0}", flush=True)
    t0 = time.perf_counter()
    scale = args.latency_scale
    bf_cfg = pipeline_config(f"{tmp}/async", mode="async", steps=steps, latency_scale=scale)
    sync_cfg = pipeline_config(f"{tmp}/sync", mode="sync", steps=steps, latency_scale=scale)
    from gymllm.rollout.sync_baseline import sync_batch_groups

    r = sync_cfg.rollout  # the run's own RolloutConfig (its groups_per_step is the learner's)
    sync_groups = sync_batch_groups(sync_cfg.env.num_envs, None, r)
    sync_groups = min(
        sync_groups, sync_cfg.engine.num_slots // r.group_size
    )  # the engine's rows (it caps them too)
    barrier_free = measure(bf_cfg)
    sync = measure(sync_cfg)
    tunix = measure(tunix_config(f"{tmp}/tunix", steps=tunix_steps))
    tunix_step_s = float(np.mean(tunix["step_s"][2:]))
    roof = learner_roofline(roof_steps, 2 if args.quick else 3)
    out = {
        "barrier_free_vs_sync": sync["wall_s"] / barrier_free["wall_s"],
        "trainer_idle_fraction": barrier_free["trainer_idle_fraction"],
        "trainer_idle_fraction_steady": barrier_free["trainer_idle_fraction_steady"],
        "barrier_free_staleness_mean": barrier_free["staleness_mean"],
        "barrier_free_staleness_max": barrier_free["staleness_max"],
        "sync_staleness_mean": sync["staleness_mean"],
        "sync_staleness_max": sync["staleness_max"],
        "reward_per_step": {
            "barrier_free": barrier_free["reward_per_step"],
            "sync": sync["reward_per_step"],
        },
        "width": {
            "barrier_free_in_flight": bf_cfg.rollout.max_concurrency,
            "sync_batch_trajectories": sync_groups * r.group_size,
            "sync_batch_groups": sync_groups,
            "groups_per_step": sync_cfg.learner.groups_per_step,
        },
        "tunix_config_step_s": tunix_step_s,
        "tunix_config_side_by_side": "benchmarks/peers.py",
        "learner_vs_roofline": roof["learner_vs_roofline"],
        "learner_vs_plain_fwd_bwd": roof["learner_vs_plain_fwd_bwd"],
        "learner_roofline": roof,
        "steps": steps,
        "latency_scale": scale,
        "barrier_free": {k: v for k, v in barrier_free.items() if k != "step_s"},
        "sync": {k: v for k, v in sync.items() if k != "step_s"},
        "sync_trainer_idle_fraction": sync["trainer_idle_fraction"],
        "tunix_step_s_all": tunix["step_s"],
        "total_s": time.perf_counter() - t0,
        "cpu": cpu,
        "loadavg": {"start": load0, "end": loadavg()},
    }
    print(
        f"barrier-free ({bf_cfg.rollout.max_concurrency} in flight, eta {bf_cfg.rollout.max_staleness}): "
        f"{barrier_free['wall_s']:.1f}s for {steps} steps, trainer idle "
        f"{barrier_free['trainer_idle_fraction']:.0%} (after step 1: {barrier_free['trainer_idle_fraction_steady']:.0%}, "
        f"fill {barrier_free['fill_wait_s']:.2f}s), staleness mean {barrier_free['staleness_mean']:.2f} max "
        f"{barrier_free['staleness_max']:.0f}"
    )
    print(
        f"sync ({sync_groups} groups = {sync_groups * r.group_size} trajectories per batch): {sync['wall_s']:.1f}s, "
        f"trainer idle {sync['trainer_idle_fraction']:.0%}, staleness mean {sync['staleness_mean']:.2f} max "
        f"{sync['staleness_max']:.0f}"
    )
    print(f"{'figure':24s} {'value':>8s}")
    print(
        f"{'barrier_free_vs_sync':24s} {out['barrier_free_vs_sync']:8.2f}x  (equal width: 64 and 64; "
        f"async_vs_sync / async_narrow_vs_sync: benchmarks/rollout.py)"
    )
    print(
        "step walls (s): barrier-free",
        np.round(barrier_free["step_s"], 2).tolist(),
        "sync",
        np.round(sync["step_s"], 2).tolist(),
    )
    print(reward_table(barrier_free["reward_per_step"], sync["reward_per_step"]))
    print(
        f"Tunix CPU config: {tunix_step_s:.3f}s per step (peers on this config side by side: benchmarks/peers.py)"
    )
    print_roofline(roof)
    print(f"load average at the end {out['loadavg']['end']}")
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("train", out)


if __name__ == "__main__":
    main()
