"""A short memory-bandwidth probe, the ceiling decode bandwidth is compared with.

Decoding one token reads every weight once, so its speed limit is how fast the
machine streams memory. The probe copies a buffer much larger than the caches
a few times and keeps the best rate; a copy reads and writes each byte once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..engine import timing


@dataclass
class ProbeResult:
    bytes_per_s: float  # best rate over the repeats, counting read + write
    buffer_bytes: int
    repeats: int
    method: str = "torch copy_ (read + write), best of repeats"

    def to_dict(self) -> dict:
        return asdict(self)


def measure_bandwidth(device: torch.device, mib: int = 256, repeats: int = 5) -> ProbeResult:
    n = mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page once so first-touch faults are not timed
    best = float("inf")
    for _ in range(repeats):
        t0 = timing.now(device)
        dst.copy_(src)
        best = min(best, timing.now(device) - t0)
    nbytes = 2 * src.numel() * src.element_size()
    return ProbeResult(bytes_per_s=nbytes / best, buffer_bytes=src.numel() * src.element_size(),
                       repeats=repeats)
