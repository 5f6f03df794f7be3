"""VllmEngine: the Engine protocol over vLLM's in-process async engine (optional extra ``gymllm[vllm]``).

    engine = VllmEngine("path/to/hf-checkpoint", gpu_memory_utilization=0.5)
    completion = await engine.generate(prompt_ids, SamplingParams(temperature=1.0))
    engine.update_weights({"model.layers.0.self_attn.q_proj.weight": jax_array, ...}, version=3)

vLLM is imported lazily (constructing the engine), so importing this module is free and raises
:class:`~gymllm.errors.MissingExtraError` only when vLLM is absent. The engine is created with
``logprobs_mode="processed_logprobs"`` (log-probabilities of the temperature-processed
distribution, as gymllm's trainer computes them) where the installed vLLM supports it.

Weight updates take a mapping of Hugging Face parameter names to arrays (JAX, NumPy or torch):
each is handed to the workers' ``model.load_weights`` through ``collective_rpc`` while generation is
paused (vLLM >= 0.10 ``pause_generation``), so no step mixes versions; tokens finished after the
swap carry the new version. Versions are tracked per request: a request records the version current
when each of its output chunks arrived.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from gymllm.errors import EngineError, MissingExtraError, explain
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams


def _import_vllm() -> Any:
    try:
        import vllm  # noqa: F401
    except ImportError as exc:  # also raised for a broken CUDA stack
        raise MissingExtraError("vllm", "vllm") from exc
    return vllm


def to_torch(array: Any) -> Any:
    """A JAX / NumPy array as a torch tensor (zero copy through DLPack where possible)."""
    import torch

    if isinstance(array, torch.Tensor):
        return array
    try:
        return torch.from_dlpack(array)
    except Exception:  # e.g. bfloat16 NumPy or a non-contiguous view
        return torch.from_numpy(np.ascontiguousarray(np.asarray(array, dtype=np.float32)))


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, Any]]) -> None:
    """Runs inside each vLLM worker (sent by ``collective_rpc``)."""
    model = worker.model_runner.model
    device = next(model.parameters()).device
    model.load_weights((name, tensor.to(device)) for name, tensor in weights)


def vllm_sampling_params(vllm: Any, params: SamplingParams) -> Any:
    return vllm.SamplingParams(
        n=1, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or -1,
        max_tokens=params.max_tokens, stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None, seed=params.seed, logprobs=0,
    )


class VllmEngine:
    """An in-process vLLM ``AsyncLLMEngine`` behind the :class:`~gymllm.inference.Engine` protocol."""

    def __init__(self, model: str, *, version: int = 0, **engine_args: Any):
        vllm = self._vllm = _import_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs

        engine_args.setdefault("logprobs_mode", "processed_logprobs")
        try:
            args = AsyncEngineArgs(model=model, **engine_args)
        except TypeError:  # an older vLLM without logprobs_mode
            engine_args.pop("logprobs_mode")
            args = AsyncEngineArgs(model=model, **engine_args)
        self._engine = vllm.AsyncLLMEngine.from_engine_args(args)
        self._version = version
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop generation runs on

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *,
                       session_id: str | None = None) -> Completion:
        """``session_id`` is accepted for the protocol; vLLM's automatic prefix caching does the reuse."""
        params = params or SamplingParams()
        if self._closed:
            raise EngineError("generate: expected an open engine, received a closed one. Fix: build a new engine.")
        if len(prompt_ids) == 0:
            raise EngineError(explain("prompt_ids", expected="at least one token id", received=[],
                                      fix="pass a non-empty prompt"))
        sp = vllm_sampling_params(self._vllm, params)
        rid = uuid.uuid4().hex
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish = "abort"
        loop = self._loop = asyncio.get_running_loop()
        start, first = loop.time(), float("nan")
        prompt = {"prompt_token_ids": [int(t) for t in prompt_ids]}
        async for out in self._engine.generate(prompt, sp, rid):
            o = out.outputs[0]
            new = list(o.token_ids[len(ids):])
            if new and not ids:
                first = loop.time() - start
            lps = (o.logprobs or [])[len(ids):]
            ids.extend(int(t) for t in new)
            logprobs.extend(float(d[t].logprob) if d and t in d else float("nan") for t, d in
                            zip(new, lps or [None] * len(new)))
            versions.extend([self._version] * len(new))
            if out.finished:
                finish = o.finish_reason if o.finish_reason in ("stop", "length", "abort") else "abort"
        return Completion(token_ids=ids, logprobs=logprobs, finish_reason=finish, versions=versions,
                          prompt_len=len(prompt_ids), ttft_s=first, latency_s=loop.time() - start)

    def update_weights(self, state: Mapping[str, Any] | Iterable[tuple[str, Any]], version: int) -> Any:
        """Load HF-named weights into the running engine. Thread-safe: the swap is scheduled on the
        event loop that serves generation; returns its task / concurrent future."""
        weights = [(n, to_torch(a)) for n, a in (state.items() if isinstance(state, Mapping) else state)]
        if self._loop is None:
            raise EngineError("update_weights: expected a running engine (call generate once first), "
                              "received one without an event loop. Fix: await aupdate_weights(...) instead")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return self._loop.create_task(self.aupdate_weights(weights, version))
        return asyncio.run_coroutine_threadsafe(self.aupdate_weights(weights, version), self._loop)

    async def aupdate_weights(self, weights: list[tuple[str, Any]], version: int) -> None:
        """Pause generation, load ``weights`` on every worker, bump the version, resume."""
        pause = getattr(self._engine, "pause_generation", None)
        if pause is not None:
            await pause()
        try:
            await self._engine.collective_rpc(_load_weights_on_worker, args=(weights,))
            await self._engine.reset_prefix_cache()
            self._version = int(version)
        finally:
            resume = getattr(self._engine, "resume_generation", None)
            if resume is not None:
                await resume()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            shutdown = getattr(self._engine, "shutdown", None)
            if shutdown is not None:
                shutdown()
