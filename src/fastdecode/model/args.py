"""Model configuration: the typed `ModelArgs` dataclass and its named presets."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import FastDecodeError


def yarn_mscale(factor: float, m: float = 1.0) -> float:
    """YaRN's magnitude correction for stretching the context `factor` times: 0.1 m ln(factor) + 1
    (1 when factor <= 1). Its value at m = 1 scales cos and sin unless a checkpoint says otherwise."""
    return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling: Llama-3-style frequency-dependent ("llama3"), "linear" (every
    frequency divided by `factor`, as Gemma 3's global layers), "yarn" (Qwen's
    long-context setting: high frequencies kept, low ones divided by `factor`, a ramp
    between the dims that turn `beta_fast` and `beta_slow` times over the original
    context, and cos and sin scaled by `attention_factor`), or "longrope" (Phi-3.5 and
    Phi-4: each frequency divided by its own factor, `long_factor`'s where the engine's
    context is longer than the original one, else `short_factor`'s; cos and sin scaled
    by `attention_factor`, by default sqrt(1 + ln(factor) / ln(original context)))."""

    factor: float = 8.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 8192  # llama3, yarn, longrope
    kind: str = "llama3"  # one of KINDS; "linear" ignores the other fields
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: Optional[float] = None  # yarn, longrope; None: the default cos_sin_scale names
    truncate: bool = True  # yarn: the ramp's ends rounded to whole dims
    short_factor: tuple[float, ...] = ()  # longrope: a divisor per frequency (rotated dims / 2)
    long_factor: tuple[float, ...] = ()  # longrope

    KINDS = ("llama3", "linear", "yarn", "longrope")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise FastDecodeError(f"rope_scaling.kind must be one of {', '.join(self.KINDS)}, got {self.kind!r}")
        if not self.factor > 0:
            raise FastDecodeError(f"rope_scaling.factor must be > 0, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise FastDecodeError(
                "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )
        if self.original_max_position_embeddings < 1:
            raise FastDecodeError(
                "rope_scaling.original_max_position_embeddings must be >= 1, got "
                f"{self.original_max_position_embeddings}"
            )
        if not (0 < self.beta_slow <= self.beta_fast < math.inf):
            raise FastDecodeError(
                f"rope_scaling needs 0 < beta_slow <= beta_fast, got {self.beta_slow} and {self.beta_fast}")
        if self.attention_factor is not None and not 0 < self.attention_factor < math.inf:
            raise FastDecodeError(f"rope_scaling.attention_factor must be > 0, got {self.attention_factor}")
        for name in ("short_factor", "long_factor"):
            values = tuple(getattr(self, name))  # a tuple (JSON gives lists), so that args compare and hash
            object.__setattr__(self, name, values)
            if self.kind == "longrope" and (not values or any(
                    isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf for v in values)):
                raise FastDecodeError(f"rope_scaling.{name} must be a list of numbers > 0, got {list(values)[:4]}")
        if self.kind == "longrope" and len(self.short_factor) != len(self.long_factor):
            raise FastDecodeError(f"rope_scaling's short_factor and long_factor must be as long as each other, got "
                                  f"{len(self.short_factor)} and {len(self.long_factor)}")

    def context(self, declared: int) -> int:
        """The positions a checkpoint declaring `declared` runs: YaRN stretches its original
        context `factor` times (a Qwen config keeps its 40,960 beside factor 4 over 32,768)."""
        if self.kind != "yarn":
            return declared
        return max(declared, min(int(self.original_max_position_embeddings * self.factor), MAX_POSITIONS))

    @property
    def cos_sin_scale(self) -> float:
        """What cos and sin are multiplied by (so q.k by its square): yarn's and longrope's attention
        factor, else 1."""
        if self.kind not in ("yarn", "longrope"):
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.kind == "yarn":
            return yarn_mscale(self.factor)
        if self.factor <= 1:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_position_embeddings))


LAYER_TYPES = ("global", "sliding")
ROUTERS = ("softmax", "sigmoid")
NORMS = ("rms", "layer")
# "swiglu_oai" (gpt-oss): gate clamped above at glu_limit, up to +-glu_limit, then
# gate * sigmoid(glu_alpha * gate) * (up + 1).
ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "swiglu_oai")
# Most positions a model may declare: above every real context length (Llama 4 Scout's 10,485,760),
# and every position exact in the float32 RoPE angles (rope_angles).
MAX_POSITIONS = 1 << 24
MAX_LAYERS = 4096  # a sanity bound (the largest open models have ~130): each layer is modules and tensors


