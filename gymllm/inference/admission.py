"""Admission for the JAX engine: the waiting queue, the slot table, prefill batches, and row compaction.

:class:`Admission` owns which requests join the decode rows and where:

* the waiting queue (callers enqueue from any thread; the engine thread takes from it);
* the :class:`~gymllm.inference.slot_table.SlotTable` of cache rows (a request is placed in the free row
  holding the longest prefix of its prompt, its own session's row first, else the lowest free row);
* :meth:`Admission.admit`: the requests placed this iteration, grouped into prefill batches by length
  bucket. When more requests wait than rows are free, admission waits until a whole prefill batch of
  rows is free, so a saturated engine makes fewer, fuller prefill calls. With rows decoding, the batch
  of the smallest bucket rides along the next decode step when ``EngineConfig.piggyback_tokens``
  allows (:mod:`gymllm.inference.piggyback`);
* prompt sharing (``EngineConfig.share_prompt_prefill``): a request whose prompt shares at least
  ``min_bucket`` tokens (enough that the rest falls in a smaller prefill bucket) with the prompt of a
  row that is decoding (k/v computed under the same kv tag:
  weights version and adapter) is placed with that prefix reused, and :meth:`Admission.copy_shared`
  copies the source row into its row before the prefill; a request sharing such a prefix with one
  admitted in the same round waits one iteration (its source is prefilled by then), so a group of
  identical prompts prefills the prompt once;
* :meth:`Admission.prefill_inputs`: the host arrays of one batch of prompt chunks; with
  ``EngineConfig.shapes="fixed"`` every request admitted in a round forms one batch, laid out in
  packed calls of ``prefill_tokens`` tokens (:func:`~gymllm.inference.token_budget.pack_pieces`,
  :meth:`Admission.packed_inputs`);
* :meth:`Admission.compact` (``EngineConfig.compact_rows``): before a decode step, active rows above the
  narrowest width that could hold them trade places with idle rows below it (a session's cached
  prefix moves with its row), so the tail of a batch decodes narrow; span "compact".

``cv`` (the engine's condition) guards the queue and the table; it is held briefly.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from gymllm.inference.config import EngineConfig
from gymllm.inference.device_cache import DeviceSteps
from gymllm.inference.request import EngineRequest
from gymllm.inference.rows import DecodeRows, SamplingRows
from gymllm.inference.slot_table import Placement, SlotTable, common_prefix_len, pick_bucket
from gymllm.inference.token_budget import Piece
from gymllm.telemetry import span

Batch = tuple[list[EngineRequest], int]  # (requests, length bucket of their prompt chunks)


class Admission:
    """The waiting requests and the cache rows they are placed in."""

    def __init__(
        self,
        config: EngineConfig,
        cv: threading.Condition,
        buckets: Sequence[int],
        stats: dict[str, int],
    ):
        self.config = config
        self.cv = cv
        self.buckets = tuple(buckets)  # prefill chunk length buckets
        self.stats = (
            stats  # the engine's counters: "prefill_tokens", "reused_tokens" are counted here
        )
        self.table = SlotTable(config.num_slots)
        self.waiting: list[EngineRequest] = []
        self.copies: list[
            tuple[int, int]
        ] = []  # (source row, destination row) to copy before this round's prefill

    # ------------------------------------------------------------------ the queue (any thread)
    def enqueue(self, req: EngineRequest) -> None:
        """Queue ``req`` and wake the loop."""
        with self.cv:
            self.waiting.append(req)
            self.cv.notify_all()

    def has_waiting(self) -> bool:
        with self.cv:
            return bool(self.waiting)

    def take_cancelled(self) -> list[EngineRequest]:
        """Remove and return the waiting requests their callers cancelled."""
        with self.cv:
            gone = [r for r in self.waiting if r.cancelled]
            self.waiting = [r for r in self.waiting if not r.cancelled]
        return gone

    def drain(self) -> list[EngineRequest]:
        """Remove and return every waiting request (the engine is stopping)."""
        with self.cv:
            waiting, self.waiting = self.waiting, []
        return waiting

    # ------------------------------------------------------------------ admission (engine thread)
    def admit(
        self, decoding: bool, version: Any, active: dict[int, EngineRequest] | None = None
    ) -> tuple[list[Batch], Batch | None]:
        """Place waiting requests in free rows under policy ``version`` (an int, or a function of a request's
        adapter index giving the kv tag its row computes under: a cached prefix is reused only under an
        equal one) and group them into prefill batches
        ``[(requests, bucket)]`` (ascending buckets, at most ``max_prefill_batch`` each). ``decoding``: rows
        are decoding; then a saturated engine admits nothing until a whole batch of rows is free, and
        the smallest bucket's batch is returned apart (``ride``) when piggybacking covers it. ``active``:
        the decoding rows (slot -> request), sources of prompt sharing; the row copies it needs are left
        in :attr:`copies` for :meth:`copy_shared`."""
        cfg = self.config
        share = cfg.prefix_reuse and cfg.share_prompt_prefill
        sources = (
            [(r.slot, r.prompt, r.kv_version) for r in (active or {}).values()] if share else []
        )
        admitted: list[EngineRequest] = []
        deferred: list[EngineRequest] = []
        self.copies = []
        with self.cv:
            free, fill = self.table.num_free, min(cfg.max_prefill_batch, cfg.num_slots)
            if decoding and len(self.waiting) > free and free < fill:
                return (
                    [],
                    None,
                )  # saturated: let rows free up to fill a whole prefill batch (fewer, fuller prefills)
            while self.waiting and self.table.num_free:
                req = self.waiting.pop(0)
                reuse_ok = cfg.prefix_reuse
                tag = version(req.adapter) if callable(version) else version
                if share and self.wait_for_source(req, tag, admitted, sources):
                    deferred.append(
                        req
                    )  # its source is prefilled this round: it copies from it next round
                    if len(deferred) >= cfg.num_slots:
                        break  # enough wait for a round; the rest keep their place in the queue unexamined
                    continue
                req.placement = self.table.acquire(
                    req.prompt if reuse_ok else [], req.session_id, tag
                )
                req.kv_version = tag
                if not reuse_ok:
                    req.placement = Placement(req.placement.slot, 0)
                elif share:
                    self.share_from(req, tag, sources)
                admitted.append(req)
            self.waiting[:0] = deferred
        if (
            cfg.shapes == "fixed"
        ):  # one round, packed into calls of prefill_tokens tokens by the loop
            return ([(admitted, cfg.prefill_tokens)] if admitted else []), None
        by_bucket: dict[int, list[EngineRequest]] = {}
        for req in admitted:
            chunk = len(req.prompt) - req.placement.reuse_len
            by_bucket.setdefault(pick_bucket(chunk, self.buckets), []).append(req)
        batches = [
            (reqs[i : i + cfg.max_prefill_batch], bucket)
            for bucket, reqs in sorted(by_bucket.items())
            for i in range(0, len(reqs), cfg.max_prefill_batch)
        ]
        ride = None
        if decoding and batches and batches[0][1] <= cfg.piggyback_tokens:
            ride = batches.pop(0)  # the smallest bucket rides along the decode step
        return batches, ride

    @staticmethod
    def shared_len(prompt: list[int], other: list[int]) -> int:
        """Prompt tokens whose k/v ``other``'s row holds once prefilled (at least one token is left to prefill)."""
        return min(common_prefix_len(prompt, other), len(prompt) - 1)

    def best_source(
        self, req: EngineRequest, tag: Any, sources: list[tuple[int, list[int], Any]]
    ) -> tuple[int, int]:
        """(row, shared tokens) of the decoding row whose prompt k/v (computed under ``tag``) cover most of
        ``req``'s prompt; (-1, 0) if none."""
        best = (-1, 0)
        for slot, prompt, kv in sources:
            if kv is not None and kv == tag:
                n = self.shared_len(req.prompt, prompt)
                if n > best[1]:
                    best = (slot, n)
        return best

    def wait_for_source(
        self,
        req: EngineRequest,
        tag: Any,
        admitted: list[EngineRequest],
        sources: list[tuple[int, list[int], Any]],
    ) -> bool:
        """(Holding ``cv``.) Whether ``req`` should wait a round: a request admitted this round under the
        same tag shares at least ``min_bucket`` prompt tokens with it, more than any free or decoding row
        holds now."""
        later = max(
            (self.shared_len(req.prompt, r.prompt) for r in admitted if r.kv_version == tag),
            default=0,
        )
        if later < self.config.min_bucket:
            return False
        now = max(self.table.best_reuse(req.prompt, tag), self.best_source(req, tag, sources)[1])
        return self.worth(req, later, now)

    def worth(self, req: EngineRequest, shared: int, reused: int) -> bool:
        """Sharing ``shared`` prompt tokens pays over reusing ``reused``: at least ``min_bucket`` tokens, and
        the chunk left to prefill falls in a smaller length bucket (a prompt that shares only a short
        head, such as a chat template's system prompt, prefills as it would without sharing). With fixed
        shapes every token costs its place in a packed call: at least ``min_bucket`` tokens more than
        ``reused`` pay."""
        n = len(req.prompt)
        if self.config.shapes == "fixed":
            return shared >= self.config.min_bucket and shared > reused
        return (
            shared >= self.config.min_bucket
            and shared > reused
            and pick_bucket(n - shared, self.buckets) < pick_bucket(n - reused, self.buckets)
        )

    def share_from(
        self, req: EngineRequest, tag: Any, sources: list[tuple[int, list[int], Any]]
    ) -> None:
        """(Holding ``cv``.) If a decoding row holds more of ``req``'s prompt (at least ``min_bucket``
        tokens) than its own row, plan the copy of that row into it and reuse that prefix."""
        slot, n = self.best_source(req, tag, sources)
        if not self.worth(req, n, req.placement.reuse_len):
            return
        self.copies.append((slot, req.slot))
        req.placement = Placement(req.slot, n)
        self.stats["shared_prefill_tokens"] = self.stats.get("shared_prefill_tokens", 0) + n

    def copy_shared(self, device: DeviceSteps) -> None:
        """Copy the source rows planned by :meth:`admit` into their destination rows (span "share")."""
        if not self.copies:
            return
        copies, self.copies = self.copies, []
        src, dst = (list(x) for x in zip(*copies))
        with span("share", track="engine", rows=len(src)):
            device.copy(src, dst)

    def prefill_inputs(
        self, reqs: list[EngineRequest], bucket: int, p: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, SamplingRows]:
        """Host inputs of ``p`` prompt chunks (``reqs`` then padding rows) in length bucket ``bucket``:
        (tokens [p, T], positions [p, T], rows [p], last [p], sampling inputs); counts the tokens
        prefilled and reused."""
        max_len = self.config.max_len
        tokens = np.zeros((p, bucket), np.int32)
        positions = np.zeros((p, bucket), np.int32)
        rows = np.full(p, self.config.num_slots, np.int32)
        last = np.zeros(p, np.int32)
        rp = SamplingRows.inert(p)
        for i, r in enumerate(reqs):
            start = r.placement.reuse_len
            chunk = r.prompt[start:]
            tokens[i, : len(chunk)] = chunk
            # pads continue the positions (clipped to the scratch index): never attended by real tokens
            # (causal), and their k/v are not written (past ``last``)
            positions[i] = np.minimum(start + np.arange(bucket), max_len - 1)
            rows[i] = r.slot
            last[i] = len(chunk) - 1
            rp.set(i, r.key, 0, r.params, r.adapter)
            self.stats["prefill_tokens"] += len(chunk)
            self.stats["reused_tokens"] += start
        return tokens, positions, rows, last, rp

    def packed_inputs(
        self, reqs: list[EngineRequest], pieces: list[Piece], tokens: int, p: int
    ) -> tuple[np.ndarray, ...]:
        """Host inputs of one packed prefill call (:meth:`DeviceSteps.call_prefill_packed`): ``pieces`` (at
        most ``p``) of ``reqs``' prompt chunks end to end in ``tokens`` slots, then padding: (tokens [N],
        positions [N], seg [N], rows [p], starts [p], last [p], sampling inputs [p]); counts the tokens
        prefilled and (at a request's first piece) reused."""
        max_len, s = self.config.max_len, self.config.num_slots
        ids = np.zeros(tokens, np.int32)
        positions = np.full(
            tokens, max_len - 1, np.int32
        )  # padding: the scratch slot, segment p (none)
        seg = np.full(tokens, p, np.int32)
        rows, starts, last = np.full(p, s, np.int32), np.zeros(p, np.int32), np.zeros(p, np.int32)
        rp = SamplingRows.inert(p)
        at = 0
        for j, piece in enumerate(pieces):
            r = reqs[piece.index]
            start = r.placement.reuse_len + piece.offset
            ids[at : at + piece.length] = r.prompt[start : start + piece.length]
            positions[at : at + piece.length] = start + np.arange(piece.length)
            seg[at : at + piece.length] = j
            rows[j], starts[j], last[j] = r.slot, start, at + piece.length - 1
            rp.set(j, r.key, 0, r.params, r.adapter)
            at += piece.length
            self.stats["prefill_tokens"] += piece.length
            if piece.offset == 0:
                self.stats["reused_tokens"] += r.placement.reuse_len
        return ids, positions, seg, rows, starts, last, rp

    def compact(self, rows: DecodeRows, device: DeviceSteps) -> None:
        """Pack the active rows into the narrowest decode width that holds them: each active row above it
        trades places with an idle row below it (a session's cached prefix moves up with its row). Rows
        pinned by trajectories waiting on tools, or the long requests left at the tail of a batch, would
        otherwise keep every step as wide as the busiest moment."""
        with self.cv:
            swaps = self.table.compaction(device.widths, self.config.num_slots // 2)
            back = [
                (b, a) for a, b in swaps if self.table.slots[b].cached
            ]  # idle rows holding a prefix
        if not swaps:
            return
        src, dst = (list(x) for x in zip(*(swaps + back)))  # a busy row down; an idle prefix up
        with span("compact", track="engine", rows=len(swaps), copies=len(src)):
            device.copy(src, dst)
        with self.cv:
            for a, b in swaps:
                self.table.swap(a, b)
        for a, b in swaps:
            rows.move(a, b)

    # ------------------------------------------------------------------ rows coming back
    def release(self, slot: int, cached: list[int] | None, version: int | None) -> None:
        """Row ``slot`` is free again; ``cached`` = the ids whose k/v it holds, computed under ``version``
        (None: forget the row)."""
        with self.cv:
            if cached is None:
                self.table.invalidate(slot)
            else:
                self.table.release(slot, cached, version)

    def invalidate_all(self) -> None:
        """Forget what every row holds (the cache was rebuilt)."""
        with self.cv:
            for i in range(self.config.num_slots):
                self.table.invalidate(i)

    def end_session(self, session_id: str) -> None:
        """Unpin a session's row (its prefix stays reusable until another request needs the row)."""
        with self.cv:
            self.table.end_session(session_id)
