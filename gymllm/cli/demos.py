"""``gymllm demos``: solved episodes of an env as chat JSONL (stub; being built for issue #19 part 2)."""

from __future__ import annotations

import sys
from typing import Annotated

import tyro


def demos(env_id: Annotated[str, tyro.conf.Positional], /, n: int = 100, out: str = "demos.jsonl", seed: int = 0,
          env_kwargs: str = "", system_prompt: str = "") -> int:
    """Write solved episodes of an env (search, shortest path, the tool call) as chat JSONL for `gymllm sft`."""
    print("gymllm demos: not built yet", file=sys.stderr)
    return 2
