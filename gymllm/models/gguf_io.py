"""GGUF files: read (dequantized with the ``gguf`` package) and write (float32, for tiny models).

Reading rebuilds everything from the file alone:

* the config from ``<arch>.*`` metadata (Gemma 3 settings the file lacks come from the family
  defaults: local RoPE base 10,000, every 6th layer global, query scale = head_dim);
* the weights, undoing llama.cpp's conversions: for ``llama`` the q/k projection rows are permuted
  to interleaved RoPE (we restore rotate-half), and Gemma norm weights are stored as ``1 + w``;
* the tokenizer with ``tokenizers`` from ``tokenizer.ggml.*`` (byte-level BPE for ``gpt2`` models,
  with the pre-tokenizer named by ``tokenizer.ggml.pre``; byte-fallback BPE for ``llama``/SPM
  models, merges derived from the scores) and the chat template from ``tokenizer.chat_template``.

:func:`save_gguf` writes the inverse (the same conversions), so a tiny model round-trips.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from gymllm.errors import ModelLoadError, explain
from gymllm.validation import require
from gymllm.models.checkpoint import assemble_params, external_tensors
from gymllm.models.config import ModelConfig, family_defaults, gemma3_layer_types
from gymllm.models.loaded import LoadedModel
from gymllm.models.tokenizer import TokenizerBundle
from gymllm.models.transformer import Transformer
from gymllm.telemetry import span

_ARCH_TO_FAMILY = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}
_NORMS_PLUS_ONE = ("norm",)  # every gemma norm param name ends with "norm"

# Pre-tokenizer regexes by llama.cpp's ``tokenizer.ggml.pre`` name.
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ----- permutations and norm offsets llama.cpp applies -----


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half rows -> llama.cpp interleaved rows (its converter's ``permute``)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _fix(cfg: ModelConfig, reading: bool):
    """The per-tensor conversion between GGUF and Hugging Face layout (arrays are [out, in])."""

    def fix(ours: str, layer: int | None, arr: np.ndarray) -> np.ndarray:
        if cfg.family == "llama" and ours in ("layers.wq", "layers.wk"):
            heads = cfg.num_heads if ours == "layers.wq" else cfg.num_kv_heads
            return (_unpermute if reading else _permute)(arr, heads)
        if cfg.norm_plus_one and ours.endswith(_NORMS_PLUS_ONE):
            return arr - 1.0 if reading else arr + 1.0
        return arr

    return fix


# ----- reading -----


def _fields(reader) -> dict[str, Any]:
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            out[name] = field.contents()
        except Exception:  # an exotic field type we do not need
            continue
    return out


def config_from_gguf(meta: dict[str, Any], tensor_names: list[str]) -> ModelConfig:
    arch = meta.get("general.architecture")
    family = _ARCH_TO_FAMILY.get(arch)
    require(
        family is not None,
        "GGUF general.architecture",
        expected=f"one of {sorted(_ARCH_TO_FAMILY)}",
        received=arch,
        fix="use a GGUF of a supported family",
        error=ModelLoadError,
    )
    fd = family_defaults(family)

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    n_layers, n_heads = int(get("block_count")), int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length") or hidden // n_heads)
    vocab = int(get("vocab_size") or len(meta["tokenizer.ggml.tokens"]))
    fields: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=n_layers,
        num_heads=n_heads,
        num_kv_heads=int(get("attention.head_count_kv") or n_heads),
        head_dim=head_dim,
        rms_norm_eps=_f32(get("attention.layer_norm_rms_epsilon", fd["rms_norm_eps"])),
        rope_theta=_f32(get("rope.freq_base", fd["rope_theta"])),
        tie_word_embeddings="output.weight" not in tensor_names,
        max_position_embeddings=int(get("context_length", 8192)),
        final_logit_softcap=float(get("final_logit_softcapping") or 0.0),
        attn_logit_softcap=float(get("attn_logit_softcapping") or 0.0),
    )
    scaling_type = get("rope.scaling.type")
    if scaling_type in ("linear",) and get("rope.scaling.factor"):
        fields["rope_scaling"] = (
            ("factor", float(get("rope.scaling.factor"))),
            ("rope_type", "linear"),
        )
    if family == "gemma3":
        window = int(get("attention.sliding_window") or 512)
        pattern = int(meta.get("gymllm.sliding_window_pattern") or 6)
        fields.update(
            sliding_window=window,
            layer_types=gemma3_layer_types(n_layers, pattern),
            query_pre_attn_scalar=float(meta.get("gymllm.query_pre_attn_scalar") or head_dim),
            rope_local_theta=float(meta.get("gymllm.rope_local_theta") or 10_000.0),
        )
    return ModelConfig.for_family(family, **fields)


def _f32(x: Any) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.9999997e-06)."""
    return float(f"{float(x):.7g}")


