"""VllmEngine: the Engine protocol over vLLM's in-process async engine (optional extra ``gymllm[vllm]``).

    engine = VllmEngine("path/to/hf-checkpoint", gpu_memory_utilization=0.5)
    completion = await engine.generate(prompt_ids, SamplingParams(temperature=1.0))
    engine.update_weights({"model.layers.0.self_attn.q_proj.weight": jax_array, ...}, version=3)

vLLM is imported lazily (constructing the engine), so importing this module is free and raises
:class:`~gymllm.errors.MissingExtraError` only when vLLM is absent. The vLLM calls used here were
checked against vLLM's source and docs (v0.10-v0.3x, V1 engine; see the test module
``tests/test_inference_vllm.py`` for the list):

- the engine is ``AsyncLLM.from_engine_args(AsyncEngineArgs(model=..., **engine_args))``
  (``vllm.AsyncLLMEngine`` is an alias of it), built with ``logprobs_mode="processed_logprobs"``
  (vLLM's default, ``raw_logprobs``, is the log-softmax *before* temperature, not what the
  trainer computes) and ``worker_extension_cls`` = :class:`WeightLoaderExtension`;
- ``generate(TokensPrompt(prompt_token_ids=ids), SamplingParams(..., logprobs=0,
  output_kind=DELTA), request_id)`` streams RequestOutputs; ``logprobs=0`` returns the sampled
  token's logprob only; a cancelled request is aborted with ``abort(request_id)``;
- weights travel to the workers as a ``torch.save`` file whose path goes through
  ``collective_rpc("gymllm_load_weights", args=(path,))``: vLLM's RPC is msgpack between
  processes, which carries strings but decodes tensors in untyped arguments as plain lists and
  refuses functions unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``;
- the swap runs inside ``pause_generation(mode="keep", clear_cache=True)`` / ``resume_generation()``
  (vLLM's async-RL recipe): in-flight requests are frozen, not aborted (the default mode
  ``"abort"`` would end them), their KV cache is recomputed under the new weights, and tokens
  received after the swap carry the new version.

Logprob semantics differ from :class:`~gymllm.inference.JaxEngine` in one case: with top_k or
top_p set, vLLM's processed logprobs are those of the *filtered, renormalised* distribution
(gymllm's are of the full tempered distribution). With both filters off they agree.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import tempfile
import uuid
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from gymllm.errors import EngineError, MissingExtraError, explain
from gymllm.validation import require
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams, require_one_sample, require_prompt

WORKER_EXTENSION = "gymllm.inference.vllm_engine.WeightLoaderExtension"
FINISH_REASONS = ("stop", "length", "abort")


def _import_vllm() -> Any:
    try:
        import vllm  # noqa: F401
    except ImportError as exc:  # also raised for a broken CUDA stack
        raise MissingExtraError("vllm", "vllm") from exc
    return vllm


def to_torch(array: Any) -> Any:
    """A JAX / NumPy / torch array as a CPU torch tensor with the same dtype and values (bf16 kept)."""
    import torch

    if isinstance(array, torch.Tensor):
        return array.detach().cpu().contiguous()
    a = np.array(array)  # device -> host copy, writable and contiguous
    if (
        a.dtype.name == "bfloat16"
    ):  # ml_dtypes bfloat16: torch.from_numpy cannot read it, the bits can
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def hf_weights(loaded: Any) -> dict[str, np.ndarray]:
    """Hugging Face-named arrays of a gymllm ``LoadedModel`` (what vLLM's ``load_weights`` expects)."""
    from gymllm.models.checkpoint import external_tensors

    params = {k: np.asarray(v) for k, v in loaded.model.flat_params().items()}
    return external_tensors(loaded.config, params, "hf")


def _named(state: Any) -> list[tuple[str, Any]]:
    if hasattr(state, "config") and hasattr(getattr(state, "model", None), "flat_params"):
        state = hf_weights(state)
    pairs = list(state.items() if isinstance(state, Mapping) else state)
    bad = [n for n, _ in pairs if not isinstance(n, str)]
    require(
        bool(pairs and not bad),
        "update_weights(state)",
        expected="a non-empty mapping (or pairs) of Hugging "
        "Face parameter names to arrays, or a gymllm LoadedModel",
        received=bad[:3] or "nothing",
        fix="pass e.g. hf_weights(loaded_model)",
        error=EngineError,
    )
    return pairs


def _torch_pairs(state: Any) -> list[tuple[str, Any]]:
    """``(hf_name, CPU torch tensor)`` pairs of any weights :meth:`VllmEngine.update_weights` accepts."""
    return [(n, to_torch(a)) for n, a in _named(state)]


class WeightLoaderExtension:
    """Mixed into every vLLM worker class (engine arg ``worker_extension_cls``); runs in the workers."""

    def gymllm_load_weights(self, path: str) -> int:
        """Load the ``{hf_name: tensor}`` file at ``path`` into this worker's model; returns the count."""
        import torch

        weights = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        model = self.model_runner.model
        device = next(
            model.parameters()
        ).device  # one tensor at a time on the device, as vLLM's loaders expect
        model.load_weights(weights=((name, t.to(device)) for name, t in weights.items()))
        return len(weights)


def vllm_sampling_params(vllm: Any, params: SamplingParams) -> Any:
    """gymllm SamplingParams -> vLLM SamplingParams for one sample, streamed as deltas."""
    from vllm.sampling_params import RequestOutputKind

    require_one_sample(params)
    return vllm.SamplingParams(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k or -1,  # -1 = off in every vLLM (0 is off only from v0.9 on)
        max_tokens=params.max_tokens,
        stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        seed=params.seed,
        logprobs=0,  # the sampled token's logprob only
        output_kind=RequestOutputKind.DELTA,
    )


def _engine_class(vllm: Any) -> Any:
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError:  # before the V1 engine: the public alias
        return vllm.AsyncLLMEngine
    return AsyncLLM


class VllmEngine:
    """vLLM's in-process ``AsyncLLM`` behind the :class:`~gymllm.inference.Engine` protocol.

    ``weight_dir`` holds the transient weight files of :meth:`update_weights` (default: a fresh
    temporary directory); every vLLM worker must be able to read it (one node).
    """

    def __init__(
        self, model: str, *, version: int = 0, weight_dir: str | None = None, **engine_args: Any
    ):
        vllm = self._vllm = _import_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs

        engine_args.setdefault("logprobs_mode", "processed_logprobs")
        engine_args.setdefault("worker_extension_cls", WORKER_EXTENSION)
        try:
            args = AsyncEngineArgs(model=model, **engine_args)
        except TypeError as exc:
            raise EngineError(
                explain(
                    "VllmEngine(**engine_args)",
                    expected="arguments the installed vLLM's AsyncEngineArgs accepts "
                    "(gymllm sets logprobs_mode and worker_extension_cls: vLLM >= 0.10.2)",
                    received=str(exc),
                    fix="pip install -U 'vllm>=0.11', or drop the argument it names",
                )
            ) from exc
        self._engine = _engine_class(vllm).from_engine_args(args)
        self._version = int(version)
        self._weight_dir = weight_dir or tempfile.mkdtemp(prefix="gymllm-vllm-weights-")
        self._closed = False
        self._lock: asyncio.Lock | None = None  # one weight swap at a time
        self._tasks: set[Any] = set()  # pending swaps (kept referenced)
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # set by the first generate

    @property
    def version(self) -> int:
        return self._version

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        session_id: str | None = None,
    ) -> Completion:
        """Sample one completion. ``session_id`` is accepted for the protocol: vLLM's automatic
        prefix caching reuses a trajectory's prefix without it. Cancellation aborts the request."""
        params = params or SamplingParams()
        self._check_open("generate")
        require_prompt(prompt_ids)
        sp = vllm_sampling_params(self._vllm, params)
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=[int(t) for t in prompt_ids])
        loop = self._loop = asyncio.get_running_loop()
        rid = uuid.uuid4().hex
        acc = _Accumulator(loop.time())
        stream = self._engine.generate(prompt, sp, rid)
        try:
            async for out in stream:
                acc.add(out, self._version, loop.time())
        except asyncio.CancelledError:
            await self._engine.abort(rid)
            raise
        finally:
            await stream.aclose()
        return acc.completion(len(prompt_ids), loop.time())

    async def generate_n(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        """``params.n`` completions of one prompt (sample i seeded with ``seed + i`` when seeded)."""
        seeds = [None if params.seed is None else params.seed + i for i in range(params.n)]
        return list(
            await asyncio.gather(
                *(self.generate(prompt_ids, params.replace(n=1, seed=s)) for s in seeds)
            )
        )

    def update_weights(
        self, state: Mapping[str, Any] | Iterable[tuple[str, Any]] | Any, version: int
    ) -> Any:
        """Load Hugging Face-named weights (JAX / NumPy / torch arrays, or a gymllm LoadedModel) into
        the running engine at ``version``. Thread-safe and non-blocking: the swap runs on the loop
        that serves generation; returns its task (same thread) or concurrent future (other thread)."""
        weights = _torch_pairs(state)  # converted now: the caller may reuse its arrays afterwards
        self._check_open("update_weights")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and self._loop in (None, running):
            task = running.create_task(self._update(weights, version))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return task
        require(
            self._loop is not None,
            "update_weights",
            expected="an engine whose event loop is known",
            received="no loop (no generate yet, called outside any loop)",
            fix="await engine.aupdate_weights(...) on the serving loop",
            error=EngineError,
        )
        return asyncio.run_coroutine_threadsafe(self._update(weights, version), self._loop)

    async def aupdate_weights(
        self, weights: Iterable[tuple[str, Any]] | Mapping[str, Any] | Any, version: int
    ) -> None:
        """Write ``weights`` to a file, pause generation (in-flight requests kept), load the file on
        every worker, bump the version, resume. Generation goes on while the file is written."""
        await self._update(_torch_pairs(weights), version)

    async def _update(self, pairs: list[tuple[str, Any]], version: int) -> None:
        """:meth:`aupdate_weights` of already converted ``(hf_name, torch tensor)`` pairs."""
        import torch

        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            path = os.path.join(
                self._weight_dir, f"weights-v{int(version)}-{uuid.uuid4().hex[:8]}.pt"
            )
            await asyncio.to_thread(torch.save, dict(pairs), path)
            try:
                await self._swap(path, int(version))
            finally:
                os.remove(path)

    async def _swap(self, path: str, version: int) -> None:
        cleared = await self._pause()
        try:
            try:
                await self._engine.collective_rpc("gymllm_load_weights", args=(path,))
            except Exception as exc:
                raise EngineError(
                    explain(
                        "update_weights",
                        expected="weights every vLLM worker loads (Hugging Face names and shapes "
                        "of the served model)",
                        received=f"{type(exc).__name__}: {exc}",
                        fix="pass hf_weights(loaded_model) of the same architecture",
                    )
                ) from exc
            if not cleared:
                await self._engine.reset_prefix_cache()
            self._version = version
        finally:
            await self._resume()

    async def _pause(self) -> bool:
        """Freeze in-flight requests; True when the KV / prefix cache was cleared with the pause."""
        pause = getattr(self._engine, "pause_generation", None)
        if pause is None:  # no pause API: the RPC still runs between two engine steps
            return False
        names = inspect.signature(pause).parameters
        if (
            "mode" in names
        ):  # recent vLLM: keep the requests, recompute their KV under the new weights
            await pause(mode="keep", clear_cache=True)
            return True
        if (
            "wait_for_inflight_requests" in names
        ):  # older: its default aborts in-flight requests, so drain
            await pause(wait_for_inflight_requests=True)
        return False

    async def _resume(self) -> None:
        resume = getattr(self._engine, "resume_generation", None)
        if resume is not None:
            await resume()

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise EngineError(
                f"{what}: expected an open engine, received a closed one. Fix: build a new engine."
            )

    async def close(self) -> None:
        """Shut vLLM down (its engine-core process and workers). Idempotent."""
        if not self._closed:
            self._closed = True
            shutdown = getattr(self._engine, "shutdown", None)
            if shutdown is not None:
                shutdown()


class _Accumulator:
    """Collects one request's streamed (delta) outputs into a Completion."""

    def __init__(self, start: float):
        self.start, self.first = start, float("nan")
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.text: list[str] = []
        self.finish, self.stop_reason, self.cached = "abort", None, 0

    def add(self, out: Any, version: int, now: float) -> None:
        o = out.outputs[0]
        new = [int(t) for t in o.token_ids]
        if new and not self.ids:
            self.first = now - self.start
        self.logprobs.extend(_sampled_logprobs(new, o.logprobs))
        self.ids.extend(new)
        self.versions.extend([version] * len(new))
        self.text.append(o.text or "")
        if out.finished:
            self.finish = _finish_reason(o.finish_reason)
            self.stop_reason = o.stop_reason
            self.cached = int(getattr(out, "num_cached_tokens", 0) or 0)

    def completion(self, prompt_len: int, now: float) -> Completion:
        return Completion(
            token_ids=self.ids,
            logprobs=self.logprobs,
            finish_reason=self.finish,
            versions=self.versions,
            prompt_len=prompt_len,
            ttft_s=self.first,
            latency_s=now - self.start,
            text="".join(self.text),
            stop_reason=self.stop_reason,
            cached_prompt_len=self.cached,
        )


def _sampled_logprobs(ids: list[int], entries: Any) -> list[float]:
    """The sampled ids' logprobs from vLLM's per-token ``{token_id: Logprob}`` dicts."""
    entries = list(entries or [])
    require(
        len(entries) == len(ids) and all(t in d for t, d in zip(ids, entries)),
        "vLLM output logprobs",
        expected=f"one {{token_id: Logprob}} per sampled token holding that token ({len(ids)})",
        received=entries[:3],
        fix="keep logprobs=0 in the SamplingParams (set by VllmEngine)",
        error=EngineError,
    )
    return [float(d[t].logprob) for t, d in zip(ids, entries)]


def _finish_reason(reason: Any) -> str:
    reason = None if reason is None else str(reason)
    if reason in FINISH_REASONS:
        return reason
    raise EngineError(
        explain(
            "vLLM finish_reason",
            expected=" / ".join(FINISH_REASONS),
            received=reason,
            fix="see vLLM's log for the request's error",
        )
    )
