"""Elementwise activations in torch.fx (used by `bounds.graph.fx_handlers`): each torch function,
tensor method or `nn.Module` that a relaxation declares as one of its spellings
(`relaxations.registry`) maps to that relaxation, with the options its constants give.

A spelling's `read(*args, **kwargs)` receives the call's arguments after the activation (for
modules: the module) and returns the relaxation's options, or raises ValueError for constants we
cannot bound (reported as unsupported at the node). The registry is read at each call, so a
relaxation registered later (a plugin) is found too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from bounds.graph.fx_common import Act, Builder, unsupported
from bounds.ops import ActivationOp
from relaxations import get_relaxation
from relaxations.registry import Spelling, module_spelling, spelling_of


def activation(
    b: Builder, node: str, name: str, x: Any, options: dict[str, Any] | None = None
) -> Act:
    """The ActivationOp of relaxation `name` (with `options`) on `x`, named `node`."""
    return _activation(b, node, name, x, lambda: options or {})


def _activation(
    b: Builder, node: str, name: str, x: Any, options: Callable[[], dict[str, Any]]
) -> Act:
    if not isinstance(x, Act):
        raise unsupported(name, node, "its first argument must depend on the network input")
    try:
        relaxation = get_relaxation(name, **options())
    except (KeyError, ValueError) as exc:
        raise unsupported(name, node, str(exc)) from exc
    return b.add(node, ActivationOp(relaxation, x.shape), [x])


def spelled(
    b: Builder, node: str, found: tuple[str, Spelling], x: Any, *args: Any, **kwargs: Any
) -> Act:
    """The ActivationOp of a registered spelling `found` (relaxation name, spelling) on `x`,
    its options read from the call's other arguments (and `x`'s shape, if it asks)."""
    name, spelling = found

    def options() -> dict[str, Any]:
        shape = {"shape": x.shape} if spelling.shaped else {}
        return spelling.read(*args, **kwargs, **shape)

    return _activation(b, node, name, x, options)


def function_handler(target: Any) -> Callable[..., Act] | None:
    """An fx handler `(builder, node, x, *args, **kwargs)` for the registered activation spelled
    `target` (a torch function or a tensor method's name), or None."""
    found = spelling_of(target)
    if found is None:
        return None
    return lambda b, node, x, *args, **kwargs: spelled(b, node, found, x, *args, **kwargs)


def module_activation(b: Builder, node: str, module: nn.Module, x: Any) -> Act | None:
    """The ActivationOp of a registered activation module (exact type match) on `x`, or None."""
    found = module_spelling(module)
    return None if found is None else spelled(b, node, found, x, module)
