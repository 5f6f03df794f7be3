"""Hugging Face checkpoint directories: read and write.

A directory holds ``config.json``, ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``), ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat
template). :func:`load_hf_dir` reads any supported family; :func:`save_hf_dir` writes one that
``transformers`` (and :func:`load_hf_dir`) read back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from gymllm.errors import ModelLoadError, explain
from gymllm.models.checkpoint import assemble_params, external_tensors
from gymllm.models.config import ModelConfig
from gymllm.models.loaded import LoadedModel
from gymllm.models.tokenizer import TokenizerBundle, require_file
from gymllm.models.transformer import Transformer
from gymllm.telemetry import span

INDEX = "model.safetensors.index.json"


def _shard_map(d: Path) -> dict[str, Path]:
    """``{tensor_name: file}`` from the index, or from every ``*.safetensors`` file."""
    from safetensors import safe_open

    if (d / INDEX).exists():
        weight_map = json.loads((d / INDEX).read_text())["weight_map"]
        return {name: d / f for name, f in weight_map.items()}
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            explain(
                f"checkpoint directory {d}",
                expected="model.safetensors or an index + shards",
                received=sorted(p.name for p in d.iterdir()),
                fix="point at a Hugging Face model directory (save_pretrained output)",
            )
        )
    out = {}
    for f in files:
        with safe_open(str(f), framework="flax") as fh:
            out.update({k: f for k in fh.keys()})
    return out


def read_safetensors(d: Path) -> tuple[dict[str, Path], callable]:
    """The tensor names of a directory and a getter returning NumPy arrays (bf16 via ml_dtypes)."""
    from safetensors import safe_open

    shard_of = _shard_map(d)
    handles: dict[Path, object] = {}

    def get(name: str) -> np.ndarray:
        f = shard_of[name]
        if f not in handles:
            handles[f] = safe_open(str(f), framework="numpy")
        try:
            return handles[f].get_tensor(name)
        except (TypeError, ValueError):  # bf16 and friends: NumPy has no dtype, JAX does
            with safe_open(str(f), framework="flax") as fh:
                return np.asarray(fh.get_tensor(name))

    return shard_of, get


def load_hf_dir(path: str | os.PathLike, dtype=jnp.float32) -> LoadedModel:
    """Load a Hugging Face safetensors directory as a :class:`LoadedModel` with weights in ``dtype``."""
    d = Path(path)
    config = require_file(
        d / "config.json",
        "model directory",
        fix="pass a Hugging Face model directory or a .gguf file",
    )
    with span("load_hf_dir", track="engine", path=str(d)):
        cfg = ModelConfig.from_hf(json.loads(config.read_text()))
        shard_of, get = read_safetensors(d)
        params = assemble_params(cfg, get, list(shard_of), "hf", source=str(d))
        model = Transformer.from_params(cfg, params, dtype=dtype)
        tok = TokenizerBundle.from_dir(d)
    return LoadedModel(model=model, tokenizer=tok, config=cfg, source=str(d))


def save_hf_dir(
    lm: LoadedModel, path: str | os.PathLike, *, max_shard_bytes: int | None = None
) -> Path:
    """Write ``lm`` as a Hugging Face directory (sharded with an index when ``max_shard_bytes`` is set)."""
    from safetensors.numpy import save_file

    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    cfg = lm.config
    tensors = external_tensors(
        cfg, {k: np.asarray(v) for k, v in lm.model.flat_params().items()}, "hf"
    )
    hf = cfg.to_hf()
    hf["torch_dtype"] = str(np.asarray(lm.model.embed[...]).dtype)
    for key, tid in (
        ("bos_token_id", lm.tokenizer.bos_token_id),
        ("eos_token_id", lm.tokenizer.eos_token_id),
        ("pad_token_id", lm.tokenizer.pad_token_id),
    ):
        hf[key] = tid
    (d / "config.json").write_text(json.dumps(hf, indent=2))
    shards = _split(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], str(d / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k, shard in enumerate(shards):
            name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(d / name), metadata={"format": "pt"})
            weight_map.update({t: name for t in shard})
        total = sum(a.nbytes for a in tensors.values())
        (d / INDEX).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    lm.tokenizer.save(d)
    return d


def _split(tensors: dict[str, np.ndarray], max_bytes: int | None) -> list[dict[str, np.ndarray]]:
    if not max_bytes:
        return [tensors]
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, arr in tensors.items():
        if shards[-1] and size + arr.nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = arr
        size += arr.nbytes
    return shards
