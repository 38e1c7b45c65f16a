"""Layer operators, one file per family."""

from bounds.ops.activation import ActivationOp, MultiActivationOp
from bounds.ops.adaptive_pool import AdaptiveAvgPoolOp
from bounds.ops.add import SumOp
from bounds.ops.base import BoundOp, UnaryAffineOp
from bounds.ops.concat import ConcatOp
from bounds.ops.conv import ConvOp, avg_pool_as_conv
from bounds.ops.conv_transpose import ConvTransposeOp
from bounds.ops.elementwise import ElementwiseAffineOp
from bounds.ops.index import IndexOp
from bounds.ops.linear import LinearOp
from bounds.ops.matmul import MatMulOp
from bounds.ops.pad import PadOp
from bounds.ops.permute import PermuteOp
from bounds.ops.reduce import ExpandOp, ReduceOp
from bounds.ops.reshape import ReshapeOp

__all__ = [
    "ActivationOp",
    "AdaptiveAvgPoolOp",
    "BoundOp",
    "ConcatOp",
    "ConvOp",
    "ConvTransposeOp",
    "ElementwiseAffineOp",
    "ExpandOp",
    "IndexOp",
    "LinearOp",
    "MatMulOp",
    "MultiActivationOp",
    "PadOp",
    "PermuteOp",
    "ReduceOp",
    "ReshapeOp",
    "SumOp",
    "UnaryAffineOp",
    "avg_pool_as_conv",
]
