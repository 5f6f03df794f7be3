"""``make_tiny``: random tiny models of every family with a small real tokenizer, for tests.

The tokenizer is a byte-level BPE trained with ``tokenizers`` on a built-in corpus (milliseconds),
with SmolLM2's pre-tokenizer (each digit alone, then the byte-level regex), the ChatML special
tokens ``<|endoftext|>`` (0), ``<|im_start|>`` (1), ``<|im_end|>`` (2, eos and stop token) and the
tool markup tokens ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``.
The chat template is Qwen2.5's ChatML with tools (:data:`CHATML_TOOLS_TEMPLATE`).
Weights are random (seeded); norms and biases get noise so parity tests exercise them.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp

from gymllm.validation import require
from gymllm.models.chat_templates import CHATML_TOOLS_TEMPLATE
from gymllm.models.config import FAMILIES, ModelConfig, gemma3_layer_types
from gymllm.models.loaded import LoadedModel
from gymllm.models.tokenizer import TokenizerBundle
from gymllm.models.transformer import Transformer, init_params

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

_CORPUS = [
    "You are a helpful assistant. Answer the question and think step by step.",
    "What is the capital of France? The capital of France is Paris.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Compute 12 + 35 = 47, then 47 * 3 = 141, and finally 141 - 41 = 100.",
    "The answer is 42. Let me check: 6 * 7 = 42, so the result is correct.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    'import json\n\ndata = json.loads(\'{"name": "calculator", "arguments": {"x": 1}}\')\n',
    '{"name": "calculator", "arguments": {"expression": "2 + 2"}}',
    "Tool result: 4. The user asked for the sum, so the final answer is 4.",
    "Guess the number between 1 and 100. Too high! Too low! Correct, you win.",
    "Alice has 3 apples and Bob has 5 apples. Together they have 8 apples.",
    "Solve for x: 2x + 3 = 11, so 2x = 8 and x = 4.",
    "Héllo wörld, ça va? Ünïcödé text and emoji 😀 are bytes too.",
    "The model reads the prompt, writes an answer, and the environment gives a reward.",
]


@functools.lru_cache(maxsize=8)
def _tiny_tokenizer_json(vocab_size: int) -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok.to_str()


def tiny_tokenizer(vocab_size: int = 512) -> TokenizerBundle:
    """The tiny models' tokenizer bundle (a fresh object; training is cached per vocab size)."""
    from tokenizers import Tokenizer

    require(
        vocab_size >= 256 + len(SPECIAL_TOKENS) + len(TOOL_TOKENS),
        "make_tiny vocab_size",
        expected=">= 263 (256 bytes + 7 special tokens)",
        received=vocab_size,
        fix="use vocab_size >= 263, e.g. 512",
    )
    tok = Tokenizer.from_str(_tiny_tokenizer_json(vocab_size))
    return TokenizerBundle(
        tokenizer=tok,
        chat_template=CHATML_TOOLS_TEMPLATE,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )


def tiny_config(
    family: str = "llama",
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 0,
    **overrides: Any,
) -> ModelConfig:
    """A tiny config of ``family``; Gemma 3 alternates sliding (window 8) and global layers."""
    require(
        family in FAMILIES,
        "make_tiny family",
        expected=f"one of {FAMILIES}",
        received=family,
        fix="pick a supported family",
    )
    sizes: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=2048,
    )
    if family == "gemma3":
        sizes.update(
            sliding_window=8,
            layer_types=gemma3_layer_types(num_layers, 2),
            query_pre_attn_scalar=float(head_dim or hidden_size // num_heads),
        )
    sizes.update(overrides)
    return ModelConfig.for_family(family, **sizes)


def make_tiny(
    family: str = "llama",
    *,
    seed: int = 0,
    dtype=jnp.float32,
    vocab_size: int = 512,
    std: float = 0.08,
    **sizes: Any,
) -> LoadedModel:
    """A random tiny model of ``family`` with the tiny tokenizer and ChatML-with-tools template.

    ``sizes`` override :func:`tiny_config` fields (hidden_size, num_layers, ... or any config field).
    """
    cfg = tiny_config(family, vocab_size=vocab_size, **sizes)
    tok = tiny_tokenizer(vocab_size)
    params = init_params(cfg, seed, dtype, std=std, norm_noise=0.1)
    return LoadedModel(
        model=Transformer(cfg, params=params), tokenizer=tok, config=cfg, source=f"tiny:{family}"
    )
