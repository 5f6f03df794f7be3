"""Model contract: cached decoding == full forward, packing, log-probs, config errors, tiny tokenizer
and chat template. Oracles: the full forward (for the cache), separate rows (for packing), a NumPy
log-softmax (for token_logprobs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.errors import ConfigError, ModelLoadError
from gymllm.models import FAMILIES, ModelConfig, Transformer, make_tiny, token_logprobs
from gymllm.models.tiny import tiny_config

from accel import tolerance

T = 12
# float32 comparisons against the full forward / NumPy: full-precision matmuls on an accelerator too
pytestmark = pytest.mark.highest_precision


def tiny_model(family: str, seed: int = 0, **kw):
    """The one tiny shape per family used across model tests (so jit compiles are shared)."""
    extra = dict(num_layers=4, sliding_window=5) if family == "gemma3" else dict(num_layers=3)
    return make_tiny(family, seed=seed, **extra, **kw)


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    return tiny_model(request.param)


def _tokens(seed: int, b: int, t: int, v: int) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).integers(0, v, (b, t)), jnp.int32)


def _pos(b: int, t: int, start: int = 0) -> jnp.ndarray:
    return jnp.broadcast_to(jnp.arange(start, start + t, dtype=jnp.int32), (b, t))


def test_forward_shapes_and_dtype(tiny):
    toks = _tokens(0, 2, T, tiny.config.vocab_size)
    logits, cache = tiny.model(toks, _pos(2, T))
    assert (
        logits.shape == (2, T, tiny.config.vocab_size)
        and logits.dtype == jnp.float32
        and cache is None
    )
    assert np.isfinite(np.asarray(logits)).all()


def test_cached_decoding_equals_full_forward(tiny):
    """Prefill 5 tokens (right-padded to T), then decode one at a time: same logits as one full
    forward. Rows have different prompt lengths, so padding slots get overwritten before use."""
    toks = _tokens(1, 2, T, tiny.config.vocab_size)
    full, _ = tiny.model(toks, _pos(2, T))
    lengths = np.array([5, 8])
    cache = tiny.model.init_cache(2, 16)
    prompt = jnp.where(jnp.arange(T)[None] < lengths[:, None], toks, 0)  # pads carry token 0
    if tiny.config.family == "llama":  # last-token logits only (one family: it is shared code)
        last, _ = tiny.model(
            prompt, _pos(2, T), cache=cache, logits_at=jnp.asarray(lengths - 1)
        )  # [2, 1, V]
        for row, n in enumerate(lengths):
            np.testing.assert_allclose(
                np.asarray(last[row, 0]), np.asarray(full[row, n - 1]), **tolerance("logits")
            )
    first, cache = tiny.model(prompt, _pos(2, T), cache=cache)
    for row, n in enumerate(lengths):
        np.testing.assert_allclose(
            np.asarray(first[row, :n]), np.asarray(full[row, :n]), **tolerance("logits")
        )
    got = {0: [], 1: []}
    for step in range(T - lengths.max()):
        pos = jnp.asarray(lengths + step, jnp.int32)[:, None]  # [2, 1]
        out, cache = tiny.model(jnp.take_along_axis(toks, pos, 1), pos, cache=cache)
        for row in range(2):
            got[row].append(np.asarray(out[row, 0]))
    for row, n in enumerate(lengths):
        want = np.asarray(full[row, n : n + len(got[row])])
        np.testing.assert_allclose(np.stack(got[row]), want, **tolerance("logits"))


def test_packed_segments_equal_separate_rows():
    """Two sequences packed in one row with segment ids == each run alone in its own row.
    (Gemma 3: segments, sliding windows and positions interact; the mask code is shared.)"""
    tiny = tiny_model("gemma3")
    v = tiny.config.vocab_size
    a, b = _tokens(3, 1, 5, v)[0], _tokens(4, 1, 7, v)[0]
    packed = jnp.stack([jnp.concatenate([a, b])] * 2)
    pos = jnp.stack([jnp.concatenate([jnp.arange(5), jnp.arange(7)])] * 2).astype(jnp.int32)
    seg = jnp.asarray([[1] * 5 + [2] * 7] * 2, jnp.int32)
    out, _ = tiny.model(packed, pos, segment_ids=seg)
    alone = jnp.stack([jnp.pad(a, (0, 7)), jnp.pad(b, (0, 5))])
    ref, _ = tiny.model(alone, _pos(2, T))
    np.testing.assert_allclose(
        np.asarray(out[0, :5]), np.asarray(ref[0, :5]), **tolerance("logits")
    )
    np.testing.assert_allclose(
        np.asarray(out[0, 5:]), np.asarray(ref[1, :7]), **tolerance("logits")
    )


_GEMMA: dict = {}
CHUNK = 4


@settings(max_examples=25, deadline=None)
@given(split=st.integers(1, T - 1), chunk=st.integers(1, CHUNK), seed=st.integers(0, 1000))
def test_chunked_prefill_equals_full_forward(split, chunk, seed):
    """Prefill ``split`` tokens, then chunks of ``chunk`` tokens (each right-padded to a fixed
    CHUNK so shapes, hence compiles, are shared). Sliding windows + local/global RoPE (Gemma 3)."""
    if "lm" not in _GEMMA:
        _GEMMA["lm"] = tiny_model("gemma3")
    lm = _GEMMA["lm"]
    toks = _tokens(seed, 2, T + CHUNK, lm.config.vocab_size)
    full, _ = lm.model(toks[:, :T], _pos(2, T))
    cache = lm.model.init_cache(2, 16)
    out, cache = lm.model(toks[:, :T], _pos(2, T), cache=cache)  # valid up to split
    outs = [np.asarray(out[:, :split])]
    for s in range(split, T, chunk):
        n = min(chunk, T - s)
        out, cache = lm.model(toks[:, s : s + CHUNK], _pos(2, CHUNK, s), cache=cache)
        outs.append(np.asarray(out[:, :n]))
    np.testing.assert_allclose(np.concatenate(outs, 1), np.asarray(full), **tolerance("logits"))


def test_bf16_forward_close_to_fp32():
    lm32 = tiny_model("llama", seed=5)
    lm16 = tiny_model("llama", seed=5, dtype=jnp.bfloat16)
    toks = _tokens(5, 2, T, lm32.config.vocab_size)
    l32, _ = lm32.model(toks, _pos(2, T))
    l16, _ = lm16.model(toks, _pos(2, T))
    assert l16.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(l32 - l16))) < 0.05 * float(jnp.max(jnp.abs(l32)))


@pytest.mark.parametrize("transposed,f32_out", [(False, False), (True, True), (False, True)])
def test_dense_bf16_value_and_grads_match_float32_reference(transposed, f32_out):
    """The mixed-precision matmul (f32 accumulation, bf16 backward) against autodiff of the
    float32 product of the same bf16-rounded inputs; and the float32 path is the plain product."""
    from gymllm.models.layers import dense

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 5, 16)), jnp.bfloat16)  # [B, T, E]
    w = jnp.asarray(rng.standard_normal((24, 16) if transposed else (16, 24)), jnp.bfloat16)
    probe = jnp.asarray(rng.standard_normal((2, 5, 24)), jnp.float32)

    def loss(fn, x, w):
        return jnp.sum(fn(x, w).astype(jnp.float32) * probe)

    ours = lambda x, w: dense(x, w, transposed=transposed, f32_out=f32_out)  # noqa: E731
    ref = lambda x, w: x.astype(jnp.float32) @ (w.T if transposed else w).astype(jnp.float32)  # noqa: E731
    out = ours(x, w)
    assert out.dtype == (jnp.float32 if f32_out else jnp.bfloat16) and out.shape == (2, 5, 24)
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(ref(x, w)), rtol=2e-2, atol=5e-2
    )
    g_ours = jax.grad(loss, argnums=(1, 2))(ours, x, w)
    g_ref = jax.grad(loss, argnums=(1, 2))(ref, x.astype(jnp.float32), w.astype(jnp.float32))
    for a, b in zip(g_ours, g_ref):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b), rtol=3e-2, atol=0.15)
    x32, w32 = x.astype(jnp.float32), w.astype(jnp.float32)
    np.testing.assert_allclose(
        np.asarray(dense(x32, w32, transposed=transposed, f32_out=f32_out)),
        np.asarray(ref(x32, w32)),
        **tolerance("reference"),
    )


def test_packed_bf16_weights_equal_bf16_weights():
    """uint16 bit patterns (pack_bf16) decode to exactly the bf16 model, with and without a cache."""
    from gymllm.models.transformer import forward
    from gymllm.models.blocks import pack_bf16

    lm = tiny_model("gemma3", seed=4, dtype=jnp.bfloat16)
    cfg, params = lm.config, lm.model.flat_params()
    packed = pack_bf16(params)
    assert all(v.dtype == jnp.uint16 for v in packed.values())
    toks = _tokens(4, 2, T, cfg.vocab_size)
    a, _ = forward(cfg, params, toks, _pos(2, T))
    b, _ = forward(cfg, packed, toks, _pos(2, T))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    cache = lm.model.init_cache(2, T + 2)
    c1, _ = forward(cfg, params, toks, _pos(2, T), None, cache)
    c2, _ = forward(cfg, packed, toks, _pos(2, T), None, cache)
    np.testing.assert_array_equal(np.asarray(c1), np.asarray(c2))


def test_compute_dtype_bf16_mixed_precision_forward_and_gradients():
    """fp32 master weights, bf16 compute: logits close to fp32, gradients float32 and aligned."""
    from gymllm.models.transformer import forward

    lm = tiny_model("qwen3", seed=3)
    cfg, params = lm.config, lm.model.flat_params()
    toks = _tokens(3, 2, T, cfg.vocab_size)

    def loss(p, cd):
        logits, _ = forward(cfg, p, toks, _pos(2, T), compute_dtype=cd)
        return token_logprobs(logits[:, :-1], toks[:, 1:]).mean(), logits

    (l32, lg32), g32 = jax.value_and_grad(loss, has_aux=True)(params, None)
    (l16, lg16), g16 = jax.value_and_grad(loss, has_aux=True)(params, "bfloat16")
    assert lg16.dtype == jnp.float32 and all(v.dtype == jnp.float32 for v in g16.values())
    assert abs(float(l32) - float(l16)) < 0.02 * abs(float(l32))
    assert float(jnp.max(jnp.abs(lg32 - lg16))) < 0.05 * float(jnp.max(jnp.abs(lg32)))
    flat32 = np.concatenate([np.ravel(g32[k]) for k in sorted(g32)])
    flat16 = np.concatenate([np.ravel(g16[k]) for k in sorted(g16)])
    cos = flat32 @ flat16 / (np.linalg.norm(flat32) * np.linalg.norm(flat16))
    assert cos > 0.99, cos


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), temperature=st.sampled_from([0.3, 1.0, 1.7]))
def test_token_logprobs_matches_numpy(seed, temperature):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(2, 3, 11)).astype(np.float32) * 4
    targets = rng.integers(0, 11, (2, 3))
    z = logits / temperature
    ref = z - z.max(-1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
    ref = np.take_along_axis(ref, targets[..., None], -1)[..., 0]
    got = token_logprobs(jnp.asarray(logits), jnp.asarray(targets), temperature)
    assert got.dtype == jnp.float32 and got.shape == (2, 3)
    np.testing.assert_allclose(np.asarray(got), ref, **tolerance("reference"))


def test_split_merge_roundtrip_under_jit():
    from flax import nnx

    lm = tiny_model("qwen2")
    graphdef, state = nnx.split(lm.model)
    toks = _tokens(6, 2, T, lm.config.vocab_size)

    @jax.jit
    def f(state, toks):
        return nnx.merge(graphdef, state)(toks, _pos(2, T))[0]

    np.testing.assert_allclose(
        np.asarray(f(state, toks)), np.asarray(lm.model(toks, _pos(2, T))[0]), atol=1e-6
    )


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="family"):
        ModelConfig(
            family="gpt2",
            vocab_size=8,
            hidden_size=8,
            intermediate_size=8,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
        )
    with pytest.raises(ConfigError, match="num_kv_heads"):
        tiny_config("llama", num_heads=4, num_kv_heads=3)
    with pytest.raises(ConfigError, match="sliding_window"):
        tiny_config("llama", layer_types=("sliding_attention", "full_attention"))
    with pytest.raises(ModelLoadError, match="missing"):
        cfg = tiny_config("llama")
        Transformer(cfg, params={"embed": jnp.zeros((cfg.vocab_size, cfg.hidden_size))})


def test_hf_config_roundtrip():
    for fam in FAMILIES:
        cfg = tiny_config(fam)
        assert ModelConfig.from_hf(cfg.to_hf()) == cfg.replace(head_dim=cfg.resolved_head_dim)


# ----- tokenizer bundle and chat template of the tiny models -----

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tok():
    return make_tiny("llama").tokenizer


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=60))
def test_tiny_tokenizer_roundtrip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_special_tokens(tok):
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [
        0,
        1,
        2,
    ]
    assert tok.eos_token_id == 2 and tok.pad_token_id == 0 and tok.stop_token_ids[0] == 2
    call = tok.encode('<tool_call>{"name": "f"}</tool_call>')
    assert call[0] == tok.token_to_id("<tool_call>") and call[-1] == tok.token_to_id("</tool_call>")
    assert tok.encode("12") == [
        tok.token_to_id("1"),
        tok.token_to_id("2"),
    ]  # digits split one by one


def test_chat_template_without_and_with_tools(tok):
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    plain = tok.apply_chat_template(msgs, add_generation_prompt=True)
    assert plain == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    with_tools = tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True)
    assert '"name": "calculator"' in with_tools and "<tools>" in with_tools
    assert with_tools.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    conv = msgs + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "2+2"}},
                }
            ],
        },
        {"role": "tool", "content": "4"},
    ]
    text = tok.apply_chat_template(conv, tools=TOOLS)
    assert (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call><|im_end|>'
        in text
    )
    assert text.endswith("<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n")
    ids = tok.apply_chat_template(conv, tools=TOOLS, tokenize=True)
    assert tok.decode(ids) == text


def test_chat_template_matches_transformers(tok, tmp_path):
    transformers = pytest.importorskip("transformers")
    tok.save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    conv = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi ünï 😀"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Sum 1 2"},
    ]
    for tools in (None, TOOLS):
        ours = tok.apply_chat_template(conv, tools=tools, add_generation_prompt=True)
        theirs = hf.apply_chat_template(
            conv, tools=tools, add_generation_prompt=True, tokenize=False
        )
        assert ours == theirs
        assert tok.encode(ours) == hf.encode(ours, add_special_tokens=False)


def test_prefix_preserving(tok):
    assert tok.is_prefix_preserving(("user", "tool"))


def test_attention_matches_numpy_reference_with_softcap_and_gqa():
    """models.attention (GQA, mask, attention soft-capping as in Gemma 2) vs plain NumPy."""
    from gymllm.models.attention import attention

    rng = np.random.default_rng(0)
    b, t, s, h, k, d, cap, scale = 2, 3, 5, 4, 2, 8, 0.7, 0.3
    q, kk, vv = (
        rng.normal(size=(b, t, h, d)),
        rng.normal(size=(b, s, k, d)),
        rng.normal(size=(b, s, k, d)),
    )
    mask = rng.random((b, t, s)) < 0.7
    mask[..., 0] = True
    got = attention(
        *(jnp.asarray(x, jnp.float32) for x in (q, kk, vv)),
        jnp.asarray(mask),
        scale=scale,
        softcap=cap,
    )
    krep, vrep = np.repeat(kk, h // k, axis=2), np.repeat(vv, h // k, axis=2)  # [B, S, H, D]
    scores = np.einsum("bthd,bshd->bhts", q, krep) * scale
    scores = cap * np.tanh(scores / cap)
    scores = np.where(mask[:, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ref = np.einsum("bhts,bshd->bthd", probs, vrep).reshape(b, t, h * d)
    np.testing.assert_allclose(np.asarray(got), ref, **tolerance("reference"))
