"""The fx side of the checksums of `verify.monitor.sums`: which values of the user's traced
module a checksum reads.

A checksum relates the output `y` of a layer (an `nn.Linear` or `nn.Conv2d`, or the
`nn.BatchNorm1d/2d` that normalises its output) to the values it was computed from, read
further up the graph than the layer's own input so that a corruption between them breaks the
invariant too: `y` is computed from `[flatten]([pool](relu(source)))` (or without the ReLU),
and the check recomputes `relu(source)` and goes through the (linear) pooling and the flatten
in its weights (`InputChain`). A corrupted ReLU output, pooled value or flattened view then
changes `y` but not what the check reads.

Soundness needs the values the check reads to be those the layer's computation started from:
`inplace_users` tells whether some other user may overwrite one of them in place (the chain
is then not used).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx, nn

_RELU_FUNCTIONS = (torch.relu, nn.functional.relu)
_INPLACE_RELU_FUNCTIONS = (torch.relu_, nn.functional.relu_)
# Linear poolings with non-negative weights (averages); a checksum goes through them.
POOLS = (nn.AvgPool2d, nn.AdaptiveAvgPool2d)


@dataclass(frozen=True)
class InputChain:
    """A layer's input `[flatten]([pool](relu(source)))`: `relu` and `pool` the fx nodes (or
    None), `flatten` whether a flatten from dim 1 lies between."""

    source: fx.Node
    relu: fx.Node | None
    pool: fx.Node | None
    flatten: bool


def relu_call(node: fx.Node, gm: fx.GraphModule) -> bool | None:
    """Whether `node` is a ReLU of its first argument, and how: None (not a ReLU), True (it
    overwrites its input: `nn.ReLU(inplace=True)`, `F.relu(x, inplace=True)`, `x.relu_()`,
    `torch.relu_`) or False (`nn.ReLU()`, `torch.relu`, `F.relu`, `x.relu()`)."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return bool(module.inplace) if type(module) is nn.ReLU else None
    if len(node.args) != 1 or not isinstance(node.args[0], fx.Node):
        return None
    if set(node.kwargs) - {"inplace"}:
        return None
    if node.op == "call_method" and node.target in ("relu", "relu_"):
        return node.target == "relu_"
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS:
        return bool(node.kwargs.get("inplace", False))
    if node.op == "call_function" and node.target in _INPLACE_RELU_FUNCTIONS:
        return True
    return None


def _is_flatten(node: fx.Node, gm: fx.GraphModule) -> bool:
    if node.op == "call_module":
        sub = gm.get_submodule(node.target)
        return type(sub) is nn.Flatten and sub.start_dim == 1 and sub.end_dim == -1
    return (
        node.op == "call_function"
        and node.target is torch.flatten
        and tuple(node.args[1:]) == (1,)
        and not node.kwargs
    )


def _is_identity(node: fx.Node, gm: fx.GraphModule) -> bool:
    """A module that returns its input as it is (`nn.Identity`, `nn.Dropout` in eval mode)."""
    if node.op != "call_module":
        return False
    module = gm.get_submodule(node.target)
    return type(module) is nn.Identity or (
        isinstance(module, nn.Dropout) and not module.training and not module.inplace
    )


def _is_pool(node: fx.Node, gm: fx.GraphModule) -> bool:
    """An average-pooling module (no hook-free functional forms: the module is what the
    checksum's weights are computed from)."""
    return node.op == "call_module" and type(gm.get_submodule(node.target)) in POOLS


def input_chain(node: fx.Node, gm: fx.GraphModule) -> InputChain | None:
    """The input chain of the layer `node` (module docstring): from the layer up, at most one
    flatten (before or after the ReLU), one pooling (after the ReLU: `pool(relu(source))`, not
    `relu(pool(source))`) and one ReLU, and identities
    (`nn.Identity`, an eval-mode `nn.Dropout`) anywhere in between; None where the
    layer's input is not an fx node or a value in the chain may be overwritten in place."""
    x = node.args[0] if node.args else None
    relu = pool = None
    flatten = False
    for _ in range(8):
        if not isinstance(x, fx.Node):
            return None
        if _is_identity(x, gm):
            x = x.args[0] if x.args else None
        elif not flatten and pool is None and _is_flatten(x, gm):
            flatten, x = True, x.args[0]
        elif pool is None and relu is None and _is_pool(x, gm):
            pool, x = x, x.args[0]
        elif relu is None and relu_call(x, gm) is not None:
            relu, x = x, x.args[0]
        else:
            break
    if not isinstance(x, fx.Node) or inplace_users(x, gm, allowed=relu):
        return None
    between = node.args[0]
    while between is not x:  # the chain's own values: nothing else overwrites them
        if inplace_users(between, gm):
            return None
        between = between.args[0]
    return InputChain(x, relu, pool, flatten)


def inplace_users(node: fx.Node, gm: fx.GraphModule, allowed: fx.Node | None = None) -> bool:
    """Whether a user of `node` (other than `allowed`) may modify its value in place (a check
    then keeps a copy); the users of an identity of `node` (an alias of it) count too."""
    for user in node.users:
        if user is allowed:
            continue
        if _is_identity(user, gm) and inplace_users(user, gm):
            return True
        if user.op == "call_module" and getattr(gm.get_submodule(user.target), "inplace", False):
            return True
        name = user.target if isinstance(user.target, str) else getattr(user.target, "__name__", "")
        if user.kwargs.get("inplace") or (name.endswith("_") and not name.endswith("__")):
            return True
    return False


__all__ = ["POOLS", "InputChain", "inplace_users", "input_chain", "relu_call"]
