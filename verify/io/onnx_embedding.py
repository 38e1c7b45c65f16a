"""ONNX embedding lookups -> torch.fx (used by `verify.io.onnx_shapes`): `Cast` of an
activation to an integer type and `Gather` of a constant table on axis 0 with a variable index.

The index input and its domain. The loaded network has one float input (as every network
`verify` bounds); a recommendation model's sparse ids are columns of it, integers stored
exactly in float, cast to INT64/INT32 (`Cast` truncates towards zero) and gathered from their
tables: `Gather(table [rows, dim], ids)` on axis 0 is the lookup `table[ids]`. The domain of an
index is the box the caller gives for those columns (`verify.bounds`'s `lower`/`upper`,
`verify.monitor`'s `Box`): `[0, rows - 1]` for every row, narrower for fewer. A box that lets a
truncated id leave `[0, rows - 1]` (ONNX reads a negative id from the end; torch refuses it) is
an `IndexOutOfTableError` naming the Gather node, raised when the network is bounded
(`bounds.ops.embedding`). A separate integer network input is refused by the loader (one float
input).

The emitted vocabulary: `call_method long` (the bound graph builder's `Index`,
`bounds.graph.fx_embedding`) and `call_function F.embedding(ids, table buffer)`.
"""

from __future__ import annotations

import onnx
import torch.nn.functional as F

from verify.io.onnx_builder import GraphBuilder, Traced, Value
from verify.io.onnx_checks import check_size, float_weight, unsupported
from verify.io.onnx_fold import node_attributes
from verify.io.onnx_ops import hint

Node = onnx.NodeProto
INTEGER_TYPES = (
    onnx.TensorProto.INT64,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8,
)


def is_lookup(inputs: list[Value]) -> bool:
    """A Gather of a constant (the table) by an activation (the ids)."""
    return len(inputs) > 1 and not isinstance(inputs[0], Traced) and isinstance(inputs[1], Traced)


def integer_cast(b: GraphBuilder, node: Node, x: Traced) -> Traced:
    """`Cast` to an integer type: `x.long()` (truncation towards zero, as ONNX casts)."""
    fx_node = b.graph.call_method("long", (x.node,))
    return Traced(fx_node, x.example.long(), x.batched)


def float_cast(b: GraphBuilder, node: Node, x: Traced) -> Traced:
    """`Cast` of integer ids back to float: `x.float()` (the loaded module computes it; the
    bound graph builder refuses ids used other than as indices)."""
    return Traced(b.graph.call_method("float", (x.node,)), x.example.float(), x.batched)


def lookup(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    """`Gather(table, ids)` on axis 0 of a constant `[rows, dim]` table: `F.embedding(ids,
    table)`, the result held as the ids are (batched or not)."""
    table, ids = inputs[0], inputs[1]
    axis = int(node_attributes(node).get("axis", 0))
    if table.ndim != 2 or axis not in (0, -2):
        raise unsupported(node, f"a Gather of a constant of shape {list(table.shape)} on axis "
                          f"{axis} by a variable index (only [rows, dim] tables on axis 0)")  # fmt: skip
    if ids.example.is_floating_point():
        raise unsupported(node, "its indices are floats (they must be Cast to an integer type)")
    table = float_weight(node, node.input[0], table)
    check_size(node, (*ids.shape, table.shape[1]))
    buf = b.buffer(f"{hint(node)}_table", table)
    return b.function(F.embedding, ids, buf, batched=ids.batched, hint=hint(node))
