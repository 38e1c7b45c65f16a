"""Functionals kept as local windows ("patches", as auto_LiRPA's `Patches` mode: Xu et al.,
NeurIPS 2020, "Automatic Perturbation Analysis for Scalable Certified Robustness and Beyond").

The functional `e_j` on neuron `(c, i, j)` of a convolution, pushed backward through
convolutions and elementwise activations, is nonzero on a window of each node it reaches only
(the neuron's receptive field there). `Patches` holds it as `values [B, S, C, Mh, Mw]` and, per
spec, the window's origin (top-left corner, in the node's coordinates); a window may reach
outside the node, where its values are zero. Reading a node-shaped tensor at the windows
(`read_windows`) and scattering the windows to the dense functional (`to_dense`) are the two
ways between the forms; a convolution's adjoint on a window is `ConvOp.adjoint_window`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Patches:
    """A functional `[B, S, C, H, W]` zero outside one `Mh x Mw` window per spec: `values
    [B, S, C, Mh, Mw]` on rows `rows[s] + (0..Mh-1)` and columns `cols[s] + (0..Mw-1)`
    (`rows`, `cols`: `[S]` integer tensors); values outside the node are zero."""

    values: Tensor
    rows: Tensor
    cols: Tensor

    @property
    def window(self) -> tuple[int, int]:
        return int(self.values.shape[-2]), int(self.values.shape[-1])


def unit_patches(index: Tensor, shape: tuple[int, ...], batch: int, like: Tensor) -> Patches:
    """`+e_j` then `-e_j` for each flat index `j` of a `[C, H, W]` node: one-hot `1 x 1` windows
    (`unit_functionals` without the dense identity)."""
    channels, height, width = shape
    k = index.numel()
    chan = torch.div(index, height * width, rounding_mode="floor")
    rows = torch.div(index % (height * width), width, rounding_mode="floor")
    cols = index % width
    eye = like.new_zeros(k, channels)
    eye[torch.arange(k, device=index.device), chan] = 1.0
    both = torch.cat([eye, -eye]).reshape(1, 2 * k, channels, 1, 1)
    return Patches(both.expand(batch, *both.shape[1:]), rows.repeat(2), cols.repeat(2))


def _positions(origin: Tensor, length: int, size: int) -> tuple[Tensor, Tensor]:
    """`origin[s] + (0..length-1)` clamped into `[0, size)`, `[S, length]`, and which of them
    lie inside the node."""
    pos = origin.unsqueeze(1) + torch.arange(length, device=origin.device)
    inside = (pos >= 0) & (pos < size)
    return pos.clamp(0, size - 1), inside


def _flat_index(p: Patches, shape: tuple[int, ...], per_spec: bool) -> Tensor:
    """Flat positions `[S * C * Mh * Mw]` of each spec's window in a `[C, H, W]` node (clamped
    into it), offset by the spec's block of `C H W` when `per_spec`."""
    channels, height, width = shape
    mh, mw = p.window
    rows = _positions(p.rows, mh, height)[0][:, None, :, None]
    cols = _positions(p.cols, mw, width)[0][:, None, None, :]
    chan = torch.arange(channels, device=p.rows.device).reshape(1, -1, 1, 1)
    flat = (chan * height + rows) * width + cols
    if per_spec:
        spec = torch.arange(p.rows.numel(), device=p.rows.device).reshape(-1, 1, 1, 1)
        flat = flat + spec * (channels * height * width)
    return flat.flatten()


def masked(p: Patches, shape: tuple[int, ...]) -> Patches:
    """`p` with the window positions outside the `[C, H, W]` node set to zero (what a dense
    adjoint crops)."""
    mh, mw = p.window
    rows_in = _positions(p.rows, mh, shape[1])[1][:, None, :, None]
    cols_in = _positions(p.cols, mw, shape[2])[1][:, None, None, :]
    return Patches(p.values * (rows_in & cols_in).to(p.values.dtype), p.rows, p.cols)


def read_windows(t: Tensor, p: Patches, shape: tuple[int, ...]) -> Tensor:
    """`t` (broadcastable to `[B, S, *shape]`, `shape = (C, H, W)`) read at each spec's window:
    `[B or 1, S, C, Mh, Mw]`. Positions outside the node read its nearest border value (finite:
    the caller's values there are zero)."""
    lead = (t.shape[0], t.shape[1]) if t.dim() == 5 else (1, 1)
    full = torch.broadcast_to(t, (*lead, *shape)).reshape(lead[0], -1)
    index = _flat_index(p, shape, per_spec=lead[1] > 1)
    return full.index_select(1, index).reshape(lead[0], p.rows.numel(), shape[0], *p.window)


def to_dense(p: Patches, shape: tuple[int, ...]) -> Tensor:
    """The dense functional `[B, S, *shape]` (values outside the node must be zero: `masked`)."""
    batch, specs = p.values.shape[:2]
    index = _flat_index(p, shape, per_spec=True)
    dense = p.values.new_zeros(batch, specs * int(torch.Size(shape).numel()))
    dense = dense.index_add(1, index, p.values.reshape(batch, -1))
    return dense.reshape(batch, specs, *shape)
