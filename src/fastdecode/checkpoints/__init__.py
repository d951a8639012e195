"""Real checkpoints: GGUF files and Hugging Face directories, with their own tokenizers.

    ckpt = load_checkpoint(default_model_path(), dtype=torch.float32, device="cpu")
    ckpt.args, ckpt.state_dict, ckpt.tokenizer
"""

from .cache import cache_root, clear_cache
from .hf_tokenizer import HFTokenizer
from .loader import Checkpoint, load_checkpoint
from .registry import CHECKPOINTS, INSTALL_COMMAND, default_model_path, resolve_checkpoint_name, suggest

__all__ = [
    "Checkpoint", "load_checkpoint", "default_model_path", "resolve_checkpoint_name", "suggest", "CHECKPOINTS",
    "INSTALL_COMMAND", "clear_cache", "cache_root", "HFTokenizer",
]
