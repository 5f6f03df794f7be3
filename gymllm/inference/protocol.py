"""The Engine protocol: what the rollout layer needs from any inference backend.

    completion = await engine.generate(prompt_ids, SamplingParams(temperature=1.0), session_id="traj-7")
    engine.update_weights(state, version=3)   # thread-safe; lands between decode steps
    await engine.close()

``session_id`` lets an engine keep a trajectory's cached prefix between turns, so the next turn
(prompt = previous prompt ++ sampled ids ++ observation ids) prefills only the new tokens.
``generate_n`` samples ``params.n`` completions of one prompt.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams


@runtime_checkable
class Engine(Protocol):
    @property
    def version(self) -> int: ...

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session_id: str | None = None
    ) -> Completion: ...

    def update_weights(self, state: Any, version: int) -> None: ...

    async def close(self) -> None: ...
