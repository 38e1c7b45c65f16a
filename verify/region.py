"""Input regions and output specifications of the public API, validated with clear errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from bounds.errors import InvalidRegionError, ShapeMismatchError
from bounds.types import Interval


def as_tensor(value: Any, name: str, dtype: torch.dtype, device: torch.device | None) -> Tensor:
    """`value` (tensor, array, number) as a tensor; NaN/Inf raise InvalidRegionError."""
    t = torch.as_tensor(np.asarray(value) if not isinstance(value, Tensor) else value)
    t = t.detach().to(dtype=dtype, device=device)
    if not torch.isfinite(t).all():
        raise InvalidRegionError(f"{name} contains NaN or Inf")
    return t


def _batched(t: Tensor, name: str, input_shape: tuple[int, ...] | None) -> Tensor:
    if input_shape is not None and tuple(t.shape) == tuple(input_shape):
        return t.unsqueeze(0)
    if t.dim() < 1:
        raise ShapeMismatchError(f"{name} must have a batch dimension, got a scalar")
    if input_shape is not None and tuple(t.shape[1:]) != tuple(input_shape):
        raise ShapeMismatchError(
            f"{name} has shape {tuple(t.shape)}; the network expects [batch, *{tuple(input_shape)}]"
        )
    return t


def _check_box(lower: Tensor, upper: Tensor) -> None:
    if lower.shape != upper.shape:
        raise ShapeMismatchError(
            f"lower {tuple(lower.shape)} and upper {tuple(upper.shape)} differ"
        )
    if lower.numel() == 0:
        raise InvalidRegionError("the input box is empty (zero elements)")
    bad = (lower > upper).nonzero()
    if bad.numel():
        idx = tuple(bad[0].tolist())
        raise InvalidRegionError(
            f"empty input box: lower > upper at index {idx} "
            f"({float(lower[idx]):.6g} > {float(upper[idx]):.6g})"
        )


def input_box(
    *,
    eps: Any,
    x: Any,
    lower: Any,
    upper: Any,
    domain: tuple[float, float] | None,
    input_shape: tuple[int, ...] | None,
    dtype: torch.dtype,
    device: torch.device | None,
) -> Interval:
    """The box `[batch, *input_shape]` from an L-inf ball (`x`, `eps`, optionally clipped to
    `domain`) or from explicit `lower`/`upper`."""
    if (lower is None) != (upper is None):
        raise InvalidRegionError("give both lower and upper, or neither")
    if lower is not None:
        if x is not None or eps is not None:
            raise InvalidRegionError("give either (x, eps) or (lower, upper), not both")
        lo = _batched(as_tensor(lower, "lower", dtype, device), "lower", input_shape)
        up = _batched(as_tensor(upper, "upper", dtype, device), "upper", input_shape)
    else:
        if x is None or eps is None:
            raise InvalidRegionError("an L-inf ball needs both x and eps")
        center = _batched(as_tensor(x, "x", dtype, device), "x", input_shape)
        radius = as_tensor(eps, "eps", dtype, device)
        if (radius < 0).any():
            raise InvalidRegionError(f"eps must be >= 0, got {eps}")
        lo, up = center - radius, center + radius
    if domain is not None:
        d_lo, d_hi = domain
        if not d_lo <= d_hi:
            raise InvalidRegionError(f"domain {domain} is empty")
        lo, up = lo.clamp(d_lo, d_hi), up.clamp(d_lo, d_hi)
    _check_box(lo, up)
    return Interval(lo, up)


def output_spec(C: Any, batch: int, n_out: int, dtype: torch.dtype, device) -> Tensor:
    """`C` as `[batch, n_specs, n_out]` (identity when None; a 2-D C is shared by the batch)."""
    if C is None:
        return torch.eye(n_out, dtype=dtype, device=device).expand(batch, n_out, n_out)
    c = as_tensor(C, "C", dtype, device)
    if c.dim() == 2:
        c = c.expand(batch, *c.shape)
    if c.dim() != 3 or c.shape[0] != batch or c.shape[2] != n_out:
        raise ShapeMismatchError(
            f"C has shape {tuple(c.shape)}; expected [batch={batch}, n_specs, n_out={n_out}]"
        )
    return c
