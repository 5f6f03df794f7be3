"""``ModelConfig``: one frozen config for the decoder-only families gymllm runs.

One dataclass covers Llama (SmolLM2), Qwen2/Qwen2.5 (q/k/v biases), Qwen3 (q/k RMSNorm) and
Gemma 3 (GeGLU, (1 + w) norms, post-attention/FFN norms, embedding scale, local/global
sliding-window layers with their own RoPE bases, optional soft-capping). The per-family
differences are plain fields, so the forward pass is one code path; :func:`family_defaults` holds
what each family fixes. The config is hashable (tuples only), so it can be a static jit argument.

Conversions to and from a Hugging Face ``config.json`` dict live here too
(:meth:`ModelConfig.from_hf`, :meth:`ModelConfig.to_hf`), accepting both the 4.x keys
(``rope_theta``, ``rope_scaling``) and the 5.x ``rope_parameters``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from gymllm.validation import field_error, require

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3")
ACTIVATIONS = ("silu", "gelu_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")
ROPE_TYPES = ("default", "linear", "llama3")
#: a model's sizes (positive ints); with ``seed``, what builds a tiny model (``tiny-<family>``)
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
)
TINY_FIELDS = ("seed", *SIZE_FIELDS)

# What each family fixes (everything else is a size): Llama's choices, and what each other family
# changes of them (Qwen's norm epsilon and RoPE base, then its biases or qk-norm; Gemma 3's norms,
# activation, embedding scale and local RoPE base).
_LLAMA = dict(
    activation="silu",
    attention_bias=False,
    qk_norm=False,
    norm_plus_one=False,
    post_norms=False,
    embed_scale=False,
    rms_norm_eps=1e-5,
    rope_theta=10_000.0,
)
_QWEN = {**_LLAMA, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0}
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": _LLAMA,
    "qwen2": {**_QWEN, "attention_bias": True},
    "qwen3": {**_QWEN, "qk_norm": True},
    "gemma3": {
        **_QWEN,
        "activation": "gelu_tanh",
        "qk_norm": True,
        "norm_plus_one": True,
        "post_norms": True,
        "embed_scale": True,
        "rope_local_theta": 10_000.0,
    },
}

_HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}


def family_defaults(family: str) -> dict[str, Any]:
    """The fields a family fixes (activation, biases, norm style, ...)."""
    require(
        family in _FAMILY_DEFAULTS,
        "ModelConfig.family",
        expected=f"one of {FAMILIES}",
        received=family,
        fix="pick a supported family",
    )
    return dict(_FAMILY_DEFAULTS[family])


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Sizes and family switches of one decoder-only transformer."""

    family: str = "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0: hidden_size // num_heads (stored resolved after validation)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10_000.0  # global (full-attention) layers
    rope_local_theta: float = 0.0  # sliding layers; 0: same as rope_theta
    rope_scaling: tuple[
        tuple[str, Any], ...
    ] = ()  # e.g. (("rope_type", "llama3"), ("factor", 8.0), ...)
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    qk_norm: bool = False  # RMSNorm on q and k per head (Qwen3, Gemma 3)
    norm_plus_one: bool = False  # norms scale by (1 + w) (Gemma)
    post_norms: bool = False  # norms after attention and MLP outputs (Gemma 3)
    embed_scale: bool = False  # multiply embeddings by sqrt(hidden_size) (Gemma)
    activation: str = "silu"
    query_pre_attn_scalar: float = 0.0  # 0: scale scores by head_dim ** -0.5
    sliding_window: int = 0  # 0: no sliding window
    layer_types: tuple[str, ...] = ()  # per layer; () means all "full_attention"
    attn_logit_softcap: float = 0.0  # 0: off
    final_logit_softcap: float = 0.0  # 0: off
    max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        def bad(field: str, expected: str, fix: str) -> None:
            raise field_error(self, field, expected, fix, what=f"ModelConfig.{field}")

        if self.family not in FAMILIES:
            bad("family", f"one of {FAMILIES}", "pick a supported family")
        for f in SIZE_FIELDS:
            if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                bad(f, "a positive int", f"set {f} > 0")
        if self.num_heads % self.num_kv_heads:
            bad(
                "num_kv_heads",
                f"a divisor of num_heads={self.num_heads}",
                "use grouped-query sizes that divide",
            )
        if self.head_dim < 0 or (self.head_dim == 0 and self.hidden_size % self.num_heads):
            bad(
                "head_dim",
                "> 0, or 0 with hidden_size divisible by num_heads",
                "set head_dim explicitly",
            )
        object.__setattr__(
            self, "head_dim", self.resolved_head_dim
        )  # canonical: equal configs hash equal
        if self.resolved_head_dim % 2:
            bad("head_dim", "an even number (RoPE rotates pairs)", "use an even head_dim")
        if self.activation not in ACTIVATIONS:
            bad("activation", f"one of {ACTIVATIONS}", "pick a supported activation")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            bad(
                "layer_types",
                f"{self.num_layers} entries (num_layers)",
                "give one type per layer or ()",
            )
        if any(t not in LAYER_TYPES for t in self.layer_types):
            bad("layer_types", f"entries from {LAYER_TYPES}", "fix the layer type names")
        if "sliding_attention" in self.layer_types and self.sliding_window <= 0:
            bad("sliding_window", "> 0 when a layer is 'sliding_attention'", "set sliding_window")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            bad(
                "rms_norm_eps" if self.rms_norm_eps <= 0 else "rope_theta",
                "> 0",
                "use a positive value",
            )
        rope_type = self.rope_scaling_dict.get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            bad("rope_scaling", f"rope_type in {ROPE_TYPES}", "use a supported RoPE scaling or ()")

    # ----- derived -----
    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling)

    @property
    def resolved_layer_types(self) -> tuple[str, ...]:
        return self.layer_types or ("full_attention",) * self.num_layers

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.resolved_head_dim) ** -0.5

    @property
    def embed_multiplier(self) -> float:
        return math.sqrt(self.hidden_size) if self.embed_scale else 1.0

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ----- constructors -----
    @classmethod
    def for_family(cls, family: str, **sizes: Any) -> "ModelConfig":
        """A config with the family's fixed switches and the given sizes.

        Gemma 3 gets its every-6th-layer-global pattern when ``sliding_window`` is given and
        ``layer_types`` is not.
        """
        fields = family_defaults(family)
        fields.update(sizes)
        if family == "gemma3" and fields.get("sliding_window") and not fields.get("layer_types"):
            fields["layer_types"] = gemma3_layer_types(fields["num_layers"])
        return cls(family=family, **fields)

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict (4.x or 5.x keys)."""
        model_type = hf.get("model_type", "")
        family = {
            "llama": "llama",
            "qwen2": "qwen2",
            "qwen3": "qwen3",
            "gemma3_text": "gemma3",
            "gemma3": "gemma3",
            "mistral": "llama",
        }.get(model_type)
        require(
            family is not None,
            "config.json model_type",
            expected="llama, qwen2, qwen3, gemma3_text",
            received=model_type,
            fix="use a checkpoint of a supported family",
        )
        if "text_config" in hf:  # multimodal Gemma 3 wrapper: the text part is what we run
            return cls.from_hf({"model_type": "gemma3_text", **hf["text_config"]})
        fd = family_defaults(family)
        rope = _hf_rope(hf, family, fd)
        layer_types = tuple(hf.get("layer_types") or ())
        sliding = int(hf.get("sliding_window") or 0)
        if family == "gemma3" and not layer_types and sliding:
            layer_types = gemma3_layer_types(
                hf["num_hidden_layers"], int(hf.get("sliding_window_pattern", 6))
            )
        if family != "gemma3" and not hf.get("use_sliding_window", False):
            layer_types, sliding = (), 0
        if layer_types and "sliding_attention" not in layer_types:
            layer_types = ()
        activation = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu_tanh", "silu": "silu"}.get(
            hf.get("hidden_activation") or hf.get("hidden_act") or fd["activation"], "unsupported"
        )
        return cls(
            family=family,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=int(hf["num_attention_heads"]),
            num_kv_heads=int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
            head_dim=int(hf.get("head_dim") or 0),
            rms_norm_eps=float(hf.get("rms_norm_eps", fd["rms_norm_eps"])),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
            attention_bias=bool(hf.get("attention_bias", fd["attention_bias"]))
            or family == "qwen2",
            qk_norm=fd["qk_norm"],
            norm_plus_one=fd["norm_plus_one"],
            post_norms=fd["post_norms"],
            embed_scale=fd["embed_scale"],
            activation=activation,
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar") or 0.0),
            sliding_window=sliding if layer_types else 0,
            layer_types=layer_types,
            # transformers' Gemma 3 stores attn_logit_softcapping but never applies it
            attn_logit_softcap=0.0
            if family == "gemma3"
            else float(hf.get("attn_logit_softcapping") or 0.0),
            final_logit_softcap=float(hf.get("final_logit_softcapping") or 0.0),
            max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
            **rope,
        )

    def to_hf(self) -> dict[str, Any]:
        """A Hugging Face ``config.json`` dict that transformers 4.x and 5.x both read."""
        rope_global = {
            "rope_type": "default",
            "rope_theta": self.rope_theta,
            **self.rope_scaling_dict,
        }
        out: dict[str, Any] = {
            "architectures": [_HF_ARCHITECTURES[self.family]],
            "model_type": _HF_MODEL_TYPES[self.family],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.resolved_head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": "float32",
        }
        if self.family == "gemma3":
            local = {"rope_type": "default", "rope_theta": self.rope_local_theta or self.rope_theta}
            out.update(
                hidden_activation="gelu_pytorch_tanh",
                query_pre_attn_scalar=int(self.query_pre_attn_scalar or self.resolved_head_dim),
                sliding_window=self.sliding_window or None,
                layer_types=list(self.resolved_layer_types),
                rope_local_base_freq=local["rope_theta"],
                rope_parameters={"full_attention": rope_global, "sliding_attention": local},
                final_logit_softcapping=self.final_logit_softcap or None,
                attn_logit_softcapping=self.attn_logit_softcap or None,
            )
            if self.rope_scaling:
                out["rope_scaling"] = self.rope_scaling_dict
        else:
            out.update(hidden_act="silu", rope_parameters=rope_global)
            if self.rope_scaling:
                out["rope_scaling"] = self.rope_scaling_dict
        return out


def gemma3_layer_types(num_layers: int, pattern: int = 6) -> tuple[str, ...]:
    """Gemma 3's default: every ``pattern``-th layer is global, the rest slide."""
    return tuple(
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(num_layers)
    )


def _hf_rope(hf: Mapping[str, Any], family: str, fd: dict[str, Any]) -> dict[str, Any]:
    """RoPE bases and scaling from either ``rope_theta``/``rope_scaling`` or ``rope_parameters``."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params:  # Gemma 3 style, per layer type
        glob, local = params["full_attention"], params.get("sliding_attention", {})
    else:
        glob, local = params, {}
    theta = float(glob.get("rope_theta") or hf.get("rope_theta") or fd["rope_theta"])
    local_theta = float(
        local.get("rope_theta") or hf.get("rope_local_base_freq") or fd.get("rope_local_theta", 0.0)
    )
    scaling = dict(hf.get("rope_scaling") or {})
    scaling.update({k: v for k, v in glob.items() if k != "rope_theta"})
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    scaling.pop("type", None)
    if scaling.get("rope_type", "default") == "default":
        scaling = {}
    keep = (
        "rope_type",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    )
    return dict(
        rope_theta=theta,
        rope_local_theta=local_theta if family == "gemma3" else 0.0,
        rope_scaling=tuple(sorted((k, v) for k, v in scaling.items() if k in keep)),
    )
