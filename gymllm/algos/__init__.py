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

from gymllm._lazy import lazy_exports

_LAZY = {
    "LossConfig": "gymllm.algos.config",
    "AdvantageConfig": "gymllm.algos.config",
    "PolicyLossConfig": "gymllm.algos.config",
    "CorrectionConfig": "gymllm.algos.config",
    "KLConfig": "gymllm.algos.config",
    "ShapingConfig": "gymllm.algos.config",
    "loss_preset": "gymllm.algos.config",
    "LossBatch": "gymllm.algos.loss",
    "micro_batch_loss": "gymllm.algos.loss",
    "OptimizerConfig": "gymllm.algos.optim",
    "make_optimizer": "gymllm.algos.optim",
    "LoRAConfig": "gymllm.models.lora",
    "LearnerConfig": "gymllm.algos.learner_config",
    "StreamingLearner": "gymllm.algos.learner",
    "StepReport": "gymllm.algos.learner",
    "ShardingConfig": "gymllm.algos.sharding",
    "make_mesh": "gymllm.algos.sharding",
    "Checkpointer": "gymllm.algos.checkpoint",
    "WeightPusher": "gymllm.algos.weight_sync",
    "AdapterPusher": "gymllm.algos.lora_push",
    "MultiHostConfig": "gymllm.algos.multihost",
    "initialize_from_env": "gymllm.algos.multihost",
    "initialize_distributed": "gymllm.algos.multihost",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
