"""The JAX engine's thread: when an iteration may run, and what one iteration does.

:class:`LoopGate` decides when the engine thread runs an iteration: when there is work, unless
:meth:`LoopGate.paused` holds it between two iterations (then only the iterations
:meth:`LoopGate.run_iterations` lets through run), and never once closing.

:class:`EngineLoop` is the thread's body. One iteration, under the engine's device lock:

1. apply a pending weight update (:class:`~gymllm.inference.weights.WeightStore`), so no forward mixes
   versions;
2. finish cancelled requests (finish reason "abort");
3. admit waiting requests (:class:`~gymllm.inference.admission.Admission`) and prefill them (with
   ``EngineConfig.shapes="fixed"``: in packed calls of ``prefill_tokens`` tokens,
   :meth:`EngineLoop.prefill_packed`);
4. one device step (:class:`~gymllm.inference.device_cache.DeviceSteps`): the decode step with the
   smallest prompts riding along (piggybacking), or, after compaction, a decode step (or a chunk of
   up to ``decode_chunk`` steps while nobody waits) over the active rows.

It then records what was sampled, token by token: each token carries the version of the forward that
produced it (on an engine serving LoRA adapters, the version of the row's own adapter), is streamed, and may finish its request (stop ids, stop strings, ``max_tokens``, the
context); a finished row keeps its k/v for prefix reuse. A step that raises fails only the requests
in it (:class:`~gymllm.inference.request.RequestFailed`, naming the call: its program and shape, e.g.
``decode (active 60, width 64, length 1024)``); if it took the (donated) cache with it, the
cache is rebuilt and every row forgotten. A bug in the loop itself fails every request clearly.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np

from gymllm.errors import EngineError
from gymllm.inference.admission import Admission
from gymllm.inference.config import EngineConfig
from gymllm.inference.device_cache import DeviceSteps
from gymllm.inference.multi_token_decode import chunk_limits
from gymllm.inference.request import EngineRequest, RequestFailed
from gymllm.inference.rows import DecodeRows
from gymllm.inference.slot_table import pick_bucket
from gymllm.inference.token_budget import plan_calls
from gymllm.inference.weights import WeightStore


class LoopGate:
    """When the engine thread may run an iteration: work to do, :meth:`paused` holds, closing.

    ``cv`` is the engine's condition (its lock also guards the queue, the table and pending weights);
    ``alive`` tells whether the engine thread still runs (a paused caller stops waiting once it died).
    """

    def __init__(self, cv: threading.Condition, *, idle_wait_s: float, alive: Callable[[], bool]):
        self.cv = cv
        self.idle_wait_s = idle_wait_s
        self.alive = alive
        self.closing = False  # set once: no request is queued after it
        self._holds = 0  # paused(): the loop parks between iterations while > 0 ...
        self._allowed = 0  # ... except for the iterations run_iterations() lets through
        self._parked = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the loop between two iterations while the block runs; entering blocks until the current
        iteration has finished. Nestable."""
        with self.cv:
            self._holds += 1
            self.cv.notify_all()
            while not (self._parked or self.closing or not self.alive()):
                self.cv.wait(0.05)
        try:
            yield
        finally:
            with self.cv:
                self._holds -= 1
                self.cv.notify_all()

    def run_iterations(self, n: int) -> None:
        """Inside :meth:`paused`: let exactly ``n`` iterations run, and return when they are done."""
        with self.cv:
            if self._holds <= 0:
                raise EngineError(
                    "run_iterations: expected a paused engine, received a running one. "
                    "Fix: call it inside `with engine.paused():`."
                )
            self._allowed += int(n)
            self.cv.notify_all()
            while not (self._allowed == 0 and self._parked) and not self.closing:
                self.cv.wait(0.05)  # the loop parks again once the n-th iteration is done

    def wait_for_work(self, has_work: Callable[[], bool]) -> bool:
        """(Engine thread.) Wait until ``has_work()`` (called holding ``cv``) and no :meth:`paused` hold
        stops it (or :meth:`run_iterations` lets one iteration through); False once closing."""
        with self.cv:
            while not self.closing:
                idle = not has_work()
                if self._holds > 0 and self._allowed > 0:
                    self._allowed -= 1
                    if idle:  # an empty iteration: nothing to run
                        self.cv.notify_all()
                        continue
                    self._parked = False
                    return True
                if self._holds == 0 and not idle:
                    self._parked = False
                    return True
                self._parked = self._holds > 0
                if self._parked:
                    self.cv.notify_all()
                self.cv.wait(self.idle_wait_s)
            self._parked = False
            return False

    def close(self) -> None:
        """Stop: the loop exits after its current iteration; no request is queued from now on."""
        with self.cv:
            self.closing = True
            self.cv.notify_all()

    def wake(self) -> None:
        """Wake the loop (a request was cancelled)."""
        with self.cv:
            self.cv.notify_all()


