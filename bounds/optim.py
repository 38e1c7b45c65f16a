"""The one Adam of the bound methods: a pure, projected ascent step (Kingma and Ba, 2015,
"Adam: a method for stochastic optimization", Algorithm 1; betas 0.9, 0.999, eps 1e-8).

alpha-CROWN (slopes), beta-CROWN (slopes and split multipliers), the supergradient dual and the
active set (Anderson duals) all ascend with it: it is written once, on tuples of tensors, and
returns new tensors, so it compiles inside each method's step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def identity(t: Tensor) -> Tensor:
    """The projection of an unconstrained parameter."""
    return t


def adam_ascent(
    params: tuple[Tensor, ...], grads: tuple[Tensor, ...], m: tuple[Tensor, ...],
    v: tuple[Tensor, ...], t: Tensor, lr: Tensor | tuple[Tensor, ...],
    projections: tuple[Callable, ...],
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], tuple[Tensor, ...], Tensor]:  # fmt: skip
    """One Adam step (Kingma and Ba, 2015; betas 0.9, 0.999) ascending along `grads`, each
    parameter with its step (`lr`, or `lr[i]`) and then projected by its own `projections[i]`
    (e.g. its relaxation's `project`); returns `(params, m, v, t)`. Written out (no torch.optim,
    whose import of torch._dynamo costs seconds per process) and pure, so it compiles with the
    step; the moments by `lerp` (`0.9 m + 0.1 g` in one op)."""
    t = t + 1
    c1, c2 = 1 - 0.9**t, 1 - 0.999**t
    steps = lr if isinstance(lr, tuple) else (lr,) * len(params)
    m = tuple(torch.lerp(m_i, g, 0.1) for m_i, g in zip(m, grads))
    v = tuple(torch.lerp(v_i, g * g, 0.001) for v_i, g in zip(v, grads))
    new = tuple(
        project(p + (step / c1) * m_i / ((v_i / c2).sqrt() + 1e-8))
        for p, m_i, v_i, step, project in zip(params, m, v, steps, projections)
    )
    return new, m, v, t
