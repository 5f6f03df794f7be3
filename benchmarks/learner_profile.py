"""Where a learner step goes: a phase breakdown of the streaming learner on the peers' medium config.

Each phase runs as its own jitted function on the same micro-batch, so its time is its own (no
overlap with the others), median of ``--reps`` calls, the phases interleaved round-robin in one
process (under contention every phase sees about the same load):

* ``ref_forward``: the reference model's forward + token log-probs (beta > 0, KL in the loss);
* ``policy_forward``: the policy's forward + log-probs + entropy alone (what an extra old-policy
  forward would cost; the learner never runs one: see ``old_policy_forward`` in the result);
* ``policy_fwd_bwd``: the policy's loss gradient without the reference;
* ``grad_program``: the learner's whole per-micro-batch program (policy fwd+bwd + reference forward),
  and ``grad_program_packed``: the same on the rows packed (when they pack into fewer rows);
* ``attention_fwd_bwd``: the attention alone (``gymllm.models.attention``, 4 layers' worth, the
  micro-batch's shape, dense causal mask), and ``attention_block_causal``: the same attention with
  the queries cut in two halves, the first half against the first half of the keys only (what a
  block-causal kernel skips: the masked upper-right quarter; exact, ``block_causal_max_diff``);
* ``optimizer``: the AdamW update (clip, moments, apply) over all weights;
* ``host_batching``: trajectories -> rows -> the padded micro-batch (NumPy);
* ``host_to_device`` / ``device_to_host``: the micro-batch's arrays onto the device, the metric sums back;
* ``recompiles``: XLA compilations during steady learner steps (after ``warmup()``), counted with a
  ``jax.monitoring`` listener over ``--steps`` end-to-end ``StreamingLearner`` steps;
* ``padding_share``: padded positions over all positions the model runs (and ``prompt_share``: the
  positions that carry no loss, prompt tokens, over all).

Two response-length scenarios: ``full`` (every reply runs to the 64-token budget: the peers' medium
run with its random-init model, which almost never samples EOS) and ``mixed`` (reply lengths uniform
in 4..64, a trained policy's spread). ``--compare`` also times the learner's whole step with the
rows packed (``LearnerConfig(packing=True)``: segment ids, no FLOP on padding) against the padded
path, A/B interleaved in one process, and checks that the two give the same update; ``--split 8``
A/Bs the peers' one micro-batch of 64 rows against micro-batches of 8 rows (the same update);
``--head`` A/Bs the learner step with the LM head on every position (``loss_positions_only=False``)
against the head on the loss positions only (the default; ``max_response_len`` as the trainer sets it:
64 here), on the medium workload and on a SmolLM2-135M-shaped one (``--head-layers`` of its 30
layers, random weights; the Quickstart's learner: 2 groups of 6 rows, 97-token prompt, two 24-token
replies around a 14-token observation, bucket 160, budget 48, ``compute_dtype="auto"``); ``--shared-prefix``
A/Bs the learner step (and its gradient program alone, fastest of N) with every row run whole
(``shared_prefix=False``) against each group's prompt run once (``shared_prefix=True``,
:mod:`gymllm.models.shared_prefix`) on the same two workloads.

The machine is shared (2 cores, other jobs): absolute times are contended; the shares and the A/B
ratios, measured side by side, are the figures to read.

    python benchmarks/learner_profile.py --quick            # ~2 min
    python benchmarks/learner_profile.py --reps 5 --steps 4 --compare      # docs/learner-profile.md
    python benchmarks/learner_profile.py --quick --scenarios full --split 8
    python benchmarks/learner_profile.py --quick --scenarios full --head --no-phases
    python benchmarks/learner_profile.py --quick --scenarios full --shared-prefix --no-phases

Ends with ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gymllm.algos import config as C
from gymllm.algos.batching import (
    buckets,
    loss_positions,
    make_micro_batch,
    on_loss_positions,
    pack_rows,
    pick_bucket,
    row_from_trajectory,
    shared_prefix_layout,
    shared_prefix_table,
)
from gymllm.algos.learner import StreamingLearner
from gymllm.algos.learner_config import LearnerConfig
from gymllm.algos.learner_programs import build_loss_fn
from gymllm.algos.optim import OptimizerConfig, make_optimizer
from gymllm.models.attention import attention
from gymllm.models.layers import causal_mask
from gymllm.models.logprobs import token_logprobs
from gymllm.models.tiny import tiny_config
from gymllm.models.transformer import forward, init_params
from gymllm.types import Group, Trajectory

# the peers' medium spec (benchmarks/peers.py SIZES["medium"]): 4 layers, d 128, 8 prompts x 8 samples, 64 new tokens
MEDIUM = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_layers=4,
    num_heads=8,
    num_kv_heads=4,
)
PROMPTS, GROUP, NEW_TOKENS, PROMPT_LEN, MAX_PROMPT = 8, 8, 64, 44, 64
# the Quickstart's learner workload (train_config preset "default": SmolLM2-135M on ArithmeticTool-v0):
# a 97-token chat prompt, reply (<= 24), tool observation, reply (<= 24); 2 groups of 6 a step
QS_PROMPT, QS_REPLY, QS_OBS, QS_GROUPS, QS_GROUP = 97, 24, 14, 2, 6


def model(workload: str = "medium", layers: int = 4):
    if (
        workload == "smollm2"
    ):  # SmolLM2-135M's exact architecture (benchmarks/accelerator_check.py), fewer layers
        from accelerator_check import SHAPES

        cfg = tiny_config("llama", **{**SHAPES["smollm2-135m"], "num_layers": layers})
        return cfg, init_params(cfg, 0, std=0.02)
    cfg = tiny_config("qwen3", **MEDIUM)
    return cfg, init_params(cfg, 0)


def quickstart_groups(*, seed: int = 0, version: int = 0, vocab: int = 49152) -> list[Group]:
    """2 groups x 6 trajectories of the Quickstart's layout: prompt, reply, observation, reply (159
    tokens: the 160 bucket's rows full, the 48-token response budget full)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(QS_GROUPS):
        prompt = rng.integers(3, vocab, QS_PROMPT)
        trajs = []
        for m in range(QS_GROUP):
            parts = [
                prompt,
                rng.integers(3, vocab, QS_REPLY),
                rng.integers(3, vocab, QS_OBS),
                rng.integers(3, vocab, QS_REPLY),
            ]
            ids = np.concatenate(parts).astype(np.int32)
            mask = np.concatenate([np.full(len(p), i % 2) for i, p in enumerate(parts)]).astype(
                np.int8
            )
            mu = np.where(mask > 0, -3.0 + rng.normal(0, 0.05, len(ids)), 0).astype(np.float32)
            trajs.append(
                Trajectory(
                    token_ids=ids,
                    loss_mask=mask,
                    behaviour_logprobs=mu,
                    versions=np.where(mask > 0, version, -1).astype(np.int32),
                    reward=float(rng.random()),
                    trajectory_id=f"q{seed}/{k}/{m}",
                    group_id=f"q{seed}/{k}",
                )
            )
        out.append(
            Group(
                group_id=f"q{seed}/{k}", task_id="t", trajectories=trajs, admitted_version=version
            )
        )
    return out


