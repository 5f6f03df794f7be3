"""gymllm.models: Flax NNX LLMs (Llama, Qwen2, Qwen3, Gemma 3), loaders, tokenizer bundle.

Public names are imported lazily (JAX loads only when a model name is first used):

    from gymllm.models import load, make_tiny, token_logprobs
    lm = make_tiny("qwen3")                       # LoadedModel(model, tokenizer, config)
    logits, cache = lm.model(tokens, positions, cache=lm.model.init_cache(B, S))
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports, lazy_table

_LAZY = lazy_table(
    __name__,
    {
        ".config": ("ModelConfig", "FAMILIES"),
        ".transformer": ("Transformer", "forward", "param_shapes"),
        ".cache": ("KVCache",),
        ".logprobs": ("token_logprobs",),
        ".tokenizer": ("TokenizerBundle",),
        ".loaded": ("LoadedModel",),
        ".tiny": ("make_tiny", "tiny_config", "tiny_tokenizer"),
        ".registry": ("load", "REGISTRY", "cache_dir"),
        ".hf_io": ("load_hf_dir", "save_hf_dir"),
        ".gguf_io": ("load_gguf", "save_gguf"),
        ".chat_templates": ("CHATML_TOOLS_TEMPLATE", "render_chat_template"),
    },
)

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
