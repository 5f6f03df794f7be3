"""A STAND-IN for the slice of vLLM's API that ``gymllm.inference.VllmEngine`` uses. It is NOT vLLM.

The real vLLM cannot run on this machine (its PyPI wheel needs a CUDA GPU; its CPU wheels are not on
PyPI), so the adapter's logic is tested against these modules, inserted into ``sys.modules`` by
:func:`install`. Names, signatures and behaviours follow vLLM's source as read for the adapter
(the V1 engine, v0.10-v0.3x; files named per class below). What is modelled:

- ``vllm.engine.arg_utils.AsyncEngineArgs``: a dataclass, so an unknown argument is a TypeError;
  ``logprobs_mode`` validated against vLLM's four modes (``vllm/config/model.py``).
- ``vllm.sampling_params.SamplingParams`` / ``RequestOutputKind``: the fields the adapter sets,
  top_k 0 or -1 = off, unknown fields rejected (``vllm/sampling_params.py``).
- ``vllm.inputs.TokensPrompt``: a TypedDict with ``prompt_token_ids``.
- ``vllm.outputs.RequestOutput`` / ``CompletionOutput``, ``vllm.logprobs.Logprob``.
- ``vllm.v1.engine.async_llm.AsyncLLM`` (``vllm.AsyncLLMEngine`` is the same class, as in vLLM):
  ``from_engine_args``, ``generate(prompt, sampling_params, request_id)`` streaming outputs per
  engine step (DELTA / CUMULATIVE / FINAL_ONLY), ``abort(request_id)`` (also on cancellation, as
  vLLM's generate does), ``pause_generation(mode=..., clear_cache=...)`` with modes abort / wait /
  keep, ``resume_generation``, ``collective_rpc(method: str, timeout, args, kwargs)`` run between
  two engine steps on every worker, ``reset_prefix_cache``, ``shutdown``. Outputs go from the
  "engine core" through an output-handler task to per-request queues, as in vLLM, so a consumer
  sees them a little after they were produced.
- RPC arguments must be what vLLM's msgpack RPC carries intact (str, numbers, lists, dicts);
  functions and tensors raise here (vLLM refuses functions without
  VLLM_ALLOW_INSECURE_SERIALIZATION and decodes tensors in untyped arguments as plain lists).
- Workers: the class named by ``worker_extension_cls`` is mixed into the worker class, as vLLM
  does; ``worker.model_runner.model.load_weights(weights)`` copies named tensors (KeyError for an
  unknown name, ValueError for a wrong shape).

The "model" is a toy script: step k of a prompt samples ``(sum(prompt) + k) % 50 + 100 * w`` with
``w = lm_head.weight[0, 0]`` of the loaded weights (so a token tells which weights produced it), and
the sampled token's logprob is ``-0.25 (k + 1) / T`` (T = 1 when greedy) under
``logprobs_mode="processed_logprobs"`` and ``-0.25 (k + 1)`` under ``raw_logprobs``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import importlib
import sys
import types
from typing import Any, TypedDict

STEP_S = 0.002  # one engine step
RPC_LATENCY_S = 0.005
OUTPUT_LAG_S = (
    3 * STEP_S
)  # engine core -> output handler -> request queue; under pause_generation's 0.02 s
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


# ---------------------------------------------------------------- vllm.engine.arg_utils
@dataclasses.dataclass(kw_only=True)
class AsyncEngineArgs:
    model: str
    logprobs_mode: str = "raw_logprobs"
    worker_extension_cls: str = ""
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    dtype: str = "auto"
    enable_prefix_caching: bool | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}"
            )


# ---------------------------------------------------------------- vllm.sampling_params
class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclasses.dataclass(kw_only=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    logprobs: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if not (self.top_k in (-1, 0) or self.top_k >= 1):
            raise ValueError(f"top_k must be 0 or -1 (disable), or at least 1, got {self.top_k}.")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.n < 1:
            raise ValueError("invalid temperature / top_p / n")
        if self.logprobs is not None and self.logprobs < -1:
            raise ValueError(f"logprobs must be non-negative or -1, got {self.logprobs}.")


# ---------------------------------------------------------------- vllm.inputs / outputs / logprobs
class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: list[int]


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0


# ---------------------------------------------------------------- workers
class ToyModel:
    """The worker's model: named CPU tensors and vLLM's ``load_weights(weights)`` contract."""

    def __init__(self) -> None:
        import torch

        self.params = {
            "model.embed_tokens.weight": torch.zeros(8, 4),
            "lm_head.weight": torch.zeros(8, 4),
            "model.norm.weight": torch.ones(4, dtype=torch.bfloat16),
        }
        self.received: list[dict[str, Any]] = []  # every load_weights call, as received

    def parameters(self):  # as torch.nn.Module's
        return iter(self.params.values())

    def load_weights(self, weights: Any) -> set[str]:
        batch = {name: t.clone() for name, t in weights}
        for name, t in batch.items():
            if name not in self.params:
                raise KeyError(name)
            if tuple(t.shape) != tuple(self.params[name].shape):
                raise ValueError(
                    f"{name}: shape {tuple(t.shape)} != {tuple(self.params[name].shape)}"
                )
        for name, t in batch.items():
            self.params[name].copy_(t)
        self.received.append(batch)
        return set(batch)

    @property
    def w(self) -> int:
        return int(round(float(self.params["lm_head.weight"][0, 0])))


class Worker:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.model_runner = types.SimpleNamespace(model=ToyModel())


def _resolve(qualname: str) -> type:
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _msgpack_native(value: Any) -> bool:
    if value is None or isinstance(value, (str, bytes, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_msgpack_native(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _msgpack_native(v) for k, v in value.items())
    return False


# ---------------------------------------------------------------- vllm.v1.engine.async_llm
@dataclasses.dataclass
class _Req:
    rid: str
    prompt: list[int]
    sp: SamplingParams
    queue: asyncio.Queue
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = dataclasses.field(default_factory=list)
    text: str = ""
    cached: int = 0


class AsyncLLM:
    """The V1 async engine's client surface, over a toy engine-core task on the running loop."""

    instances: list["AsyncLLM"] = []

    def __init__(self, args: AsyncEngineArgs) -> None:
        self.args = args
        base = (Worker,) + (
            (_resolve(args.worker_extension_cls),) if args.worker_extension_cls else ()
        )
        worker_cls = type(
            "StandInWorker", base, {}
        )  # vLLM mixes the extension into its worker class
        self.workers = [worker_cls(rank) for rank in range(args.tensor_parallel_size)]
        self.calls: list[tuple] = []  # (method, args) of every call the adapter makes
        self.requests: dict[str, _Req] = {}
        self.received: list[tuple[Any, SamplingParams, str]] = []  # (prompt, params, request_id)
        self.aborted: list[str] = []
        self.paused = False
        self.prefix_cache: list[list[int]] = []
        self.finish_override: str | None = None  # force the next finish reason (e.g. "error")
        self.core: asyncio.Task | None = None
        self.outq: asyncio.Queue | None = None
        AsyncLLM.instances.append(self)

    @classmethod
    def from_engine_args(
        cls,
        engine_args: AsyncEngineArgs,
        start_engine_loop: bool = True,
        usage_context: Any = None,
        stat_loggers: Any = None,
    ) -> "AsyncLLM":
        return cls(engine_args)

    # -- the engine core (one token per active request per step) and the output handler
    def _start(self) -> None:
        if self.core is None:
            self.outq = asyncio.Queue()
            self.core = asyncio.get_running_loop().create_task(self._run_core())
            self.handler = asyncio.get_running_loop().create_task(self._run_output_handler())

    async def _run_core(self) -> None:
        while True:
            await asyncio.sleep(STEP_S)
            if not self.paused:
                for req in list(self.requests.values()):
                    self._step(req)

    async def _run_output_handler(self) -> None:
        while True:
            batch = [await self.outq.get()]
            await asyncio.sleep(OUTPUT_LAG_S)  # delivery lags production by a few steps, as in vLLM
            while not self.outq.empty():
                batch.append(self.outq.get_nowait())
            for req, out in batch:
                req.queue.put_nowait(out)

    def _step(self, req: _Req) -> None:
        k, w = len(req.tokens), self.workers[0].model_runner.model.w
        tok = (sum(req.prompt) + k) % 50 + 100 * w
        t = req.sp.temperature if req.sp.temperature > 0 else 1.0
        lp = -0.25 * (k + 1) / (t if self.args.logprobs_mode == "processed_logprobs" else 1.0)
        req.tokens.append(tok)
        req.logprobs.append({tok: Logprob(lp, rank=1, decoded_token=f"<{tok}>")})
        req.text += f"<{tok}>"
        finish, stop_reason = self._finish(req, tok)
        self._emit(req, finish, stop_reason)

    def _finish(self, req: _Req, tok: int) -> tuple[str | None, Any]:
        if self.finish_override is not None:
            return self.finish_override, None
        if tok in (req.sp.stop_token_ids or []):
            return "stop", tok
        for s in [req.sp.stop] if isinstance(req.sp.stop, str) else req.sp.stop or []:
            if s in req.text:
                return "stop", s
        if req.sp.max_tokens is not None and len(req.tokens) >= req.sp.max_tokens:
            return "length", None
        return None, None

    def _emit(self, req: _Req, finish: str | None, stop_reason: Any = None) -> None:
        kind, n = req.sp.output_kind, len(req.tokens)
        if kind is RequestOutputKind.FINAL_ONLY and finish is None:
            return
        lo = n - 1 if kind is RequestOutputKind.DELTA and finish != "abort" else 0
        if kind is RequestOutputKind.DELTA and finish == "abort":
            lo = n  # an abort adds no token
        lps = req.logprobs[lo:] if req.sp.logprobs is not None else None
        text = "".join(f"<{t}>" for t in req.tokens[lo:])
        comp = CompletionOutput(0, text, list(req.tokens[lo:]), None, lps, finish, stop_reason)
        out = RequestOutput(req.rid, None, req.prompt, None, [comp], finish is not None, req.cached)
        if finish is not None:
            self.requests.pop(req.rid, None)
        self.outq.put_nowait((req, out))

    # -- the client API
    async def generate(
        self, prompt: Any, sampling_params: SamplingParams, request_id: str, **kwargs: Any
    ):
        self._start()
        self.received.append((prompt, sampling_params, request_id))
        ids = list(prompt["prompt_token_ids"])
        req = _Req(request_id, ids, sampling_params, asyncio.Queue(), cached=self._cached(ids))
        self.prefix_cache.append(ids)
        self.requests[request_id] = req
        try:
            while True:
                out = await req.queue.get()
                yield out
                if out.finished:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(request_id)
            raise

    def _cached(self, ids: list[int]) -> int:
        best = 0
        for p in self.prefix_cache:
            n = 0
            while n < min(len(p), len(ids) - 1) and p[n] == ids[n]:
                n += 1
            best = max(best, n)
        return best

    async def abort(self, request_id: str | list[str], internal: bool = False) -> None:
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            self.aborted.append(rid)
            req = self.requests.get(rid)
            if req is not None:
                self._emit(req, "abort")

    async def pause_generation(
        self,
        *,
        mode: str = "abort",
        wait_for_inflight_requests: bool | None = None,
        clear_cache: bool = True,
    ) -> None:
        self.calls.append(("pause_generation", {"mode": mode, "clear_cache": clear_cache}))
        if mode == "abort":
            await self.abort(list(self.requests))
        elif mode == "wait":
            while self.requests:
                await asyncio.sleep(STEP_S)
        self.paused = True
        if clear_cache:
            self.prefix_cache.clear()
        await asyncio.sleep(0.02)  # as vLLM: lets outputs of the last steps reach their queues

    async def resume_generation(self) -> None:
        self.calls.append(("resume_generation", {}))
        self.paused = False

    async def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
    ) -> list[Any]:
        self.calls.append(("collective_rpc", {"method": method, "args": args, "kwargs": kwargs}))
        if not isinstance(method, str):
            raise TypeError(
                f"Object of type {type(method)} is not serializable. Set "
                "VLLM_ALLOW_INSECURE_SERIALIZATION=1 to allow fallback to pickle-based serialization."
            )
        if not _msgpack_native(list(args)) or not _msgpack_native(kwargs or {}):
            raise TypeError(
                "stand-in: an RPC argument that vLLM's msgpack RPC would not deliver as sent"
            )
        await asyncio.sleep(RPC_LATENCY_S)  # the round trip to the engine-core process
        return [
            getattr(w, method)(*args, **(kwargs or {})) for w in self.workers
        ]  # between two steps

    async def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        self.calls.append(("reset_prefix_cache", {}))
        self.prefix_cache.clear()
        return True

    def shutdown(self, timeout: float | None = None) -> None:
        self.calls.append(("shutdown", {}))
        for task in (self.core, getattr(self, "handler", None)):
            if task is not None:
                task.cancel()


