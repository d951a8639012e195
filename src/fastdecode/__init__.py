"""fastdecode: PyTorch-native LLM text generation."""

from .api.generate import Completion, GenerationConfig
from .api.llm import LLM, load
from .errors import FastDecodeError
from .model.args import ModelArgs, RopeScaling, PRESETS, get_preset
from .sampling import SamplingParams

__all__ = [
    "LLM", "load", "Completion", "GenerationConfig", "SamplingParams", "ModelArgs", "RopeScaling",
    "PRESETS", "get_preset", "FastDecodeError",
]
__version__ = "0.1.0"
