"""Engine wrappers: an :class:`EngineWrapper` delegates everything to the engine it wraps and
overrides what it changes; :class:`SkipConsumed` is the one a resumed run uses.

    class Spy(EngineWrapper):
        async def generate(self, prompt_ids, params, *, session_id=None):
            completion = await super().generate(prompt_ids, params, session_id=session_id)
            ...; return completion
"""

from __future__ import annotations

from typing import Any

__all__ = ["EngineWrapper", "SkipConsumed"]


class EngineWrapper:
    """An engine that forwards every attribute and ``generate`` to ``engine`` (``version`` read live)."""

    def __init__(self, engine: Any):
        self.engine = engine

    @property
    def version(self) -> int:
        return self.engine.version

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, params, *, session_id=None):
        return await self.engine.generate(prompt_ids, params, session_id=session_id)


class SkipConsumed(EngineWrapper):
    """Engine wrapper for resume: trajectories of groups consumed before the checkpoint (``skip``: their
    group ids) get an empty completion (one ``stop_id`` token, no compute) so the deterministic group
    sequence is replayed without generating it again; the learner then skips those groups."""

    def __init__(self, engine: Any, skip: set[str], stop_id: int):
        super().__init__(engine)
        self.skip, self.stop_id = skip, stop_id

    async def generate(self, prompt_ids, params, *, session_id=None):
        gid = (session_id or "").split("/")[0]
        if gid in self.skip:
            from gymllm.inference.completion import Completion

            return Completion(
                token_ids=[self.stop_id],
                logprobs=[0.0],
                finish_reason="stop",
                versions=[self.engine.version],
                prompt_len=len(prompt_ids),
            )
        return await super().generate(prompt_ids, params, session_id=session_id)
