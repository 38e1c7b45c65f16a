"""Elementwise activations in torch.fx (used by `bounds.fx_handlers`): each torch function,
tensor method or `nn.Module` that is an elementwise nonlinearity maps to a registered
relaxation (`relaxations`) and the options its constants give; one line per spelling.

A spec is `(relaxation name, options)` where `options(*args, **kwargs)` receives the call's
arguments after the activation (for modules: the module) and returns the relaxation's options,
or raises ValueError for constants we cannot bound (reported as unsupported at the node).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bounds.graph.fx_common import Act, Builder, unsupported
from bounds.ops import ActivationOp
from relaxations import get_relaxation

Options = Callable[..., dict[str, Any]]


def _plain(*args: Any, inplace: bool = False, **kwargs: Any) -> dict[str, Any]:
    """No constants (an `inplace` flag changes nothing here)."""
    if args or kwargs:
        raise ValueError(f"unexpected arguments {args} {kwargs}")
    return {}


def _module(*attributes: str) -> Options:
    """Options read from the module's attributes of the same names."""
    return lambda module: {name: getattr(module, name) for name in attributes}


def _leaky(negative_slope: float = 0.01, inplace: bool = False) -> dict[str, Any]:
    return {"negative_slope": float(negative_slope)}


def _hardtanh(min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> dict:
    return {"min": float(min_val), "max": float(max_val)}


def _clamp(min: Any = None, max: Any = None) -> dict[str, Any]:
    """Constant limits only (a missing one is infinite)."""
    for value in (min, max):
        if value is not None and not isinstance(value, (int, float)):
            raise ValueError("clamp limits must be constants (numbers)")
    low = -float("inf") if min is None else float(min)
    return {"min": low, "max": float("inf") if max is None else float(max)}


def _exponent(exponent: Any) -> dict[str, Any]:
    """A constant integer exponent (the relaxation refuses the affine 0 and 1)."""
    if isinstance(exponent, torch.Tensor) and exponent.numel() == 1:
        exponent = exponent.item()
    if not isinstance(exponent, (int, float)) or float(exponent) != int(exponent):
        raise ValueError(f"the exponent must be a constant integer, got {exponent!r}")
    return {"exponent": int(exponent)}


def _square() -> dict[str, Any]:
    return {"exponent": 2}


_SIMPLE = ("sigmoid", "tanh", "abs", "sign", "floor", "exp", "reciprocal", "sin", "cos")

FUNCTIONS: dict[Any, tuple[str, Options]] = {
    torch.relu: ("relu", _plain),
    F.relu: ("relu", _plain),
    **{getattr(torch, name): (name, _plain) for name in _SIMPLE},
    F.sigmoid: ("sigmoid", _plain),
    F.tanh: ("tanh", _plain),
    F.leaky_relu: ("leaky_relu", _leaky),
    F.hardtanh: ("hardtanh", _hardtanh),
    F.relu6: ("hardtanh", lambda inplace=False: {"min": 0.0, "max": 6.0}),
    torch.clamp: ("hardtanh", _clamp),
    torch.clip: ("hardtanh", _clamp),
    torch.pow: ("pow", _exponent),
    operator.pow: ("pow", _exponent),
    torch.square: ("pow", _square),
}

METHODS: dict[str, tuple[str, Options]] = {
    "relu": ("relu", _plain),
    **{name: (name, _plain) for name in _SIMPLE},
    "clamp": ("hardtanh", _clamp),
    "clip": ("hardtanh", _clamp),
    "pow": ("pow", _exponent),
    "square": ("pow", _square),
}

MODULES: dict[type, tuple[str, Options]] = {
    nn.ReLU: ("relu", lambda module: {}),
    nn.Sigmoid: ("sigmoid", lambda module: {}),
    nn.Tanh: ("tanh", lambda module: {}),
    nn.LeakyReLU: ("leaky_relu", _module("negative_slope")),
    nn.Hardtanh: ("hardtanh", lambda m: {"min": float(m.min_val), "max": float(m.max_val)}),
    nn.ReLU6: ("hardtanh", lambda module: {"min": 0.0, "max": 6.0}),
}


def activation(b: Builder, node: str, spec: tuple[str, Options], x: Any, *args, **kwargs) -> Act:
    """The ActivationOp of `spec` on `x`, named `node`."""
    name, options = spec
    if not isinstance(x, Act):
        raise unsupported(name, node, "its first argument must depend on the network input")
    try:
        relaxation = get_relaxation(name, **options(*args, **kwargs))
    except (KeyError, ValueError) as exc:
        raise unsupported(name, node, str(exc)) from exc
    return b.add(node, ActivationOp(relaxation, x.shape), [x])


def function_handler(spec: tuple[str, Options]) -> Callable[..., Act]:
    """An fx handler `(builder, node, x, *args, **kwargs)` for a function or method spec."""
    return lambda b, node, x, *args, **kwargs: activation(b, node, spec, x, *args, **kwargs)


def module_spec(module: nn.Module) -> tuple[str, Options] | None:
    """The spec of an activation module (exact type match), or None."""
    return MODULES.get(type(module))
