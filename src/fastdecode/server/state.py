"""What the app's handlers share: settings, the loaded model (once loaded), metrics, lifecycle."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..api.llm import LLM
from .errors import APIError
from .metrics import Metrics


@dataclass
class ServerState:
    settings: Any  # ServeSettings
    llm: Optional[LLM] = None  # None while loading
    load_error: Optional[BaseException] = None
    draining: bool = False  # SIGTERM: new requests get 503
    active: int = 0  # HTTP requests being answered, streams included
    created: int = field(default_factory=lambda: int(time.time()))
    metrics: Metrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = Metrics(lambda: self.llm.engine.slots_in_use if self.llm else 0,
                               lambda: self.llm.engine.queue_length if self.llm else 0)

    @property
    def model_name(self) -> str:
        return self.settings.served_model_name

    def ready_llm(self) -> LLM:
        """The model, or 503 while it loads or the server shuts down."""
        if self.draining:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        if self.llm is None:
            raise APIError(503, "the model is loading; retry shortly (GET /health answers 200 when ready)",
                           code="loading", headers={"Retry-After": "1"})
        return self.llm
