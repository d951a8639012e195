"""`fastdecode bench`: fastdecode's modes side by side with transformers and llama.cpp."""

from .cli import main
from .options import MODES, PEERS, BenchSettings

__all__ = ["main", "BenchSettings", "MODES", "PEERS"]
