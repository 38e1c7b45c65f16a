"""The attack's view of a network: the network's own forward values, with gradients where the
function has none.

- **Piecewise-constant activations** (sign, heaviside, floor) have a zero derivative almost
  everywhere, so projected gradient descent does not move through them. The attack
  differentiates them with the surrogate derivative their relaxation gives
  (`attack_derivative`: a smoothed step for sign, the identity for floor): Backward Pass
  Differentiable Approximation (BPDA; Athalye, Carlini and Wagner 2018, Sec. 4.1), the
  straight-through estimator with which binarised networks are trained (Hubara et al. 2016).
  The forward value stays the function's own.
- **A final softmax** saturates: in float32 its outputs are exactly 0 and 1 once the logits
  differ by about 100, and its gradient vanishes there. Softmax keeps the order of its inputs
  along its axis, `y_j >= y_k` iff `z_j >= z_k`, so when the network's output *is* a softmax's
  and every unsafe row compares two outputs (`c (y_j - y_k) <= 0`, `comparisons_only`), each
  row has the same sign on the logits `z`, and the objective is computed on them. A softmax
  inside the network (attention) is left as it is.

Only the search uses this view: a point it finds is still validated on the network itself in
float64 (`verify.attack.validate`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from relaxations import get_relaxation
from relaxations.registry import Spelling, spelling_of

SOFTMAX = (torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax)


class _Surrogate(torch.autograd.Function):
    """`value` forward; backward, the gradient times `derivative` passes to `x` (BPDA)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, value: Tensor, derivative: Tensor) -> Tensor:
        ctx.save_for_backward(derivative)
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (derivative,) = ctx.saved_tensors
        return grad * derivative, None, None


def _spelling(func: Any) -> tuple[str, Spelling] | None:
    """The registered relaxation and spelling of a torch function or tensor method, or None."""
    found = spelling_of(func)
    if found is None:
        name = getattr(func, "__name__", None)
        if isinstance(name, str) and getattr(torch.Tensor, name, None) is func:
            found = spelling_of(name)
    return found


def surrogate_derivative(func: Any, args: tuple, kwargs: dict) -> Tensor | None:
    """The relaxation's `attack_derivative` at `args[0]` for the call `func(*args, **kwargs)`,
    or None (not a registered function, options it does not read, or no surrogate)."""
    found = _spelling(func)
    if found is None or not args or not isinstance(args[0], Tensor):
        return None
    name, spelling = found
    try:
        relaxation = get_relaxation(name, **spelling.read(*args[1:], **kwargs))
    except (TypeError, ValueError):
        return None
    return relaxation.attack_derivative(args[0])


class AttackMode(TorchFunctionMode):
    """Inside it, piecewise-constant activations pass surrogate gradients (module docstring)
    and the last softmax's output is kept with its input (`logits_of`: a final softmax is the
    last one; keeping only it holds no attention maps)."""

    def __init__(self) -> None:
        super().__init__()
        self.last_softmax: tuple[Tensor, Tensor, Any] | None = None
        self.surrogates = 0  # calls differentiated by a surrogate so far

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        value = func(*args, **kwargs)
        if func in SOFTMAX:
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            self.last_softmax = (value, args[0], dim)
            return value
        x = args[0] if args else None
        if not (isinstance(x, Tensor) and x.requires_grad and isinstance(value, Tensor)):
            return value
        derivative = surrogate_derivative(func, args, kwargs)
        if derivative is None or derivative.shape != x.shape or value.shape != x.shape:
            return value
        self.surrogates += 1
        return _Surrogate.apply(x, value, derivative)

    def logits_of(self, y: Tensor) -> Tensor | None:
        """The input of the softmax over the features whose output is `y` itself, or None."""
        if self.last_softmax is None:
            return None
        value, z, dim = self.last_softmax
        return z if value is y and y.dim() == 2 and dim in (1, -1) else None


def uses_surrogates(net: nn.Module, x: Tensor) -> bool:
    """Whether the attack differentiates `net` at `x` `[1, *input_shape]` through a surrogate
    derivative anywhere (a piecewise-constant activation): its gradient is then an
    approximation (BPDA), and a descent may stall where the true function goes on falling."""
    mode = AttackMode()
    with mode, torch.enable_grad():
        net(x.detach().clone().requires_grad_(True))
    return mode.surrogates > 0


def attack_outputs(net: nn.Module, x: Tensor, peel_softmax: bool) -> Tensor:
    """`net(x)` as the attack sees it: gradients through straight-through activations, and
    with `peel_softmax` the logits in place of a final softmax over the features."""
    mode = AttackMode()
    with mode:
        y = net(x)
    if peel_softmax:
        z = mode.logits_of(y)
        if z is not None:
            return z
    return y
