"""JaxEngine: the embedded continuous-batching engine over an NNX model.

    engine = JaxEngine(loaded.model, loaded.tokenizer, config=EngineConfig(num_slots=16, max_len=512))
    completion = await engine.generate(prompt_ids, SamplingParams(temperature=1.0), session_id="t0")

Design (one background thread owns the device; asyncio callers never block):

* A fixed pool of ``num_slots`` cache rows preallocated with ``model.init_cache``. Requests join
  between decode steps (prefilled in length buckets, several prompts per call) and leave as soon as
  they finish; one jitted decode step advances every slot at once. When more requests wait than
  rows are free, admission waits until a whole prefill batch of rows is free, so a saturated engine
  makes fewer, fuller prefill calls.
* Compiled shapes are fixed. ``EngineConfig.shapes="fixed"``: a set known in advance whatever the
  traffic: one packed prefill of ``prefill_tokens`` tokens (prompts of any lengths and counts laid end to
  end, each piece reading its row's cached prefix, a long prompt continuing in the next call), one
  decode program over all ``num_slots`` rows, one row-copy program, per cache length
  (``decode_lengths``); no piggybacking, no compaction (:meth:`JaxEngine.program_shapes`).
  ``shapes="buckets"``: prefill (batch size in powers of two up to ``max_prefill_batch``) x
  (length bucket) x (cached slots read: 0, or the smallest of ``lengths`` covering every row's
  reused prefix; :mod:`gymllm.models.prefill` reads only those, writes only real tokens), and decode
  over the first W rows for W in ``widths`` (powers of two from 8 up to ``num_slots``, and 24, 48, 96...:
  :func:`~gymllm.inference.slot_table.decode_widths`; free rows are
  taken lowest first, so a lightly loaded engine runs narrow steps) x the first S cache slots for S
  in ``lengths`` (``max_len``, ``max_len / 2``, ...: the smallest covering every active row's
  position, so attention costs what the sequences need). ``trace_counts`` exposes the number of
  compilations (shared by engines over equal model graphs, which share the compiled steps). Prefill
  projects only each prompt's last token onto the vocabulary.
* Piggybacking (``EngineConfig.piggyback_tokens`` > 0): prompts of a small bucket that arrive while
  rows decode ride along the next decode step in one device call (:mod:`gymllm.inference.piggyback`;
  mixed programs: widths x lengths x those buckets), instead of a prefill call every decoding row
  waits for. Pays where a step costs mostly reading the weights.
* Row compaction (``EngineConfig.compact_rows``): before a decode step, active rows above the narrowest
  width that could hold them trade places with idle rows below it (``SlotTable.compaction``; a
  session's cached prefix moves with its row), so the tail of a batch decodes narrow, and so do
  steps while many trajectories wait on tools with their rows pinned; span "compact".
* ``EngineConfig.compute_dtype="bfloat16"`` keeps the engine's weights in bf16 (cast once, and at
  every update): matmuls in bf16 with float32 accumulation, several times faster on AMX CPUs at
  16+ rows; logits, sampling and logprobs stay float32.
* Per-request keys: sample i of a request with ``seed`` uses a key derived from ``(seed, i)``;
  without a seed the engine draws a fresh one. Token j uses ``fold_in(key, j)``, so a seeded request
  samples the same tokens whatever else is batched with it (up to float rounding of the logits).
* Prefix reuse: a finished row keeps its k/v; a later request whose prompt starts with that row's
  tokens (the same ``session_id`` first) prefills only the rest.
* Prompt sharing (``EngineConfig.share_prompt_prefill``): a request whose prompt shares at least
  ``min_bucket`` tokens with a row still decoding (k/v of the same version and adapter) copies that
  row into its own (the compaction copy program) and prefills only the rest; identical prompts
  arriving together (a GRPO group) prefill once, the others joining one iteration later
  (``stats["shared_prefill_tokens"]``, also in ``reused_tokens``; span "share").
* ``update_weights(state, version)`` is thread-safe and is applied by the loop between steps, so no
  forward pass mixes versions; every token records the version of the forward that produced it.
* Multi-LoRA serving (``adapters=AdapterConfig(lora=..., names=(...))``, :mod:`gymllm.inference.adapters`):
  one engine holds the frozen base and a stack of named LoRA adapters; a request names its adapter
  (``generate(..., adapter="a")`` or the Engine view ``for_adapter("a")``), rows of different adapters
  decode in the same step (one compiled program for every mix), ``update_adapter(name, adapters,
  version)`` swaps one adapter between steps, every token records its own adapter's version, and a
  cached prefix is reused only by the same adapter at the same versions.
* Spans "prefill" / "decode" on track "engine" measure busy time (a piggybacked step is a "decode"
  span with ``prefill`` and ``bucket`` tags).

Rooms (this module is the public face; each collaborator owns one concern):

* :mod:`gymllm.inference.request`: one request's record, its finishing rules, result delivery;
* :mod:`gymllm.inference.admission`: the waiting queue, the slot table (:mod:`~gymllm.inference.slot_table`),
  prefill batches and their inputs, row compaction;
* :mod:`gymllm.inference.rows`: the decode rows on the host (who decodes where, next inputs);
* :mod:`gymllm.inference.device_cache`: the cache and every compiled call and shape
  (:mod:`~gymllm.inference.jit_steps`, :mod:`~gymllm.inference.multi_token_decode`, :mod:`~gymllm.inference.piggyback`);
* :mod:`gymllm.inference.weights`: the weights, their version and the pending update;
* :mod:`gymllm.inference.loop`: the engine thread (when it runs, what one iteration does).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import warnings
from typing import Any, Sequence

import numpy as np
from flax import nnx

from gymllm.errors import EngineError, explain
from gymllm.inference.adapters import BASE, AdapterConfig, AdapterStore, AdapterView, require_store
from gymllm.inference.admission import Admission
from gymllm.inference.completion import Completion
from gymllm.inference.config import EngineConfig
from gymllm.inference.device_cache import DeviceSteps
from gymllm.inference.loop import EngineLoop, LoopGate
from gymllm.inference.params import SamplingParams, require_one_sample
from gymllm.inference.request import EngineRequest
from gymllm.inference.rows import DecodeRows
from gymllm.inference.sampling import request_key
from gymllm.inference.weights import WeightStore, kv_cache_dtype
from gymllm.models.tokenizer import stop_ids
from gymllm.utils.host import resolve_compute_dtype
from gymllm.validation import require, require_instance

warnings.filterwarnings("ignore", message="Some donated buffers were not usable")

__all__ = ["JaxEngine"]


def infer_vocab(model: Any, tokenizer: Any) -> int:
    """The vocabulary size: ``model.config.vocab_size``, else the tokenizer's; raises if neither has one."""
    cfg = getattr(model, "config", None)
    v = getattr(cfg, "vocab_size", None)
    if v is None and tokenizer is not None:
        v = getattr(tokenizer, "vocab_size", None)
    require(
        v is not None,
        "JaxEngine",
        expected="a model with config.vocab_size or a tokenizer with vocab_size",
        received=type(model).__name__,
        fix="pass the tokenizer from gymllm.models.load",
        error=EngineError,
    )
    return int(v)