def quickstart_learner_config(**kw) -> LearnerConfig:
    """The Quickstart's learner (train_config preset "default", as the trainer's ``wiring.learner_kwargs`` completes it)."""
    base = dict(
        groups_per_step=QS_GROUPS,
        micro_batch_size=QS_GROUP,
        num_steps=12,
        max_len=256,
        min_bucket=160,
        compute_dtype="auto",
        max_response_len=2 * QS_REPLY,
    )
    base.update(kw)
    return LearnerConfig(**base)


def groups(scenario: str, *, seed: int = 0, version: int = 0) -> list[Group]:
    """8 groups x 8 trajectories: a 44-token prompt shared by the group, a reply of 64 tokens
    (``full``) or 4..64 (``mixed``); behaviour log-probs near the random model's (-log V)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(PROMPTS):
        prompt = rng.integers(3, MEDIUM["vocab_size"], PROMPT_LEN)
        trajs = []
        for m in range(GROUP):
            n = NEW_TOKENS if scenario == "full" else int(rng.integers(4, NEW_TOKENS + 1))
            ids = np.concatenate([prompt, rng.integers(3, MEDIUM["vocab_size"], n)]).astype(
                np.int32
            )
            mask = np.r_[np.zeros(PROMPT_LEN), np.ones(n)].astype(np.int8)
            mu = np.where(
                mask > 0, -np.log(MEDIUM["vocab_size"]) + rng.normal(0, 0.05, len(ids)), 0
            ).astype(np.float32)
            trajs.append(
                Trajectory(
                    token_ids=ids,
                    loss_mask=mask,
                    behaviour_logprobs=mu,
                    versions=np.where(mask > 0, version, -1).astype(np.int32),
                    reward=float(rng.random()),
                    trajectory_id=f"{seed}/{k}/{m}",
                    group_id=f"{seed}/{k}",
                )
            )
        out.append(
            Group(group_id=f"{seed}/{k}", task_id="t", trajectories=trajs, admitted_version=version)
        )
    return out


def learner_config(**kw) -> LearnerConfig:
    """The peers' medium learner settings (benchmarks/peers/run_gymllm.py)."""
    base = dict(
        groups_per_step=PROMPTS,
        micro_batch_size=PROMPTS * GROUP,
        num_steps=100,
        max_len=MAX_PROMPT + NEW_TOKENS,
        min_bucket=64,
        buckets_per_octave=4,
    )
    base.update(kw)
    return LearnerConfig(**base)


