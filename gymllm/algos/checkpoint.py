"""Orbax checkpoints of a training run: everything needed to resume exactly after a kill.

Saved at optimizer-step boundaries (the learner holds no half-accumulated step then):

* ``state``: the trained arrays (full weights, or the LoRA adapters) and the Optax state;
* ``meta`` (JSON): step / policy version, the learner's counters, the ids of every consumed group
  (trained, filtered or stale: the rollout bookkeeping that prevents repeating or skipping data on
  resume), the trainer's NumPy RNG state, and the run's config for a sanity check.

    ckpt = Checkpointer(run_dir / "checkpoints", max_to_keep=3)
    ckpt.save(step, learner, extra={"rng": rng.bit_generator.state})
    step = ckpt.restore_latest(learner)   # None when there is nothing to resume

Reading a run's trained weights back (no learner) lives with the model loaders,
:mod:`gymllm.models.trained` (``checkpoint_dir``, ``restore_trained``, ``apply_trained``).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax

from gymllm.telemetry import span

__all__ = ["Checkpointer"]


class Checkpointer:
    """A thin wrapper over ``orbax.checkpoint.CheckpointManager`` for :class:`StreamingLearner` state."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.directory = pathlib.Path(directory).resolve()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def save(
        self, step: int, learner: Any, *, extra: dict[str, Any] | None = None, wait: bool = False
    ) -> None:
        """Save ``step``: the learner's arrays (:meth:`StreamingLearner.state`) and its bookkeeping plus
        ``extra`` as JSON. Asynchronous: it returns once the arrays are copied off the device, and the
        files are written in the background (training and rollouts go on meanwhile); the next save,
        :meth:`latest_step`, :meth:`restore` and :meth:`close` wait for it, and a kill before it ends
        leaves the previous checkpoint as the latest (Orbax finalizes a step by an atomic rename).
        The learner's arrays are never donated (its programs donate only their accumulators), so the
        background write reads exactly the saved step's values. ``wait``: block until it is on disk."""
        ocp = self._ocp
        meta = {**learner.bookkeeping(), **(extra or {})}
        with span(
            "checkpoint", track="trainer", step=step
        ):  # the blocking part: the arrays reach the host
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(learner.state()), meta=ocp.args.JsonSave(meta)
                ),
            )
        if wait:
            self.wait()

    def wait(self) -> None:
        """Block until every save started so far is on disk (finalized: a reader sees it whole)."""
        with span("checkpoint_write", track="trainer"):
            self.manager.wait_until_finished()

    def latest_step(self) -> int | None:
        """The newest saved step (a save still being written counts once it is finished: this waits)."""
        self.wait()
        return self.manager.latest_step()

    def restore(self, step: int, learner: Any) -> dict[str, Any]:
        """Load ``step`` into ``learner`` (in place); returns the JSON metadata."""
        ocp = self._ocp
        self.wait()
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, learner.state())
        out = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
            ),
        )
        meta = dict(out["meta"])
        learner.restore(out["state"], meta)
        return meta

    def restore_latest(self, learner: Any) -> dict[str, Any] | None:
        step = self.latest_step()
        return None if step is None else self.restore(step, learner)

    def close(self) -> None:
        """Wait for the save being written, then release the manager."""
        self.wait()
        self.manager.close()