class JaxEngine:
    """Continuous-batching engine; implements the :class:`~gymllm.inference.Engine` protocol."""

    def __init__(
        self,
        model: nnx.Module,
        tokenizer: Any = None,
        *,
        config: EngineConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
        version: int = 0,
        cache_dtype: Any = None,
        decode_chunk: int | None = None,
        adapters: AdapterConfig | None = None,
    ):
        """``decode_chunk`` > 1: run up to that many decode steps per device call while no request
        waits to join (:mod:`gymllm.inference.multi_token_decode`; same tokens, fewer host round trips);
        None: ``config.decode_chunk``. ``adapters``: the LoRA adapters this engine serves per request
        (:mod:`gymllm.inference.adapters`; each starts as zeros, the base model, at ``version``)."""
        cfg = config or EngineConfig()
        if (
            cfg.compute_dtype == "auto"
        ):  # the dtype that is fastest on this host, chosen where the engine runs
            cfg = dataclasses.replace(cfg, compute_dtype=resolve_compute_dtype("auto"))
        self.config = cfg
        self.tokenizer = tokenizer
        self.default_stop_ids = stop_ids(tokenizer, stop_token_ids)
        self.max_len = cfg.max_len
        self.decode_chunk = max(1, int(cfg.decode_chunk if decode_chunk is None else decode_chunk))
        self._cv = (
            threading.Condition()
        )  # guards the queue, the slot table, pending weights, the gate (held briefly)
        self._device_lock = threading.Lock()  # guards the cache and weights during device steps
        graphdef, state = nnx.split(model)
        self._weights = WeightStore(state, version, compute_dtype=cfg.compute_dtype, cv=self._cv)
        if adapters is not None:
            require(
                isinstance(adapters, AdapterConfig),
                "JaxEngine(adapters)",
                expected="an AdapterConfig",
                received=adapters,
                fix="pass AdapterConfig(lora=LoRAConfig(rank=...), names=(...))",
                error=EngineError,
            )
            base = nnx.merge(graphdef, self._weights.state).flat_params()
            self._weights.adapters = AdapterStore(adapters, base, version, cv=self._cv)
        self.vocab_size = infer_vocab(model, tokenizer)
        cache = model.init_cache(cfg.num_slots, cfg.max_len, kv_cache_dtype(cfg, cache_dtype))
        self._steps = steps = DeviceSteps(
            graphdef, self._weights, cache, config=cfg, decode_chunk=self.decode_chunk
        )
        self.trace_counts, self.mixed_trace_counts = steps.trace_counts, steps.mixed_trace_counts
        if self.decode_chunk > 1:
            self.chunk_trace_counts = steps.chunk_trace_counts
        self.packed_trace_counts = (
            steps.packed_trace_counts
        )  # the packed prefill's (shapes="fixed")
        self.buckets, self.batch_sizes = (
            steps.buckets,
            steps.batch_sizes,
        )  # prefill lengths and batch sizes
        self.widths, self.lengths = (
            steps.widths,
            steps.lengths,
        )  # decode row counts and cache lengths
        self.stats = {
            "prefill_tokens": 0,
            "reused_tokens": 0,
            "shared_prefill_tokens": 0,
            "decode_steps": 0,
            "generated_tokens": 0,
        }
        self._rng = np.random.default_rng(cfg.seed)
        self._rows = DecodeRows(cfg.num_slots, cfg.max_len)
        self._admission = Admission(cfg, self._cv, self.buckets, self.stats)
        self._gate = LoopGate(
            self._cv, idle_wait_s=cfg.idle_wait_s, alive=lambda: self._thread.is_alive()
        )
        self._loop = EngineLoop(
            config=cfg,
            admission=self._admission,
            rows=self._rows,
            device=steps,
            weights=self._weights,
            gate=self._gate,
            lock=self._device_lock,
            stats=self.stats,
            stop_ids=self.default_stop_ids,
            tokenizer=tokenizer,
            decode_chunk=self.decode_chunk,
        )
        self._closed = False
        self._thread = threading.Thread(
            target=self._loop.run, name="gymllm-jax-engine", daemon=True
        )
        self._thread.start()

    @classmethod
    def from_loaded(cls, loaded: Any, **kwargs: Any) -> "JaxEngine":
        """Build from ``gymllm.models.load(...)`` / ``make_tiny(...)`` output."""
        return cls(loaded.model, loaded.tokenizer, **kwargs)

    # ------------------------------------------------------------------ public API
    @property
    def version(self) -> int:
        """The policy version that tokens sampled from now on carry (a pending update counts)."""
        return self._weights.latest_version

    @property
    def adapters(self) -> AdapterStore | None:
        """The LoRA adapters this engine serves per request (names, versions, stacks; None: none;
        :mod:`gymllm.inference.adapters`)."""
        return self._weights.adapters

    def update_adapter(self, name: str, adapters: Any, version: int) -> None:
        """Swap in adapter ``name``'s new LoRA arrays (``{"layers.<t>.lora_a": [L, in, r], "layers.<t>.lora_b":
        [L, r, out]}`` of the engine's LoRAConfig, unscaled, or ``lora.merge``'s MergedWeights) at
        ``version``. Thread-safe; the loop applies it between two device steps; other adapters' rows
        keep their weights and versions."""
        require_store(self._weights.adapters, "update_adapter").submit(name, adapters, version)

    def for_adapter(self, name: str) -> AdapterView:
        """An Engine (generate, generate_n, stream, version, end_session, update_weights) that serves adapter
        ``name`` of this engine (:class:`~gymllm.inference.adapters.AdapterView`)."""
        require_store(self._weights.adapters, "for_adapter(name)").resolve(name)
        return AdapterView(self, name)

    @property
    def serving(self) -> bool:
        """Whether requests are accepted and run: False once closed, or once the loop stopped (see ``failure``)."""
        return self._thread.is_alive() and not self._gate.closing

    @property
    def failure(self) -> BaseException | None:
        """The exception that stopped the engine loop, if one did (the loop fails single requests, not itself)."""
        return self._loop.crash

    @property
    def prefill_lengths(self) -> tuple[int, ...]:
        """The cached-prefix lengths a prefill call reads (0: no reused prefix), the decode cache lengths."""
        return self._steps.prefill_lengths

    def validate_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        """Return the prompt as a list of ints or raise :class:`EngineError` saying what to fix."""
        try:
            arr = np.asarray(prompt_ids)
        except (TypeError, ValueError):
            arr = np.asarray([None])
        if arr.size and (arr.dtype.kind not in "iu" or arr.ndim != 1):
            raise EngineError(
                explain(
                    "prompt_ids",
                    expected="a flat sequence of int token ids",
                    received=str(prompt_ids)[:80],
                    fix="tokenize the prompt first",
                )
            )
        ids = arr.astype(np.int64).tolist()
        require(
            bool(ids),
            "prompt_ids",
            expected="at least one token id",
            received=[],
            fix="pass a non-empty prompt (e.g. the chat template's ids)",
            error=EngineError,
        )
        require(
            len(ids) <= self.max_len - 1,
            "prompt_ids",
            expected=f"at most {self.max_len - 1} tokens (context "
            f"{self.max_len} minus one for the answer)",
            received=f"{len(ids)} tokens",
            fix="shorten the prompt or build the engine with a larger max_len",
            error=EngineError,
        )
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        require(
            not bad,
            "prompt_ids",
            expected=f"ids in [0, {self.vocab_size})",
            received=bad[:5],
            fix="tokenize with this model's tokenizer",
            error=EngineError,
        )
        return ids

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        session_id: str | None = None,
        adapter: str | None = None,
    ) -> Completion:
        """Sample one completion of ``prompt_ids``; cancellation aborts the request. ``adapter``: the LoRA
        adapter that serves it (an engine built with adapters; None: the base model)."""
        params = params or SamplingParams()
        require_one_sample(params)
        req = self._make_request(prompt_ids, params, session_id, 0, stream=False, adapter=adapter)
        return await self._await(req)

    async def generate_n(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> list[Completion]:
        """Sample ``params.n`` completions of one prompt (each with its own key); ``adapter`` as in generate."""
        reqs = [
            self._make_request(prompt_ids, params, None, i, stream=False, adapter=adapter)
            for i in range(params.n)
        ]
        return list(await asyncio.gather(*(self._await(r) for r in reqs)))

    async def stream(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        session_id: str | None = None,
        adapter: str | None = None,
    ):
        """Yield ``(token_id, logprob, version)`` per sampled token, then the final Completion; ``adapter`` as
        in generate."""
        params = params or SamplingParams()
        require_one_sample(params, "stream", "stream each sample separately")
        req = self._make_request(prompt_ids, params, session_id, 0, stream=True, adapter=adapter)
        assert req.stream is not None
        try:
            while True:
                item = await req.stream.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Completion):
                    return
        finally:
            req.cancelled = True
            self._gate.wake()

    def update_weights(self, state: Any, version: int) -> None:
        """Swap in new weights (an ``nnx.State``, an ``nnx.Module`` or a matching pytree) at ``version``.

        Thread-safe; the loop applies the newest pending update between two device steps. Arrays of
        the engine's dtype are used without a copy: do not donate or delete them afterwards.
        """
        self._weights.submit(state, version)

    @contextlib.contextmanager
    def paused(self):
        """Hold the loop between two iterations (no device step starts) while the block runs.

        Requests submitted inside the block wait and are admitted together when it ends, so a caller
        (a test, a debugger, an operator draining a host) decides the interleaving instead of racing
        the engine thread. Entering blocks until the current iteration has finished. Nestable.
        """
        with self._gate.paused():
            yield self

    def run_iterations(self, n: int = 1) -> None:
        """Inside :meth:`paused`: let exactly ``n`` loop iterations run (admission, then one decode or
        prefill step each), and return when they are done. Blocking; from asyncio use
        ``await asyncio.to_thread(engine.run_iterations, n)`` so results can be delivered."""
        self._gate.run_iterations(n)

    def end_session(self, session_id: str) -> None:
        """Unpin a trajectory's cached prefix (it stays reusable until another request needs its slot)."""
        self._admission.end_session(session_id)

    async def close(self) -> None:
        """Abort waiting and running requests (finish reason "abort") and stop the loop. Idempotent."""
        await asyncio.get_running_loop().run_in_executor(None, self.shutdown)

    def shutdown(self) -> None:
        """Synchronous :meth:`close`. Once the loop has stopped, the KV cache's device memory is freed
        (the weights are not: a learner may share them)."""
        self._gate.close()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        self._closed = True
        if not self._thread.is_alive():
            self._steps.release_cache()

    def program_shapes(self, max_prompt_len: int | None = None) -> list[tuple]:
        """Every device program this engine's config runs (:meth:`DeviceSteps.program_shapes
        <gymllm.inference.device_cache.DeviceSteps.program_shapes>`): what :meth:`warmup` compiles."""
        return self._steps.program_shapes(max_prompt_len)

    def warmup(self, max_prompt_len: int | None = None) -> None:
        """Compile every program of :meth:`program_shapes` now (bucketed prefill shapes only up to the
        length bucket holding ``max_prompt_len``, when given); blocks. Call before serving or timing."""
        if self._rows.active or self._admission.waiting:
            raise EngineError(
                "warmup: expected an idle engine, received one with requests. Fix: warm up first."
            )
        with self._device_lock:
            self._steps.warmup(self._rows, max_prompt_len)

    # ------------------------------------------------------------------ request plumbing
    def _make_request(
        self,
        prompt_ids,
        params,
        session_id,
        index: int,
        *,
        stream: bool,
        adapter: str | None = None,
    ) -> EngineRequest:
        require_instance(
            params,
            SamplingParams,
            "params",
            expected="a SamplingParams",
            fix="pass gymllm.inference.SamplingParams(...)",
            error=EngineError,
        )
        require(
            not params.stop or self.tokenizer is not None,
            "SamplingParams.stop",
            expected="stop strings only on an engine with a tokenizer",
            received=params.stop,
            fix="pass the tokenizer to JaxEngine or use stop_token_ids",
            error=EngineError,
        )
        ids = self.validate_prompt(prompt_ids)
        slot = (
            BASE
            if adapter is None
            else require_store(self._weights.adapters, "generate(adapter=...)").resolve(adapter)
        )
        seed = params.seed if params.seed is not None else int(self._rng.integers(0, 2**63 - 1))
        loop = asyncio.get_running_loop()
        req = EngineRequest(
            ids,
            params,
            request_key(seed, index),
            session_id,
            loop,
            loop.create_future(),
            asyncio.Queue() if stream else None,
            adapter=slot,
        )
        with self._cv:
            if self._gate.closing:
                crash = self._loop.crash
                why = f" (the loop stopped: {crash!r})" if crash is not None else ""
                raise EngineError(
                    "generate: expected an open engine, received a closed one"
                    + why
                    + ". Fix: build a new engine."
                )
            self._admission.enqueue(req)
        return req

    async def _await(self, req: EngineRequest) -> Completion:
        try:
            return await asyncio.shield(req.future)
        except asyncio.CancelledError:
            req.cancelled = True
            self._gate.wake()
            raise