def peers_loss() -> C.LossConfig:
    loss = C.grpo()  # beta 0.04, k3 in the loss: a reference forward every micro-batch
    return dataclasses.replace(
        loss, policy=dataclasses.replace(loss.policy, eps_low=0.2, eps_high=0.2)
    )


def optimizer() -> OptimizerConfig:
    return OptimizerConfig(learning_rate=1e-4, max_grad_norm=1.0)


def median_s(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - t)
    return out


def interleaved(phases: dict, reps: int) -> dict[str, float]:
    """Median seconds of each phase, the phases called round-robin (one warm call each first)."""
    for fn in phases.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {k: [] for k in phases}
    for _ in range(reps):
        for k, fn in phases.items():
            times[k] += median_s(fn, 1)
    return {k: statistics.median(v) for k, v in times.items()}


def micro_batch_of(gs: list[Group], lcfg: LearnerConfig):
    table = buckets(lcfg.min_bucket, lcfg.max_len, lcfg.buckets_per_octave)
    rows = [
        row_from_trajectory(
            t, advantage=0.5, group_tokens=64.0, sample_id=t.trajectory_id, max_len=table[-1]
        )
        for g in gs
        for t in g.trajectories
    ]
    return make_micro_batch(
        rows, lcfg.micro_batch_size, pick_bucket(max(r.length for r in rows), table)
    ), rows


