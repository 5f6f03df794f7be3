"""``LoadedModel``: what ``load`` and ``make_tiny`` return -- model, tokenizer bundle, config."""

from __future__ import annotations

import dataclasses
from typing import Any

from gymllm.models.config import ModelConfig
from gymllm.models.tokenizer import TokenizerBundle


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadedModel:
    model: Any  # gymllm.models.transformer.Transformer
    tokenizer: TokenizerBundle
    config: ModelConfig
    source: str = ""  # where it came from: a path, a registry name, "tiny:<family>"

    def __iter__(self):  # model, tokenizer, config = load(...)
        return iter((self.model, self.tokenizer, self.config))