class EngineLoop:
    """The engine thread's body (:meth:`run`): iterations of admission, one device step, and the record
    of every sampled token. ``crash`` holds the exception that stopped the loop, if any."""

    def __init__(
        self,
        *,
        config: EngineConfig,
        admission: Admission,
        rows: DecodeRows,
        device: DeviceSteps,
        weights: WeightStore,
        gate: LoopGate,
        lock: threading.Lock,
        stats: dict[str, int],
        stop_ids: frozenset[int],
        tokenizer: Any,
        decode_chunk: int,
    ):
        self.config, self.admission, self.rows, self.device = config, admission, rows, device
        self.weights, self.gate, self.lock, self.stats = weights, gate, lock, stats
        self.stop_ids, self.tokenizer, self.decode_chunk = stop_ids, tokenizer, decode_chunk
        self.max_len = config.max_len
        self.crash: BaseException | None = None

    def run(self) -> None:
        """Iterate until closed; then abort what is left (an error for everyone if the loop crashed)."""
        try:
            while self.gate.wait_for_work(self.has_work):
                with self.lock:
                    self.iterate()
        except BaseException as exc:  # a bug in the loop: fail everything clearly rather than hang
            self.crash = exc
            raise
        finally:
            self.gate.close()  # no request can be queued after the drain below
            self.abort_all()

    def has_work(self) -> bool:
        """(Holding ``cv``.) Requests wait or decode, or weights are pending."""
        return bool(self.admission.waiting or self.rows.active or self.weights.has_pending())

    def iterate(self) -> None:
        """One iteration: weights, cancellations, admission (and prefill), then one device step."""
        self.weights.apply()
        self.drop_cancelled()
        batches, ride = self.admission.admit(
            bool(self.rows.active), self.weights.kv_tag, self.rows.active
        )
        if self.admission.copies:
            try:
                self.admission.copy_shared(self.device)
            except (
                Exception
            ) as exc:  # the copy failed: fail this round's requests, keep serving the rest
                self.fail_step(
                    [r for reqs, _ in batches + ([ride] if ride else []) for r in reqs], exc
                )
                return
        for reqs, bucket in batches:
            if self.device.fixed:
                self.prefill_packed(reqs)
            else:
                self.prefill(reqs, bucket)
        if ride is not None:
            self.mixed(*ride)
        elif self.rows.active:
            if self.config.compact_rows:
                self.admission.compact(self.rows, self.device)
            self.decode()

    def drop_cancelled(self) -> None:
        for req in self.admission.take_cancelled():
            self.finish(req, "abort")
        for req in list(self.rows.active.values()):
            if req.cancelled:
                self.finish(req, "abort")

    # ------------------------------------------------------------------ device steps
    def prefill(self, reqs: list[EngineRequest], bucket: int) -> None:
        """Prefill one batch of prompt chunks in a call of its own; the requests join the decode rows."""
        p = pick_bucket(len(reqs), self.device.batch_sizes)
        try:
            tokens, positions, rows, last, rp = self.admission.prefill_inputs(reqs, bucket, p)
        except Exception as exc:  # a request the host cannot lay out: fail it alone, never the loop
            self.isolate_inputs(reqs, bucket, exc)
            return
        try:
            length = self.device.prefill_length(int(positions[:, 0].max()))
            tok, logp = self.device.call_prefill(tokens, positions, rows, last, rp, length)
        except Exception as exc:  # isolate: fail these requests, keep serving the rest
            self.fail_step(reqs, exc)
            return
        self.start(reqs, tok, logp)

    def prefill_packed(self, reqs: list[EngineRequest]) -> None:
        """(Fixed shapes.) Prefill a round's requests in packed calls of ``prefill_tokens`` tokens
        (:func:`~gymllm.inference.token_budget.plan_calls`: with ``prefill_tokens_small``, calls of
        either budget); a request joins the decode rows after the call
        holding its last piece. A call that raises fails the requests with a piece in it (and, if it took
        the cache with it, every request of the round not yet decoding)."""
        cfg, device = self.config, self.device
        chunks = [len(r.prompt) - r.placement.reuse_len for r in reqs]
        over: set[int] = set()  # requests started or failed
        for budget, call in plan_calls(chunks, device.prefill_budgets, cfg.max_prefill_batch):
            call = [piece for piece in call if piece.index not in over]
            if not call:
                continue
            try:
                *inputs, rp = self.admission.packed_inputs(
                    reqs, call, budget, cfg.max_prefill_batch
                )
                length = device.prefill_length(int(inputs[4].max()))
                tok, logp = device.call_prefill_packed(*inputs, rp, length)
            except Exception as exc:  # isolate: fail these requests, keep serving the rest
                hit = {piece.index for piece in call}
                if device.cache_lost():  # the earlier pieces of the round went with it
                    hit = set(range(len(reqs))) - over
                over |= hit
                self.fail_step([reqs[i] for i in sorted(hit)], exc)
                continue
            done = [j for j, piece in enumerate(call) if piece.final]
            over.update(call[j].index for j in done)
            self.start([reqs[call[j].index] for j in done], tok[done], logp[done])

    def mixed(self, reqs: list[EngineRequest], bucket: int) -> None:
        """One decode step over the active rows with ``reqs``' prompt chunks (bucket ``bucket``) prefilled
        in the same call (:mod:`gymllm.inference.piggyback`); a failure fails both."""
        rows, device = self.rows, self.device
        try:
            *pre, pre_rp = self.admission.prefill_inputs(
                reqs, bucket, self.config.max_prefill_batch
            )
        except (
            Exception
        ) as exc:  # prefill them on their own (the bad one fails alone), then decode as usual
            self.isolate_inputs(reqs, bucket, exc)
            if rows.active:
                self.decode()
            return
        decoding = list(rows.active.items())
        try:
            w = device.width(rows.top_row())
            # the cache length read covers the active rows and every chunk's start
            n = pick_bucket(
                max(rows.max_position() + 1, int(pre[1][:, 0].max()), 1), device.lengths
            )
            tokens, positions, rp = rows.inputs(w)
            tok, logp = device.call_mixed(
                (tokens, positions), rp, tuple(pre), pre_rp, n, active=len(rows.active)
            )
        except Exception as exc:
            self.fail_step(reqs + [r for _, r in decoding], exc)
            return
        self.stats["decode_steps"] += 1
        for slot, req in decoding:
            self.accept(req, int(tok[slot]), float(logp[slot]))
        self.start(reqs, tok[w:], logp[w:])

    def isolate_inputs(self, reqs: list[EngineRequest], bucket: int, exc: Exception) -> None:
        """Laying out ``reqs``' inputs raised: prefill each alone, so only the request that raises fails."""
        if len(reqs) == 1:
            self.fail_step(reqs, exc)
            return
        for req in reqs:
            self.prefill([req], bucket)

    def decode(self) -> None:
        """One decode step (or a chunk of steps) over the active rows; tokens recorded by :meth:`accept_chunk`."""
        rows, device = self.rows, self.device
        try:
            w = device.width(rows.top_row())
            tokens, positions, rp = rows.inputs(w)
            if self.decode_chunk > 1:
                k = self.chunk_steps()
                stop, budget = chunk_limits(rows.active, w, self.stop_ids, self.max_len)
                n = device.decode_length(rows.max_position(ahead=k - 1))
                toks, logps, ran = device.call_decode_chunk(
                    tokens, positions, rp, stop, budget, k, n, active=len(rows.active)
                )
            else:
                n = device.decode_length(rows.max_position())
                tok, logp = device.call_decode(tokens, positions, rp, n, active=len(rows.active))
                toks, logps, ran = tok[None], logp[None], 1
        except Exception as exc:
            self.fail_step(list(rows.active.values()), exc)
            return
        self.stats["decode_steps"] += ran
        self.accept_chunk(toks, logps, ran)

    def chunk_steps(self) -> int:
        """Decode steps before the host looks again: 1 while a request waits (it joins next iteration),
        else up to ``decode_chunk``, no more than the active row with the most budget left can use."""
        if self.admission.has_waiting():
            return 1
        return max(
            1,
            min(self.decode_chunk, max(r.budget(self.max_len) for r in self.rows.active.values())),
        )

    # ------------------------------------------------------------------ what was sampled
    def start(self, reqs: list[EngineRequest], tok: np.ndarray, logp: np.ndarray) -> None:
        """Prefilled requests join the decode rows with their first sampled token."""
        now = time.perf_counter()
        for i, r in enumerate(reqs):
            r.first_token = now
            self.rows.join(r)
            self.accept(r, int(tok[i]), float(logp[i]))

    def accept_chunk(self, toks: np.ndarray, logps: np.ndarray, ran: int) -> None:
        """Record ``ran`` decode steps' tokens and logprobs [ran, W] as accepting them one step at a time
        would: each row keeps its tokens up to the one that ends it; rows end in step order, then in
        row order (which frees their cache rows in that order); the rest write their next input once.
        A row is taken a whole column at a time: its end is found by the stop ids and its budget (or,
        with stop strings, by checking the decoded tail after each token)."""
        cols_t, cols_l = toks[:ran].T.tolist(), logps[:ran].T.tolist()  # [W][ran], converted once
        ends: list[tuple[int, int, EngineRequest, str]] = []
        for order, (slot, req) in enumerate(list(self.rows.active.items())):
            kept, reason = self.take(req, cols_t[slot], cols_l[slot])
            if reason is None:
                self.rows.schedule(req)
            else:
                ends.append((kept, order, req, reason))
        for _, _, req, reason in sorted(ends, key=lambda e: e[:2]):
            self.finish(req, reason)

    def take(
        self, req: EngineRequest, tokens: list[int], logprobs: list[float]
    ) -> tuple[int, str | None]:
        """Record the head of ``tokens`` that ``req`` keeps; returns (tokens kept, finish reason or None)."""
        if req.params.stop and self.tokenizer is not None:  # stop strings: look after every token
            for i, (t, lp) in enumerate(zip(tokens, logprobs)):
                reason = self.record(req, t, lp)
                if reason is not None:
                    return i + 1, reason
            return len(tokens), None
        own = req.params.stop_token_ids
        n = max(1, min(len(tokens), req.budget(self.max_len)))
        for i in range(n):
            if tokens[i] in self.stop_ids or tokens[i] in own:
                n = i + 1
                break
        version = self.weights.version_of(req.adapter)
        req.record_many(tokens[:n], logprobs[:n], version, self.weights.kv_tag(req.adapter))
        self.stats["generated_tokens"] += n
        if req.stream is not None:
            for t, lp in zip(tokens[:n], logprobs[:n]):
                req.deliver("token", (t, lp, version))
        return n, req.finish_reason(tokens[n - 1], self.stop_ids, self.tokenizer, self.max_len)

    def accept(self, req: EngineRequest, token: int, logprob: float) -> None:
        """Record one sampled token; finish the request or write its next decode input."""
        reason = self.record(req, token, logprob)
        if reason is not None:
            self.finish(req, reason)
        else:
            self.rows.schedule(req)

    def record(self, req: EngineRequest, token: int, logprob: float) -> str | None:
        """Record one sampled token (and stream it); returns the finish reason (None: it goes on)."""
        version = self.weights.version_of(
            req.adapter
        )  # with adapters: the version of the row's own adapter
        req.record(token, logprob, version, self.weights.kv_tag(req.adapter))
        self.stats["generated_tokens"] += 1
        if req.stream is not None:
            req.deliver("token", (token, logprob, version))
        return req.finish_reason(token, self.stop_ids, self.tokenizer, self.max_len)

    def finish(self, req: EngineRequest, reason: str) -> None:
        self.release(req, req.cached_ids())
        req.deliver("done", req.completion(reason, self.tokenizer))

    def fail(self, req: EngineRequest, exc: BaseException, where: str = "") -> None:
        """Fail ``req`` with ``exc``; ``where``: the device call that raised (its program and shape)."""
        self.release(req, None)
        at = f" in {where}" if where else ""
        err = RequestFailed(f"request failed in the engine{at}: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        req.deliver("error", err)

    def release(self, req: EngineRequest, cached: list[int] | None) -> None:
        """Free the request's row; ``cached`` = the ids whose k/v it holds (None: forget the row)."""
        if req.placement is None:
            return
        self.rows.leave(req)
        self.admission.release(req.slot, cached, req.kv_version)

    def fail_step(self, reqs: list[EngineRequest], exc: BaseException) -> None:
        """A device step raised: fail its requests; if the (donated) cache is gone, rebuild it and forget
        every row (failing the requests still in them). Their error names the call that raised
        (``DeviceSteps.running``)."""
        where = getattr(self.device, "running", "")
        self.device.running = ""  # read once: a later host-side failure names no call
        for r in reqs:
            self.fail(r, exc, where)
        if not self.device.cache_lost():
            return
        for r in list(self.rows.active.values()):
            self.fail(r, exc, where)
        self.device.rebuild_cache()
        self.admission.invalidate_all()

    def abort_all(self) -> None:
        """The loop stopped: waiting and running requests end with "abort" (or an error after a crash)."""
        waiting = self.admission.drain()
        if self.crash is not None:
            for r in waiting + list(self.rows.active.values()):
                r.deliver("error", RequestFailed(f"the engine loop stopped: {self.crash!r}"))
            self.rows.active.clear()
            return
        for r in waiting:
            r.deliver("done", r.completion("abort", self.tokenizer))
        for r in list(self.rows.active.values()):
            self.finish(r, "abort")
