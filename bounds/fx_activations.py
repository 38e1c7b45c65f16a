"""Elementwise activations in torch.fx (used by `bounds.fx_handlers`): each torch function,
tensor method or `nn.Module` that is an elementwise nonlinearity maps to a registered
relaxation (`relaxations`) and the options its constants give; one line per spelling.

A spec is `(relaxation name, options)` where `options(*args, **kwargs)` receives the call's
arguments after the activation (for modules: the module) and returns the relaxation's options,
or raises ValueError for constants we cannot bound (reported as unsupported at the node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bounds.fx_common import Act, Builder, unsupported
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


FUNCTIONS: dict[Any, tuple[str, Options]] = {
    torch.relu: ("relu", _plain),
    F.relu: ("relu", _plain),
}

METHODS: dict[str, tuple[str, Options]] = {
    "relu": ("relu", _plain),
}

MODULES: dict[type, tuple[str, Options]] = {
    nn.ReLU: ("relu", lambda module: {}),
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