def tokenizer_from_gguf(meta: dict[str, Any]) -> TokenizerBundle:
    """Rebuild the tokenizer (and its special tokens and chat template) from GGUF metadata."""
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if kind == "gpt2":
        tok = _bpe_tokenizer(
            tokens, list(meta.get("tokenizer.ggml.merges") or []), meta.get("tokenizer.ggml.pre")
        )
    elif kind == "llama":
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        tok = _spm_tokenizer(
            tokens,
            list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)),
            types,
            None if unk is None else tokens[int(unk)],
        )
    else:
        raise ModelLoadError(
            explain(
                "GGUF tokenizer.ggml.model",
                expected="'gpt2' (byte-level BPE) or 'llama' (SPM)",
                received=kind,
                fix="use a GGUF with a supported tokenizer",
            )
        )
    _add_special(tok, tokens, types)

    def name(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    return TokenizerBundle(
        tokenizer=tok,
        chat_template=meta.get("tokenizer.chat_template"),
        bos_token=name("bos_token_id"),
        eos_token=name("eos_token_id"),
        pad_token=name("padding_token_id"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    )


def _bpe_tokenizer(tokens: list[str], merges: list[str], pre: str | None):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    if pre in ("qwen2", "deepseek-r1-qwen"):
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_QWEN2_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif pre in ("llama-bpe", "llama3"):
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif (
        pre == "smollm"
    ):  # llama.cpp splits every digit first (transformers' GGUF import drops this)
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm_tokenizer(tokens: list[str], scores: list[float], types: list[int], unk: str | None):
    """SentencePiece-style BPE with byte fallback (Gemma): merges derived from the piece scores."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {t: i for i, t in enumerate(tokens)}
    order = sorted(
        ((s, t) for t, s, ty in zip(tokens, scores, types) if ty == 1 and len(t) > 1),
        key=lambda x: -x[0],
    )
    merges = []
    for _, piece in order:
        cands = [
            (vocab[piece[:k]], vocab[piece[k:]], piece[:k], piece[k:])
            for k in range(1, len(piece))
            if piece[:k] in vocab and piece[k:] in vocab
        ]
        merges.extend((a, b) for _, _, a, b in sorted(cands))
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True, unk_token=unk)
    )
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tok


def _add_special(tok, tokens: list[str], types: list[int]) -> None:
    from tokenizers import AddedToken

    control = [
        AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3
    ]
    user = [
        AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4
    ]
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)


def read_gguf(
    path: str | os.PathLike,
) -> tuple[ModelConfig, dict[str, np.ndarray], TokenizerBundle]:
    """Config, flat float32 params (HF layout restored) and tokenizer of a GGUF file."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    p = Path(path)
    require(
        p.is_file(),
        "GGUF file",
        expected="an existing .gguf file",
        received=str(p),
        fix="check the path, or load a registry name such as 'smollm2-135m-instruct'",
        error=ModelLoadError,
    )
    reader = GGUFReader(str(p))
    meta = _fields(reader)
    by_name = {t.name: t for t in reader.tensors}
    cfg = config_from_gguf(meta, list(by_name))

    def get(name: str) -> np.ndarray:
        t = by_name[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)

    params = assemble_params(
        cfg, get, list(by_name), "gguf", source=str(p), fix=_fix(cfg, reading=True)
    )
    return cfg, params, tokenizer_from_gguf(meta)


def load_gguf(path: str | os.PathLike, dtype=jnp.float32) -> LoadedModel:
    with span("load_gguf", track="engine", path=str(path)):
        cfg, params, tok = read_gguf(path)
        model = Transformer.from_params(cfg, params, dtype=dtype)
    return LoadedModel(model=model, tokenizer=tok, config=cfg, source=str(path))


# ----- writing -----


def save_gguf(lm: LoadedModel, path: str | os.PathLike) -> Path:
    """Write ``lm`` as a float32 GGUF file with llama.cpp's conventions and the tokenizer inside."""
    import gguf

    cfg, p = lm.config, Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}[cfg.family]
    w = gguf.GGUFWriter(str(p), arch)
    w.add_name(lm.source or f"gymllm-{cfg.family}")
    head_dim = cfg.resolved_head_dim
    for add, value in (
        (w.add_context_length, cfg.max_position_embeddings),
        (w.add_embedding_length, cfg.hidden_size),
        (w.add_block_count, cfg.num_layers),
        (w.add_feed_forward_length, cfg.intermediate_size),
        (w.add_head_count, cfg.num_heads),
        (w.add_head_count_kv, cfg.num_kv_heads),
        (w.add_key_length, head_dim),
        (w.add_value_length, head_dim),
        (w.add_rope_dimension_count, head_dim),
        (w.add_rope_freq_base, cfg.rope_theta),
        (w.add_layer_norm_rms_eps, cfg.rms_norm_eps),
        (w.add_vocab_size, cfg.vocab_size),
    ):
        add(value)  # the <arch>.* metadata read_gguf rebuilds the config from
    if cfg.family == "gemma3":
        w.add_sliding_window(cfg.sliding_window)
        types = cfg.resolved_layer_types
        pattern = next((i + 1 for i, t in enumerate(types) if t == "full_attention"), len(types))
        w.add_uint32("gymllm.sliding_window_pattern", pattern)
        w.add_float32(
            "gymllm.query_pre_attn_scalar", cfg.query_pre_attn_scalar or cfg.resolved_head_dim
        )
        w.add_float32("gymllm.rope_local_theta", cfg.rope_local_theta or cfg.rope_theta)
    _write_tokenizer(w, lm.tokenizer, cfg.vocab_size)
    params = {k: np.asarray(v, dtype=np.float32) for k, v in lm.model.flat_params().items()}
    for name, arr in external_tensors(cfg, params, "gguf", fix=_fix(cfg, reading=False)).items():
        w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return p


def _write_tokenizer(w, bundle: TokenizerBundle, vocab_size: int) -> None:
    spec = json.loads(bundle.tokenizer.to_str())
    model = spec["model"]
    require(
        model.get("type") == "BPE" and "merges" in model,
        "save_gguf tokenizer",
        expected="a byte-level BPE tokenizer",
        received=model.get("type"),
        fix="save GGUF only for BPE tokenizers",
        error=ModelLoadError,
    )
    n = bundle.tokenizer.get_vocab_size(with_added_tokens=True)
    tokens = [bundle.tokenizer.id_to_token(i) for i in range(n)]
    types = [1] * n
    for added in spec.get("added_tokens", []):
        types[added["id"]] = 3 if added.get("special") else 4
    tokens += [f"[PAD{i}]" for i in range(n, vocab_size)]  # model rows past the tokenizer
    types += [5] * (vocab_size - n)  # UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    pre = spec.get("pre_tokenizer") or {}
    digits = any(p.get("type") == "Digits" for p in pre.get("pretokenizers", []))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm" if digits else "default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for add, tid in (
        (w.add_bos_token_id, bundle.bos_token_id),
        (w.add_eos_token_id, bundle.eos_token_id),
        (w.add_pad_token_id, bundle.token_to_id(bundle.pad_token) if bundle.pad_token else None),
    ):
        if tid is not None:
            add(tid)
    if bundle.chat_template:
        w.add_chat_template(bundle.chat_template)
