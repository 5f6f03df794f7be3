"""LoRA: low-rank adapters on chosen projections of the flat parameter dict; only adapters train.

Weights are flat ``{"layers.wq": [L, in, out], ...}`` (see :mod:`gymllm.models.transformer`).
An adapter on ``layers.wq`` is ``A [L, in, r]`` (small random) and ``B [L, r, out]`` (zeros), so the
adapted model starts equal to the base; the effective weight is ``W + (alpha / r) A @ B``.
:func:`merge` gives the full weights the engine runs (the base is never modified).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from gymllm.algos.config import check_range
from gymllm.errors import ConfigError, explain

PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """rank 0 = LoRA off (full fine-tuning); targets: projections among wq wk wv wo w_gate w_up w_down."""

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = ("wq", "wv")
    seed: int = 0

    def __post_init__(self) -> None:
        check_range("LoRAConfig", "rank", self.rank, lo=0)
        check_range("LoRAConfig", "alpha", self.alpha, lo=0.0, lo_open=True)
        bad = [t for t in self.targets if t not in PROJECTIONS]
        if bad or (self.rank and not self.targets):
            raise ConfigError(explain("LoRAConfig.targets", expected=f"a non-empty subset of {list(PROJECTIONS)}",
                                      received=self.targets, fix="e.g. targets=('wq', 'wv')"))

    @property
    def enabled(self) -> bool:
        return self.rank > 0


def init_adapters(cfg: LoRAConfig, base: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """``{"layers.wq.lora_a": [L, in, r], "layers.wq.lora_b": [L, r, out], ...}``."""
    rng = np.random.default_rng(cfg.seed)
    out = {}
    for t in cfg.targets:
        w = base[f"layers.{t}"]
        l, d_in, d_out = w.shape
        a = rng.standard_normal((l, d_in, cfg.rank)).astype(np.float32) / np.sqrt(d_in)
        out[f"layers.{t}.lora_a"] = jnp.asarray(a, w.dtype)
        out[f"layers.{t}.lora_b"] = jnp.zeros((l, cfg.rank, d_out), w.dtype)
    return out


def merge(cfg: LoRAConfig, base: dict[str, jax.Array], adapters: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Effective weights ``W + (alpha / r) A @ B`` on the targets; other weights are the base's."""
    scale = cfg.alpha / cfg.rank
    out = dict(base)
    for t in cfg.targets:
        a, b = adapters[f"layers.{t}.lora_a"], adapters[f"layers.{t}.lora_b"]
        out[f"layers.{t}"] = base[f"layers.{t}"] + scale * jnp.einsum("lir,lro->lio", a, b)
    return out
