"""Output specifications: robustness margins and VNN-LIB unsafe sets as `C` matrices."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from verify.property import Region


def margin_spec(labels: Tensor, n_classes: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """`C [batch, n_classes - 1, n_classes]` with rows `e_label - e_j` (j != label): the input is
    robust when every lower bound of `C y` is positive."""
    labels = torch.as_tensor(labels).reshape(-1)
    rows = []
    for label in labels.tolist():
        others = [j for j in range(n_classes) if j != label]
        c = torch.zeros(n_classes - 1, n_classes, dtype=dtype)
        c[:, label] = 1.0
        c[torch.arange(n_classes - 1), others] = -1.0
        rows.append(c)
    return torch.stack(rows)


def region_box(
    region: Region, input_shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """The VNN-LIB region's input box as `[1, *input_shape]` tensors (row-major X_i order)."""
    lower = torch.tensor(np.array(region.lower), dtype=dtype).reshape(1, *input_shape)
    upper = torch.tensor(np.array(region.upper), dtype=dtype).reshape(1, *input_shape)
    return lower, upper


def region_spec(
    region: Region, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor, list[int]]:
    """All unsafe polytopes' rows stacked: `(C [1, m, n_out], b [m], polytope id per row)`.

    The property holds on the region if for every polytope some row has `C y > b` everywhere,
    i.e. some row's lower bound of `C y - b` is positive.
    """
    n_out = region.unsafe[0].A.shape[1] if region.unsafe else 0
    rows, rhs, owner = [np.zeros((0, n_out))], [np.zeros(0)], []
    for k, poly in enumerate(region.unsafe):
        if poly.A_x is not None:
            raise NotImplementedError("constraints mixing inputs and outputs are not supported yet")
        rows.append(np.asarray(poly.A))
        rhs.append(np.asarray(poly.b))
        owner += [k] * len(poly.b)
    C = torch.tensor(np.concatenate(rows), dtype=dtype).unsqueeze(0)
    return C, torch.tensor(np.concatenate(rhs), dtype=dtype), owner


def region_proven(lower: Tensor, b: Tensor, owner: list[int], n_polytopes: int) -> bool:
    """True if every one of the `n_polytopes` unsafe polytopes has a row whose lower bound of
    `C y` exceeds `b` (so no output in the bounds lies in any unsafe polytope). A polytope with
    no rows (the whole output space) is never excluded."""
    excluded = [False] * n_polytopes
    for above, k in zip((lower.reshape(-1) > b).tolist(), owner):
        excluded[k] = excluded[k] or above
    return all(excluded)
