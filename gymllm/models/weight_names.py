"""Weight-name tables: one per family, mapping gymllm parameters to Hugging Face and GGUF names.

Each row is ``(ours, hf_name, gguf_name, transpose)``. Names with ``{i}`` are per layer (ours are
stacked on a leading [L] axis). ``transpose`` is True for matrices: Hugging Face and GGUF store
``[out, in]`` (numpy order), gymllm stores ``[in, out]``. A row whose parameter the config does
not have (biases, q/k norms, lm_head when tied) is skipped by :func:`table_for`.
"""

from __future__ import annotations

from gymllm.models.config import ModelConfig
from gymllm.models.transformer import param_shapes

Row = tuple[str, str, str, bool]


def _layer(ours: str, hf: str, gguf: str, transpose: bool = False, part: str = "weight") -> Row:
    """A per-layer row: ``layers.<ours>``, ``model.layers.{i}.<hf>.<part>``, ``blk.{i}.<gguf>.<part>``."""
    return (
        f"layers.{ours}",
        f"model.layers.{{i}}.{hf}.{part}",
        f"blk.{{i}}.{gguf}.{part}",
        transpose,
    )


_GLOBAL: list[Row] = [
    ("embed", "model.embed_tokens.weight", "token_embd.weight", False),
    ("final_norm", "model.norm.weight", "output_norm.weight", False),
    ("lm_head", "lm_head.weight", "output.weight", True),
]

_ATTN: list[Row] = [
    _layer("attn_norm", "input_layernorm", "attn_norm"),
    *(_layer(f"w{p}", f"self_attn.{p}_proj", f"attn_{p}", True) for p in "qkv"),
    _layer("wo", "self_attn.o_proj", "attn_output", True),
]

_MLP: list[Row] = [
    _layer(f"w_{p}", f"mlp.{p}_proj", f"ffn_{p}", True) for p in ("gate", "up", "down")
]

_BIAS: list[Row] = [_layer(f"b{p}", f"self_attn.{p}_proj", f"attn_{p}", part="bias") for p in "qkv"]

_QK_NORM: list[Row] = [_layer(f"{p}_norm", f"self_attn.{p}_norm", f"attn_{p}_norm") for p in "qk"]

LLAMA: list[Row] = [
    *_GLOBAL,
    *_ATTN,
    *_MLP,
    _layer("mlp_norm", "post_attention_layernorm", "ffn_norm"),
]
QWEN2: list[Row] = LLAMA + _BIAS
QWEN3: list[Row] = LLAMA + _QK_NORM
# Gemma 3 names its norms differently: post_attention_layernorm is the *post-attention output* norm.
GEMMA3: list[Row] = [
    *_GLOBAL,
    *_ATTN,
    *_MLP,
    *_QK_NORM,
    _layer("post_attn_norm", "post_attention_layernorm", "post_attention_norm"),
    _layer("mlp_norm", "pre_feedforward_layernorm", "ffn_norm"),
    _layer("post_mlp_norm", "post_feedforward_layernorm", "post_ffw_norm"),
]

TABLES: dict[str, list[Row]] = {"llama": LLAMA, "qwen2": QWEN2, "qwen3": QWEN3, "gemma3": GEMMA3}

# Tensors checkpoints may carry that the model does not use.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rope_freqs.weight")


def table_for(cfg: ModelConfig) -> list[Row]:
    """The family's rows restricted to the parameters this config has."""
    have = param_shapes(cfg)
    return [row for row in TABLES[cfg.family] if row[0] in have]


def expand(cfg: ModelConfig, fmt: str) -> dict[str, tuple[str, int | None, bool]]:
    """``{external_name: (our_name, layer_or_None, transpose)}`` for ``fmt`` "hf" or "gguf"."""
    col = 1 if fmt == "hf" else 2
    out: dict[str, tuple[str, int | None, bool]] = {}
    for row in table_for(cfg):
        name = row[col]
        if "{i}" in name:
            for i in range(cfg.num_layers):
                out[name.format(i=i)] = (row[0], i, row[3])
        else:
            out[name] = (row[0], None, row[3])
    return out
