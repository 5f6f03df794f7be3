"""JaxEngine: the embedded continuous-batching engine over an NNX model.

    engine = JaxEngine(loaded.model, loaded.tokenizer, config=EngineConfig(num_slots=16, max_len=512))
    completion = await engine.generate(prompt_ids, SamplingParams(temperature=1.0), session_id="t0")

Design (one background thread owns the device; asyncio callers never block):

* A fixed pool of ``num_slots`` cache rows preallocated with ``model.init_cache``. Requests join
  between decode steps (prefilled in length buckets, several prompts per call) and leave as soon as
  they finish; one jitted decode step advances every slot at once. When more requests wait than
  rows are free, admission waits until a whole prefill batch of rows is free, so a saturated engine
  makes fewer, fuller prefill calls.
* Compiled shapes are fixed: prefill (batch size in powers of two up to ``max_prefill_batch``) x
  (length bucket) x (cached slots read: 0, or the smallest of ``lengths`` covering every row's
  reused prefix; :mod:`gymllm.models.prefill` reads only those, writes only real tokens), and decode
  over the first W rows for W in ``widths`` (powers of two from 8 up to ``num_slots``, and 24, 48, 96...:
  :func:`~gymllm.inference.scheduler.decode_widths`; free rows are
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
* ``update_weights(state, version)`` is thread-safe and is applied by the loop between steps, so no
  forward pass mixes versions; every token records the version of the forward that produced it.
* Spans "prefill" / "decode" on track "engine" measure busy time (a piggybacked step is a "decode"
  span with ``prefill`` and ``bucket`` tags).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import threading
import time
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gymllm.errors import EngineError, explain
from gymllm.inference.completion import Completion
from gymllm.inference.multistep import MAX_STOP_IDS, make_decode_chunk
from gymllm.inference.config import EngineConfig
from gymllm.inference.params import SamplingParams
from gymllm.inference.piggyback import make_mixed_step
from gymllm.inference.rows import SamplingRows
from gymllm.inference.sampling import request_key
from gymllm.inference.scheduler import (Placement, SlotTable, decode_widths, halving_buckets, pick_bucket,
                                        power_of_two_buckets)
from gymllm.inference.steps import make_steps
from gymllm.telemetry import counter, span

warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


class RequestFailed(EngineError):
    """A valid request failed inside the engine (a device step raised); other requests keep running."""


@dataclasses.dataclass(eq=False)
class _Request:
    prompt: list[int]
    params: SamplingParams
    key: np.ndarray  # [2] uint32
    session_id: str | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    stream: asyncio.Queue | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    submitted: float = dataclasses.field(default_factory=time.perf_counter)
    first_token: float = float("nan")
    placement: Placement | None = None
    cancelled: bool = False
    stop_reason: int | str | None = None
    kv_version: int | None = None  # the version of all k/v in the row; None once it spans versions

    @property
    def slot(self) -> int:
        assert self.placement is not None
        return self.placement.slot

    def cached_ids(self) -> list[int]:
        """Ids whose k/v this request's row holds: the prompt and every sampled id fed back."""
        return self.prompt + self.tokens[:-1]


def _cast_floats(state: Any, dtype: Any) -> Any:
    """The weights with every floating-point leaf cast to ``dtype`` (integer leaves unchanged). On CPU,
    bfloat16 weights are stored as their uint16 bit patterns (``models.transformer.pack_bf16``: the
    forward decodes them per layer; XLA:CPU slices bf16 layer stacks slowly)."""
    packed = jnp.dtype(dtype) == jnp.bfloat16 and jax.default_backend() == "cpu"
    return jax.tree.map(lambda x: _as_engine_dtype(x, jnp.uint16 if packed else dtype), state)


def _cache_dtype(cfg: EngineConfig, cache_dtype: Any) -> Any:
    """The KV cache's storage dtype: ``cache_dtype`` when given; else, computing in bfloat16, bf16 (on
    CPU as uint16 bit patterns, which XLA:CPU slices at memory speed): half the bytes a decode step
    reads, and the bf16 compute rounds the keys and values the same way anyway; else None (the model's
    choice)."""
    if cache_dtype is not None:
        return cache_dtype
    if cfg.compute_dtype == "bfloat16":
        return jnp.uint16 if jax.default_backend() == "cpu" else jnp.bfloat16
    return None


