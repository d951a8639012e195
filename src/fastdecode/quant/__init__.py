"""Quantized weights: layouts (`formats`), modules (`linear`), the load-time transform (`transform`)."""

from .formats import GGUF_LAYOUTS, LAYOUT_VERSION
from .transform import (WEIGHTS, KernelChoice, apply_kernels, build_model, check_weights, native_ops,
                        quantize_state_dict)

__all__ = ["GGUF_LAYOUTS", "LAYOUT_VERSION", "WEIGHTS", "KernelChoice", "apply_kernels", "build_model",
           "check_weights", "native_ops", "quantize_state_dict"]
