"""The JAX engine's device side: the KV cache, the compiled calls that read and write it, and their shapes.

:class:`DeviceSteps` owns the preallocated cache (``model.init_cache(num_slots, max_len)``) and makes
every device call of the engine, each under its telemetry span on track "engine":

* prefill (:mod:`gymllm.inference.jit_steps`): P prompt chunks of length bucket T into chosen rows,
  reading the first ``length`` cached slots of those rows (0: no reused prefix);
* decode: one step over rows [0, W) attending over slots [0, S) (:mod:`gymllm.inference.jit_steps`), or up
  to K steps in one call (:mod:`gymllm.inference.multi_token_decode`);
* mixed: a decode step with prompt chunks riding along (:mod:`gymllm.inference.piggyback`);
* row copies for compaction (:func:`copy_rows`).

Compiled shapes are fixed by the config (:meth:`DeviceSteps.program_shapes` lists them,
:meth:`DeviceSteps.warmup` compiles them). ``EngineConfig.shapes="buckets"``: prefill batch sizes (powers
of two up to ``max_prefill_batch``) x length ``buckets`` x ``prefill_lengths``; decode ``widths``
(:func:`~gymllm.inference.slot_table.decode_widths`) x cache ``lengths`` (``max_len``, ``max_len / 2``,
...); mixed: widths x lengths x the piggybacked buckets; copies: ``copy_sizes`` rows.
``shapes="fixed"``: a set that does not depend on the traffic: the packed prefill
(:func:`~gymllm.inference.jit_steps.make_packed_prefill`: ``prefill_tokens`` tokens, ``max_prefill_batch``
pieces) per cache length, one decode program (width ``num_slots``; the chunked one when
``decode_chunk`` > 1, a single step being a chunk of one) per cache length, one copy size
(``num_slots`` rows, padded with copies that drop). The compiled steps are shared by engines over
equal model graphs (``trace_counts`` count their compilations).

Callers pick the shapes (from the rows they decode) and hold the engine's device lock; the steps read
the weights from the engine's :class:`~gymllm.inference.weights.WeightStore` at call time. The
callables ``prefill``, ``decode``, ``mixed`` and ``decode_k`` are looked up on each call, so a test may
replace one to inject a failure.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gymllm.inference.config import EngineConfig
from gymllm.inference.multi_token_decode import chunk_limits, make_decode_chunk
from gymllm.inference.piggyback import make_mixed_step
from gymllm.inference.rows import SamplingRows
from gymllm.inference.slot_table import (
    decode_widths,
    halving_buckets,
    pick_bucket,
    power_of_two_buckets,
)
from gymllm.inference.jit_steps import make_packed_prefill, make_steps
from gymllm.inference.weights import WeightStore
from gymllm.telemetry import span


@functools.partial(jax.jit, donate_argnums=(0,))
def copy_rows(cache: Any, src: jax.Array, dst: jax.Array) -> Any:
    """Cache rows ``src`` [M] copied to rows ``dst`` [M] (a ``dst`` past the cache is dropped).

    Every source row is read before any row is written: read one at a time by dynamic slices into a small
    [L, M, ...] buffer, then written one at a time by dynamic-update-slices, in place on the donated
    cache. No gather: on the TPU v5e a gather of rows (``jnp.take``) relaid the whole cache out first,
    8.4 GB of temporaries over a 3.02 GB bf16 cache at 128 rows x 1024 slots, which failed to load;
    these loops hold 0.19 GB and take 4.4 ms for 16 rows there (``benchmarks/chip_profile.py --parts
    copy``)."""
    return jax.tree.map(lambda c: write_rows(c, read_rows(c, src), dst), cache)


def read_rows(c: jax.Array, src: jax.Array) -> jax.Array:
    """Rows ``src`` [M] of a cache array [L, W, ...] into a new [L, M, ...] buffer, one dynamic slice
    a row (:func:`copy_rows`' read)."""

    def read(i: jax.Array, rows_lm: jax.Array) -> jax.Array:
        row = jax.lax.dynamic_slice_in_dim(c, src[i], 1, axis=1)
        return jax.lax.dynamic_update_slice_in_dim(rows_lm, row, i, axis=1)

    rows_lm = jnp.zeros((c.shape[0], src.shape[0], *c.shape[2:]), c.dtype)
    return jax.lax.fori_loop(0, src.shape[0], read, rows_lm)


def write_rows(c: jax.Array, rows_lm: jax.Array, dst: jax.Array) -> jax.Array:
    """``rows_lm`` [L, M, ...] written to rows ``dst`` [M] of a cache array [L, W, ...], one
    dynamic-update-slice a row, in place when ``c`` is donated (a ``dst`` >= W is dropped:
    :func:`copy_rows`' write)."""
    width = c.shape[1]

    def write(i: jax.Array, c: jax.Array) -> jax.Array:
        d = dst[i]
        at = jnp.minimum(d, width - 1)
        row = jax.lax.dynamic_slice_in_dim(rows_lm, i, 1, axis=1)
        kept = jax.lax.dynamic_slice_in_dim(c, at, 1, axis=1)  # a dropped copy writes it back
        return jax.lax.dynamic_update_slice_in_dim(c, jnp.where(d < width, row, kept), at, axis=1)

    return jax.lax.fori_loop(0, dst.shape[0], write, c)


class DeviceSteps:
    """The cache, the compiled steps over it, and the shape sets they compile for."""

    def __init__(
        self,
        graphdef: Any,
        weights: WeightStore,
        cache: Any,
        *,
        config: EngineConfig,
        decode_chunk: int = 1,
    ):
        cfg = self.config = config
        self.graphdef, self.weights, self.cache = graphdef, weights, cache
        self.running = ""  # the device call in progress, or the last one that raised (device_call)
        self.prefill, self.decode, self.trace_counts = make_steps(
            graphdef, cfg.kv_write, cfg.decode_attention
        )
        self.mixed, self.mixed_trace_counts = make_mixed_step(graphdef)
        self.prefill_packed, self.packed_trace_counts = make_packed_prefill(graphdef)
        self.decode_chunk = decode_chunk
        if decode_chunk > 1:
            self.decode_k, self.chunk_trace_counts = make_decode_chunk(
                graphdef, decode_chunk, cfg.kv_write, cfg.decode_attention
            )
        self.fixed = cfg.shapes == "fixed"
        self.buckets = power_of_two_buckets(cfg.max_len, cfg.min_bucket)  # prefill chunk lengths
        self.batch_sizes = power_of_two_buckets(cfg.max_prefill_batch, 1)  # prefill batch sizes
        self.widths = decode_widths(cfg.num_slots)  # decode row counts
        self.lengths = halving_buckets(cfg.max_len, cfg.decode_lengths)  # decode cache lengths
        self.copy_sizes = power_of_two_buckets(
            cfg.num_slots, min(4, cfg.num_slots)
        )  # rows one compaction copies
        if self.fixed:  # one width, one copy size, one packed prefill batch (module docstring)
            self.batch_sizes, self.widths = (cfg.max_prefill_batch,), (cfg.num_slots,)
            self.copy_sizes = (cfg.num_slots,)

    @contextlib.contextmanager
    def device_call(self, span_name: str, program: str, **tags: int) -> Iterator[None]:
        """One device call: its telemetry span (``span_name`` on the engine track, with ``tags``), and its
        program and shape in :attr:`running` until it returns (a call that raises leaves it there: what the
        error of the requests it fails names, e.g. ``decode (active 60, width 64, length 1024)``)."""
        self.running = f"{program} ({', '.join(f'{k} {v}' for k, v in tags.items())})"
        with span(span_name, track="engine", **tags):
            yield
        self.running = ""

    # ------------------------------------------------------------------ shapes
    @property
    def prefill_lengths(self) -> tuple[int, ...]:
        """The cached-prefix lengths a prefill call reads: 0 (no reused prefix) and the decode cache lengths;
        with fixed shapes the decode cache lengths only (a packed call reads its rows whatever they hold)."""
        return self.lengths if self.fixed else (0, *self.lengths)

    @property
    def prefill_budgets(self) -> tuple[int, ...]:
        """(Fixed shapes.) The token budgets of the packed prefill programs, smallest first:
        ``prefill_tokens_small`` (when set) and ``prefill_tokens``."""
        small, full = self.config.prefill_tokens_small, self.config.prefill_tokens
        return (small, full) if small else (full,)

    def prefill_budget(self, used: int) -> int:
        """(Fixed shapes.) The smallest packed prefill budget that holds ``used`` tokens."""
        return next(t for t in self.prefill_budgets if used <= t)

    def prefill_length(self, max_start: int) -> int:
        """The smallest prefill length covering every row's start (reused prefix) ``max_start``."""
        return pick_bucket(max_start, self.prefill_lengths)

    def decode_length(self, max_pos: int) -> int:
        """The cache length a decode step attends over when no active row is past ``max_pos``: the
        smallest bucket covering it (the step reads only those slots, copying nothing)."""
        return pick_bucket(max_pos + 1, self.lengths)

    def width(self, top_row: int) -> int:
        """The narrowest decode width covering row ``top_row`` (rows [0, W) are decoded)."""
        return pick_bucket(top_row + 1, self.widths)

    def prefill_shapes(self, limit: int, max_prompt: int) -> list[tuple[int, int]]:
        """Every (length bucket, prefill length) a prompt of at most ``max_prompt`` tokens can use, chunk
        buckets up to ``limit``: a chunk in bucket t has more tokens than the bucket below it, a start read
        with length n is past the length below it, and start + chunk <= ``max_prompt``."""
        buckets = [b for b in self.buckets if b <= limit]
        lows = dict(zip(self.buckets, (0, *self.buckets)))
        starts = dict(zip(self.prefill_lengths, (0, *(n + 1 for n in self.prefill_lengths))))
        return [
            (t, n)
            for t in buckets
            for n in self.prefill_lengths
            if starts[n] + lows[t] + 1 <= max_prompt
        ]

    # ------------------------------------------------------------------ calls
    def adapter_args(self, rp: SamplingRows) -> dict[str, Any]:
        """A step's LoRA arguments: the adapter stacks and each row's index when the engine serves adapters
        (:mod:`gymllm.inference.adapters`), else none (the plain steps)."""
        store = self.weights.adapters
        return {} if store is None else {"adapters": store.stacks, "adapter": rp.adapter}

    def call_prefill(
        self, tokens, positions, rows, last, rp: SamplingRows, length: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One prefill call: chunks tokens/positions [P, T] into cache rows ``rows`` [P] (``num_slots``: a
        padding row), sampling at index ``last`` [P]; ``length`` (one of :attr:`prefill_lengths`, >= every
        row's start): the cached slots it reads. Returns (tokens [P], logprobs [P])."""
        with self.device_call(
            "prefill",
            "prefill_jit",
            batch=int(tokens.shape[0]),
            bucket=int(tokens.shape[1]),
            length=length,
        ):
            self.cache, tok, logp = self.prefill(
                self.weights.state,
                self.cache,
                tokens,
                positions,
                rows,
                last,
                *rp.arrays(),
                length,
                **self.adapter_args(rp),
            )
            return np.asarray(tok), np.asarray(logp)

    def call_prefill_packed(
        self, tokens, positions, seg, rows, starts, last, rp: SamplingRows, length: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One packed prefill call: pieces laid end to end in tokens/positions/seg [N] (segment ``seg[n]``;
        ``len(rows)``: padding), segment p continuing cache row ``rows[p]`` from slot ``starts[p]`` and
        sampling at token index ``last[p]``; ``length`` (one of :attr:`prefill_lengths`, >= every start):
        the cached slots read per row. Returns (tokens [P], logprobs [P])."""
        with self.device_call(
            "prefill",
            "prefill_packed",
            tokens=int(tokens.shape[0]),
            segments=int(rows.shape[0]),
            length=length,
        ):
            self.cache, tok, logp = self.prefill_packed(
                self.weights.state,
                self.cache,
                tokens,
                positions,
                seg,
                rows,
                starts,
                last,
                *rp.arrays(),
                length,
                **self.adapter_args(rp),
            )
            return np.asarray(tok), np.asarray(logp)

    def call_decode(
        self, tokens, positions, rp: SamplingRows, length: int, *, active: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One decode step over rows [0, W) (W = len(tokens)) attending over cache slots [0, length);
        ``active``: the rows in use (a span tag). Returns (tokens [W], logprobs [W])."""
        w = int(tokens.shape[0])
        with self.device_call("decode", "decode", active=active, width=w, length=length):
            self.cache, tok, logp = self.decode(
                self.weights.state,
                self.cache,
                tokens,
                positions,
                *rp.arrays(),
                length,
                **self.adapter_args(rp),
            )
            return np.asarray(tok), np.asarray(logp)

    def call_decode_chunk(
        self,
        tokens,
        positions,
        rp: SamplingRows,
        stop: np.ndarray,
        budget: np.ndarray,
        k: int,
        length: int,
        *,
        active: int,
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Up to ``k`` decode steps over rows [0, W) in one call, a row done at one of its ``stop`` ids
        [W, MAX_STOP_IDS] or its ``budget`` [W]; returns (tokens [k', W], logprobs [k', W], steps run k')."""
        w = int(tokens.shape[0])
        with self.device_call(
            "decode", "decode_chunk", active=active, width=w, length=length, steps=k
        ):
            self.cache, tok, logp, ran = self.decode_k(
                self.weights.state,
                self.cache,
                tokens,
                positions,
                *rp.arrays(),
                stop,
                budget,
                np.int32(k),
                length,
                **self.adapter_args(rp),
            )
            ran = int(ran)
            return np.asarray(tok)[:ran], np.asarray(logp)[:ran], ran

    def call_mixed(
        self,
        dec: tuple[np.ndarray, np.ndarray],
        dec_rp: SamplingRows,
        pre: tuple,
        pre_rp: SamplingRows,
        length: int,
        *,
        active: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The piggybacked call: a decode step over rows [0, W) (``dec`` = (tokens [W], positions [W])) with
        prompt chunks ``pre`` = (tokens [P, T], positions [P, T], rows [P], last [P]) prefilled in it;
        returns (tokens [W + P], logprobs [W + P]): the decode rows, then the chunks."""
        tokens = pre[0]
        with self.device_call(
            "decode",
            "mixed",
            active=active,
            width=int(dec[0].shape[0]),
            length=length,
            prefill=int(tokens.shape[0]),
            bucket=int(tokens.shape[1]),
        ):
            rp = dec_rp.concat(pre_rp)
            self.cache, tok, logp = self.mixed(
                self.weights.state,
                self.cache,
                dec,
                pre,
                *rp.arrays(),
                length,
                **self.adapter_args(rp),
            )
            return np.asarray(tok), np.asarray(logp)

    def copy(self, src: list[int], dst: list[int]) -> None:
        """Copy cache rows ``src`` to rows ``dst`` (padded to one of ``copy_sizes`` with copies that drop)."""
        n = pick_bucket(len(src), self.copy_sizes)
        s = self.config.num_slots
        self.running = f"copy_rows (rows {n})"
        self.cache = copy_rows(
            self.cache,
            np.array(src + [0] * (n - len(src)), np.int32),
            np.array(dst + [s] * (n - len(dst)), np.int32),
        )
        self.running = ""

    # ------------------------------------------------------------------ failures
    def cache_lost(self) -> bool:
        """True when a failed (donating) call deleted the cache."""
        return any(leaf.is_deleted() for leaf in jax.tree.leaves(self.cache))

    def release_cache(self) -> None:
        """Free the cache's device memory now, not when the engine is garbage-collected (a closed
        engine's cache otherwise stays on the device while anything references the engine: on the
        chip, the next engine of a benchmark then failed to load its programs). Afterwards
        :meth:`cache_lost` is True."""
        for leaf in jax.tree.leaves(self.cache):
            if not leaf.is_deleted():
                leaf.delete()

    def rebuild_cache(self) -> None:
        """A fresh zeroed cache of the same shape and dtype (after :meth:`cache_lost`)."""
        self.cache = nnx.merge(self.graphdef, self.weights.state).init_cache(
            self.config.num_slots, self.config.max_len, jax.tree.leaves(self.cache)[0].dtype
        )

    # ------------------------------------------------------------------ compilation
    def program_shapes(self, max_prompt_len: int | None = None) -> list[tuple]:
        """Every program this config runs, as ``(step, *shape)`` with ``step`` the jitted function's name:
        ``("prefill_jit", batch, bucket, length)``, ``("prefill_packed", tokens, segments, length)``,
        ``("decode", width, length)``, ``("decode_chunk", width, length)``, ``("copy_rows", rows)``,
        ``("mixed", width, bucket, length)``. Bucketed prefill shapes only up to the bucket holding
        ``max_prompt_len`` when given (the fixed set does not depend on it). :meth:`warmup` compiles these."""
        cfg, max_len = self.config, self.config.max_len
        out: list[tuple] = []
        if self.fixed:
            out += [
                ("prefill_packed", t, cfg.max_prefill_batch, n)
                for t in self.prefill_budgets
                for n in self.prefill_lengths
            ]
        else:
            limit = (
                pick_bucket(min(max_prompt_len, max_len - 1), self.buckets)
                if max_prompt_len
                else max_len
            )
            shapes = self.prefill_shapes(limit, min(max_prompt_len or max_len, max_len - 1))
            out += [("prefill_jit", p, t, n) for p in self.batch_sizes for t, n in shapes]
        step = "decode_chunk" if self.decode_chunk > 1 else "decode"
        out += [(step, w, n) for w in self.widths for n in self.lengths]
        if (cfg.compact_rows and not self.fixed) or (cfg.prefix_reuse and cfg.share_prompt_prefill):
            out += [
                ("copy_rows", n) for n in self.copy_sizes
            ]  # compaction (one width: none) or prompt sharing
        if not self.fixed and cfg.piggyback_tokens:
            limit = (
                pick_bucket(min(max_prompt_len, max_len - 1), self.buckets)
                if max_prompt_len
                else max_len
            )
            out += [
                ("mixed", w, t, n)
                for t in self.buckets
                if t <= min(limit, cfg.piggyback_tokens)
                for w in self.widths
                for n in self.lengths
            ]
        return out

    def warmup(self, rows: Any, max_prompt_len: int | None = None) -> None:
        """Compile every program of :meth:`program_shapes` now, decoding the idle ``rows`` (a
        :class:`~gymllm.inference.rows.DecodeRows`; padding prefill rows write nothing). The caller holds
        the device lock and the engine is idle."""
        cfg, s = self.config, self.config.num_slots
        for step, *shape in self.program_shapes(max_prompt_len):
            if step == "prefill_packed":
                tokens, p, n = shape
                z = np.zeros(tokens, np.int32)
                self.call_prefill_packed(
                    z,
                    z,
                    np.full(tokens, p, np.int32),
                    np.full(p, s, np.int32),
                    np.zeros(p, np.int32),
                    np.zeros(p, np.int32),
                    SamplingRows.inert(p),
                    n,
                )
            elif step == "prefill_jit":
                p, t, n = shape
                pad = np.full(p, s, np.int32)  # padding rows only: nothing is written
                self.call_prefill(
                    np.zeros((p, t), np.int32),
                    np.zeros((p, t), np.int32),
                    pad,
                    np.zeros(p, np.int32),
                    SamplingRows.inert(p),
                    n,
                )
            elif step in ("decode", "decode_chunk"):
                w, n = shape
                tokens, positions, rp = rows.inputs(w)
                if step == "decode_chunk":
                    stop, budget = chunk_limits({}, w, frozenset(), cfg.max_len)
                    self.call_decode_chunk(tokens, positions, rp, stop, budget, 1, n, active=0)
                else:
                    self.call_decode(tokens, positions, rp, n, active=0)
            elif step == "copy_rows":
                self.cache = copy_rows(
                    self.cache, np.zeros(shape[0], np.int32), np.full(shape[0], s, np.int32)
                )
            else:  # mixed
                w, t, n = shape
                p = cfg.max_prefill_batch
                pre = (
                    np.zeros((p, t), np.int32),
                    np.zeros((p, t), np.int32),
                    np.full(p, s, np.int32),
                    np.zeros(p, np.int32),
                )
                tokens, positions, rp = rows.inputs(w)
                self.call_mixed((tokens, positions), rp, pre, SamplingRows.inert(p), n, active=0)
