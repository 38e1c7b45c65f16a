"""Embedding lookups in torch.fx (used by `bounds.graph.fx_handlers`): an activation cast to an
integer type (`x.long()`, `x.int()`, `x.to(torch.int64)`) becomes an `Index`, which only
selections, reshapes and lookups may take:

- `F.embedding(i, table)`, an `nn.Embedding` module, `table[i]` and
  `torch.index_select(table, 0, i)` of a constant 2-D table: an `EmbeddingOp`
  (`bounds/ops/embedding.py`) on the index's float source (the cast truncates towards zero;
  the op does the same);
- `i[...]`, `torch.index_select(i, ...)`, `i.reshape(...)` / `view` / `flatten` / `squeeze` /
  `unsqueeze`, and `.long()` again: the same on the float source, still an `Index`.

Anything else that takes an `Index` (arithmetic on ids, `EmbeddingBag`, `max_norm`, which
rewrites the table in place) is an `UnsupportedOperationError` naming the node.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from bounds.graph import fx_shapes as shapes
from bounds.graph.fx_common import Act, Builder, reshape_result, unsupported
from bounds.ops.embedding import EmbeddingOp

INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_RESHAPE_METHODS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous"}
_RESHAPE_FUNCTIONS = {torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze}


@dataclass(frozen=True)
class Index:
    """An integer index: `trunc(source)` of the float activation `source`."""

    source: Act

    @property
    def value(self) -> Tensor:
        return self.source.value.trunc().long()


def _int_target(args: tuple, kwargs: dict) -> bool:
    """Whether `.to(...)` / `.type(...)` arguments name an integer dtype."""
    values = [*args, *kwargs.values()]
    return any(v in INTEGER_DTYPES for v in values if isinstance(v, torch.dtype))


def handles(node: fx.Node, flat: list[Any]) -> bool:
    """Whether this file translates `node` (its flattened arguments `flat`): it takes an
    `Index`, or casts an activation to an integer type."""
    if any(isinstance(v, Index) for v in flat):
        return True
    if node.op != "call_method" or not flat or not isinstance(flat[0], Act):
        return False
    if node.target in ("long", "int"):
        return True
    return node.target in ("to", "type") and _int_target(tuple(node.args[1:]), node.kwargs)


def _table(b: Builder, node: str, table: Any) -> Tensor:
    if isinstance(table, Act) or not isinstance(table, Tensor) or table.dim() != 2:
        raise unsupported("embedding", node, "the table must be a constant [rows, dim] tensor")
    if not table.is_floating_point():
        raise unsupported("embedding", node, f"a table of {table.dtype}")
    return b.const(table, node)


def lookup(b: Builder, node: str, index: Index, table: Any) -> Act:
    """`table[trunc(source)]` as an `EmbeddingOp` on the index's float source."""
    source = index.source
    return b.add(node, EmbeddingOp(_table(b, node, table), source.shape, node), [source])


def _embedding(b: Builder, node: str, index: Any, table: Any, padding_idx: Any = None,
               max_norm: Any = None, *rest: Any, **kwargs: Any) -> Act:  # fmt: skip
    """`F.embedding`: `padding_idx` only changes gradients; `max_norm` renormalises the
    table's rows in place (a lookup that mutates the model): refused."""
    if max_norm is not None or kwargs.get("max_norm") is not None:
        raise unsupported("embedding", node, "max_norm (renormalises the table in place)")
    if not isinstance(index, Index):
        raise unsupported("embedding", node, "the index must be an integer cast of the input")
    return lookup(b, node, index, table)


def _reindexed(b: Builder, node: str, index: Index, fn) -> Index:
    """`fn` (a selection or reshape of the float source) applied to the index."""
    out = fn(index.source)
    if not isinstance(out, Act):
        raise unsupported("index", node, "a selection of an index that is not one tensor")
    return Index(out)


def call(b: Builder, gm: fx.GraphModule, node: fx.Node, args: list, kwargs: dict) -> Any:
    """The translation of a node that `handles` accepts."""
    name, target = node.name, node.target
    if node.op == "call_module":
        mod = gm.get_submodule(target)
        if isinstance(mod, nn.Embedding) and isinstance(args[0], Index) and len(args) == 1:
            if mod.max_norm is not None:
                raise unsupported("Embedding", name, "max_norm (renormalises the table in place)")
            return lookup(b, name, args[0], mod.weight)
        raise unsupported(type(mod).__name__, name, "takes an integer index of the input "
                          "(only nn.Embedding lookups may)")  # fmt: skip
    first = args[0] if args else None
    if node.op == "call_method":
        if target in ("long", "int", "to", "type"):
            if isinstance(first, Index):
                return first
            return Index(first)
        if target in _RESHAPE_METHODS and isinstance(first, Index):
            out = getattr(first.value, target)(*args[1:], **kwargs)
            return _reindexed(b, name, first, lambda s: reshape_result(b, name, s, out))
    elif node.op == "call_function":
        if target is F.embedding:
            return _embedding(b, name, *args, **kwargs)
        if target is operator.getitem and isinstance(first, Index):
            return _reindexed(b, name, first, lambda s: shapes.getitem(b, name, s, args[1]))
        if target is operator.getitem and isinstance(args[1], Index):
            return lookup(b, name, args[1], first)
        if target is torch.index_select and isinstance(first, Index):
            return _reindexed(b, name, first, lambda s: shapes.index_select(b, name, s, *args[1:]))
        if target is torch.index_select and isinstance(args[2], Index) and args[1] == 0:
            return lookup(b, name, args[2], first)
        if target in _RESHAPE_FUNCTIONS and isinstance(first, Index):
            out = target(first.value, *args[1:], **kwargs)
            return _reindexed(b, name, first, lambda s: reshape_result(b, name, s, out))
    what = target if isinstance(target, str) else getattr(target, "__name__", str(target))
    raise unsupported(what, name, "takes an integer index of the input (only selections, "
                      "reshapes and embedding lookups may)")  # fmt: skip