def _as_engine_dtype(x: Any, dtype: Any) -> jax.Array:
    """``x`` in the engine's storage dtype; uint16 storage holds bfloat16 bit patterns."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != jnp.uint16:
        return x
    if jnp.dtype(dtype) == jnp.uint16 and x.dtype != jnp.uint16:
        return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
    return x.astype(dtype)


@functools.partial(jax.jit, donate_argnums=(0,))
def _copy_rows(cache: Any, src: jax.Array, dst: jax.Array) -> Any:
    """Cache rows ``src`` [M] copied to rows ``dst`` [M] (a ``dst`` past the cache is dropped)."""
    return jax.tree.map(lambda c: c.at[:, dst].set(jnp.take(c, src, axis=1), mode="drop"), cache)


def _deliver(req: _Request, kind: str, payload: Any) -> None:
    """Hand a result to the caller's event loop from the engine thread."""

    def put() -> None:
        if kind == "token":
            if req.stream is not None:
                req.stream.put_nowait(payload)
            return
        if req.stream is not None:
            req.stream.put_nowait(payload)
        if req.future.done():
            return
        if kind == "error":
            req.future.set_exception(payload)
        else:
            req.future.set_result(payload)

    try:
        req.loop.call_soon_threadsafe(put)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass


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
        decode_chunk: int = 1,
    ):
        """``decode_chunk`` > 1: run up to that many decode steps per device call while no request
        waits to join (:mod:`gymllm.inference.multistep`; same tokens, fewer host round trips)."""
        self.config = cfg = config or EngineConfig()
        self.tokenizer = tokenizer
        if stop_token_ids is None:
            stop_token_ids = tuple(getattr(tokenizer, "stop_token_ids", ()) or ()) if tokenizer is not None else ()
        self.default_stop_ids = frozenset(int(t) for t in stop_token_ids)
        self.max_len = cfg.max_len
        self._graphdef, self._state = nnx.split(model)
        if cfg.compute_dtype is not None:
            self._state = _cast_floats(self._state, cfg.compute_dtype)
        self.vocab_size = self._infer_vocab(model, tokenizer)
        self._cache = model.init_cache(cfg.num_slots, cfg.max_len, _cache_dtype(cfg, cache_dtype))
        self._prefill, self._decode, self.trace_counts = make_steps(self._graphdef)
        self._mixed, self.mixed_trace_counts = make_mixed_step(self._graphdef)
        self.decode_chunk = max(1, int(decode_chunk))
        if self.decode_chunk > 1:
            self._decode_k, self.chunk_trace_counts = make_decode_chunk(self._graphdef, self.decode_chunk)
        self.buckets = power_of_two_buckets(cfg.max_len, cfg.min_bucket)
        self.batch_sizes = power_of_two_buckets(cfg.max_prefill_batch, 1)
        self.widths = decode_widths(cfg.num_slots)  # decode row counts
        self.lengths = halving_buckets(cfg.max_len, cfg.decode_lengths)  # decode cache lengths
        self._table = SlotTable(cfg.num_slots)
        self._rng = np.random.default_rng(cfg.seed)
        self._version = version
        self._pending_weights: tuple[Any, int] | None = None
        self._waiting: list[_Request] = []
        self._active: dict[int, _Request] = {}  # slot -> request
        self._cv = threading.Condition()  # guards the queues and the slot table (held briefly)
        self._device = threading.Lock()  # guards the cache and weights during device steps
        self._closing = False
        self._closed = False
        self._holds = 0  # paused(): the loop parks between iterations while > 0 ...
        self._allowed = 0  # ... except for the iterations run_iterations() lets through
        self._parked = False
        self._crash: BaseException | None = None
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0, "decode_steps": 0, "generated_tokens": 0}
        s = cfg.num_slots
        self._h_tokens = np.zeros(s, np.int32)
        self._h_pos = np.full(s, cfg.max_len - 1, np.int32)  # idle rows write only to the scratch index
        self._h_sampling = SamplingRows.inert(s)  # each row's sampling inputs at its next decode step
        self._copy_sizes = power_of_two_buckets(s, min(4, s))  # rows one compaction copies (padded to these)
        self._thread = threading.Thread(target=self._run, name="gymllm-jax-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_loaded(cls, loaded: Any, **kwargs: Any) -> "JaxEngine":
        """Build from ``gymllm.models.load(...)`` / ``make_tiny(...)`` output."""
        return cls(loaded.model, loaded.tokenizer, **kwargs)

    @staticmethod
    def _infer_vocab(model: Any, tokenizer: Any) -> int:
        cfg = getattr(model, "config", None)
        v = getattr(cfg, "vocab_size", None)
        if v is None and tokenizer is not None:
            v = getattr(tokenizer, "vocab_size", None)
        if v is None:
            raise EngineError(
                explain("JaxEngine", expected="a model with config.vocab_size or a tokenizer with vocab_size",
                        received=type(model).__name__, fix="pass the tokenizer from gymllm.models.load")
            )
        return int(v)

    # ------------------------------------------------------------------ public API
    @property
    def version(self) -> int:
        """The policy version that tokens sampled from now on carry (a pending update counts)."""
        with self._cv:
            return self._pending_weights[1] if self._pending_weights is not None else self._version

    def validate_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        """Return the prompt as a list of ints or raise :class:`EngineError` saying what to fix."""
        try:
            arr = np.asarray(prompt_ids)
        except (TypeError, ValueError):
            arr = np.asarray([None])
        if arr.size and (arr.dtype.kind not in "iu" or arr.ndim != 1):
            raise EngineError(explain("prompt_ids", expected="a flat sequence of int token ids",
                                      received=str(prompt_ids)[:80], fix="tokenize the prompt first"))
        ids = arr.astype(np.int64).tolist()
        if not ids:
            raise EngineError(explain("prompt_ids", expected="at least one token id", received=[],
                                      fix="pass a non-empty prompt (e.g. the chat template's ids)"))
        if len(ids) > self.max_len - 1:
            raise EngineError(explain("prompt_ids", expected=f"at most {self.max_len - 1} tokens (context "
                                      f"{self.max_len} minus one for the answer)", received=f"{len(ids)} tokens",
                                      fix="shorten the prompt or build the engine with a larger max_len"))
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineError(explain("prompt_ids", expected=f"ids in [0, {self.vocab_size})",
                                      received=bad[:5], fix="tokenize with this model's tokenizer"))
        return ids

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *, session_id: str | None = None
    ) -> Completion:
        """Sample one completion of ``prompt_ids``; cancellation aborts the request."""
        params = params or SamplingParams()
        if params.n != 1:
            raise EngineError(explain("SamplingParams.n", expected="1 for generate", received=params.n,
                                      fix="call generate_n(prompt_ids, params) to get n completions"))
        req = self._make_request(prompt_ids, params, session_id, 0, stream=False)
        return await self._await(req)

    async def generate_n(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[Completion]:
        """Sample ``params.n`` completions of one prompt (each with its own key)."""
        reqs = [self._make_request(prompt_ids, params, None, i, stream=False) for i in range(params.n)]
        return list(await asyncio.gather(*(self._await(r) for r in reqs)))

    async def stream(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *, session_id: str | None = None
    ):
        """Yield ``(token_id, logprob, version)`` per sampled token, then the final Completion."""
        params = params or SamplingParams()
        if params.n != 1:
            raise EngineError(explain("SamplingParams.n", expected="1 for stream", received=params.n,
                                      fix="stream each sample separately"))
        req = self._make_request(prompt_ids, params, session_id, 0, stream=True)
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
            self._wake()

    def update_weights(self, state: Any, version: int) -> None:
        """Swap in new weights (an ``nnx.State``, an ``nnx.Module`` or a matching pytree) at ``version``.

        Thread-safe; the loop applies the newest pending update between two device steps. Arrays of
        the engine's dtype are used without a copy: do not donate or delete them afterwards.
        """
        if isinstance(state, nnx.Module):
            state = nnx.state(state)
        new_leaves, new_def = jax.tree.flatten(state)
        old_leaves, old_def = jax.tree.flatten(self._state)
        if new_def != old_def:
            raise EngineError(explain("update_weights(state)", expected="the same pytree structure as the "
                                      "engine's model state (nnx.split(model)[1])", received=str(new_def)[:200],
                                      fix="pass nnx.state(model) of the same architecture"))
        for n, o in zip(new_leaves, old_leaves):
            if tuple(np.shape(n)) != tuple(o.shape):
                raise EngineError(explain("update_weights(state)", expected=f"a leaf of shape {o.shape}",
                                          received=np.shape(n), fix="pass weights of the same model config"))
        # same dtypes as compiled: a weight update never triggers a recompile
        leaves = [_as_engine_dtype(n, o.dtype) for n, o in zip(new_leaves, old_leaves)]
        state = jax.tree.unflatten(old_def, leaves)
        with self._cv:
            self._pending_weights = (state, int(version))
            self._cv.notify_all()

    @contextlib.contextmanager
    def paused(self):
        """Hold the loop between two iterations (no device step starts) while the block runs.

        Requests submitted inside the block wait and are admitted together when it ends, so a caller
        (a test, a debugger, an operator draining a host) decides the interleaving instead of racing
        the engine thread. Entering blocks until the current iteration has finished. Nestable.
        """
        with self._cv:
            self._holds += 1
            self._cv.notify_all()
            while not (self._parked or self._closing or not self._thread.is_alive()):
                self._cv.wait(0.05)
        try:
            yield self
        finally:
            with self._cv:
                self._holds -= 1
                self._cv.notify_all()

    def run_iterations(self, n: int = 1) -> None:
        """Inside :meth:`paused`: let exactly ``n`` loop iterations run (admission, then one decode or
        prefill step each), and return when they are done. Blocking; from asyncio use
        ``await asyncio.to_thread(engine.run_iterations, n)`` so results can be delivered."""
        with self._cv:
            if self._holds <= 0:
                raise EngineError("run_iterations: expected a paused engine, received a running one. "
                                  "Fix: call it inside `with engine.paused():`.")
            self._allowed += int(n)
            self._cv.notify_all()
            while not (self._allowed == 0 and self._parked) and not self._closing:
                self._cv.wait(0.05)  # the loop parks again once the n-th iteration is done

    def end_session(self, session_id: str) -> None:
        """Unpin a trajectory's cached prefix (it stays reusable until another request needs its slot)."""
        with self._cv:
            self._table.end_session(session_id)

    async def close(self) -> None:
        """Abort waiting and running requests (finish reason "abort") and stop the loop. Idempotent."""
        await asyncio.get_running_loop().run_in_executor(None, self.shutdown)

    def shutdown(self) -> None:
        """Synchronous :meth:`close`."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        self._closed = True

    def warmup(self, max_prompt_len: int | None = None) -> None:
        """Compile the decode step and every prefill shape (only the length buckets up to the one
        holding ``max_prompt_len``, when given) now; blocks. Call before serving or timing."""
        if self._active or self._waiting:
            raise EngineError("warmup: expected an idle engine, received one with requests. Fix: warm up first.")
        limit = pick_bucket(min(max_prompt_len, self.max_len - 1), self.buckets) if max_prompt_len else self.max_len
        with self._device:
            for p in self.batch_sizes:
                for t, n in self._prefill_shapes(limit, min(max_prompt_len or self.max_len, self.max_len - 1)):
                    rows = np.full(p, self.config.num_slots, np.int32)  # padding rows only: nothing is written
                    self._call_prefill(np.zeros((p, t), np.int32), np.zeros((p, t), np.int32), rows,
                                       np.zeros(p, np.int32), SamplingRows.inert(p), n)
            for w in self.widths:
                for n in sorted({self._decode_length(w, n - 1) for n in self.lengths}):
                    if self.decode_chunk > 1:
                        self._call_decode_chunk(1, w, n)
                    else:
                        self._call_decode(w, n)
            for n in self._copy_sizes if self.config.compact_rows else ():
                self._cache = _copy_rows(self._cache, np.zeros(n, np.int32), np.full(n, self.config.num_slots, np.int32))
            p = self.config.max_prefill_batch
            for t in (b for b in self.buckets if b <= min(limit, self.config.piggyback_tokens)):
                pre = (np.zeros((p, t), np.int32), np.zeros((p, t), np.int32), np.full(p, self.config.num_slots, np.int32),
                       np.zeros(p, np.int32), SamplingRows.inert(p))
                for w in self.widths:
                    for n in self.lengths:
                        self._call_mixed(*pre, width=w, length=n)

    # ------------------------------------------------------------------ request plumbing
    def _make_request(self, prompt_ids, params, session_id, index: int, *, stream: bool) -> _Request:
        if not isinstance(params, SamplingParams):
            raise EngineError(explain("params", expected="a SamplingParams", received=type(params).__name__,
                                      fix="pass gymllm.inference.SamplingParams(...)"))
        if params.stop and self.tokenizer is None:
            raise EngineError(explain("SamplingParams.stop", expected="stop strings only on an engine with a "
                                      "tokenizer", received=params.stop, fix="pass the tokenizer to JaxEngine or "
                                      "use stop_token_ids"))
        ids = self.validate_prompt(prompt_ids)
        seed = params.seed if params.seed is not None else int(self._rng.integers(0, 2**63 - 1))
        loop = asyncio.get_running_loop()
        req = _Request(ids, params, request_key(seed, index), session_id, loop, loop.create_future(),
                       asyncio.Queue() if stream else None)
        with self._cv:
            if self._closing:
                why = f" (the loop stopped: {self._crash!r})" if self._crash is not None else ""
                raise EngineError("generate: expected an open engine, received a closed one" + why +
                                  ". Fix: build a new engine.")
            self._waiting.append(req)
            self._cv.notify_all()
        return req

    async def _await(self, req: _Request) -> Completion:
        try:
            return await asyncio.shield(req.future)
        except asyncio.CancelledError:
            req.cancelled = True
            self._wake()
            raise

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # ------------------------------------------------------------------ the loop (engine thread)
    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    if not self._wait_for_work():
                        break
                with self._device:
                    self._apply_weights()
                    self._drop_cancelled()
                    ride = self._admit()
                    if ride is not None:
                        self._mixed_step(*ride)
                    elif self._active:
                        self._compact()
                        self._step()
        except BaseException as exc:  # a bug in the loop: fail everything clearly rather than hang
            self._crash = exc
            raise
        finally:
            with self._cv:
                self._closing = True  # no request can be queued after the drain below
            self._abort_all()

    def _wait_for_work(self) -> bool:
        """(Holding ``_cv``.) Wait until there is work and no :meth:`paused` hold stops it (or
        :meth:`run_iterations` lets one iteration through); False once closing."""
        while not self._closing:
            idle = not (self._waiting or self._active or self._pending_weights)
            if self._holds > 0 and self._allowed > 0:
                self._allowed -= 1
                if idle:  # an empty iteration: nothing to run
                    self._cv.notify_all()
                    continue
                self._parked = False
                return True
            if self._holds == 0 and not idle:
                self._parked = False
                return True
            self._parked = self._holds > 0
            if self._parked:
                self._cv.notify_all()
            self._cv.wait(self.config.idle_wait_s)
        self._parked = False
        return False

    def _apply_weights(self) -> None:
        with self._cv:
            pending, self._pending_weights = self._pending_weights, None
        if pending is not None:
            self._state, self._version = pending
            counter("policy_version", self._version, track="engine")

    def _drop_cancelled(self) -> None:
        with self._cv:
            gone = [r for r in self._waiting if r.cancelled]
            self._waiting = [r for r in self._waiting if not r.cancelled]
        for req in gone:
            self._finish(req, "abort")
        for req in list(self._active.values()):
            if req.cancelled:
                self._finish(req, "abort")

    def _admit(self) -> tuple[list[_Request], int] | None:
        """Place waiting requests in free rows and prefill them, in length-bucket batches; with rows
        decoding and ``EngineConfig.piggyback_tokens`` >= the smallest bucket, that batch is returned
        instead, to ride along the next decode step (:meth:`_mixed_step`)."""
        admitted: list[_Request] = []
        with self._cv:
            free, fill = self._table.num_free, min(self.config.max_prefill_batch, self.config.num_slots)
            if self._active and len(self._waiting) > free and free < fill:
                return None  # saturated: let rows free up to fill a whole prefill batch (fewer, fuller prefills)
            while self._waiting and self._table.num_free:
                req = self._waiting.pop(0)
                reuse_ok = self.config.prefix_reuse
                req.placement = self._table.acquire(req.prompt if reuse_ok else [], req.session_id, self._version)
                req.kv_version = self._version
                if not reuse_ok:
                    req.placement = Placement(req.placement.slot, 0)
                admitted.append(req)
        by_bucket: dict[int, list[_Request]] = {}
        for req in admitted:
            chunk = len(req.prompt) - req.placement.reuse_len
            by_bucket.setdefault(pick_bucket(chunk, self.buckets), []).append(req)
        batches = [(reqs[i : i + self.config.max_prefill_batch], bucket) for bucket, reqs in sorted(by_bucket.items())
                   for i in range(0, len(reqs), self.config.max_prefill_batch)]
        ride = None
        if self._active and batches and batches[0][1] <= self.config.piggyback_tokens:
            ride = batches.pop(0)  # the smallest bucket rides along the decode step
        for reqs, bucket in batches:
            self._prefill_batch(reqs, bucket)
        return ride

    def _prefill_inputs(self, reqs: list[_Request], bucket: int, p: int) -> tuple:
        """Host inputs of ``p`` prompt chunks (``reqs`` then padding rows) in length bucket ``bucket``:
        (tokens [p, T], positions [p, T], rows [p], last [p], sampling params)."""
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
            positions[i] = np.minimum(start + np.arange(bucket), self.max_len - 1)
            rows[i] = r.slot
            last[i] = len(chunk) - 1
            rp.set(i, r.key, 0, r.params)
            self.stats["prefill_tokens"] += len(chunk)
            self.stats["reused_tokens"] += start
        return tokens, positions, rows, last, rp

    def _prefill_batch(self, reqs: list[_Request], bucket: int) -> None:
        tokens, positions, rows, last, rp = self._prefill_inputs(reqs, bucket, pick_bucket(len(reqs), self.batch_sizes))
        try:
            length = self._prefill_length(int(positions[:, 0].max()))
            tok, logp = self._call_prefill(tokens, positions, rows, last, rp, length)
        except Exception as exc:  # isolate: fail these requests, keep serving the rest
            for r in reqs:
                self._fail(r, exc)
            self._recover(exc)
            return
        self._start(reqs, tok, logp)

    def _start(self, reqs: list[_Request], tok: np.ndarray, logp: np.ndarray) -> None:
        """Prefilled requests join the decode rows with their first sampled token."""
        now = time.perf_counter()
        for i, r in enumerate(reqs):
            r.first_token = now
            self._active[r.slot] = r
            self._accept(r, int(tok[i]), float(logp[i]))

    def _mixed_step(self, reqs: list[_Request], bucket: int) -> None:
        """One decode step over the active rows with ``reqs``' prompt chunks (bucket ``bucket``) prefilled
        in the same call (:mod:`gymllm.inference.piggyback`); a failure fails both."""
        pre = self._prefill_inputs(reqs, bucket, self.config.max_prefill_batch)
        decoding = list(self._active.items())
        try:
            tok, logp, w = self._call_mixed(*pre)
        except Exception as exc:
            for r in reqs + [r for _, r in decoding]:
                self._fail(r, exc)
            self._recover(exc)
            return
        self.stats["decode_steps"] += 1
        for slot, req in decoding:
            self._accept(req, int(tok[slot]), float(logp[slot]))
        self._start(reqs, tok[w:], logp[w:])

    def _call_mixed(self, tokens, positions, rows, last, rp: SamplingRows, width: int | None = None,
                    length: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
        """The piggybacked call: decode rows [0, W) (W, and the cache length read, cover the active rows
        and every chunk's start unless given); returns (tokens [W + P], logprobs [W + P], W)."""
        w = width or self._width()
        top = max([int(self._h_pos[s]) + 1 for s in self._active] + [int(positions[:, 0].max())])
        n = length or pick_bucket(max(top, 1), self.lengths)
        with span("decode", track="engine", active=len(self._active), width=w, length=n,
                  prefill=int(tokens.shape[0]), bucket=int(tokens.shape[1])):
            self._cache, tok, logp = self._mixed(
                self._state, self._cache, (self._h_tokens[:w], self._h_pos[:w]), (tokens, positions, rows, last),
                *self._h_sampling.head(w).concat(rp).arrays(), n,  # decode rows, then the chunks
            )
            return np.asarray(tok), np.asarray(logp), w

    def _call_prefill(self, tokens, positions, rows, last, rp: SamplingRows, length: int):
        """One prefill call; ``length`` (one of :attr:`prefill_lengths`, >= every row's start): the cached
        slots it reads."""
        with span("prefill", track="engine", batch=int(tokens.shape[0]), bucket=int(tokens.shape[1]), length=length):
            self._cache, tok, logp = self._prefill(
                self._state, self._cache, tokens, positions, rows, last, *rp.arrays(), length,
            )
            return np.asarray(tok), np.asarray(logp)

    @property
    def prefill_lengths(self) -> tuple[int, ...]:
        """The cached-prefix lengths a prefill call reads (0: no reused prefix), the decode cache lengths."""
        return (0, *self.lengths)

    def _prefill_length(self, max_start: int) -> int:
        """The smallest prefill length covering every row's start (reused prefix) ``max_start``."""
        return pick_bucket(max_start, self.prefill_lengths)

    def _prefill_shapes(self, limit: int, max_prompt: int) -> list[tuple[int, int]]:
        """Every (length bucket, prefill length) a prompt of at most ``max_prompt`` tokens can use, chunk
        buckets up to ``limit``: a chunk in bucket t has more tokens than the bucket below it, a start read
        with length n is past the length below it, and start + chunk <= ``max_prompt``."""
        buckets = [b for b in self.buckets if b <= limit]
        lows = dict(zip(self.buckets, (0, *self.buckets)))
        starts = dict(zip(self.prefill_lengths, (0, *(n + 1 for n in self.prefill_lengths))))
        return [(t, n) for t in buckets for n in self.prefill_lengths if starts[n] + lows[t] + 1 <= max_prompt]

    def _call_decode(self, width: int | None = None, length: int | None = None):
        """One decode step over rows [0, width) attending over cache slots [0, length); each defaults to
        the smallest that covers every active row (its slot / its position)."""
        w = width or self._width()
        n = length or self._decode_length(w, max((int(self._h_pos[s]) for s in self._active), default=0))
        with span("decode", track="engine", active=len(self._active), width=w, length=n):
            self._cache, tok, logp = self._decode(
                self._state, self._cache, self._h_tokens[:w], self._h_pos[:w], *self._h_sampling.head(w).arrays(), n,
            )
            return np.asarray(tok), np.asarray(logp)

    def _width(self) -> int:
        """The narrowest decode width covering every active row (rows [0, W) are decoded)."""
        return pick_bucket(max(self._active, default=0) + 1, self.widths)

    def _decode_length(self, width: int, max_pos: int) -> int:
        """The cache length a decode step over ``width`` rows attends over when no active row is past
        ``max_pos``: the smallest bucket covering it (the step reads only those slots, copying nothing)."""
        del width
        return pick_bucket(max_pos + 1, self.lengths)

    def _recover(self, exc: BaseException) -> None:
        """After a failed step: if the (donated) cache is gone, rebuild it and forget every row."""
        if not any(leaf.is_deleted() for leaf in jax.tree.leaves(self._cache)):
            return
        for r in list(self._active.values()):
            self._fail(r, exc)
        self._cache = nnx.merge(self._graphdef, self._state).init_cache(
            self.config.num_slots, self.max_len, jax.tree.leaves(self._cache)[0].dtype)
        with self._cv:
            for i in range(self.config.num_slots):
                self._table.invalidate(i)

    def _step(self) -> None:
        try:
            if self.decode_chunk > 1:
                toks, logps, ran = self._call_decode_chunk(self._chunk_steps())
            else:
                tok, logp = self._call_decode()
                toks, logps, ran = tok[None], logp[None], 1
        except Exception as exc:
            for r in list(self._active.values()):
                self._fail(r, exc)
            self._recover(exc)
            return
        self.stats["decode_steps"] += ran
        for j in range(ran):  # token by token, as single steps would: rows that finish drop out
            for slot, req in list(self._active.items()):
                self._accept(req, int(toks[j, slot]), float(logps[j, slot]))

    def _budget(self, req: _Request) -> int:
        """Tokens ``req`` may still sample (max_tokens and the context limit)."""
        return min(req.params.max_tokens - len(req.tokens), self.max_len - len(req.prompt) - len(req.tokens))

    def _chunk_steps(self) -> int:
        """Decode steps before the host looks again: 1 while a request waits (it joins next iteration),
        else up to ``decode_chunk``, no more than the active row with the most budget left can use."""
        with self._cv:
            if self._waiting:
                return 1
        return max(1, min(self.decode_chunk, max(self._budget(r) for r in self._active.values())))

    def _call_decode_chunk(self, k: int, width: int | None = None, length: int | None = None):
        """Up to ``k`` decode steps in one call; returns (tokens [k', W], logprobs [k', W], steps run k')."""
        w = width or self._width()
        stop = np.full((w, MAX_STOP_IDS), -1, np.int32)
        budget = np.zeros(w, np.int32)
        last = 0
        for s, r in self._active.items():
            ids = sorted(self.default_stop_ids | set(r.params.stop_token_ids))[:MAX_STOP_IDS]
            stop[s, : len(ids)] = ids
            budget[s] = self._budget(r)
            last = max(last, min(int(self._h_pos[s]) + k - 1, self.max_len - 1))
        n = length or self._decode_length(w, last)
        with span("decode", track="engine", active=len(self._active), width=w, length=n, steps=k):
            self._cache, tok, logp, ran = self._decode_k(
                self._state, self._cache, self._h_tokens[:w], self._h_pos[:w], *self._h_sampling.head(w).arrays(),
                stop, budget, np.int32(k), n,
            )
            ran = int(ran)
            return np.asarray(tok)[:ran], np.asarray(logp)[:ran], ran

    def _accept(self, req: _Request, token: int, logprob: float) -> None:
        """Record one sampled token; finish the request or schedule its next decode input."""
        req.tokens.append(token)
        req.logprobs.append(logprob)
        req.versions.append(self._version)
        if req.kv_version != self._version:
            req.kv_version = None  # this row now mixes versions: its prefix is not reused
        self.stats["generated_tokens"] += 1
        if req.stream is not None:
            _deliver(req, "token", (token, logprob, self._version))
        reason = self._finish_reason(req, token)
        if reason is not None:
            self._finish(req, reason)
            return
        s = req.slot
        self._h_tokens[s] = token
        self._h_pos[s] = len(req.prompt) + len(req.tokens) - 1
        self._h_sampling.set(s, req.key, len(req.tokens), req.params)

    def _finish_reason(self, req: _Request, token: int) -> str | None:
        if token in self.default_stop_ids or token in req.params.stop_token_ids:
            req.stop_reason = token
            return "stop"
        if req.params.stop and self.tokenizer is not None:
            hit = self._stop_string(req)
            if hit is not None:
                req.stop_reason = hit
                return "stop"
        if len(req.tokens) >= req.params.max_tokens or len(req.prompt) + len(req.tokens) >= self.max_len:
            return "length"
        return None

    def _stop_string(self, req: _Request) -> str | None:
        window = max(len(s) for s in req.params.stop) + 8  # tokens enough to spell any stop string
        tail = self.tokenizer.decode(req.tokens[-window:])
        for s in req.params.stop:
            if s in tail:
                return s
        return None

    def _completion(self, req: _Request, reason: str) -> Completion:
        text = self.tokenizer.decode(req.tokens) if self.tokenizer is not None else None
        return Completion(
            token_ids=req.tokens, logprobs=req.logprobs, finish_reason=reason, versions=req.versions,
            prompt_len=len(req.prompt), ttft_s=req.first_token - req.submitted,
            latency_s=time.perf_counter() - req.submitted, text=text, stop_reason=req.stop_reason,
            cached_prompt_len=req.placement.reuse_len if req.placement else 0,
        )

    def _compact(self) -> None:
        """Before a decode step, pack the active rows into the narrowest decode width that holds them: each
        active row above it trades places with an idle row below it (a session's cached prefix moves up
        with its row). Rows pinned by trajectories waiting on tools, or the long requests left at the tail
        of a batch, would otherwise keep every step as wide as the busiest moment."""
        if not self.config.compact_rows:
            return
        with self._cv:
            swaps = self._table.compaction(self.widths, self.config.num_slots // 2)
            back = [(b, a) for a, b in swaps if self._table.slots[b].cached]  # idle rows holding a prefix
        if not swaps:
            return
        src, dst = (list(x) for x in zip(*(swaps + back)))  # a busy row down; an idle prefix up
        n = pick_bucket(len(src), self._copy_sizes)
        with span("compact", track="engine", rows=len(swaps), copies=len(src)):
            self._cache = _copy_rows(self._cache, np.array(src + [0] * (n - len(src)), np.int32),
                                     np.array(dst + [self.config.num_slots] * (n - len(dst)), np.int32))
        with self._cv:
            for a, b in swaps:
                self._table.swap(a, b)
        for a, b in swaps:
            req = self._active.pop(a)
            req.placement = Placement(b, req.placement.reuse_len)
            self._active[b] = req
            self._h_tokens[b], self._h_pos[b] = self._h_tokens[a], self._h_pos[a]
            self._h_sampling.copy_row(a, b)
            self._idle_row(a)

    def _idle_row(self, slot: int) -> None:
        """Host inputs of a row nobody decodes: it writes only to the scratch slot, greedy, unfiltered."""
        self._h_pos[slot] = self.max_len - 1
        self._h_sampling.clear(slot)

    def _release(self, req: _Request, cached: list[int] | None) -> None:
        """Free the request's row; ``cached`` = the ids whose k/v it holds (None: forget the row)."""
        if req.placement is None:
            return
        if self._active.get(req.slot) is req:
            del self._active[req.slot]
            self._idle_row(req.slot)
        with self._cv:
            if cached is None:
                self._table.invalidate(req.slot)
            else:
                self._table.release(req.slot, cached, req.kv_version)

    def _finish(self, req: _Request, reason: str) -> None:
        self._release(req, req.cached_ids())
        _deliver(req, "done", self._completion(req, reason))

    def _fail(self, req: _Request, exc: BaseException) -> None:
        self._release(req, None)
        err = RequestFailed(f"request failed in the engine: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        _deliver(req, "error", err)

    def _abort_all(self) -> None:
        with self._cv:
            waiting, self._waiting = self._waiting, []
        if self._crash is not None:
            for r in waiting + list(self._active.values()):
                _deliver(r, "error", RequestFailed(f"the engine loop stopped: {self._crash!r}"))
            self._active.clear()
            return
        for r in waiting:
            _deliver(r, "done", self._completion(r, "abort"))
        for r in list(self._active.values()):
            self._finish(r, "abort")
