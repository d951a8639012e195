"""Model configuration: the typed `ModelArgs` dataclass and its named presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from .errors import FastDecodeError


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3-style frequency-dependent RoPE scaling ("rope_type": "llama3")."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.factor <= 0:
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


@dataclass(frozen=True)
class ModelArgs:
    """Shape and numerics of a Llama-family decoder (Llama, Mistral, Qwen2, SmolLM)."""

    dim: int
    n_layers: int
    n_heads: int
    vocab_size: int
    hidden_dim: int  # SwiGLU inner size
    n_kv_heads: Optional[int] = None  # None: same as n_heads (no grouping)
    head_dim: Optional[int] = None  # None: dim // n_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    max_seq_len: int = 2048
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has biases on q, k and v

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
        if self.n_heads % self.n_kv_heads:
            raise FastDecodeError(
                f"ModelArgs.n_heads ({self.n_heads}) must be a multiple of "
                f"n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise FastDecodeError(f"ModelArgs.head_dim must be even for RoPE, got {self.head_dim}")
        if not self.norm_eps > 0:
            raise FastDecodeError(f"ModelArgs.norm_eps must be > 0, got {self.norm_eps}")
        if not self.rope_theta > 0:
            raise FastDecodeError(f"ModelArgs.rope_theta must be > 0, got {self.rope_theta}")
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelArgs":
        """Build from a dict, ignoring keys that are not fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def replace(self, **changes: Any) -> "ModelArgs":
        return dataclasses.replace(self, **changes)


# Presets are found by exact name and every one gets random, seeded weights
# (llm.py); "tiny" is the fixture model for tests. The others copy a real
# model's shapes for benchmarks, and their names start with "random-" so that
# none is mistaken for the checkpoint it imitates.
PRESETS: dict[str, ModelArgs] = {
    "tiny": ModelArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=260,
        hidden_dim=160, max_seq_len=512, rope_theta=10000.0, tie_embeddings=False,
    ),
    "random-smollm2-135m": ModelArgs(  # the shapes of checkpoint smollm2-135m-instruct
        dim=576, n_layers=30, n_heads=9, n_kv_heads=3, vocab_size=49152,
        hidden_dim=1536, norm_eps=1e-5, rope_theta=100000.0, max_seq_len=8192,
        tie_embeddings=True,
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


__all__ = ["ModelArgs", "RopeScaling", "PRESETS", "get_preset"]
