"""The learner's configuration (:class:`LearnerConfig`, re-exported by :mod:`gymllm.algos.learner`) and
the defaults the learner resolves from it."""

from __future__ import annotations

import dataclasses
from typing import Any

from gymllm.validation import check_order, check_range, require

__all__ = ["HEAD_SHARE_AUTO", "LearnerConfig", "SHARED_PREFIX_AUTO", "head_flops_share"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    """The streaming learner's settings (the shared values it reads from other sections are constructor arguments of
    :class:`~gymllm.algos.learner.StreamingLearner`)."""

    groups_per_step: int = 4
    """B groups per optimizer update."""
    micro_batch_size: int = 8
    """rows per compiled micro-batch."""
    num_steps: int = 100
    """optimizer updates of a run."""
    max_len: int = 512
    """The longest length bucket of micro-batches (a longer row is cut and counted; in a run at least the engine's
    max_len)."""
    min_bucket: int = 32
    """The shortest length bucket; buckets are powers of two up to max_len, each octave cut into buckets_per_octave
    steps."""
    buckets_per_octave: int = 1
    """Steps each octave of length buckets is cut into (less padding, more compiles)."""
    max_staleness: int | None = None
    """drop groups more than this many versions old (None = the learner's ``default_staleness``: in a run, the group
    source's ``rollout.max_staleness``; else no bound)."""
    compute_entropy: bool = True
    """report the policy entropy (costs one pass over the logits)."""
    fast_compile: bool = False
    """compile with XLA's cheap CPU settings (about 3x faster compiles, for tiny models, tests and CPU runs; off for
    real models, where the optimized code matters)."""
    max_response_len: int = 0
    """L_max of the "constant" aggregation (Dr. GRPO), the sampling budget of a trajectory (0 = the learner's
    ``sample_budget``: in a run, ``sampling.max_tokens * rollout.max_model_calls``; else max_len)."""
    compute_dtype: str | None = None
    """None (compute in the weights' dtype) or "bfloat16" / "float16": mixed precision, float32 master weights and
    optimizer state, low-precision matmuls with float32 accumulation (``forward(compute_dtype=...)``); log-
    softmax stays float32. "auto": bfloat16 where bf16 matmuls are native, else float32
    (:func:`gymllm.utils.host.resolve_compute_dtype`, resolved by the learner)."""
    packing: bool = False
    """run the model on each micro-batch's rows packed end to end into fewer rows of the same bucket length (segment
    ids, positions restarting per sequence; :func:`gymllm.algos.batching.pack_rows`), so padding costs no FLOPs;
    the loss is computed on the padded layout, so the update is the same up to float32 summation order; a micro-
    batch that would not pack into fewer rows runs padded."""
    pack_row_steps: int = 8
    """the packed row count is rounded up to a multiple of ``ceil(micro_batch_size / pack_row_steps)``, so a bucket
    has at most ``pack_row_steps - 1`` more compiled shapes (:meth:`gymllm.algos.learner.StreamingLearner.warmup`
    compiles them all: about as many more compiles as that times the buckets; fewer steps compile less and pad
    more)."""
    loss_positions_only: bool | None = None
    """run the LM head (vocab projection, log-softmax, entropy) of the policy and reference forwards only on the
    positions the loss reads, ``min(max_response_len, bucket)`` per row (every policy-sampled target, then
    fillers: :func:`gymllm.algos.batching.loss_positions`), not on prompt or observation positions; the hidden
    states are computed for all positions as before, so the loss and gradients are those of the full projection
    (up to float32 summation order). A micro-batch with a row of more sampled tokens than ``max_response_len``
    (or a learner with ``max_response_len`` 0, or a bucket no longer than it) projects every position (counted:
    ``full_head_micro_batches`` when rows outgrew the budget). None (default): on when the LM head is at least
    :data:`HEAD_SHARE_AUTO` of a position's weight-matmul FLOPs (:func:`head_flops_share`: SmolLM2-135M 0.21,
    Qwen2.5-0.5B 0.28; the peers' medium config, vocab 512 at d 128, 0.10, where skipping it measured no faster:
    the gather costs what the smaller projection saves), resolved by the learner."""
    shared_prefix: bool | None = None
    """run each micro-batch's rows that share a prompt (the same token ids before the first sampled token: single-
    turn GRPO groups, and multi-turn ones up to their first reply), or that belong to one group (a game's
    seat dealt differently each game: they share their common prefix,
    :func:`gymllm.algos.batching.prefix_clusters`), as one prefix forward and S continuations attending to its
    keys/values (:func:`gymllm.models.shared_prefix.shared_prefix_hidden`; the same loss and gradients up to
    float32 summation order), when that runs fewer positions than the padded micro-batch
    (counted: ``shared_prefix_micro_batches``); micro-batches then take whole groups, shortest longest-row first,
    so a group's rows stay together (a group split over two micro-batches is a smaller group in each). Padded
    layout only: with ``packing`` too, the layout running fewer positions wins. Its shapes (prompts, samples,
    prompt and continuation lengths rounded up to :func:`gymllm.algos.batching.shared_prefix_table`) compile at
    first use, not in :meth:`StreamingLearner.warmup` (every possible pair would be tens of compiles; a run's
    prompts usually meet one or two), unless ``fixed_shapes``. None (default): :data:`SHARED_PREFIX_AUTO`,
    resolved by the learner."""
    fixed_shapes: bool = False
    """run a fixed set of programs decided when the learner is built, whatever the rollouts bring
    (:meth:`StreamingLearner.program_shapes`; :meth:`StreamingLearner.warmup` compiles exactly those, ahead of
    time, and nothing compiles after it): one length, ``max_len`` (``min_bucket`` and ``buckets_per_octave``
    unused; a longer row is cut to it and counted, as always), one gradient program (with ``shared_prefix`` the
    fixed layout of ``prefix_slots`` and ``prefix_len``, else the padded rows), the update, and the reference
    forward only where a reward-placement KL needs one. The LM head on the loss positions
    (``loss_positions_only``) takes exactly ``max_response_len`` positions a row: a row with more sampled tokens
    keeps its first ``max_response_len`` in the loss (the rest counted: ``sampled_tokens_over_budget``). Not with
    ``packing``."""
    prefix_len: int = 0
    """the prompt length Tp of the fixed shared-prefix layout (``fixed_shapes`` and ``shared_prefix``): a pass is
    ``prefix_slots`` prompt slots of ``prefix_len`` tokens and ``micro_batch_size`` continuations of ``max_len -
    prefix_len`` (:func:`gymllm.algos.batching.fixed_prefix_slots`). Rows share at most their first
    ``prefix_len`` inputs, so set it to at most the shortest prompt (the rest of a longer prompt runs once per
    row; a group whose common prefix is shorter may not fit one slot and take more passes). 0: ``max_len // 2``."""
    prefix_slots: int = 1
    """prompt slots per pass of the fixed layout: at least the groups one micro-batch holds (``micro_batch_size /
    group_size``, rounded up). A micro-batch whose rows need more slots runs as several passes of the same
    program (counted: ``shared_prefix_passes``; the gradients add up, so the update is the same); rows that share
    nothing (groups of one) need one slot each, so there leave ``shared_prefix`` off. Rounded up to a multiple of
    the mesh's devices."""

    def __post_init__(self) -> None:
        for f in (
            "groups_per_step",
            "micro_batch_size",
            "num_steps",
            "max_len",
            "min_bucket",
            "buckets_per_octave",
            "pack_row_steps",
        ):
            check_range("LearnerConfig", f, getattr(self, f), lo=1)
        check_range("LearnerConfig", "max_response_len", self.max_response_len, lo=0)
        if self.max_staleness is not None:
            check_range("LearnerConfig", "max_staleness", self.max_staleness, lo=0)
        require(
            self.compute_dtype in (None, "auto", "bfloat16", "float16", "float32"),
            "LearnerConfig.compute_dtype",
            expected='None, "auto", "bfloat16", "float16" or "float32"',
            received=self.compute_dtype,
            fix='use "bfloat16" for mixed precision',
        )
        require(
            self.shared_prefix in (None, True, False),
            "LearnerConfig.shared_prefix",
            expected="None (auto), True or False",
            received=self.shared_prefix,
            fix="pass a bool, or None for the default",
        )
        check_range("LearnerConfig", "prefix_slots", self.prefix_slots, lo=1)
        require(
            0 <= self.prefix_len < self.max_len,
            "LearnerConfig.prefix_len",
            expected=f"0 (auto) to max_len - 1 ({self.max_len - 1})",
            received=self.prefix_len,
            fix="use at most the shortest prompt's length",
        )
        require(
            not self.fixed_shapes or not self.packing,
            "LearnerConfig.packing",
            expected="False with fixed_shapes=True",
            received=self.packing,
            fix="turn one of packing and fixed_shapes off",
        )
        check_order("LearnerConfig", "min_bucket", self.min_bucket, "max_len", self.max_len)


SHARED_PREFIX_AUTO = True  # shared_prefix=None: docs/learner-profile.md "The shared-prefix forward"
HEAD_SHARE_AUTO = (
    0.15  # loss_positions_only=None turns on at this LM-head share of a position's matmul FLOPs
)


def head_flops_share(model_config: Any) -> float:
    """The LM head's share of one position's weight-matmul FLOPs (attention scores left out)."""
    c = model_config
    e, hd, kd = (
        c.hidden_size,
        c.num_heads * c.resolved_head_dim,
        c.num_kv_heads * c.resolved_head_dim,
    )
    head = e * c.vocab_size
    return head / (head + c.num_layers * (e * (hd + 2 * kd) + hd * e + 3 * e * c.intermediate_size))
