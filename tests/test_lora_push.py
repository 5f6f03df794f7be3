"""Adapter-only LoRA pushes: the engine keeps its base, receives only the adapters (+ version),
merges them on its device and samples exactly as a model with the merged weights; the trainer's
LoRA run sends adapters only."""

from __future__ import annotations

import asyncio
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.models.lora import LoRAConfig, MergedWeights, adapter_keys, init_adapters, merge, nbytes
from gymllm.algos.lora_push import AdapterPusher
from gymllm.algos.weight_sync import WeightPusher
from gymllm.errors import EngineError
from gymllm.inference import JaxEngine, SamplingParams
from gymllm.inference.config import EngineConfig
from gymllm.inference.lora_receiver import LoraReceiver, apply_lora_update, receiver_of
from gymllm.models import make_tiny, token_logprobs
from gymllm.models.transformer import Transformer

LORA = LoRAConfig(rank=2, alpha=4.0, targets=("wq", "wv", "w_up"))
MAX_LEN = 32


@pytest.fixture(scope="module")
def lm():
    return make_tiny("llama", vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2)


@pytest.fixture
def engine(lm):
    eng = JaxEngine.from_loaded(
        lm, config=EngineConfig(num_slots=4, max_len=MAX_LEN, min_bucket=MAX_LEN), stop_token_ids=()
    )
    yield eng
    eng.shutdown()


def trained_adapters(base, seed=1):
    """Adapters as after some training: B is no longer zero, so the merged model differs from the base."""
    ad = init_adapters(LORA, base)
    rng = np.random.default_rng(seed)
    return {
        k: jnp.asarray(rng.normal(0, 0.3, v.shape), v.dtype) if k.endswith("lora_b") else v
        for k, v in ad.items()
    }


def logprobs_under(config, params, prompt, tokens) -> np.ndarray:
    """token_logprobs of ``tokens`` after ``prompt`` under a model with ``params`` (one full forward)."""
    ids = list(prompt) + [int(t) for t in tokens]
    padded = np.zeros((1, MAX_LEN), np.int32)
    padded[0, : len(ids)] = ids
    logits, _ = Transformer(config, params=dict(params))(
        jnp.asarray(padded), jnp.arange(MAX_LEN)[None]
    )
    targets = np.zeros((1, MAX_LEN), np.int32)
    targets[0, : len(ids) - 1] = ids[1:]
    return np.asarray(token_logprobs(logits, jnp.asarray(targets), 1.0))[
        0, len(prompt) - 1 : len(ids) - 1
    ]


def sample(engine, prompts, seed=0):
    sp = SamplingParams(temperature=1.0, max_tokens=8, seed=seed)

    async def main():
        return await asyncio.gather(*(engine.generate(p, sp) for p in prompts))

    return asyncio.run(main())


def test_adapter_push_samples_like_the_merged_model(lm, engine):
    base = lm.model.flat_params()
    adapters = trained_adapters(base)
    merged = merge(LORA, base, adapters)
    pusher = AdapterPusher(engine, lm.config, base, LORA)
    pusher.push(merged, 3)  # MergedWeights: only its adapters travel
    assert pusher.last_bytes == nbytes(adapters) < nbytes(merged) / 10
    assert receiver_of(engine).history[-1]["keys"] == sorted(adapter_keys(LORA))
    prompts = [[5, 17, 42, 9], [7, 7, 101, 250, 3, 11]]
    for p, c in zip(prompts, sample(engine, prompts)):
        assert set(c.versions.tolist()) == {3}  # every token carries the pushed version
        lp_merged = logprobs_under(lm.config, merged, p, c.token_ids)
        lp_base = logprobs_under(lm.config, base, p, c.token_ids)
        np.testing.assert_allclose(c.logprobs, lp_merged, atol=1e-4)
        assert np.abs(c.logprobs - lp_base).max() > 1e-2  # the check can fail: the adapters matter
    for k, v in lm.model.flat_params().items():  # the base itself is never modified
        assert np.array_equal(np.asarray(v), np.asarray(base[k])), k


def test_apply_lora_update_and_bad_adapters(lm, engine):
    with pytest.raises(EngineError, match="LoraReceiver"):
        apply_lora_update(engine, {}, 1)
    rec = LoraReceiver.from_model(engine, lm.model, LORA)
    base = lm.model.flat_params()
    adapters = trained_adapters(base, seed=2)
    apply_lora_update(engine, adapters, 5)
    assert rec.pushes == 1 and engine.version == 5
    want = merge(LORA, base, adapters)
    got = rec.merged(adapters)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), atol=1e-6, err_msg=k)
    with pytest.raises(EngineError, match="lora_b"):
        rec.apply({k: v[..., :1] if k.endswith("lora_b") else v for k, v in adapters.items()}, 6)
    with pytest.raises(EngineError, match="rank > 0"):
        LoraReceiver.from_model(engine, lm.model, LoRAConfig(rank=0))


def test_weight_pusher_sends_merged_weights_as_adapters(lm, engine, monkeypatch):
    base = lm.model.flat_params()
    adapters = trained_adapters(base, seed=3)
    merged = merge(LORA, base, adapters)
    assert isinstance(merged, MergedWeights) and type(jax.tree.map(lambda x: x, merged)) is dict
    monkeypatch.setattr(
        WeightPusher, "state_of", lambda *a: pytest.fail("full weights were pushed")
    )
    WeightPusher(engine, lm.config).push(merged, 2)
    rec = receiver_of(engine)
    assert rec is not None and rec.history[-1] == {
        **rec.history[-1],
        "version": 2,
        "bytes": nbytes(adapters),
    }
    monkeypatch.undo()
    WeightPusher(engine, lm.config).push(dict(base), 4)  # plain weights: the full push, as before
    assert rec.pushes == 1 and engine.version == 4


def test_trainer_lora_run_pushes_adapters_only(tmp_path, monkeypatch):
    from test_algos_trainer import small_config

    from gymllm.train.trainer import train

    sent = []
    apply = LoraReceiver.apply

    def spy(self, adapters, version):
        sent.append(
            (
                version,
                {k: tuple(v.shape) for k, v in adapters.items()},
                nbytes(adapters),
                nbytes(self.base),
            )
        )
        return apply(self, adapters, version)

    monkeypatch.setattr(LoraReceiver, "apply", spy)
    monkeypatch.setattr(
        WeightPusher, "state_of", lambda *a: pytest.fail("full weights were pushed")
    )
    cfg = dataclasses.replace(small_config(tmp_path / "lora", steps=2), lora=LORA)
    res = train(cfg)
    assert res.steps == 2
    assert [v for v, *_ in sent] == [1, 2]
    for _, shapes, sent_bytes, base_bytes in sent:
        assert sorted(shapes) == sorted(adapter_keys(LORA))
        assert all(s[-1] == LORA.rank or s[1] == LORA.rank for s in shapes.values())
        assert sent_bytes < base_bytes / 10
    assert all(h["weight_sync_s"] > 0 for h in res.history)
