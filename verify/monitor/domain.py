"""The domain of a monitor: boxes (`Box`) and L-inf balls (`Ball`), one region each, read as
`[R, *input_shape]` boxes (`regions_box`), and the per-sample input shape a `[1, *shape]` box
implies (`implied_shape`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bounds.errors import InvalidRegionError, ShapeMismatchError, VerificationInputError
from bounds.types import Interval
from verify.region import input_box


@dataclass(frozen=True)
class Box:
    """The input box `lower <= x <= upper` (`[*input_shape]`, or `[k, *input_shape]`: k boxes)."""

    lower: Any
    upper: Any


@dataclass(frozen=True)
class Ball:
    """The L-inf ball(s) of radius `eps` around `center` (`[*input_shape]` or `[k, ...]`),
    intersected with the box `within = (low, high)` when given (e.g. the pixel range)."""

    center: Any
    eps: Any
    within: tuple[float, float] | None = None


def regions_box(domain: Any, input_shape: tuple[int, ...] | None) -> Interval:
    """The domain as `R` boxes `[R, *input_shape]` (float64). `domain`: a `Box`, a `Ball`, an
    `Interval`, a `(lower, upper)` pair, or a list of them (region `i` of the list first)."""
    items = list(domain) if isinstance(domain, list) else [domain]
    if not items:
        raise InvalidRegionError("the domain is an empty list of regions")
    lowers, uppers = [], []
    for i, item in enumerate(items):
        where = f"domain[{i}]" if isinstance(domain, list) else "domain"
        try:
            box = _one_region(item, input_shape)
        except VerificationInputError as err:
            raise type(err)(f"{where}: {err}") from err
        if input_shape is None:
            input_shape = tuple(box.lower.shape[1:])
        lowers.append(box.lower)
        uppers.append(box.upper)
    return Interval(torch.cat(lowers), torch.cat(uppers))


def _one_region(item: Any, shape: tuple[int, ...] | None) -> Interval:
    kw = dict(input_shape=shape, dtype=torch.float64, device=None, domain=None)
    if isinstance(item, Ball):
        kw["domain"] = item.within
        return input_box(eps=item.eps, x=item.center, lower=None, upper=None, **kw)
    if isinstance(item, Interval):
        item = Box(item.lower, item.upper)
    elif isinstance(item, tuple) and len(item) == 2:
        item = Box(*item)
    if not isinstance(item, Box):
        raise InvalidRegionError(
            f"a region must be a Box, a Ball, an Interval or a (lower, upper) pair; got "
            f"{type(item).__name__}"
        )
    if shape is None:  # one box of the network's per-sample shape
        kw["input_shape"] = tuple(torch.as_tensor(item.lower).shape)
    return input_box(eps=None, x=None, lower=item.lower, upper=item.upper, **kw)


def _first_corner(domain: Any) -> Any:
    """The lower corner of the domain's first box, or None (a Ball: its leading axis is always
    the regions'; anything else: left to `regions_box` to refuse)."""
    item = domain[0] if isinstance(domain, list) and domain else domain
    if isinstance(item, (Box, Interval)):
        return item.lower
    if isinstance(item, tuple) and len(item) == 2:
        return item[0]
    return None


def _shape_of(value: Any) -> tuple[int, ...] | None:
    try:
        return tuple(value.shape) if isinstance(value, Tensor) else tuple(np.shape(value))
    except (TypeError, ValueError):  # ragged or not numeric: `regions_box` names the problem
        return None


def _accepts(net: nn.Module, shape: tuple[int, ...]) -> bool:
    """Whether `net` runs on a batch of two zero inputs of `shape` (two, not one: an unbatched
    convolution would take a batch of one for a sample)."""
    tensors = [t for t in (*net.parameters(), *net.buffers()) if t.is_floating_point()]
    dtype = tensors[0].dtype if tensors else torch.get_default_dtype()
    device = tensors[0].device if tensors else None
    try:
        with torch.no_grad():
            net(torch.zeros(2, *shape, dtype=dtype, device=device))
    except Exception:  # any failure means the network does not take this shape
        return False
    return True


def implied_shape(net: nn.Module, domain: Any) -> tuple[int, ...] | None:
    """The per-sample input shape of a network that declares none, when the domain's first box
    has a leading axis of 1 (`[1, *shape]`, the batch axis of `verify.bounds`): `shape` when the
    network accepts only that; None (the box's own shape, as before) otherwise.
    `ShapeMismatchError` naming both shapes when the network accepts both."""
    whole = _shape_of(_first_corner(domain))
    if whole is None or len(whole) < 2 or whole[0] != 1:
        return None
    sample = whole[1:]
    if not _accepts(net, sample):
        return None
    if _accepts(net, whole):
        raise ShapeMismatchError(
            f"domain: a box of shape {whole} is ambiguous: the network takes one sample of "
            f"shape {sample} (the box with a batch axis of 1) or of shape {whole}; pass "
            f"input_shape={sample} (the expected per-sample shape) or a box of that shape"
        )
    return sample
