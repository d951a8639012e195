"""The acceptance rule of speculative sampling with a draft model.

A draft token x was drawn from the draft's distribution q. It is kept with
probability min(1, p(x) / q(x)), where p is the target's distribution at the
same position; otherwise the token is drawn from max(p - q, 0), normalized.
Either way the token that comes out is distributed exactly as p (Leviathan et
al. 2023, Chen et al. 2023), whatever q is, provided x really came from q.
"""

from __future__ import annotations

from torch import Tensor

from .ops import draw_from


def accept_or_resample(p: Tensor, q: Tensor, draft: Tensor, uniform: Tensor, resample: Tensor) -> tuple[Tensor, Tensor]:
    """p, q: [B, V] target and draft probabilities; draft: [B] tokens drawn from q;
    uniform, resample: [B] independent U[0, 1) draws, for the test and for the resample.
    Returns (accepted [B] bool, token [B]): the draft where accepted, else the resample."""
    px = p.gather(-1, draft[:, None])[:, 0]
    qx = q.gather(-1, draft[:, None])[:, 0]
    accepted = uniform * qx < px  # u < p/q without dividing; p(x) = 0 never accepts
    residual = (p - q).clamp_min(0)
    # Where p <= q everywhere, p == q and every draft is accepted; rounding can still
    # reject, and then p itself is the right distribution to draw from.
    residual = residual.where(residual.sum(-1, keepdim=True) > 0, p)
    resampled = draw_from(residual, resample)  # i with probability w_i / sum(w): no normalizing needed
    return accepted, draft.where(accepted, resampled)
