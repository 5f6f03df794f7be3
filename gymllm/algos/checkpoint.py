"""Orbax checkpoints of a training run: everything needed to resume exactly after a kill.

Saved at optimizer-step boundaries (the learner holds no half-accumulated step then):

* ``state``: the trained arrays (full weights, or the LoRA adapters) and the Optax state;
* ``meta`` (JSON): step / policy version, the learner's counters, the ids of every consumed group
  (trained, filtered or stale: the rollout bookkeeping that prevents repeating or skipping data on
  resume), the trainer's NumPy RNG state, and the run's config for a sanity check.

    ckpt = Checkpointer(run_dir / "checkpoints", max_to_keep=3)
    ckpt.save(step, learner, extra={"rng": rng.bit_generator.state})
    step = ckpt.restore_latest(learner)   # None when there is nothing to resume
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax

from gymllm.telemetry import span


class Checkpointer:
    """A thin wrapper over ``orbax.checkpoint.CheckpointManager`` for :class:`StreamingLearner` state."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.directory = pathlib.Path(directory).resolve()
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

    def save(self, step: int, learner: Any, *, extra: dict[str, Any] | None = None) -> None:
        ocp = self._ocp
        meta = {**learner.bookkeeping(), **(extra or {})}
        with span("checkpoint", track="trainer", step=step):
            self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(learner.state()),
                                                            meta=ocp.args.JsonSave(meta)))
            self.manager.wait_until_finished()

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore(self, step: int, learner: Any) -> dict[str, Any]:
        """Load ``step`` into ``learner`` (in place); returns the JSON metadata."""
        ocp = self._ocp
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, learner.state())
        out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                                 meta=ocp.args.JsonRestore()))
        meta = dict(out["meta"])
        learner.restore(out["state"], meta)
        return meta

    def restore_latest(self, learner: Any) -> dict[str, Any] | None:
        step = self.latest_step()
        return None if step is None else self.restore(step, learner)

    def close(self) -> None:
        self.manager.close()


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
    return dict(out["state"]["trainable"]), int(step)


def restore_model_weights(model: Any, path: str | os.PathLike, *, lora: Any = None, step: int | None = None) -> Any:
    """A model of ``model``'s architecture with the trained weights of the checkpoint at ``path`` (a run
    directory or its checkpoints directory). ``lora`` (a ``LoRAConfig``; read from the run's
    ``config.json`` when None) merges adapter checkpoints onto ``model``'s own weights, which must be the
    base weights the run started from."""
    import json

    from gymllm.algos import lora as lora_mod
    from gymllm.models.transformer import Transformer

    trained, step = restore_trained(path, step=step)
    if lora is None:
        conf = pathlib.Path(path) / "config.json"
        section = json.loads(conf.read_text()).get("lora", {}) if conf.is_file() else {}
        lora = lora_mod.LoRAConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in section.items()})
    base = model.flat_params()
    if lora.enabled:
        flat = dict(lora_mod.merge(lora, base, {k: jax.numpy.asarray(v) for k, v in trained.items()}))
    else:
        flat = {k: jax.numpy.asarray(v) for k, v in trained.items()}
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
