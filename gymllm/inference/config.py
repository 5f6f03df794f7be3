"""EngineConfig: the JAX engine's fixed resources (frozen, keyword-only, validated)."""

from __future__ import annotations

import dataclasses

from gymllm.models.cache import KV_WRITES
from gymllm.models.layers import DECODE_ATTENTIONS
from gymllm.validation import check_choice, check_range, is_int, require

_COMPUTE_DTYPES = (None, "auto", "float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Sizes of the slot pool and the compiled shapes.

    num_slots: concurrent sequences (rows of the preallocated KV cache, the decode batch).
    max_len: context length per slot (prompt + completion tokens).
    min_bucket: the smallest prefill length bucket; buckets double up to ``max_len`` (with
        ``shapes="fixed"``: no buckets; the least prompt prefix worth sharing, ``share_prompt_prefill``).
    max_prefill_batch: most prompts prefilled in one call (batch sizes are powers of two; with
        ``shapes="fixed"``: the prompt pieces one packed call holds, its only batch size).
    prefix_reuse: keep each finished row's k/v and skip re-prefilling a shared prompt prefix.
    seed: seeds the engine's own generator of per-request keys (requests without a seed).
    idle_wait_s: how long the idle loop sleeps between checks for new work.
    decode_lengths: how many cache lengths the decode step chooses from: it attends over the first S
        cache slots, S the smallest of ``max_len``, ``max_len / 2``, ... (this many) that covers every
        active row's position, so short sequences do not pay for the whole context. 1: always
        ``max_len``. Compiled decode shapes: widths x lengths.
    compute_dtype: the dtype the engine computes in (None: the model's own). ``"bfloat16"`` casts the
        engine's copy of the weights once (and every weight update) and runs every matmul in bf16
        with float32 accumulation: on CPUs with AMX several times faster than float32 at 16+ rows,
        slower at 1 row. Logits, sampling and logprobs stay float32; logprobs then differ from a
        float32 trainer's by bf16 rounding. ``"auto"``: bfloat16 where bf16 matmuls are native (an
        accelerator, a CPU with AMX or avx512_bf16), else float32
        (:func:`gymllm.utils.host.resolve_compute_dtype`); the engine's ``config`` holds the choice.
    piggyback_tokens: prompts (or a turn's new tokens past a reused prefix) in length buckets up to this
        many tokens join while other rows decode by riding along the decode step, one device call for
        both (:mod:`gymllm.inference.piggyback`), instead of a prefill call of their own that every
        decoding row waits for. 0: off. Compiled shapes: widths x lengths x those buckets, more.
    compact_rows: before each decode step, move the active rows into the narrowest decode width that
        holds them (swapping places with idle rows; cached prefixes move with their rows). False: a
        row decodes where it was placed until it finishes (a batch's steps keep the width of its
        highest row), as a static-batching server does.
    decode_chunk: decode steps per device call while no request waits to join (1: token by token; the
        same tokens either way, fewer host round trips; :mod:`gymllm.inference.multi_token_decode`).
    decode_attention: the form of a decode step's attention products: ``"auto"``, ``"dots"`` or
        ``"elementwise"`` (:func:`gymllm.models.layers.decode_attention`'s ``form``).
    kv_write: how a decode step writes its rows' new k/v into the cache: ``"scatter"`` (only the new
        slots), ``"select"`` (each row's slots rewritten by a select: row-parallel, for an accelerator
        whose scatter runs one row at a time; :func:`gymllm.models.cache.select_kv`) or ``"chunk"``
        (with ``decode_chunk`` > 1: the cache only read during a chunk, its k/v kept beside it and
        written once at the chunk's end, one window a row; :class:`gymllm.models.cache.RecentKV`).
        The same cache and tokens every way.
    share_prompt_prefill: (with ``prefix_reuse``) a request whose prompt shares at least ``min_bucket``
        tokens (enough that the rest falls in a smaller prefill bucket) with the prompt of a row still
        decoding (same weights version and adapter) copies that row's cache into its own and prefills
        only the rest; several such prompts arriving together (a GRPO group) prefill the first and join
        one iteration later, copying from it. False: every request prefills all but what a finished row
        holds.
    shapes: which set of programs the engine compiles. ``"buckets"``: the shapes above (prefill batch
        sizes x length buckets x cached lengths; decode widths x cache lengths; copy sizes; mixed
        shapes): each step fits its work closely, but the set grows with the config and the traffic
        decides which of them compile. ``"fixed"``: a small set known in advance whatever the prompt
        lengths, group mix, multi-turn lengths and adapter mix: one packed prefill of
        ``prefill_tokens`` tokens (up to ``max_prefill_batch`` prompt pieces laid end to end, each
        reading its row's cached prefix; a longer prompt continues in the next call,
        :mod:`gymllm.models.packed_prefill`) per cache length, one decode program (width
        ``num_slots``; the single step is the chunked decode with one step when ``decode_chunk`` > 1)
        per cache length (``decode_lengths`` of them: 1 gives one), one row-copy program; no
        piggybacking (``piggyback_tokens`` must be 0) and no row compaction (one width).
        ``DeviceSteps.program_shapes()`` lists the set; ``warmup()`` compiles it.
    prefill_tokens: (``shapes="fixed"``) the token budget of one packed prefill call: every call costs
        this many tokens however many prompts it holds (e.g. 128: a ~100-token prompt in one call, a
        GRPO group's one-token remainders together).
    prefill_tokens_small: (``shapes="fixed"``) a second, smaller token budget (0: off; else below
        ``prefill_tokens``): a packed call whose pieces fit it runs a program of this many tokens
        instead (one more program per cache length). Multi-turn traffic prefills mostly a few
        observation tokens a call, which the full budget pays for in padding (the Quickstart's
        calls held ~20 of their 128 tokens on average).
    """

    num_slots: int = 16
    """concurrent sequences (rows of the preallocated KV cache, the decode batch)."""
    max_len: int = 1024
    """context length per slot (prompt + completion tokens)."""
    min_bucket: int = 16
    """the smallest prefill length bucket; buckets double up to ``max_len`` (with ``shapes="fixed"``: no buckets;
    the least prompt prefix worth sharing, ``share_prompt_prefill``)."""
    max_prefill_batch: int = 4
    """most prompts prefilled in one call (batch sizes are powers of two; with ``shapes="fixed"``: the prompt pieces
    one packed call holds, its only batch size)."""
    prefix_reuse: bool = True
    """keep each finished row's k/v and skip re-prefilling a shared prompt prefix."""
    seed: int = 0
    """seeds the engine's own generator of per-request keys (requests without a seed)."""
    idle_wait_s: float = 0.05
    """how long the idle loop sleeps between checks for new work."""
    decode_lengths: int = 4
    """how many cache lengths the decode step chooses from: it attends over the first S cache slots, S the smallest
    of ``max_len``, ``max_len / 2``, ... (this many) that covers every active row's position, so short sequences
    do not pay for the whole context. 1: always ``max_len``. Compiled decode."""
    compute_dtype: str | None = None
    """the dtype the engine computes in (None: the model's own). ``"bfloat16"`` casts the engine's copy of the
    weights once (and every weight update) and runs every matmul in bf16 with float32 accumulation: on CPUs with
    AMX several times faster than float32 at 16+ rows, slower at 1 row. Logits, sampling and logprobs stay
    float32; logprobs then differ from a float32 trainer's by bf16 rounding. ``"auto"``: bfloat16 where bf16
    matmuls are native (an accelerator, a CPU with AMX or avx512_bf16), else float32
    (:func:`gymllm.utils.host.resolve_compute_dtype`); the engine's ``config`` holds the choice."""
    piggyback_tokens: int = 0
    """prompts (or a turn's new tokens past a reused prefix) in length buckets up to this many tokens join while
    other rows decode by riding along the decode step, one device call for both
    (:mod:`gymllm.inference.piggyback`), instead of a prefill call of their own that every decoding row waits
    for. 0: off. Compiled."""
    compact_rows: bool = True
    """before each decode step, move the active rows into the narrowest decode width that holds them (swapping
    places with idle rows; cached prefixes move with their rows). False: a row decodes where it was placed until
    it finishes (a batch's steps keep the width of its highest row), as a static-batching server does."""
    decode_chunk: int = 1
    """decode steps per device call while no request waits to join (1: token by token; the same tokens either way,
    fewer host round trips; :mod:`gymllm.inference.multi_token_decode`)."""
    decode_attention: str = "auto"
    """the form of a decode step's attention products (:func:`gymllm.models.layers.decode_attention`'s
    ``form``): ``"dots"`` (batched matrix products in the compute dtype, float32 accumulation),
    ``"elementwise"`` (multiply-and-reduce in float32) or ``"auto"`` (the faster one measured for the
    dtype, the head size and the rows). The same tokens up to rounding."""
    kv_write: str = "scatter"
    """how a decode step writes its rows' new k/v into the cache: ``"scatter"`` (only the new slots), ``"select"``
    (each row's slots rewritten by a select: row-parallel, for an accelerator whose scatter runs one row at a time;
    :func:`gymllm.models.cache.select_kv`) or ``"chunk"`` (with ``decode_chunk`` > 1: the cache only read during a
    chunk, its k/v kept beside it and written once at the chunk's end, one window a row;
    :class:`gymllm.models.cache.RecentKV`). The same cache and tokens every way."""
    share_prompt_prefill: bool = True
    """(with ``prefix_reuse``) a request whose prompt shares at least ``min_bucket`` tokens (enough that the rest
    falls in a smaller prefill bucket) with the prompt of a row still decoding (same weights version and adapter)
    copies that row's cache into its own and prefills only the rest; several such prompts arriving together (a
    GRPO group) prefill the first and join one iteration later, copying from it. False: every request prefills
    all but what a finished row holds."""
    shapes: str = "buckets"
    """Which set of programs the engine compiles: buckets (prefill batch sizes x length buckets x cached lengths,
    decode widths x cache lengths, copies: each step fits its work, the traffic decides what compiles) or fixed
    (one packed prefill of prefill_tokens, one decode program of num_slots rows, per cache length, one row copy:
    known in advance; no piggybacking, no compaction)."""
    prefill_tokens: int = 128
    """(``shapes="fixed"``) the token budget of one packed prefill call: every call costs this many tokens however
    many prompts it holds (e.g. 128: a ~100-token prompt in one call, a GRPO group's one-token remainders
    together)."""
    prefill_tokens_small: int = 0
    """(``shapes="fixed"``) a second, smaller token budget (0: off; else below ``prefill_tokens``): a packed call
    whose pieces fit it runs a program of this many tokens instead (one more program per cache length).
    Multi-turn traffic prefills mostly a few observation tokens a call, which the full budget pays for in
    padding (the Quickstart's calls held ~20 of their 128 tokens on average)."""

    def __post_init__(self) -> None:
        c = "EngineConfig"
        for name, lo, fix in (
            ("num_slots", 1, "use e.g. 16"),
            ("max_len", 2, "use e.g. 1024"),
            ("min_bucket", 1, "use e.g. 16"),
            ("max_prefill_batch", 1, "use e.g. 4"),
            ("decode_lengths", 1, "use e.g. 4 (1: always attend over the whole context)"),
            ("piggyback_tokens", 0, "use 0 (off) or a prompt length bucket such as 64"),
            ("decode_chunk", 1, "use 1 (token by token) or e.g. 8"),
            ("prefill_tokens", 1, "use e.g. 128 (tokens per packed prefill call)"),
        ):
            check_range(c, name, getattr(self, name), lo=lo, integer=True, fix=fix)
        check_range(
            c,
            "prefill_tokens_small",
            self.prefill_tokens_small,
            lo=0,
            hi=self.prefill_tokens - 1,
            integer=True,
            fix=f"use 0 (off) or a budget below prefill_tokens={self.prefill_tokens}, e.g. 32",
        )
        require(
            is_int(self.seed), f"{c}.seed", expected="an int", received=self.seed, fix="use e.g. 0"
        )
        check_range(c, "idle_wait_s", self.idle_wait_s, lo=0, lo_open=True, fix="use e.g. 0.05")
        for name in ("prefix_reuse", "share_prompt_prefill", "compact_rows"):
            value = getattr(self, name)
            require(
                isinstance(value, bool),
                f"{c}.{name}",
                expected="a bool",
                received=value,
                fix="use True (default) or False",
            )
        check_choice(
            c,
            "shapes",
            self.shapes,
            ("buckets", "fixed"),
            fix='use "fixed" (a small program set known in advance) or "buckets"',
        )
        check_choice(
            c,
            "decode_attention",
            self.decode_attention,
            DECODE_ATTENTIONS,
            fix='use "auto" (the default), "dots" or "elementwise"',
        )
        check_choice(
            c,
            "kv_write",
            self.kv_write,
            KV_WRITES,
            fix='use "scatter" (the default), "select" (row-parallel) or "chunk" (one write a chunk)',
        )
        require(
            self.shapes != "fixed" or self.piggyback_tokens == 0,
            f"{c}.piggyback_tokens",
            expected='0 with shapes="fixed" (piggybacked prefill has bucketed shapes)',
            received=self.piggyback_tokens,
            fix='set piggyback_tokens=0, or shapes="buckets"',
        )
        check_choice(
            c,
            "compute_dtype",
            self.compute_dtype,
            _COMPUTE_DTYPES,
            fix='use None (the model\'s dtype), "auto" or "bfloat16"',
        )
