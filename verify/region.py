"""Input regions and output specifications of the public API, validated with clear errors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from bounds.errors import InvalidRegionError, ShapeMismatchError
from bounds.types import Interval
from relaxations.base import broadcast_shape


def first_bad_index(t: Tensor) -> tuple[int, ...] | None:
    """The index of the first NaN or Inf of `t`, or None (`()` for a bad 0-d tensor)."""
    if t.dim() == 0:
        return None if bool(torch.isfinite(t)) else ()
    bad = (~torch.isfinite(t)).nonzero()
    return tuple(bad[0].tolist()) if bad.numel() else None


def as_tensor(
    value: Any, name: str, dtype: torch.dtype, device: torch.device | None, allow_inf: bool = False
) -> Tensor:
    """`value` (tensor, array, number) as a real tensor; anything else, the meta device, or
    NaN/Inf (its index is named; Inf allowed with `allow_inf`) raise InvalidRegionError."""
    if isinstance(value, (str, bytes)) or value is None:
        raise InvalidRegionError(f"{name} must be a number, an array or a tensor, got {value!r}")
    if isinstance(value, Tensor) and value.is_meta:
        raise InvalidRegionError(f"{name} is on the meta device: it has no values to bound")
    try:
        t = value if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidRegionError(f"{name} is not numeric: {exc}") from exc
    if t.is_complex() or not (t.is_floating_point() or t.dtype in _REAL_INTEGERS):
        raise InvalidRegionError(f"{name} must hold real numbers, got dtype {t.dtype}")
    t = t.detach().to(dtype=dtype, device=device)
    bad = first_bad_index(torch.where(torch.isinf(t), 0, t) if allow_inf else t)
    if bad is not None:
        raise InvalidRegionError(f"{name} contains NaN or Inf ({float(t[bad])}) at index {bad}")
    return t


_REAL_INTEGERS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


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
        if radius.dim() and not _broadcasts(radius.shape, center.shape):
            raise ShapeMismatchError(
                f"eps has shape {tuple(radius.shape)}, which does not broadcast to x's "
                f"{tuple(center.shape)}"
            )
        if (radius < 0).any():
            idx = tuple((radius < 0).nonzero()[0].tolist()) if radius.dim() else ()
            where = f" at index {idx}" if radius.dim() else ""
            raise InvalidRegionError(f"eps must be >= 0, got {float(radius[idx])}{where}")
        lo, up = center - radius, center + radius
    if domain is not None:
        d_lo, d_hi = _domain(domain)
        if x is not None:
            outside = ((center < d_lo) | (center > d_hi)).nonzero()
            if outside.numel():
                idx = tuple(outside[0].tolist())
                raise InvalidRegionError(
                    f"x lies outside the domain [{d_lo}, {d_hi}] at index {idx} "
                    f"(x = {float(center[idx]):.6g})"
                )
        lo, up = lo.clamp(d_lo, d_hi), up.clamp(d_lo, d_hi)
    _check_box(lo, up)
    return Interval(lo, up)


def _broadcasts(small: torch.Size, big: torch.Size) -> bool:
    try:
        return broadcast_shape(small, big) == big
    except ValueError:
        return False


def _domain(domain: Any) -> tuple[float, float]:
    """`(low, high)` as finite floats with low <= high."""
    try:
        d_lo, d_hi = (float(v) for v in domain)
    except (TypeError, ValueError) as exc:
        raise InvalidRegionError(
            f"domain must be a pair (low, high) of numbers, got {domain!r}"
        ) from exc
    if not (math.isfinite(d_lo) and math.isfinite(d_hi)) or d_lo > d_hi:
        raise InvalidRegionError(f"domain {domain} must be finite with low <= high")
    return d_lo, d_hi


def output_spec(
    C: Any, batch: int, n_out: int, dtype: torch.dtype, device: torch.device | None
) -> Tensor:
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
