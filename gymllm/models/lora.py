"""LoRA: low-rank adapters on chosen projections of the flat parameter dict; only adapters train.

Weights are flat ``{"layers.wq": [L, in, out], ...}`` (see :mod:`gymllm.models.transformer`).
An adapter on ``layers.wq`` is ``A [L, in, r]`` (small random) and ``B [L, r, out]`` (zeros), so the
adapted model starts equal to the base; the effective weight is ``W + (alpha / r) A @ B``.
:func:`merge` gives the full weights the engine runs (the base is never modified), as a
:class:`MergedWeights` dict that also keeps the adapters it was made from: a weight push of merged
weights sends only those adapters (:mod:`gymllm.algos.lora_push`); the engine keeps its base and
merges them itself (:mod:`gymllm.inference.lora_receiver`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from gymllm.validation import check_range, require

PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """rank 0 = LoRA off (full fine-tuning); targets: projections among wq wk wv wo w_gate w_up w_down."""

    rank: int = 0
    """Adapter rank (0 = LoRA off: full fine-tuning)."""
    alpha: float = 16.0
    """The adapters' scale: W + (alpha / rank) A @ B."""
    targets: tuple[str, ...] = ("wq", "wv")
    """Projections that get adapters, among wq wk wv wo w_gate w_up w_down."""
    seed: int = 0
    """Seed of the adapters' initialization."""

    def __post_init__(self) -> None:
        check_range("LoRAConfig", "rank", self.rank, lo=0)
        check_range("LoRAConfig", "alpha", self.alpha, lo=0.0, lo_open=True)
        bad = [t for t in self.targets if t not in PROJECTIONS]
        require(
            bool(not bad and (not self.rank or self.targets)),
            "LoRAConfig.targets",
            expected=f"a non-empty subset of {list(PROJECTIONS)}",
            received=self.targets,
            fix="e.g. targets=('wq', 'wv')",
        )

    @property
    def enabled(self) -> bool:
        return self.rank > 0


def init_adapters(cfg: LoRAConfig, base: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """``{"layers.wq.lora_a": [L, in, r], "layers.wq.lora_b": [L, r, out], ...}``."""
    rng = np.random.default_rng(cfg.seed)
    out = {}
    for t in cfg.targets:
        w = base[f"layers.{t}"]
        n_layers, d_in, d_out = w.shape
        a = rng.standard_normal((n_layers, d_in, cfg.rank)).astype(np.float32) / np.sqrt(d_in)
        out[f"layers.{t}.lora_a"] = jnp.asarray(a, w.dtype)
        out[f"layers.{t}.lora_b"] = jnp.zeros((n_layers, cfg.rank, d_out), w.dtype)
    return out


class MergedWeights(dict):
    """Full weights ``{name: array}`` (a plain dict to every reader) that also remember how they were
    made: ``lora`` (the config), ``base`` and ``adapters``, so a push can send the adapters alone.
    As a pytree it flattens like a dict and unflattens to a plain dict (jit, tree.map)."""

    lora: LoRAConfig
    base: dict[str, jax.Array]
    adapters: dict[str, jax.Array]


jax.tree_util.register_pytree_with_keys(
    MergedWeights,
    lambda m: ([(jax.tree_util.DictKey(k), m[k]) for k in sorted(m)], tuple(sorted(m))),
    lambda keys, values: dict(zip(keys, values)),
    flatten_func=lambda m: ([m[k] for k in sorted(m)], tuple(sorted(m))),
)


def adapter_keys(cfg: LoRAConfig) -> list[str]:
    """The adapter arrays of ``cfg``, in push order: ``layers.<t>.lora_a``, ``layers.<t>.lora_b`` per target."""
    return [f"layers.{t}.lora_{x}" for t in cfg.targets for x in "ab"]


def merged_delta(cfg: LoRAConfig, a: jax.Array, b: jax.Array) -> jax.Array:
    """``(alpha / r) A @ B``: [L, in, r] x [L, r, out] -> [L, in, out]."""
    return (cfg.alpha / cfg.rank) * jnp.einsum("lir,lro->lio", a, b)


def merge(
    cfg: LoRAConfig, base: dict[str, jax.Array], adapters: dict[str, jax.Array]
) -> MergedWeights:
    """Effective weights ``W + (alpha / r) A @ B`` on the targets; other weights are the base's."""
    out = MergedWeights(base)
    for t in cfg.targets:
        a, b = adapters[f"layers.{t}.lora_a"], adapters[f"layers.{t}.lora_b"]
        out[f"layers.{t}"] = base[f"layers.{t}"] + merged_delta(cfg, a, b)
    out.lora, out.base, out.adapters = cfg, base, adapters
    return out


def nbytes(tree: dict[str, jax.Array]) -> int:
    """Bytes of the arrays of a flat dict (what a push of it moves)."""
    return int(sum(np.dtype(v.dtype).itemsize * int(np.prod(v.shape)) for v in tree.values()))
