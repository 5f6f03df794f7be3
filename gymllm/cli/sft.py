"""``gymllm sft``: supervised fine-tuning on chat JSONL (stub; being built for issue #19 part 1)."""

from __future__ import annotations

import sys
from typing import Sequence


def sft(args: Sequence[str] = ()) -> int:
    """Supervised fine-tuning on chat JSONL (loss on assistant tokens), or on a run's best trajectories."""
    if "--help" in args or "-h" in args:
        print("usage: gymllm sft DATA.jsonl\n\n" + (sft.__doc__ or ""))
        return 0
    print("gymllm sft: not built yet", file=sys.stderr)
    return 2


sft.takes_argv = True  # type: ignore[attr-defined]  # parsed by tyro inside (nested config sections)
