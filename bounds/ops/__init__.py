"""Layer operators, one file per family."""

from bounds.ops.activation import ActivationOp
from bounds.ops.add import SumOp
from bounds.ops.base import BoundOp, UnaryAffineOp
from bounds.ops.conv import ConvOp, avg_pool_as_conv
from bounds.ops.elementwise import ElementwiseAffineOp
from bounds.ops.linear import LinearOp
from bounds.ops.reshape import ReshapeOp

__all__ = [
    "ActivationOp",
    "BoundOp",
    "ConvOp",
    "ElementwiseAffineOp",
    "LinearOp",
    "ReshapeOp",
    "SumOp",
    "UnaryAffineOp",
    "avg_pool_as_conv",
]
