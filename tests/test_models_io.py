"""Loaders and writers against independent references on tiny random weights.

* logits parity with Hugging Face ``transformers`` (CPU torch) for every family, fp32, max
  relative error < 1e-4, through our safetensors writer and transformers' own loader;
* safetensors (sharded) and GGUF round trips give identical logits, configs and tokenizers;
* bad checkpoints raise errors naming the missing / unexpected tensors.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.errors import ModelLoadError
from gymllm.models import FAMILIES, load, load_gguf, load_hf_dir, make_tiny, save_gguf, save_hf_dir
from gymllm.models.gguf_io import _permute, _unpermute

T = 12


def tiny_model(family: str, seed: int = 0, **kw):
    """Same shapes as tests/test_models.py, so jit compiles are shared within a run."""
    extra = dict(num_layers=4, sliding_window=5) if family == "gemma3" else dict(num_layers=3)
    return make_tiny(family, seed=seed, **extra, **kw)


def _inputs(v: int):
    toks = np.random.default_rng(7).integers(0, v, (2, T)).astype(np.int32)
    return toks, np.broadcast_to(np.arange(T, dtype=np.int32), (2, T))


def _logits(lm) -> np.ndarray:
    toks, pos = _inputs(lm.config.vocab_size)
    return np.asarray(lm.model(toks, pos)[0])


@pytest.fixture(scope="module", params=FAMILIES)
def written(request, tmp_path_factory):
    lm = tiny_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    save_hf_dir(lm, d / "hf")
    save_hf_dir(lm, d / "sharded", max_shard_bytes=60_000)
    save_gguf(lm, d / "model.gguf")
    return lm, d


def _hf_logits(path, toks) -> np.ndarray:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        return model(torch.as_tensor(toks, dtype=torch.long)).logits.numpy()


def _max_rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_logits_match_transformers(written):
    lm, d = written
    toks, _ = _inputs(lm.config.vocab_size)
    ours, ref = _logits(lm), _hf_logits(d / "hf", toks)
    assert _max_rel_err(ours, ref) < 1e-4
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_llama3_rope_scaling_untied_matches_transformers(tmp_path):
    scaling = (
        ("factor", 8.0),
        ("high_freq_factor", 4.0),
        ("low_freq_factor", 1.0),
        ("original_max_position_embeddings", 8),
        ("rope_type", "llama3"),
    )
    lm = make_tiny(
        "llama", num_layers=2, rope_scaling=scaling, tie_word_embeddings=False, rope_theta=500_000.0
    )
    save_hf_dir(lm, tmp_path)
    assert load_hf_dir(tmp_path).config == lm.config.replace(head_dim=lm.config.resolved_head_dim)
    toks, _ = _inputs(lm.config.vocab_size)
    assert _max_rel_err(_logits(lm), _hf_logits(tmp_path, toks)) < 1e-4


def test_safetensors_roundtrip_sharded(written):
    lm, d = written
    assert json.loads((d / "sharded" / "model.safetensors.index.json").read_text())["weight_map"]
    for sub in ("hf", "sharded"):
        back = load(d / sub)
        assert back.config == lm.config.replace(head_dim=lm.config.resolved_head_dim)
        np.testing.assert_array_equal(_logits(back), _logits(lm))


def test_gguf_and_safetensors_give_identical_logits(written):
    lm, d = written
    from_gguf, from_st = load_gguf(d / "model.gguf"), load_hf_dir(d / "hf")
    assert from_gguf.config == from_st.config
    np.testing.assert_array_equal(_logits(from_gguf), _logits(from_st))
    text = from_st.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Sum 12 and 30 ünï 😀 <tool_call>{}</tool_call>"}],
        add_generation_prompt=True,
    )
    assert (
        from_gguf.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Sum 12 and 30 ünï 😀 <tool_call>{}</tool_call>"}],
            add_generation_prompt=True,
        )
        == text
    )
    assert (
        from_gguf.tokenizer.encode(text)
        == from_st.tokenizer.encode(text)
        == lm.tokenizer.encode(text)
    )
    assert from_gguf.tokenizer.stop_token_ids == lm.tokenizer.stop_token_ids


@pytest.mark.parametrize("written", ["llama"], indirect=True)
def test_gguf_file_readable_by_transformers(written):
    """An independent reader: transformers' GGUF import of our writer (llama only: it knows its
    q/k permutation)."""
    lm, d = written
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(d), gguf_file="model.gguf", dtype=torch.float32
    )
    toks, _ = _inputs(lm.config.vocab_size)
    with torch.no_grad():
        ref = model(torch.as_tensor(toks, dtype=torch.long)).logits.numpy()
    assert _max_rel_err(_logits(lm), ref) < 1e-4


@settings(max_examples=30, deadline=None)
@given(heads=st.integers(1, 4), half=st.integers(1, 4), cols=st.integers(1, 3))
def test_gguf_permutation_inverts(heads, half, cols):
    w = np.arange(heads * 2 * half * cols, dtype=np.float32).reshape(heads * 2 * half, cols)
    np.testing.assert_array_equal(_unpermute(_permute(w, heads), heads), w)


@pytest.mark.parametrize(
    "written", ["qwen2"], indirect=True
)  # one family is enough for the error path
def test_missing_and_unexpected_tensors_are_named(written, tmp_path):
    from safetensors.numpy import load_file, save_file

    lm, d = written
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (bad / f).write_bytes((d / "hf" / f).read_bytes())
    tensors = load_file(str(d / "hf" / "model.safetensors"))
    tensors.pop("model.layers.1.self_attn.k_proj.bias")
    tensors["model.layers.0.mlp.extra.weight"] = np.zeros(3, np.float32)
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(ModelLoadError) as err:
        load_hf_dir(bad)
    assert "model.layers.1.self_attn.k_proj.bias" in str(err.value)
    assert "model.layers.0.mlp.extra.weight" in str(err.value) and "Fix:" in str(err.value)


def test_unknown_name_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="registry name"):
        load("no-such-model-xyz")
    with pytest.raises(ModelLoadError, match="config.json"):
        load(tmp_path)


def test_gemma_softcapping_and_rope_scaling_match_transformers(tmp_path):
    """Final-logit soft-capping and linear RoPE scaling of global layers. (Attention soft-capping
    has no reference here: transformers' Gemma 3 stores attn_logit_softcapping but ignores it.)"""
    lm = make_tiny(
        "gemma3",
        num_layers=2,
        final_logit_softcap=0.3,
        rope_scaling=(("factor", 4.0), ("rope_type", "linear")),
    )
    save_hf_dir(lm, tmp_path)
    assert load_hf_dir(tmp_path).config == lm.config
    toks, _ = _inputs(lm.config.vocab_size)
    ours = _logits(lm)
    assert np.max(np.abs(ours)) <= 0.3 + 1e-6  # the final cap binds
    assert _max_rel_err(ours, _hf_logits(tmp_path, toks)) < 1e-4
