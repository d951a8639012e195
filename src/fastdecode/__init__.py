"""fastdecode: PyTorch-native LLM text generation."""

from .config import ModelArgs, RopeScaling, PRESETS, get_preset
from .errors import FastDecodeError
from .generate import Completion, GenerationConfig
from .llm import LLM, load
from .sampling import SamplingParams

__all__ = [
    "LLM", "load", "Completion", "GenerationConfig", "SamplingParams", "ModelArgs", "RopeScaling",
    "PRESETS", "get_preset", "FastDecodeError",
]
__version__ = "0.1.0"