class LegacyAsyncLLM(AsyncLLM):
    """vLLM before pause modes: ``pause_generation(wait_for_inflight_requests=False, clear_cache=True)``."""

    async def pause_generation(
        self,
        *,
        wait_for_inflight_requests: bool = False,  # type: ignore[override]
        clear_cache: bool = True,
    ) -> None:
        await super().pause_generation(
            mode="wait" if wait_for_inflight_requests else "abort", clear_cache=clear_cache
        )


# ---------------------------------------------------------------- installing the modules
def _module(name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__standin__ = True
    return m


def install(monkeypatch: Any, engine_cls: type = AsyncLLM) -> types.ModuleType:
    """Put the stand-in ``vllm`` package into ``sys.modules`` (undone by monkeypatch); returns it."""
    AsyncLLM.instances.clear()
    mods = {
        "vllm": _module(
            "vllm",
            __version__="0.0.0+standin",
            SamplingParams=SamplingParams,
            AsyncLLMEngine=engine_cls,
            AsyncEngineArgs=AsyncEngineArgs,
            TokensPrompt=TokensPrompt,
        ),
        "vllm.engine": _module("vllm.engine"),
        "vllm.engine.arg_utils": _module("vllm.engine.arg_utils", AsyncEngineArgs=AsyncEngineArgs),
        "vllm.sampling_params": _module(
            "vllm.sampling_params",
            SamplingParams=SamplingParams,
            RequestOutputKind=RequestOutputKind,
        ),
        "vllm.inputs": _module("vllm.inputs", TokensPrompt=TokensPrompt),
        "vllm.outputs": _module(
            "vllm.outputs", RequestOutput=RequestOutput, CompletionOutput=CompletionOutput
        ),
        "vllm.logprobs": _module("vllm.logprobs", Logprob=Logprob),
        "vllm.v1": _module("vllm.v1"),
        "vllm.v1.engine": _module("vllm.v1.engine"),
        "vllm.v1.engine.async_llm": _module("vllm.v1.engine.async_llm", AsyncLLM=engine_cls),
    }
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return mods["vllm"]
