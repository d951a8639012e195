"""fastdecode: PyTorch-native LLM text generation."""

from .api.build import load
from .api.llm import LLM
from .engine.request import Completion, GenerationConfig
from .errors import FastDecodeError
from .model.args import ModelArgs, RopeScaling, PRESETS, get_preset
from .sampling import SamplingParams
from .structured import Constraint
from .version import __version__

__all__ = [
    "LLM", "load", "Completion", "GenerationConfig", "SamplingParams", "ModelArgs", "RopeScaling",
    "PRESETS", "get_preset", "FastDecodeError", "Constraint",
]
