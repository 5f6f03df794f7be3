"""OpenAIClientEngine: the Engine protocol over any OpenAI-compatible server (httpx, token ids in/out).

    engine = OpenAIClientEngine("http://127.0.0.1:8000", model="smollm2")
    completion = await engine.generate(prompt_ids, SamplingParams(temperature=1.0, max_tokens=64))

Prompts go out as token ids on ``/v1/completions``; sampled ids come back from the choice's
``token_ids`` (gymllm, vLLM with ``return_token_ids``) or, failing that, from ``token_id:N``
token strings (vLLM's ``return_tokens_as_token_ids``). Log-probabilities are whatever the server
reports (gymllm: the temperature-processed distribution; vLLM: configure
``logprobs_mode="processed_logprobs"`` to match). Token versions come from the server's
``versions`` when it sends them, else the version label set with :meth:`update_weights`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import httpx

from gymllm.errors import EngineError, explain
from gymllm.validation import require
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams, require_one_sample, require_prompt

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def request_body(
    model: str, prompt_ids: Sequence[int], params: SamplingParams, session_id: str | None
) -> dict:
    """The ``/v1/completions`` JSON body for one token-id prompt."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": [int(t) for t in prompt_ids],
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "n": 1,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    if params.top_k:
        body["top_k"] = params.top_k
    if params.stop:
        body["stop"] = list(params.stop)
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        body["seed"] = params.seed
    if session_id is not None:
        body["session_id"] = session_id
    return body


def parse_choice(choice: dict, prompt_len: int, version: int) -> Completion:
    """One response choice -> a :class:`Completion` (ids from ``token_ids`` or ``token_id:N`` strings)."""
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:
        toks = lp.get("tokens") or []
        if not all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
            raise EngineError(
                explain(
                    "server response",
                    expected="choice.token_ids or token_id:N token strings",
                    received=str(choice)[:200],
                    fix="use a server that returns token ids "
                    "(gymllm serve, or vLLM with return_token_ids)",
                )
            )
        ids = [int(t.split(":", 1)[1]) for t in toks]
    logprobs = lp.get("token_logprobs")
    logprobs = (
        [float("nan")] * len(ids)
        if logprobs is None
        else [float("nan") if x is None else x for x in logprobs]
    )
    versions = choice.get("versions") or [version] * len(ids)
    return Completion(
        token_ids=ids,
        logprobs=logprobs,
        versions=versions,
        prompt_len=prompt_len,
        finish_reason=_FINISH.get(choice.get("finish_reason"), "abort"),
        text=choice.get("text"),
        stop_reason=choice.get("stop_reason"),
    )


class OpenAIClientEngine:
    """Drive a remote OpenAI-compatible server through the :class:`~gymllm.inference.Engine` protocol."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        max_connections: int = 256,
        version: int = 0,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._version = version
        self._clients: dict[int, httpx.AsyncClient] = {}  # one per event loop
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(id(loop))
        if client is None or client.is_closed:
            client = httpx.AsyncClient(
                base_url=self.base_url,
                headers=self._headers,
                timeout=self._timeout,
                limits=self._limits,
            )
            self._clients[id(loop)] = client
        return client

    async def _post(self, path: str, body: dict) -> dict:
        if self._closed:
            raise EngineError(
                "generate: expected an open client engine, received a closed one. Fix: build a new one."
            )
        try:
            resp = await self._client().post(path, json=body)
        except httpx.HTTPError as exc:
            raise EngineError(
                f"{self.base_url}{path}: request failed ({type(exc).__name__}: {exc}). "
                "Fix: check the server is running and reachable"
            ) from exc
        if resp.status_code >= 400:
            try:
                message = resp.json()["error"]["message"]
            except Exception:
                message = resp.text[:500]
            raise EngineError(f"{self.base_url}{path} answered {resp.status_code}: {message}")
        return resp.json()

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        session_id: str | None = None,
    ) -> Completion:
        params = params or SamplingParams()
        require_one_sample(params)
        require_prompt(prompt_ids)
        data = await self._post(
            "/v1/completions", request_body(self.model, prompt_ids, params, session_id)
        )
        completion = parse_choice(data["choices"][0], len(prompt_ids), self._version)
        details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
        completion.cached_prompt_len = int(details.get("cached_tokens") or 0)
        return completion

    async def generate_n(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        one = params.replace(n=1)
        seeds = [None if params.seed is None else params.seed + i for i in range(params.n)]
        return list(
            await asyncio.gather(*(self.generate(prompt_ids, one.replace(seed=s)) for s in seeds))
        )

    def update_weights(self, state: Any, version: int) -> None:
        """Record the policy version the server now runs. The weights themselves live on the server:
        pass ``state=None`` after pushing them out of band."""
        require(
            state is None,
            "OpenAIClientEngine.update_weights",
            expected="state=None (weights are pushed to the server out of band)",
            received=type(state).__name__,
            fix="push weights to the server, then call update_weights(None, version)",
            error=EngineError,
        )
        self._version = int(version)

    async def models(self) -> list[str]:
        resp = await self._client().get("/v1/models")
        resp.raise_for_status()
        return [m["id"] for m in resp.json()["data"]]

    async def close(self) -> None:
        """Close the HTTP connections. Idempotent."""
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            try:
                await c.aclose()
            except RuntimeError:  # created on another, already closed loop
                pass