def phases(scenario: str, reps: int) -> dict:
    cfg, params = model()
    lcfg, loss = learner_config(), peers_loss()
    gs = groups(scenario)
    mb, rows = micro_batch_of(gs, lcfg)
    a = jax.device_put(mb.arrays())
    ref = {k: v + 0 for k, v in params.items()}
    loss_fn = build_loss_fn(cfg, loss, lcfg, None)
    no_ref = build_loss_fn(cfg, dataclasses.replace(loss, kl=C.KLConfig(beta=0.0)), lcfg, None)
    tx = make_optimizer(optimizer(), lcfg.num_steps)
    opt_state = tx.init(params)

    @jax.jit
    def ref_forward(p, a):
        logits, _ = forward(cfg, p, a["tokens"], a["positions"])
        return token_logprobs(logits, a["targets"])

    @jax.jit
    def policy_forward(p, a):
        logits, _ = forward(cfg, p, a["tokens"], a["positions"])
        lp = jax.nn.log_softmax(logits, axis=-1)
        return token_logprobs(logits, a["targets"]), -jnp.sum(jnp.exp(lp) * lp, axis=-1)

    fwd_bwd = jax.jit(lambda p, a: jax.value_and_grad(no_ref, has_aux=True)(p, None, a, None))
    grad_program = jax.jit(lambda p, a, r: jax.value_and_grad(loss_fn, has_aux=True)(p, None, a, r))

    @jax.jit
    def opt_update(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    grads = jax.tree.map(jnp.ones_like, params)
    _, sums = grad_program(params, a, ref)
    b, t = mb.shape
    quantum = -(-lcfg.micro_batch_size // lcfg.pack_row_steps)  # as the learner rounds packed rows
    packed = pack_rows(rows, b, t, quantum)
    extra = {}
    if packed is not None:
        ap = jax.device_put(
            {
                **{
                    k: v
                    for k, v in mb.arrays().items()
                    if k in ("mask", "mu", "advantages", "group_tokens")
                },
                **packed,
            }
        )
        extra["grad_program_packed"] = lambda: grad_program(params, ap, ref)

    rng = np.random.default_rng(0)
    h, k, d = cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim
    q_, k_, v_ = (jnp.asarray(rng.normal(size=(b, t, n, d)), jnp.float32) for n in (h, k, k))
    mask = causal_mask(jnp.asarray(mb.positions), None, jnp.int32(1 << 30))
    half = t // 2

    def dense(q, kk, v):
        return attention(q, kk, v, mask, scale=cfg.attn_scale)

    def blocked(q, kk, v):  # first half of the queries sees only the first half of the keys
        lo = attention(
            q[:, :half], kk[:, :half], v[:, :half], mask[:, :half, :half], scale=cfg.attn_scale
        )
        hi = attention(q[:, half:], kk, v, mask[:, half:], scale=cfg.attn_scale)
        return jnp.concatenate([lo, hi], axis=1)

    def fwd_bwd_of(fn):
        return jax.jit(
            lambda q, kk, v: [
                jax.grad(lambda *x: jnp.sum(fn(*x) ** 2), argnums=(0, 1, 2))(q, kk, v)
                for _ in range(cfg.num_layers)
            ]
        )

    att_dense, att_blocked = fwd_bwd_of(dense), fwd_bwd_of(blocked)
    diff = float(jnp.max(jnp.abs(jax.jit(dense)(q_, k_, v_) - jax.jit(blocked)(q_, k_, v_))))

    def host_batching():
        return micro_batch_of(gs, lcfg)[0].tokens

    t = interleaved(
        {
            "ref_forward": lambda: ref_forward(ref, a),
            "policy_forward": lambda: policy_forward(params, a),
            "policy_fwd_bwd": lambda: fwd_bwd(params, a),
            "grad_program": lambda: grad_program(params, a, ref),
            "optimizer": lambda: opt_update(params, opt_state, grads),
            "host_batching": host_batching,
            "host_to_device": lambda: jax.device_put(mb.arrays()),
            "device_to_host": lambda: jax.device_get(sums),
            "attention_fwd_bwd": lambda: att_dense(q_, k_, v_),
            "attention_block_causal": lambda: att_blocked(q_, k_, v_),
            **extra,
        },
        reps,
    )
    positions = mb.tokens.size
    real = sum(r.length for r in rows)
    loss_positions = float(mb.mask.sum())
    return {
        "seconds": t,
        "micro_batch_shape": list(mb.shape),
        "block_causal_max_diff": diff,
        "packed_shape": None if packed is None else list(packed["packed_tokens"].shape),
        "packed_padding_share": None if packed is None else 1 - real / packed["packed_tokens"].size,
        "padding_share": 1 - real / positions,
        "prompt_share": (real - loss_positions) / positions,
        "loss_positions_share": loss_positions / positions,
    }


class CompileCounter:
    """Counts XLA backend compilations (``jax.monitoring`` duration events) while ``active``."""

    def __init__(self):
        self.active, self.names = False, []
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event: str, duration: float, fun_name: str = "", **_) -> None:
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.names.append(fun_name)

    def start(self) -> None:
        self.names, self.active = [], True

    def stop(self) -> dict:
        self.active = False
        return {"compiles": len(self.names), "grad_program_compiles": self.names.count("jit(grad)")}


def make_learner(
    packing: bool | None = None, workload: str = "medium", layers: int = 4, **kw
) -> StreamingLearner:
    cfg, params = model(workload, layers)
    if packing is not None:
        kw["packing"] = packing
    if workload == "smollm2":
        return StreamingLearner(
            cfg,
            params,
            loss=C.async_agentic(),
            optimizer=optimizer(),
            config=quickstart_learner_config(**kw),
        )
    return StreamingLearner(
        cfg, params, loss=peers_loss(), optimizer=optimizer(), config=learner_config(**kw)
    )


def workload_groups(workload: str, scenario: str, seed: int, version: int = 0) -> list[Group]:
    return (
        quickstart_groups(seed=seed, version=version)
        if workload == "smollm2"
        else groups(scenario, seed=seed, version=version)
    )


def learner_steps(
    scenario: str, steps: int, counter: CompileCounter, packing: bool | None = None
) -> dict:
    """End-to-end learner steps (warm: ``warmup()`` first): per-step wall and compilations."""
    ln = make_learner(packing)
    ln.warmup(group_size=GROUP)
    ln.submit(groups(scenario, seed=99))  # one step to settle
    walls = []
    counter.start()
    for s in range(steps):
        gs = groups(scenario, seed=s, version=ln.version)
        t = time.perf_counter()
        ln.submit(gs)
        walls.append(time.perf_counter() - t)
    return {"step_s": walls, "median_step_s": statistics.median(walls), **counter.stop()}


def compare(
    scenario: str,
    steps: int,
    counter: CompileCounter,
    a_kw: dict | None = None,
    b_kw: dict | None = None,
    settle: bool = True,
) -> dict:
    """Learner step A (default: padded) vs B (default: packed), A/B interleaved (one step each per round,
    the order alternating), plus the updates' agreement (``speedup``: A's median step over B's).
    A settle pass over the same groups compiles the packed shapes those steps need first (``warmup()``
    would compile all ``pack_row_steps - 1`` per bucket); the timed pass counts its compilations (0 expected)."""
    a_kw, b_kw = a_kw or {"packing": False}, b_kw or {"packing": True}
    a, b = make_learner(**a_kw), make_learner(**b_kw)
    work = a_kw.get("workload", "medium")
    rounds = [workload_groups(work, scenario, s) for s in range(steps)]
    settle_s = 0.0
    if settle:
        a.warmup(group_size=GROUP)  # the padded programs (shared with b: same configuration)
        if b_kw.get("micro_batch_size"):  # another row count: its own shapes
            b.warmup(group_size=GROUP)
        t = time.perf_counter()
        for gs in rounds:  # settle: compile the packed shapes these steps use
            b.submit(gs)
        settle_s = time.perf_counter() - t
    else:  # compile only the shapes these steps use: one step of the first round on each side
        for ln in (a, b):
            ln.submit(rounds[0])
    a, b = make_learner(**a_kw), make_learner(**b_kw)
    ta, tb = [], []
    counter.start()
    for s, gs in enumerate(rounds):
        gs = [dataclasses.replace(g, admitted_version=s) for g in gs]
        for ln, out in ((a, ta), (b, tb)) if s % 2 == 0 else ((b, tb), (a, ta)):
            t = time.perf_counter()
            ln.submit(gs)
            out.append(time.perf_counter() - t)
    compiles = counter.stop()
    diff = max(float(jnp.max(jnp.abs(a.trainable[k] - b.trainable[k]))) for k in a.trainable)
    pa, pb = statistics.median(ta), statistics.median(tb)
    return {
        "a": a_kw,
        "b": b_kw,
        "a_step_s": pa,
        "b_step_s": pb,
        "speedup": pa / pb,
        "max_weight_diff": diff,
        "a_rounds": ta,
        "b_rounds": tb,
        "b_settle_s": settle_s,
        "packed_micro_batches": b.counts["packed_micro_batches"],
        "timed_pass_compiles": compiles,
        "shared_prefix_micro_batches": [
            a.counts["shared_prefix_micro_batches"],
            b.counts["shared_prefix_micro_batches"],
        ],
        "full_head_micro_batches": a.counts["full_head_micro_batches"]
        + b.counts["full_head_micro_batches"],
    }


def head_grad_program(scenario: str, workload: str, layers: int, reps: int) -> dict:
    """The learner's gradient program alone on one micro-batch, head on every position (A) vs on the loss
    positions (B), ``reps`` calls each interleaved: the fastest call of each (the least disturbed by other
    jobs on a shared machine) and the medians."""
    cfg, params = model(workload, layers)
    ln = make_learner(
        workload=workload,
        layers=layers,
        packing=False,
        loss_positions_only=True,
        **({"max_response_len": NEW_TOKENS} if workload == "medium" else {}),
    )
    lcfg = ln.config
    table = buckets(lcfg.min_bucket, lcfg.max_len, lcfg.buckets_per_octave)
    gs = workload_groups(workload, scenario, 0)
    rows = [
        row_from_trajectory(
            t, advantage=0.5, group_tokens=64.0, sample_id=t.trajectory_id, max_len=table[-1]
        )
        for g in gs
        for t in g.trajectories
    ][: lcfg.micro_batch_size]
    mb = make_micro_batch(
        rows, lcfg.micro_batch_size, pick_bucket(max(r.length for r in rows), table)
    )
    sel = loss_positions(mb.mask, lcfg.max_response_len)
    full = jax.device_put(mb.arrays())
    part = jax.device_put(on_loss_positions(mb.arrays(), sel))
    loss_fn = build_loss_fn(cfg, ln.loss, lcfg, None)
    grad = jax.jit(
        lambda p, a: jax.value_and_grad(loss_fn, has_aux=True)(p, None, a, ln.ref_params)
    )
    times = {"a": [], "b": []}
    for arrays in (full, part):
        jax.block_until_ready(grad(params, arrays))
    for i in range(reps):
        for side, arrays in (
            (("a", full), ("b", part)) if i % 2 == 0 else (("b", part), ("a", full))
        ):
            times[side] += median_s(lambda: grad(params, arrays), 1)
    a_min, b_min = min(times["a"]), min(times["b"])
    a_med, b_med = statistics.median(times["a"]), statistics.median(times["b"])
    return {
        "a_s": times["a"],
        "b_s": times["b"],
        "a_min_s": a_min,
        "b_min_s": b_min,
        "speedup_min": a_min / b_min,
        "speedup_median": a_med / b_med,
        "shape": list(mb.shape),
        "head_positions_per_row": sel["select"].shape[1],
    }


def head_compare(
    scenario: str, steps: int, counter: CompileCounter, workload: str, layers: int
) -> dict:
    """The learner step with the LM head on every position (A) against the loss positions only (B)."""
    kw = {"workload": workload, "layers": layers, "packing": False}
    if workload == "medium":
        kw["max_response_len"] = (
            NEW_TOKENS  # the trainer's sample budget (max_tokens x max_model_calls)
        )
    out = compare(
        scenario,
        steps,
        counter,
        {**kw, "loss_positions_only": False},
        {**kw, "loss_positions_only": True},
        settle=False,
    )
    out["grad_program"] = head_grad_program(scenario, workload, layers, max(steps, 5))
    cfg, _ = model(workload, layers)
    out["model"] = {
        "workload": workload,
        "layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
    }
    return out


def prefix_grad_program(scenario: str, workload: str, layers: int, reps: int) -> dict:
    """The learner's gradient program alone on one micro-batch (policy fwd+bwd, and the reference forward
    where the loss has one), the rows flat (A) vs each group's prompt once (B, ``shared_prefix_layout``),
    ``reps`` calls each interleaved (order alternating): the fastest call of each and the medians, and the
    two results' agreement (loss and gradients)."""
    cfg, params = model(workload, layers)
    ln = make_learner(workload=workload, layers=layers, packing=False, shared_prefix=True)
    lcfg = ln.config
    table = buckets(lcfg.min_bucket, lcfg.max_len, lcfg.buckets_per_octave)
    gs = workload_groups(workload, scenario, 0)
    rows = [
        row_from_trajectory(
            t,
            advantage=0.5 - (i % 3) * 0.4,
            group_tokens=64.0,
            sample_id=t.trajectory_id,
            max_len=table[-1],
        )
        for i, t in enumerate(t for g in gs for t in g.trajectories)
    ]
    rows = rows[: lcfg.micro_batch_size]
    mb = make_micro_batch(
        rows, lcfg.micro_batch_size, pick_bucket(max(r.length for r in rows), table)
    )
    sp = shared_prefix_layout(rows, *mb.shape, shared_prefix_table(lcfg.max_len))
    flat_host = mb.arrays()
    sp_host = {**{k: flat_host[k] for k in ("mask", "mu", "advantages", "group_tokens")}, **sp}
    if lcfg.loss_positions_only:
        flat_host = on_loss_positions(flat_host, loss_positions(mb.mask, lcfg.max_response_len))
        sp_host = on_loss_positions(
            sp_host, loss_positions(mb.mask, lcfg.max_response_len, sp["sp_gather"])
        )
    flat, shared = jax.device_put(flat_host), jax.device_put(sp_host)
    loss_fn = build_loss_fn(cfg, ln.loss, lcfg, None)
    grad = jax.jit(
        lambda p, a: jax.value_and_grad(loss_fn, has_aux=True)(p, None, a, ln.ref_params)
    )
    (la, _), ga = grad(params, flat)
    (lb, _), gb = grad(params, shared)
    times = {"a": [], "b": []}
    for i in range(reps):
        for side, arrays in (
            (("a", flat), ("b", shared)) if i % 2 == 0 else (("b", shared), ("a", flat))
        ):
            times[side] += median_s(lambda: grad(params, arrays), 1)
    a_min, b_min = min(times["a"]), min(times["b"])
    scale = max(float(jnp.max(jnp.abs(g))) for g in ga.values())
    positions_b = sp["sp_prefix_tokens"].size + sp["sp_suffix_tokens"].size
    return {
        "a_s": times["a"],
        "b_s": times["b"],
        "a_min_s": a_min,
        "b_min_s": b_min,
        "speedup_min": a_min / b_min,
        "speedup_median": statistics.median(times["a"]) / statistics.median(times["b"]),
        "flat_shape": list(mb.shape),
        "prefixes_shape": list(sp["sp_prefix_tokens"].shape),
        "continuations_shape": list(sp["sp_suffix_tokens"].shape),
        "positions_run": {
            "flat": int(mb.tokens.size),
            "shared": int(positions_b),
            "saved_share": 1 - positions_b / mb.tokens.size,
        },
        "loss_rel_diff": abs(float(la) - float(lb)) / max(abs(float(la)), 1e-12),
        "grad_max_diff_over_max": max(float(jnp.max(jnp.abs(ga[k] - gb[k]))) for k in ga) / scale,
        "compute_dtype": lcfg.compute_dtype,
        "loss_positions_only": lcfg.loss_positions_only,
    }


def prefix_compare(
    scenario: str, steps: int, counter: CompileCounter, workload: str, layers: int, reps: int
) -> dict:
    """The learner step with the rows flat (A, ``shared_prefix=False``) against each group's prompt run
    once (B, ``shared_prefix=True``), interleaved, plus the gradient program alone (fastest of ``reps``)."""
    kw = {"workload": workload, "layers": layers, "packing": False}
    out = compare(
        scenario,
        steps,
        counter,
        {**kw, "shared_prefix": False},
        {**kw, "shared_prefix": True},
        settle=False,
    )
    out["grad_program"] = prefix_grad_program(scenario, workload, layers, reps)
    cfg, _ = model(workload, layers)
    out["model"] = {
        "workload": workload,
        "layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
    }
    return out


def end_to_end(rounds: int, steps: int, split: int) -> dict:
    """The peers' gymllm side (``benchmarks/peers/run_gymllm.py``: engine + rollout + streaming learner,
    medium spec) with its one 64-row micro-batch (A) against ``split``-row micro-batches (B), the
    runs interleaved over ``rounds`` (order alternating); mean step wall after the 2 warm-up steps."""
    import sys
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(here, "peers")]
    import peers
    import run_gymllm

    from gymllm.train.trainer import train

    out: dict = {"a": [], "b": [], "a_train_busy_s": [], "b_train_busy_s": []}
    with tempfile.TemporaryDirectory(prefix="learner-e2e-") as tmp:
        spec = peers.peer_spec("medium", steps=steps, tokenizer_file=peers.write_tokenizer(tmp))
        for r in range(rounds):
            for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                cfg = run_gymllm.train_config(spec, os.path.join(tmp, f"{side}{r}"))
                if side == "b":
                    cfg = dataclasses.replace(
                        cfg, learner=dataclasses.replace(cfg.learner, micro_batch_size=split)
                    )
                hist = train(cfg).history[peers.WARMUP_STEPS :]
                out[side].append(statistics.mean(float(h["step_wall_s"]) for h in hist))
                out[f"{side}_train_busy_s"].append(
                    statistics.mean(float(h["train_busy_s"]) for h in hist)
                )
    out["speedup_per_round"] = [a / b for a, b in zip(out["a"], out["b"])]
    out["speedup"] = statistics.mean(out["a"]) / statistics.mean(out["b"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 reps, 2 steps (about two minutes here)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--scenarios", default="full,mixed")
    ap.add_argument(
        "--compare", action="store_true", help="A/B the padded and the packed learner step"
    )
    ap.add_argument(
        "--split",
        type=int,
        default=0,
        help="also A/B one micro-batch of 64 rows against micro-batches of this many rows (e.g. 8)",
    )
    ap.add_argument(
        "--head",
        action="store_true",
        help="A/B the learner step with the LM head on every position against the loss positions only "
        "(medium, and SmolLM2-shaped with --head-layers layers)",
    )
    ap.add_argument(
        "--head-layers", type=int, default=4, help="layers of the SmolLM2-shaped model for --head"
    )
    ap.add_argument(
        "--shared-prefix",
        action="store_true",
        help="A/B the learner step and its gradient program with the rows flat against each group's "
        "prompt run once (medium, and SmolLM2-shaped with --head-layers layers)",
    )
    ap.add_argument(
        "--no-phases",
        action="store_true",
        help="skip the phase breakdown (only the A/Bs asked for)",
    )
    ap.add_argument(
        "--e2e",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also A/B the peers' gymllm side end to end (medium, 6 steps a run) with 64-row against "
        "--split-row micro-batches (default 8), over ROUNDS interleaved rounds",
    )
    args = ap.parse_args()
    reps, steps = args.reps or (3 if args.quick else 7), args.steps or (2 if args.quick else 4)
    counter = CompileCounter()
    result: dict = {
        "reps": reps,
        "steps": steps,
        "load_avg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "old_policy_forward": "never run: ratio_against='behaviour' uses the engine's logprobs (mu), "
        "'proximal' the detached logprobs of the same policy forward",
    }
    for sc in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
        ph = {} if args.no_phases else phase_report(sc, reps, steps, counter)
        if args.compare:
            ph["packed_vs_padded"] = compare(sc, steps, counter)
        if args.split:
            ph[f"micro_batch_{args.split}_vs_64"] = compare(
                sc,
                steps,
                counter,
                {"packing": False},
                {"packing": False, "micro_batch_size": args.split},
            )
        if args.head:
            ph["head_loss_positions_vs_all"] = head_compare(sc, steps, counter, "medium", 4)
        if args.shared_prefix:
            ph["shared_prefix_vs_flat"] = prefix_compare(
                sc, steps, counter, "medium", 4, max(reps, 5)
            )
        result[sc] = ph
        print(sc, json.dumps(ph, indent=1), flush=True)
    if args.head:  # the Quickstart's layout (the scenarios do not apply)
        result["smollm2_shaped_head_loss_positions_vs_all"] = head_compare(
            "full", steps, counter, "smollm2", args.head_layers
        )
        print(json.dumps(result["smollm2_shaped_head_loss_positions_vs_all"], indent=1), flush=True)
    if args.shared_prefix:  # the Quickstart's layout (the scenarios do not apply)
        result["smollm2_shaped_shared_prefix_vs_flat"] = prefix_compare(
            "full", steps, counter, "smollm2", args.head_layers, max(reps, 5)
        )
        print(json.dumps(result["smollm2_shaped_shared_prefix_vs_flat"], indent=1), flush=True)
    if args.e2e:
        result["end_to_end_micro_batch"] = end_to_end(args.e2e, 6, args.split or 8)
        print(json.dumps(result["end_to_end_micro_batch"]), flush=True)
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("learner_profile", result)


def phase_report(sc: str, reps: int, steps: int, counter: CompileCounter) -> dict:
    """The phase breakdown of one scenario and its end-to-end learner steps."""
    ph = phases(sc, reps)
    sec = ph["seconds"]
    total = sum(
        sec[k]
        for k in ("grad_program", "optimizer", "host_batching", "host_to_device", "device_to_host")
    )
    ph["shares_of_step"] = {
        "reference_forward": sec["ref_forward"] / total,
        "policy_fwd_bwd": (sec["grad_program"] - sec["ref_forward"]) / total,
        "optimizer": sec["optimizer"] / total,
        "host_batching": sec["host_batching"] / total,
        "host_device_transfers": (sec["host_to_device"] + sec["device_to_host"]) / total,
        "attention_fwd_bwd_policy": sec["attention_fwd_bwd"] / total,
    }
    if "grad_program_packed" in sec:
        ph["packed_grad_speedup"] = sec["grad_program"] / sec["grad_program_packed"]
    ph["attention_block_causal_saving"] = (
        1 - sec["attention_block_causal"] / sec["attention_fwd_bwd"]
    )
    ph["phase_sum_s"] = total
    ph["learner"] = learner_steps(sc, steps, counter)
    return ph


if __name__ == "__main__":
    main()
