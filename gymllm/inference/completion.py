"""Completion: what an engine returns for one sample of one prompt.

Arrays are aligned with ``token_ids`` ([N] each, N = number of sampled tokens):
``logprobs[i]`` is ``log softmax(logits / T)[token_ids[i]]`` under the temperature-processed
distribution (T = 1 for greedy requests), the value ``gymllm.models.token_logprobs`` gives the
trainer for the same weights; ``versions[i]`` is the policy version of the weights whose forward
pass produced token ``i``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

FinishReason = Literal["stop", "length", "abort"]


@dataclasses.dataclass
class Completion:
    token_ids: np.ndarray  # [N] int32
    logprobs: np.ndarray  # [N] float32
    finish_reason: FinishReason
    versions: np.ndarray  # [N] int32
    prompt_len: int
    ttft_s: float = float("nan")  # submit -> first sampled token
    latency_s: float = float("nan")  # submit -> finished
    text: str | None = None  # decoded sampled text when the engine has a tokenizer
    stop_reason: int | str | None = None  # the stop id or stop string that ended the request
    cached_prompt_len: int = 0  # prompt tokens served from a reused prefix (not prefilled again)
    replica: str | None = None  # the EnginePool replica that served it (None: not through a pool)
    retried: bool = (
        False  # sampled again on another replica after its first replica failed mid-request
    )

    def __post_init__(self) -> None:
        self.token_ids = np.asarray(self.token_ids, dtype=np.int32)
        self.logprobs = np.asarray(self.logprobs, dtype=np.float32)
        self.versions = np.asarray(self.versions, dtype=np.int32)
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"Completion arrays: expected logprobs and versions of length {n} (len(token_ids)), "
                f"received {len(self.logprobs)} and {len(self.versions)}. Fix: append one of each per token."
            )

    @property
    def num_tokens(self) -> int:
        return int(len(self.token_ids))
