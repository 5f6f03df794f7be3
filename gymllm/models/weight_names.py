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

_GLOBAL: list[Row] = [
    ("embed", "model.embed_tokens.weight", "token_embd.weight", False),
    ("final_norm", "model.norm.weight", "output_norm.weight", False),
    ("lm_head", "lm_head.weight", "output.weight", True),
]

_ATTN: list[Row] = [
    (
        "layers.attn_norm",
        "model.layers.{i}.input_layernorm.weight",
        "blk.{i}.attn_norm.weight",
        False,
    ),
    ("layers.wq", "model.layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight", True),
    ("layers.wk", "model.layers.{i}.self_attn.k_proj.weight", "blk.{i}.attn_k.weight", True),
    ("layers.wv", "model.layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight", True),
    ("layers.wo", "model.layers.{i}.self_attn.o_proj.weight", "blk.{i}.attn_output.weight", True),
]

_MLP: list[Row] = [
    ("layers.w_gate", "model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight", True),
    ("layers.w_up", "model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight", True),
    ("layers.w_down", "model.layers.{i}.mlp.down_proj.weight", "blk.{i}.ffn_down.weight", True),
]

_BIAS: list[Row] = [
    ("layers.bq", "model.layers.{i}.self_attn.q_proj.bias", "blk.{i}.attn_q.bias", False),
    ("layers.bk", "model.layers.{i}.self_attn.k_proj.bias", "blk.{i}.attn_k.bias", False),
    ("layers.bv", "model.layers.{i}.self_attn.v_proj.bias", "blk.{i}.attn_v.bias", False),
]

_QK_NORM: list[Row] = [
    (
        "layers.q_norm",
        "model.layers.{i}.self_attn.q_norm.weight",
        "blk.{i}.attn_q_norm.weight",
        False,
    ),
    (
        "layers.k_norm",
        "model.layers.{i}.self_attn.k_norm.weight",
        "blk.{i}.attn_k_norm.weight",
        False,
    ),
]

LLAMA: list[Row] = (
    _GLOBAL
    + _ATTN
    + _MLP
    + [
        (
            "layers.mlp_norm",
            "model.layers.{i}.post_attention_layernorm.weight",
            "blk.{i}.ffn_norm.weight",
            False,
        ),
    ]
)
QWEN2: list[Row] = LLAMA + _BIAS
QWEN3: list[Row] = LLAMA + _QK_NORM
# Gemma 3 names its norms differently: post_attention_layernorm is the *post-attention output* norm.
GEMMA3: list[Row] = (
    _GLOBAL
    + _ATTN
    + _MLP
    + _QK_NORM
    + [
        (
            "layers.post_attn_norm",
            "model.layers.{i}.post_attention_layernorm.weight",
            "blk.{i}.post_attention_norm.weight",
            False,
        ),
        (
            "layers.mlp_norm",
            "model.layers.{i}.pre_feedforward_layernorm.weight",
            "blk.{i}.ffn_norm.weight",
            False,
        ),
        (
            "layers.post_mlp_norm",
            "model.layers.{i}.post_feedforward_layernorm.weight",
            "blk.{i}.post_ffw_norm.weight",
            False,
        ),
    ]
)

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
