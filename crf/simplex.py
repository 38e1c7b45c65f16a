"""Euclidean projection onto the probability simplex, per pixel (last dimension).

Sort-based algorithm (Held, Wolfe and Crowder 1974; Duchi et al., ICML 2008, Fig. 1):
``y = max(v - theta, 0)`` with ``theta = (sum_{j <= rho} u_j - 1) / rho`` for the sorted
``u`` and the largest ``rho`` with ``u_rho > (sum_{j <= rho} u_j - 1) / rho``. O(M log M).
(Michelot's sort-free iteration was measured 2-3x slower in torch for M = 21 on CPU.)
"""

from __future__ import annotations

import torch

__all__ = ["project_simplex"]


def project_simplex(v: torch.Tensor) -> torch.Tensor:
    """Project each row ``v[..., :]`` onto ``{y >= 0, sum y = 1}``."""
    m = v.shape[-1]
    u, _ = torch.sort(v, dim=-1, descending=True)
    css = torch.cumsum(u, -1) - 1.0
    ind = torch.arange(1, m + 1, dtype=v.dtype, device=v.device)
    cond = (u - css / ind) > 0
    rho = cond.to(torch.int64).cumsum(-1).argmax(-1, keepdim=True)  # last True index
    theta = torch.gather(css, -1, rho) / (rho + 1).to(v.dtype)
    return torch.clamp(v - theta, min=0.0)
