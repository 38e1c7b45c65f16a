"""Functionals kept as local windows ("patches", as auto_LiRPA's `Patches` mode: Xu et al.,
NeurIPS 2020, "Automatic Perturbation Analysis for Scalable Certified Robustness and Beyond").

The functional `e_j` on neuron `(c, i, j)` of a convolution, pushed backward through
convolutions and elementwise activations, is nonzero on a window of each node it reaches only
(the neuron's receptive field there). We keep it as `values [B, S, C, Mh, Mw]` with `Windows`,
each spec's window origin (top-left corner, in the node's coordinates) and their common size; a
window may reach outside the node, where the values are zero (`masked`). Reading a node-shaped
tensor at the windows (`read_windows`) and scattering windowed values to the dense functional
(`to_dense`) are the two ways between the forms; a convolution's adjoint on windows is
`ConvOp.adjoint_window`, and the windows it gives `ConvOp.windows_below`.

Through a DAG (a residual block's `add`), each node's windows are a `Placement`: the same window
for every neuron, translated with it, so two paths' windows on one node are merged as their
union (`union`), each path's values zero-padded into it (`place`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Windows:
    """Spec `s` covers rows `rows[s] + (0..size[0]-1)` and columns `cols[s] + (0..size[1]-1)`
    of a `[C, H, W]` node (`rows`, `cols`: `[S]` integer tensors)."""

    rows: Tensor
    cols: Tensor
    size: tuple[int, int]


@dataclass(frozen=True)
class Placement:
    """Windows as an affine map of the start neurons' positions: the neuron at `(row, col)` has
    its window on a node at origin `(scale[0] row + shift[0], scale[1] col + shift[1])`, of
    `size` (Python ints: the same for every neuron; a convolution multiplies `scale` by its
    stride, `ConvOp.window_below`)."""

    scale: tuple[int, int]
    shift: tuple[int, int]
    size: tuple[int, int]

    def windows(self, rows: Tensor, cols: Tensor) -> Windows:
        """The `Windows` of the neurons at `rows`, `cols` (`[S]`, `unit_windows`' origins)."""
        return Windows(
            rows * self.scale[0] + self.shift[0], cols * self.scale[1] + self.shift[1], self.size
        )


UNIT = Placement((1, 1), (0, 0), (1, 1))
"""A neuron's own `1 x 1` window (`unit_windows`)."""


def union(a: Placement, b: Placement) -> Placement | None:
    """The smallest placement that holds the windows of both (None when their scales differ:
    the offset between the two windows would depend on the neuron)."""
    if a.scale != b.scale:
        return None
    shift = (min(a.shift[0], b.shift[0]), min(a.shift[1], b.shift[1]))
    size = tuple(max(a.shift[i] + a.size[i], b.shift[i] + b.size[i]) - shift[i] for i in range(2))
    return Placement(a.scale, shift, size)


def place(values: Tensor, at: Placement, into: Placement) -> Tensor:
    """`values [..., Mh, Mw]` on the windows `at`, zero-padded to the windows `into` (which hold
    them: `union`); exact."""
    if at == into:
        return values
    top, left = at.shift[0] - into.shift[0], at.shift[1] - into.shift[1]
    bottom, right = into.size[0] - top - at.size[0], into.size[1] - left - at.size[1]
    return F.pad(values, (left, right, top, bottom))


def unit_windows(index: Tensor, shape: tuple[int, ...]) -> Windows:
    """The `1 x 1` windows of `+e_j` then `-e_j` for each flat index `j` of a `[C, H, W]` node."""
    height, width = shape[1], shape[2]
    rows = torch.div(index % (height * width), width, rounding_mode="floor")
    return Windows(rows.repeat(2), (index % width).repeat(2), (1, 1))


def unit_values(index: Tensor, shape: tuple[int, ...], batch: int, like: Tensor) -> Tensor:
    """`[batch, 2k, C, 1, 1]`: the one-hot channel of `+e_j` then `-e_j` on `unit_windows`
    (`unit_functionals` without the dense identity)."""
    k = index.numel()
    chan = torch.div(index, shape[1] * shape[2], rounding_mode="floor")
    eye = like.new_zeros(k, shape[0])
    eye[torch.arange(k, device=index.device), chan] = 1.0
    both = torch.cat([eye, -eye]).reshape(1, 2 * k, shape[0], 1, 1)
    return both.expand(batch, *both.shape[1:])


def _positions(origin: Tensor, length: int, size: int) -> tuple[Tensor, Tensor]:
    """`origin[s] + (0..length-1)` clamped into `[0, size)`, `[S, length]`, and which of them
    lie inside the node."""
    pos = origin.unsqueeze(1) + torch.arange(length, device=origin.device)
    inside = (pos >= 0) & (pos < size)
    return pos.clamp(0, size - 1), inside


def _flat_index(w: Windows, shape: tuple[int, ...], per_spec: bool) -> Tensor:
    """Flat positions `[S * C * Mh * Mw]` of each spec's window in a `[C, H, W]` node (clamped
    into it), offset by the spec's block of `C H W` when `per_spec`."""
    channels, height, width = shape
    rows = _positions(w.rows, w.size[0], height)[0][:, None, :, None]
    cols = _positions(w.cols, w.size[1], width)[0][:, None, None, :]
    chan = torch.arange(channels, device=w.rows.device).reshape(1, -1, 1, 1)
    flat = (chan * height + rows) * width + cols
    if per_spec:
        spec = torch.arange(w.rows.numel(), device=w.rows.device).reshape(-1, 1, 1, 1)
        flat = flat + spec * (channels * height * width)
    return flat.flatten()


def masked(values: Tensor, w: Windows, shape: tuple[int, ...]) -> Tensor:
    """`values [B, S, C, Mh, Mw]` with the positions outside the `[C, H, W]` node set to zero
    (what a dense adjoint crops)."""
    rows_in = _positions(w.rows, w.size[0], shape[1])[1][:, None, :, None]
    cols_in = _positions(w.cols, w.size[1], shape[2])[1][:, None, None, :]
    return values * (rows_in & cols_in).to(values.dtype)


def read_windows(t: Tensor, w: Windows, shape: tuple[int, ...]) -> Tensor:
    """`t` (broadcastable to `[B, S, *shape]`, `shape = (C, H, W)`) read at each spec's window:
    `[B or 1, S, C, Mh, Mw]`. Positions outside the node read its nearest border value (finite:
    the values multiplied with them are zero)."""
    lead = (t.shape[0], t.shape[1]) if t.dim() == 5 else (1, 1)
    full = torch.broadcast_to(t, (*lead, *shape)).reshape(lead[0], -1)
    index = _flat_index(w, shape, per_spec=lead[1] > 1)
    return full.index_select(1, index).reshape(lead[0], w.rows.numel(), shape[0], *w.size)


def to_dense(values: Tensor, w: Windows, shape: tuple[int, ...]) -> Tensor:
    """The dense functional `[B, S, *shape]` of `values` on `w` (zero outside the node: `masked`)."""
    batch, specs = values.shape[:2]
    index = _flat_index(w, shape, per_spec=True)
    dense = values.new_zeros(batch, specs * int(torch.Size(shape).numel()))
    dense = dense.index_add(1, index, values.reshape(batch, -1))
    return dense.reshape(batch, specs, *shape)
