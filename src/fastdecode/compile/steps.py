"""`Steps`: the model step as the engine calls it, whichever strategy built it.

Every compile strategy (strategies.py), an exported package (aot.py) and the
package-when-ready switch (background.py) return one; the engine and its runner
take one. It is the interface between the engine and compiling, kept here so that
neither side imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from torch import Tensor

# (tokens [B, T], input_pos [B, T], rows [B], logits_at [R, n]) -> logits [R, n, V] of those
# tokens, flat indices b * T + t (each row's last token for prefill and decode, every one to
# verify drafts, the decode rows and each prompt's last in a mixed step)
StepFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass
class Steps:
    """step: the model step for prefill chunks and decode alike (a decode step
    is a prefill of one token); warmup() compiles every graph up front."""

    step: StepFn
    warmup: Callable[[], None] = field(default=lambda: None)
    # Set by the `generate` strategy: decodes K tokens per call (see loop.py).
    chunk: Optional[object] = None
    # Called by the engine between requests only (none in flight): steps that can
    # change what they run (background.PackageWhenReady) change it here.
    refresh: Callable[[], None] = field(default=lambda: None)
    compiled: Optional[str] = None  # the exported package these steps run, if any
