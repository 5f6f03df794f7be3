"""gymllm.train: a training run put together and driven: its config (:mod:`~gymllm.train.train_config`:
``TrainConfig``, the presets), where shared values are wired (:mod:`~gymllm.train.wiring`), the table of run
kinds (:mod:`~gymllm.train.assembly`), the one loop (:mod:`~gymllm.train.run`) and its parts (components,
resume, step_log, heldout, best, opponents, policies, cluster), :func:`train` (:mod:`~gymllm.train.trainer`) and
supervised fine-tuning (:mod:`~gymllm.train.sft`, ``sft_data``, ``sft_step``). It sits above
:mod:`gymllm.algos` (the loss family and the learner). Names are imported lazily (JAX loads on first use):

    from gymllm.train import train, preset
    result = train(preset("tiny"))
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports, lazy_table

_LAZY = lazy_table(
    __name__,
    {
        ".train_config": (
            "TrainConfig",
            "ModelSection",
            "EnvSection",
            "RunSection",
            "ClusterSection",
            "EvalSection",
            "preset",
        ),
        ".run": ("Run",),
        ".components": ("LocalComponents",),
        ".cluster": ("RayComponents",),
        ".trainer": ("TrainResult", "train"),
        ".assembly": ("Kind", "register_kind"),
        ".sft": ("SFTConfig", "SFTSection", "SFTResult", "run_sft"),
    },
)

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
