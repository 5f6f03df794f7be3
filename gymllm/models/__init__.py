"""gymllm.models: Flax NNX LLMs (Llama, Qwen2, Qwen3, Gemma 3), loaders, tokenizer bundle.

Public names are imported lazily (JAX loads only when a model name is first used):

    from gymllm.models import load, make_tiny, token_logprobs
    lm = make_tiny("qwen3")                       # LoadedModel(model, tokenizer, config)
    logits, cache = lm.model(tokens, positions, cache=lm.model.init_cache(B, S))
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports

_LAZY = {
    "ModelConfig": "gymllm.models.config",
    "FAMILIES": "gymllm.models.config",
    "Transformer": "gymllm.models.transformer",
    "forward": "gymllm.models.transformer",
    "param_shapes": "gymllm.models.transformer",
    "KVCache": "gymllm.models.cache",
    "token_logprobs": "gymllm.models.logprobs",
    "TokenizerBundle": "gymllm.models.tokenizer",
    "LoadedModel": "gymllm.models.loaded",
    "make_tiny": "gymllm.models.tiny",
    "tiny_config": "gymllm.models.tiny",
    "tiny_tokenizer": "gymllm.models.tiny",
    "load": "gymllm.models.registry",
    "REGISTRY": "gymllm.models.registry",
    "cache_dir": "gymllm.models.registry",
    "load_hf_dir": "gymllm.models.hf_io",
    "save_hf_dir": "gymllm.models.hf_io",
    "load_gguf": "gymllm.models.gguf_io",
    "save_gguf": "gymllm.models.gguf_io",
    "CHATML_TOOLS_TEMPLATE": "gymllm.models.chat_templates",
    "render_chat_template": "gymllm.models.chat_templates",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
