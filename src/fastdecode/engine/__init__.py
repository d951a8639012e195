"""The continuous-batching engine: requests (request.py), the scheduler that
picks each step's work (scheduler.py) with the prefix index (prefix_cache.py),
the runner that executes it (runner.py), stopping (stopping.py), speculative
drafts (speculative.py, draft.py), timing (timing.py), the requests' output
stream (stream.py), and the engine that owns them (engine.py)."""

from .engine import DEFAULT_PREFILL_CHUNK, Engine, EngineThread
from .request import Completion, GenerationConfig, Request, RequestOutput, TokenLogprob

__all__ = ["Engine", "EngineThread", "Request", "RequestOutput", "Completion", "GenerationConfig", "TokenLogprob",
           "DEFAULT_PREFILL_CHUNK"]
