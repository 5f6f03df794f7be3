"""The trained weights of a gymllm run directory (``gymllm train`` / ``gymllm sft``), read back.

A run directory holds ``config.json`` (the run's config; its ``model`` section names the base model,
its ``lora`` section the adapters' settings) and ``checkpoints/<step>/`` (Orbax; ``state/trainable``
holds the trained arrays: full weights, or the LoRA adapters ``layers.<t>.lora_a`` / ``lora_b``).

* :func:`checkpoint_dir`: the Orbax directory of a run directory (or the directory itself);
* :func:`restore_trained`: the trained arrays of the latest (or a given) step; no optimizer state;
* :func:`apply_trained`: a model with those weights (adapters merged onto the model's own weights:
  ``W + (alpha / rank) A @ B``, the training's own merge);
* :func:`run_model_section`: the run's ``model`` section (to rebuild its base model).

:func:`gymllm.models.load` is the entry point that uses them; ``gymllm.algos.checkpoint`` re-exports
the first three names (the training side writes these checkpoints).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping

from gymllm.telemetry import span

__all__ = ["checkpoint_dir", "restore_trained", "apply_trained", "run_config", "run_model_section", "is_run_dir"]


def checkpoint_dir(path: str | os.PathLike) -> pathlib.Path:
    """The Orbax checkpoints directory of ``path``: a run directory (``RUN/checkpoints``) or the
    checkpoints directory itself. Raises :class:`FileNotFoundError` saying what was looked for."""
    p = pathlib.Path(path).resolve()
    for cand in (p / "checkpoints", p):
        if cand.is_dir() and any(c.name.isdigit() for c in cand.iterdir()):
            return cand
    raise FileNotFoundError(f"checkpoint: expected a run directory written by `gymllm train` (with checkpoints/<step>/) "
                            f"or its checkpoints directory, received {str(p)!r} (no numbered step directory there). "
                            "Fix: pass --run-dir of a run that saved a checkpoint (it saves one at its end)")


def run_config(path: str | os.PathLike) -> dict[str, Any]:
    """The run's ``config.json`` (of ``path`` or, for a checkpoints directory, of its parent); {} if none."""
    p = pathlib.Path(path)
    for cand in (p / "config.json", p.parent / "config.json"):
        if cand.is_file():
            data = json.loads(cand.read_text())
            return data if isinstance(data, dict) else {}
    return {}


def run_model_section(path: str | os.PathLike) -> dict[str, Any]:
    """The ``model`` section of the run's config (``name``, tiny sizes, ``checkpoint``); {} if none."""
    section = run_config(path).get("model", {})
    return dict(section) if isinstance(section, Mapping) else {}


def is_run_dir(path: str | os.PathLike) -> bool:
    """A gymllm run directory (or its checkpoints directory): numbered Orbax steps, and a run config
    with a ``model`` section (a Hugging Face ``config.json`` has none)."""
    try:
        checkpoint_dir(path)
    except FileNotFoundError:
        return False
    return bool(run_model_section(path).get("name"))


def restore_trained(path: str | os.PathLike, *, step: int | None = None) -> tuple[dict[str, Any], int]:
    """The trained arrays (``{"layers.wq": ...}``: full weights, or LoRA adapters) of the latest
    checkpoint under ``path`` (or of ``step``) and its step; the optimizer state is not loaded."""
    import orbax.checkpoint as ocp

    directory = checkpoint_dir(path)
    manager = ocp.CheckpointManager(directory)
    try:
        step = manager.latest_step() if step is None else int(step)
        with span("checkpoint_restore", track="trainer", step=step):
            out = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    finally:
        manager.close()
    state = out["state"]
    if "trainable" not in state and "policies" in state:  # a --multiagent.policies run: one state per policy
        from gymllm.errors import ConfigError

        raise ConfigError(f"checkpoint {directory}: expected one policy's weights (state/trainable), received a "
                          f"run of several policies ({', '.join(sorted(state['policies']))}). Fix: evaluate or "
                          "play against a run of one policy; loading one policy of several is not supported yet")
    return dict(state["trainable"]), int(step)


def _lora_settings(path: str | os.PathLike, lora: Any) -> tuple[int, float, tuple[str, ...]]:
    """(rank, alpha, targets) of ``lora`` (an object with those fields, e.g. ``LoRAConfig``, or a
    mapping), else of the run's ``config.json`` ``lora`` section; rank 0: no adapters."""
    if lora is None:
        lora = run_config(path).get("lora", {})
    get = lora.get if isinstance(lora, Mapping) else (lambda k, d=None: getattr(lora, k, d))
    return int(get("rank", 0) or 0), float(get("alpha", 16.0)), tuple(get("targets", ("wq", "wv")))


def apply_trained(model: Any, path: str | os.PathLike, *, lora: Any = None, step: int | None = None) -> Any:
    """A model of ``model``'s architecture with the trained weights of the checkpoint at ``path`` (a run
    directory or its checkpoints directory). ``lora`` (a ``LoRAConfig`` or a mapping with rank, alpha,
    targets; read from the run's ``config.json`` when None) merges adapter checkpoints onto ``model``'s
    own weights, which must be the base weights the run started from."""
    import jax.numpy as jnp

    from gymllm.models.transformer import Transformer

    trained, step = restore_trained(path, step=step)
    rank, alpha, targets = _lora_settings(path, lora)
    base = model.flat_params()
    flat = {k: jnp.asarray(v) for k, v in trained.items()}
    if rank > 0:  # the training's own merge: W + (alpha / r) A @ B on the targets
        from gymllm.models.lora import LoRAConfig, merge

        flat = dict(merge(LoRAConfig(rank=rank, alpha=alpha, targets=targets), base, flat))
    missing, extra = sorted(set(base) - set(flat)), sorted(set(flat) - set(base))
    if missing or extra:
        raise ValueError(f"checkpoint {str(path)!r} at step {step}: expected the weights of this model "
                         f"({len(base)} arrays), received {len(flat)} (missing {missing[:3]}, unexpected {extra[:3]}). "
                         "Fix: evaluate with the model the run trained (gymllm eval --checkpoint RUN reads it from "
                         "RUN/config.json when --model is not given)")
    for k, v in flat.items():
        if tuple(v.shape) != tuple(base[k].shape):
            raise ValueError(f"checkpoint {str(path)!r}: expected {k} of shape {tuple(base[k].shape)}, received "
                             f"{tuple(v.shape)}. Fix: evaluate with the model the run trained")
    return Transformer(model.config, params={k: v.astype(base[k].dtype) for k, v in flat.items()})