@dataclass(frozen=True)
class ModelArgs:
    """Shape and numerics of one decoder for every family we load.

    Llama, SmolLM and Mistral use the defaults (Mistral may set a sliding
    window); Qwen2 adds q/k/v biases, Qwen3 QK-norm; Gemma 3 sets all of the
    Gemma fields below; SmolLM3 its layers without RoPE, Granite its multipliers, OLMo 2
    its norms after each sublayer only and QK-norm over all heads, Gemma 2 its soft-capping,
    Phi-3 its partial rotary and LongRoPE, Mixtral, Qwen 2/3 MoE, OLMoE and Granite MoE their experts,
    gpt-oss its experts with biases, clamped SwiGLU and attention sinks.
    Each field is one named difference, not a family name.
    """

    dim: int
    n_layers: int
    n_heads: int
    vocab_size: int
    hidden_dim: int  # the gated MLP's inner size
    n_kv_heads: Optional[int] = None  # None: same as n_heads (no grouping)
    head_dim: Optional[int] = None  # None: dim // n_heads
    rope_dim: Optional[int] = None  # dims of each head RoPE rotates, the first ones (Phi-4's 3/4); None: head_dim
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    max_seq_len: int = 2048
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has biases on q, k and v
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3, Gemma 3)
    qk_norm_full: bool = False  # with qk_norm: over all of q's (and k's) heads at once, not each head (OLMo 2)
    qk_norm_after_rope: bool = False  # with qk_norm: applied to the rotated q and k (Hunyuan's), not before
    pre_norms: bool = True  # RMSNorm before the attention and the MLP; False: OLMo 2's post-norms only
    norm: str = "rms"  # the blocks' and the final norm: "rms", or "layer" (mean-centred, a weight, no bias: Cohere's)
    # Cohere's block: the attention and the MLP read one normalized input and join the residual together
    parallel_block: bool = False
    # Sliding-window attention: a query at position p attends to keys p - window < j <= p
    # on "sliding" layers, to all keys j <= p on "global" ones. layer_types=None means
    # every layer is sliding when a window is set (Mistral), global otherwise.
    sliding_window: Optional[int] = None
    layer_types: Optional[tuple[str, ...]] = None  # per layer: "global" or "sliding"
    rope_local_theta: Optional[float] = None  # RoPE base of the sliding layers (Gemma 3); None: rope_theta
    attn_scale: Optional[float] = None  # softmax scale; None: head_dim ** -0.5 (Gemma 3: query_pre_attn_scalar ** -0.5)
    # gated MLP: SwiGLU ("silu"), or GeGLU with tanh-approximate GELU ("gelu_tanh", Gemma) or exact GELU
    # ("gelu": Gemma 1's config as transformers 5 reads it)
    activation: str = "silu"
    glu_alpha: float = 1.702  # swiglu_oai's
    glu_limit: float = 7.0
    embed_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(dim))
    post_norms: bool = False  # RMSNorm on the attention and MLP outputs before the residual add (Gemma 3)
    # Ministral 3 (Llama 4's rule): queries at position p are multiplied, after RoPE, by
    # 1 + query_scale_beta * ln(1 + floor(p / query_scale_period)); 0: not scaled.
    query_scale_beta: float = 0.0
    query_scale_period: int = 8192
    # Layers whose attention has no position encoding (NoPE: SmolLM3's every fourth layer).
    nope_layers: tuple[int, ...] = ()
    # Granite's multipliers: the attention and MLP outputs are multiplied by residual_scale
    # before the residual add, and the logits divided by logits_scaling.
    residual_scale: float = 1.0
    logits_scaling: float = 1.0
    # Gemma 2's soft-capping, x -> cap tanh(x / cap): of the attention scores (after the softmax
    # scale) and of the logits (after logits_scaling); 0: none.
    attn_softcap: float = 0.0
    logit_softcap: float = 0.0
    # Mixture of experts (Mixtral, Qwen 2/3 MoE, OLMoE, Granite MoE): a layer's MLP is the weighted sum of the
    # n_experts_used of its n_experts gated MLPs (of expert_hidden_dim; None: hidden_dim) that a
    # softmax router ranks highest for the token, weighted by their probabilities, renormalized
    # over the chosen ones where norm_expert_weights. 0 experts: a dense MLP.
    n_experts: int = 0
    n_experts_used: int = 0
    expert_hidden_dim: Optional[int] = None
    norm_expert_weights: bool = True
    # A shared expert: a gated MLP of this size every token runs, added to the experts' sum, scaled
    # by sigmoid(w . x) where shared_expert_gate (Qwen2-MoE; Granite MoE's is not scaled); 0: none.
    shared_expert_dim: int = 0
    shared_expert_gate: bool = True
    dense_layers: tuple[int, ...] = ()  # an MoE model's layers with a dense MLP (Qwen3-MoE's mlp_only_layers)
    expert_bias: bool = False  # the router's and the experts' matrices have biases (gpt-oss)
    # The router's scores: "softmax" over the experts, or each expert's "sigmoid" (LFM2-MoE), the top k
    # chosen by score plus a learned per-expert selection bias where expert_selection_bias (which does not
    # weight them); the chosen weights are multiplied by routed_scale after any renormalizing.
    router: str = "softmax"
    expert_selection_bias: bool = False
    routed_scale: float = 1.0
    # gpt-oss's attention: a bias on the output projection too, and a learned logit per query head
    # that joins each softmax's sum as a key of no value ("attention sink").
    attn_out_bias: bool = False
    attn_sinks: bool = False
    # LFM2: layers whose token mixer is a gated short convolution over the last conv_kernel positions
    # (model/short_conv.py) in place of attention. Its state, the last conv_kernel - 1 inputs of each
    # cache slot, cannot be rewound as a KV cache can, so such a model runs eagerly, without prefix
    # reuse or speculation.
    conv_layers: tuple[int, ...] = ()
    conv_kernel: int = 3

    def __post_init__(self) -> None:
        # Derived fields are filled in here so every consumer sees concrete ints.
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.head_dim is None and self.n_heads > 0:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                     "vocab_size", "hidden_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise FastDecodeError(f"ModelArgs.{name} must be an integer >= 1, got {value!r}")
        if self.n_layers > MAX_LAYERS:
            raise FastDecodeError(f"ModelArgs.n_layers must be at most {MAX_LAYERS:,}, got {self.n_layers:,}")
        if self.max_seq_len > MAX_POSITIONS:
            raise FastDecodeError(f"ModelArgs.max_seq_len must be at most {MAX_POSITIONS:,} (positions are exact "
                                  f"in float32 RoPE angles up to there), got {self.max_seq_len:,}")
        if self.n_heads % self.n_kv_heads:
            raise FastDecodeError(
                f"ModelArgs.n_heads ({self.n_heads}) must be a multiple of "
                f"n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise FastDecodeError(f"ModelArgs.head_dim must be even for RoPE, got {self.head_dim}")
        r = self.rope_dim
        if r is not None and (not isinstance(r, int) or isinstance(r, bool) or r < 2 or r % 2 or r > self.head_dim):
            raise FastDecodeError(f"ModelArgs.rope_dim must be an even integer from 2 to head_dim "
                                  f"({self.head_dim}), got {r!r}")
        if not self.norm_eps > 0:
            raise FastDecodeError(f"ModelArgs.norm_eps must be > 0, got {self.norm_eps}")
        if not self.rope_theta > 0:
            raise FastDecodeError(f"ModelArgs.rope_theta must be > 0, got {self.rope_theta}")
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        s = self.rope_scaling
        if s is not None and s.kind == "longrope" and len(s.short_factor) != self.rotary_dim // 2:
            raise FastDecodeError(f"rope_scaling's factors must be one per frequency ({self.rotary_dim // 2}), "
                                  f"got {len(s.short_factor)}")
        self._check_attention_variants()
        self._check_experts()
        self._check_layer_list("conv_layers")
        k = self.conv_kernel
        if not isinstance(k, int) or isinstance(k, bool) or k < 2:
            raise FastDecodeError(f"ModelArgs.conv_kernel must be an integer >= 2, got {k!r}")
        if len(self.conv_layers) == self.n_layers:
            raise FastDecodeError("ModelArgs.conv_layers leaves no attention layer; a model needs at least one")

    def _check_experts(self) -> None:
        for name in ("n_experts", "n_experts_used", "shared_expert_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise FastDecodeError(f"ModelArgs.{name} must be an integer >= 0, got {value!r}")
        if self.expert_hidden_dim is None:
            object.__setattr__(self, "expert_hidden_dim", self.hidden_dim)
        e = self.expert_hidden_dim
        if not isinstance(e, int) or isinstance(e, bool) or e < 1:
            raise FastDecodeError(f"ModelArgs.expert_hidden_dim must be an integer >= 1, got {e!r}")
        if self.n_experts and not 1 <= self.n_experts_used <= self.n_experts:
            raise FastDecodeError(f"ModelArgs.n_experts_used must be from 1 to n_experts ({self.n_experts}), "
                                  f"got {self.n_experts_used}")
        if not self.n_experts and (self.n_experts_used or self.shared_expert_dim or self.expert_bias
                                   or self.expert_selection_bias):
            raise FastDecodeError("ModelArgs.n_experts_used, shared_expert_dim, expert_bias and expert_selection_bias "
                                  "need n_experts > 0")
        if self.router not in ROUTERS:
            raise FastDecodeError(f"ModelArgs.router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if not 0 < self.routed_scale < math.inf:
            raise FastDecodeError(f"ModelArgs.routed_scale must be > 0, got {self.routed_scale}")
        self._check_layer_list("dense_layers")

    def _check_layer_list(self, name: str) -> None:
        layers = tuple(getattr(self, name))  # a tuple (JSON gives lists), so that args compare and hash by value
        object.__setattr__(self, name, layers)
        if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.n_layers for i in layers) or (
                list(layers) != sorted(set(layers))):
            raise FastDecodeError(f"ModelArgs.{name} must be distinct layer indexes below {self.n_layers}, "
                                  f"in order; got {list(layers)}")

    def experts(self, layer: int) -> int:
        """How many experts layer `layer`'s MLP routes between; 0: a dense MLP."""
        return 0 if layer in self.dense_layers else self.n_experts

    def _check_attention_variants(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise FastDecodeError(f"ModelArgs.activation must be one of {', '.join(ACTIVATIONS)}, "
                                  f"got {self.activation!r}")
        if not (0 < self.glu_alpha < math.inf and 0 < self.glu_limit < math.inf):
            raise FastDecodeError(f"ModelArgs.glu_alpha and glu_limit must be > 0, got {self.glu_alpha}, "
                                  f"{self.glu_limit}")
        if self.attn_scale is not None and not self.attn_scale > 0:
            raise FastDecodeError(f"ModelArgs.attn_scale must be > 0, got {self.attn_scale}")
        if self.rope_local_theta is not None and not self.rope_local_theta > 0:
            raise FastDecodeError(f"ModelArgs.rope_local_theta must be > 0, got {self.rope_local_theta}")
        if not 0 <= self.query_scale_beta < math.inf:
            raise FastDecodeError(f"ModelArgs.query_scale_beta must be >= 0, got {self.query_scale_beta}")
        if not isinstance(self.query_scale_period, int) or self.query_scale_period < 1:
            raise FastDecodeError(f"ModelArgs.query_scale_period must be an integer >= 1, "
                                  f"got {self.query_scale_period!r}")
        for name in ("embed_scale", "residual_scale", "logits_scaling"):
            if not 0 < getattr(self, name) < math.inf:
                raise FastDecodeError(f"ModelArgs.{name} must be > 0, got {getattr(self, name)}")
        for name in ("attn_softcap", "logit_softcap"):
            if not 0 <= getattr(self, name) < math.inf:
                raise FastDecodeError(f"ModelArgs.{name} must be >= 0 (0: no capping), got {getattr(self, name)}")
        self._check_layer_list("nope_layers")
        w = self.sliding_window
        if w is not None:
            if not isinstance(w, int) or isinstance(w, bool) or w < 1:
                raise FastDecodeError(f"ModelArgs.sliding_window must be an integer >= 1, got {w!r}")
            if w > self.max_seq_len:
                raise FastDecodeError(f"sliding window of {w} positions is larger than the context of "
                                      f"{self.max_seq_len} (max_seq_len)")
        if (self.qk_norm_full or self.qk_norm_after_rope) and not self.qk_norm:
            raise FastDecodeError("ModelArgs.qk_norm_full and qk_norm_after_rope need qk_norm")
        if not (self.pre_norms or self.post_norms):
            raise FastDecodeError("ModelArgs needs pre_norms or post_norms (a block with no norm at all)")
        if self.norm not in NORMS:
            raise FastDecodeError(f"ModelArgs.norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        if self.parallel_block and (self.post_norms or not self.pre_norms):
            raise FastDecodeError("ModelArgs.parallel_block needs pre_norms and no post_norms (one norm a block)")
        if self.layer_types is None:
            return
        # A tuple (JSON gives lists), so that args compare and hash by value.
        types = tuple(self.layer_types)
        object.__setattr__(self, "layer_types", types)
        if len(types) != self.n_layers or any(t not in LAYER_TYPES for t in types):
            raise FastDecodeError(f"ModelArgs.layer_types must name {self.n_layers} layers, each one of "
                                  f"{', '.join(LAYER_TYPES)}; got {list(types)}")
        if "sliding" in types and w is None:
            raise FastDecodeError("ModelArgs.layer_types has sliding layers but sliding_window is not set")

    @property
    def eager_only(self) -> Optional[str]:
        """What keeps this model on the eager steps (no compile, no exported package, tp 1), or None:
        experts chosen by the tokens, or LFM2's convolutions with their state per slot."""
        if self.n_experts:
            return "mixture-of-experts models"
        return "LFM2's convolution layers" if self.conv_layers else None

    @property
    def attention_layers(self) -> int:
        """How many layers attend (and hold a KV cache): all but the convolution layers."""
        return self.n_layers - len(self.conv_layers)

    @property
    def rotary_dim(self) -> int:
        """The dims of each head RoPE rotates (rope_dim, else all of head_dim)."""
        return self.rope_dim or self.head_dim

    def window(self, layer: int) -> int:
        """The sliding window of layer `layer` in positions, 0 for a global layer."""
        if self.sliding_window is None:
            return 0
        if self.layer_types is not None and self.layer_types[layer] == "global":
            return 0
        return self.sliding_window

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelArgs":
        """Build from a dict, ignoring keys that are not fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def replace(self, **changes: Any) -> "ModelArgs":
        return dataclasses.replace(self, **changes)


# Presets are found by exact name and every one gets random, seeded weights
# (api/llm.py); "tiny" is the fixture model for tests. The others copy a real
# model's shapes for benchmarks, and their names start with "random-" so that
# none is mistaken for the checkpoint it imitates.
PRESETS: dict[str, ModelArgs] = {
    "tiny": ModelArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=260,
        hidden_dim=160, max_seq_len=512, rope_theta=10000.0, tie_embeddings=False,
    ),
    # The fixture for the Gemma 3 differences: a sliding layer (window 16) then a
    # global one, QK-norm, two RoPE bases, GeGLU, scaled embedding, post-norms.
    "tiny-gemma3": ModelArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=260, hidden_dim=160, max_seq_len=512,
        rope_theta=10000.0, tie_embeddings=True, qk_norm=True, sliding_window=16,
        layer_types=("sliding", "global"), rope_local_theta=100.0, attn_scale=24 ** -0.5,
        activation="gelu_tanh", embed_scale=8.0, post_norms=True,
    ),
    "random-smollm2-135m": ModelArgs(  # the shapes of checkpoint smollm2-135m-instruct
        dim=576, n_layers=30, n_heads=9, n_kv_heads=3, vocab_size=49152,
        hidden_dim=1536, norm_eps=1e-5, rope_theta=100000.0, max_seq_len=8192,
        tie_embeddings=True,
    ),
    "random-gemma3-270m": ModelArgs(  # the shapes of checkpoint gemma3-270m
        dim=640, n_layers=18, n_heads=4, n_kv_heads=1, head_dim=256, vocab_size=262144, hidden_dim=2048,
        norm_eps=1e-6, rope_theta=1_000_000.0, max_seq_len=32768, tie_embeddings=True, qk_norm=True,
        sliding_window=512, layer_types=tuple("global" if (i + 1) % 6 == 0 else "sliding" for i in range(18)),
        rope_local_theta=10000.0, attn_scale=256 ** -0.5, activation="gelu_tanh", embed_scale=640 ** 0.5,
        post_norms=True,
    ),
}


def get_preset(name: str) -> ModelArgs:
    """Return the preset called exactly `name`, or fail listing the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise FastDecodeError(
            f"unknown model preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}"
        ) from None


__all__ = ["ModelArgs", "RopeScaling", "PRESETS", "get_preset", "yarn_mscale"]
