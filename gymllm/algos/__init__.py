"""gymllm.algos: the GRPO loss family as pure JAX functions, the streaming learner, checkpoints and
sharding (a training run is put together in :mod:`gymllm.train`). Names are imported lazily (JAX loads
on first use):

    from gymllm.algos import StreamingLearner, LearnerConfig, loss_preset

Pure pieces (compose them for your own objective): ``gymllm.algos.advantages`` (grpo, dr_grpo,
rloo, batch_std), ``policy_loss`` (token/sequence ratios, PPO clip, dual clip, CISPO),
``corrections`` (token TIS, masked IS, geometric sequence mask), ``kl`` (k1/k2/k3),
``aggregation`` (token-mean over the step, seq-mean-token-mean, ..., prompt-mean), ``shaping``
(overlong punishment, zero-variance filter), composed by ``loss.micro_batch_loss``.
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports, lazy_table

_LAZY = lazy_table(
    __name__,
    {
        ".config": (
            "LossConfig",
            "AdvantageConfig",
            "PolicyLossConfig",
            "CorrectionConfig",
            "KLConfig",
            "ShapingConfig",
            "loss_preset",
        ),
        ".loss": ("LossBatch", "micro_batch_loss"),
        ".optim": ("OptimizerConfig", "make_optimizer"),
        "gymllm.models.lora": ("LoRAConfig",),
        ".learner_config": ("LearnerConfig",),
        ".learner": ("StreamingLearner", "StepReport"),
        ".sharding": ("ShardingConfig", "make_mesh"),
        ".checkpoint": ("Checkpointer",),
        ".weight_sync": ("WeightPusher",),
        ".lora_push": ("AdapterPusher",),
        ".multihost": ("MultiHostConfig", "initialize_from_env", "initialize_distributed"),
    },
)

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
