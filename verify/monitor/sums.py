"""Checksum invariants of the linear and convolution layers of a monitored network
(`verify.monitor`).

For an affine layer `y = L x + b` (`L` linear, `x` with `N` elements, `y` with `M`) the column
checksum of algorithm-based fault tolerance (Huang and Abraham, "Algorithm-Based Fault
Tolerance for Matrix Operations", IEEE Trans. Computers C-33(6), 1984, Sec. III) holds for
every input in exact arithmetic:

    1^T y = c^T x + d,    c = L^T 1,  d = 1^T b.

For `nn.Linear` (`L = W [m, n]`) `c = W^T 1` and `d = 1^T b`. For `nn.Conv2d` (zero padding,
any stride, dilation and groups) `c = L^T 1` is the transposed convolution of an all-ones
output (`ConvOp.adjoint`: input-shaped, precomputed once, flattened) and `d = (H' W') 1^T b`
(the bias repeats over the `H' W'` output positions): one dot product of length `N` per
sample checks the whole output map. With `n_c` the products of one output element (`n` for a
linear layer, `(C_in / groups) k_h k_w` for a convolution), `a = |L|^T 1` (`|W|^T 1`, or the
transposed convolution of `|W|`), `T = a^T |x| = 1^T (|L| |x|)` and `B = 1^T |b|` (`(H' W')
1^T |b|`), a float evaluation meets the invariant up to its rounding errors (Higham, Accuracy
and Stability of Numerical Algorithms, 2nd ed., Sec. 3.1, `gamma_k = k u / (1 - k u)` for
sums in any order, FMA or not; direct or GEMM-based convolutions, as `verify.monitor`
assumes):

    |fl(fl(1^T y) - c^T x) - d| <= K (T + B),
    K = gamma_{n_c+1} + gamma_M (1 + gamma_{n_c+1}) + e_c + gamma_{N+1} (s + 1 + e_c)
        + u (1 + gamma_{N+1}) (s + 2 (1 + e_c)),   s = (1 + gamma_M)(1 + gamma_{n_c+1}).

The terms: the rounding of each element of `y` (`n_c` products and the bias:
`|fl(y) - y| <= gamma_{n_c+1} (|L| |x| + |b|)`, summed over the outputs: `gamma_{n_c+1}
(T + B)`); of the sum of `y` (`M` terms of total magnitude at most `(1 + gamma_{n_c+1})(T +
B)`); of the stored `c` and `d` (`e_c`: computed in float64 with at most `r` terms each -- `m`
for a linear layer, `max(C_out k_h k_w, M)` for a convolution -- and `c` stored in the network's
dtype, `|fl(c) - c| <= e_c a`); of `fl(1^T y) - c^T x` computed by one `addmv` of `N + 1`
terms (`|fl(1^T y)| <= s (T + B)`, `|c|^T |x| <= (1 + e_c) T` as `|c| <= a`); and of the
comparison window's arithmetic. `T` is computed by a second matrix-vector product with `a`
rounded up (after a `1 + 2 gamma_r` float64 margin), and `fl(a^T |x|) >= (1 - gamma_N) T`
for non-negative terms, so the check

    |fl(fl(1^T y) - c^T x) - d| <= k1 fl(a^T |x|) + k0,  k1 = 2K / (1 - gamma_N),  k0 = 2K B

(the factor 2 covers the rounding of the tolerance itself and of the higher-order terms; `k0`
also adds a bound on underflow, `2^-126` per product) never fails on a fault-free evaluation
of any input: no false positives by construction, not only on the monitored domain. For a
linear layer (`n_c = N = n`, `M = r = m`) this is the bound of the column checksum; for a
convolution the sums over the `M` outputs and the `N` inputs dominate `K` (cifar_base's first
convolution: `k1 ~ 1e-3`, against `4e-4` for its 1024-input linear layer). It fails for a
corrupted weight or bias of the layer, a corrupted element of `y`, and -- when `x = relu(p)`
(through a flatten) -- a corrupted element of `x`: the check recomputes `relu(p)` from the
layer's pre-activation `p` instead of reading `x`, so it covers the activation between the
layers too. Its cost: one sum over `y` and two `[batch, N] x [N]` products per layer (and one
ReLU where the input is an activation).

Chains (`verify.monitor.stages`, `verify.monitor.chains`). A BatchNorm of the layer's output
is folded into the check (`y` read after it; `c = L^T s`, `d` with its shift): a corrupted
BatchNorm parameter, running statistic or output breaks the sum as a corrupted layer does. An
average pooling between the ReLU and the layer (`fc(flatten(avgpool(relu(p))))`) is folded
in too (`c = P^T W^T 1`): the check reads `p`, so a corrupted ReLU output or pooled value
breaks it. In both cases the chain's float evaluation errs by a composed relative error `g`
in place of `gamma_{n_c+1}` above (`stages.compose`), and the tolerance keeps its form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, fx, nn

from bounds.graph.graph import Graph
from bounds.ops import ConvOp, LinearOp
from bounds.types import Interval, rounded_down, rounded_up
from verify.monitor.chains import inplace_users, input_chain, relu_call
from verify.monitor.stages import (
    Sums,
    batch_norm_affine,
    conv_sums,
    gamma,
    linear_sums,
    through_pool,
)

FLOAT64_UNIT = 2.0**-53


@dataclass(frozen=True)
class SumCheck:
    """The checksum of the linear node `node`: its input is `relu(source)` (`relu`) or
    `source`, flattened from dim 1 (`flatten`), its absolute value taken unless certified
    non-negative (`absolute`); `weights [2, n] = [c, a]`, `bias_sum = d`, tolerance
    `k1 * (a^T |x|) + k0`; all in the network's dtype. `cost`: the check's work relative to
    the layer's, `(M + 2 N) / (M n_c)` (its passes over `y` and `x` per multiply-add of the
    layer: `wrap(..., checksums=c)` keeps the checks of cost at most `c`)."""

    node: str
    source: str
    relu: bool
    flatten: bool
    absolute: bool
    weights: Tensor
    bias_sum: float
    k1: float
    k0: float
    cost: float = 0.0
    report: str | None = None  # the monitored node it flags, when not `node` (a BatchNorm's)

    @property
    def monitored(self) -> str:
        """The monitored node whose flag a failure sets."""
        return self.report or self.node


def _tolerance(sums: Sums, unit: float) -> tuple[float, float]:
    """`(k1, k0)` of the module docstring for the pieces `sums` (`verify.monitor.stages`): the
    chain's relative error `g` (a single layer: `gamma_{n_c+1}`), `M` outputs, `N` inputs
    (the values the check reads), `r` float64 terms of each entry of `c`, `a` and `d`, `B`, and
    the absolute part `E` of the error of `y` (a single layer: `g B`)."""
    inputs, outputs, folded, g_y = int(sums.c.numel()), sums.outputs, sums.folded, sums.error
    e_c = unit * (1 + gamma(folded, FLOAT64_UNIT)) + gamma(folded, FLOAT64_UNIT)
    g_n, g_m, g_n1 = gamma(inputs, unit), gamma(outputs, unit), gamma(inputs + 1, unit)
    s_y = (1 + g_m) * (1 + g_y)  # |fl(1^T y)| <= s_y T + (1 + g_m) (B + E)
    k = (
        g_y  # the rounding of y
        + g_m * (1 + g_y)  # of its sum
        + e_c  # of the stored c
        + g_n1 * (s_y + 1 + e_c)  # of fl(1^T y) - c^T x (N + 1 terms)
        + unit * (1 + g_n1) * (s_y + 2 * (1 + e_c))  # of the window's arithmetic
    )
    # B and E enter through |fl(1^T y)|: its sum, the addmv and the window
    k_b = g_m + (1 + g_m) * (g_n1 + unit * (1 + g_n1))
    constant = k_b * sums.bias + (1 + k_b) * sums.slack + gamma(folded, FLOAT64_UNIT) * sums.d_terms
    # underflow: every product of y, c^T x and a^T |x| errs by at most 2^-150 (float32) beyond
    # the relative model (sums of subnormals are exact); 2^-126 each is far more than enough
    tiny = (sums.products + 2 * inputs + outputs + 8) * 2.0**-126
    return 2 * k / (1 - g_n), 2 * constant + tiny


def sum_checks(
    net: nn.Module,
    gm: fx.GraphModule,
    graph: Graph,
    names: list[str],
    bounds: dict[str, Interval],
    unit: float,
) -> dict[str, SumCheck]:
    """The checksums of the monitored nodes `names` that an `nn.Linear` or `nn.Conv2d` of
    `net` computes with the bound graph's weights (compared exactly; `net` holds the certified
    weights when the monitor is built), keyed by node name; `bounds`: the float bounds of the
    graph nodes (a non-negative input needs no absolute value). A node that is a BatchNorm
    of a layer's output (folded into the layer's op by the graph) gets the checksum of the
    layer and the BatchNorm as the module computes them (`_layer`), and a layer whose input
    is an average pooling (of a ReLU) reads the pooling's input (`chains.input_chain`)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    dtype = next((t.dtype for t in net.parameters() if t.is_floating_point()), torch.float32)
    out = {}
    for name in names:
        node = by_name.get(name)
        op = graph[name].op
        if node is None or node.op != "call_module" or not isinstance(op, (LinearOp, ConvOp)):
            continue
        found = _layer(node, gm, op, graph[name].shape, unit, dtype)
        chain = None if found is None else input_chain(found[0], gm)
        if chain is None or (isinstance(op, ConvOp) and chain.flatten):
            continue
        _, read, sums = found
        if chain.pool is not None:
            sums = _pooled(sums, chain.pool, gm, graph, unit)
            if sums is None:
                continue
        source = chain.source.name
        absolute = chain.relu is None and not (
            source in bounds and bool((bounds[source].lower >= 0).all()))  # fmt: skip
        k1, k0 = _tolerance(sums, unit)
        a = sums.a * (1 + 2 * gamma(sums.folded, FLOAT64_UNIT))
        weights = torch.stack([sums.c.to(dtype), rounded_up(a, dtype)]).contiguous()
        inputs = int(sums.c.numel())
        out[name] = SumCheck(read.name, source, chain.relu is not None, chain.flatten, absolute,
                             weights, sums.d, float(rounded_up(torch.tensor(k1), dtype)),
                             float(rounded_up(torch.tensor(k0), dtype)),
                             (sums.outputs + 2 * inputs) / (sums.outputs * sums.terms),
                             None if read.name == name else name)  # fmt: skip
    return out


def _layer(node: fx.Node, gm: fx.GraphModule, op: LinearOp | ConvOp, shape, unit: float,
           dtype: torch.dtype) -> tuple[fx.Node, fx.Node, Sums] | None:  # fmt: skip
    """`(layer, read, sums)` of the monitored node `node`: the fx node of the layer whose input
    chain the check reads, the node whose output is `y`, and the pieces. A BatchNorm of a
    layer's output is a stage of its own (`y` read after it: a corrupted BatchNorm parameter,
    output or layer output breaks the sum); where its scale is outside the error model
    (`stages.batch_norm_affine`), the layer's own checksum, flagged at the BatchNorm's node."""
    build = linear_sums if isinstance(op, LinearOp) else conv_sums
    layer = _normalised_layer(node, gm)
    if layer is None:
        sums = build(gm.get_submodule(node.target), op, shape, None, unit)
        return None if sums is None else (node, node, sums)
    module = gm.get_submodule(layer.target)
    own = _own_op(module, op)
    if own is None:
        return None
    channels = int(own.weight.shape[0])
    affine = batch_norm_affine(gm.get_submodule(node.target), channels, dtype)
    if affine is None:
        sums = build(module, own, shape, None, unit)
        return None if sums is None else (layer, layer, sums)
    sums = build(module, own, shape, affine, unit)
    return None if sums is None else (layer, node, sums)


def _pooled(sums: Sums, pool: fx.Node, gm: fx.GraphModule, graph: Graph,
            unit: float) -> Sums | None:  # fmt: skip
    """`sums` read through the average pooling `pool` (its graph node gives its input's
    shape), or None."""
    if pool.name not in {n.name for n in graph.nodes}:
        return None
    shape = graph[graph[pool.name].inputs[0]].shape
    return through_pool(sums, gm.get_submodule(pool.target), shape, unit)


def _normalised_layer(node: fx.Node, gm: fx.GraphModule) -> fx.Node | None:
    """The `nn.Linear` / `nn.Conv2d` node whose only user is the BatchNorm module `node`."""
    if not isinstance(gm.get_submodule(node.target), nn.modules.batchnorm._BatchNorm):
        return None
    layer = node.args[0] if node.args else None
    if not isinstance(layer, fx.Node) or layer.op != "call_module" or len(layer.users) != 1:
        return None
    return layer if type(gm.get_submodule(layer.target)) in (nn.Linear, nn.Conv2d) else None


def _own_op(module: nn.Module, folded: LinearOp | ConvOp) -> LinearOp | ConvOp | None:
    """The op of `module` itself, with the geometry of `folded` (the op the graph folded a
    BatchNorm into), or None when the kinds differ."""
    weight = module.weight.detach()
    bias = None if module.bias is None else module.bias.detach()
    if isinstance(folded, LinearOp) and isinstance(module, nn.Linear):
        return LinearOp(weight, bias)
    if isinstance(folded, ConvOp) and isinstance(module, nn.Conv2d):
        return ConvOp(weight, bias, folded.in_shape, folded.stride, folded.padding,
                      folded.dilation, folded.groups)  # fmt: skip
    return None


class SumRecorder:
    """Records each checksum's gap `g = fl(1^T y) - fl(c^T x)` (a sum and an in-place
    `addmv`) and `t = fl(a^T |x|)` during a forward (`record`, called from the generated
    code) into buffers of the batch size. `holds()`: every `g` lies in
    `[d - k1 t - k0, d + k1 t + k0]` (`d -+ k0` rounded outwards; NaN fails), one clamp and
    one comparison for all layers; `flags()`: the per-sample `[batch, checks]` failures."""

    def __init__(self, checks: list[SumCheck], like: Tensor, node_index: list[int]) -> None:
        self.checks = checks
        self.node_index = torch.tensor(node_index, dtype=torch.long, device=like.device)
        self.signs = [c.weights[0].to(like.device) for c in checks]
        self.sizes = [c.weights[1].to(like.device) for c in checks]
        kw = dict(dtype=like.dtype, device=like.device)
        d = torch.tensor([c.bias_sum for c in checks], dtype=torch.float64)[:, None]
        k0 = torch.tensor([c.k0 for c in checks], dtype=torch.float64)[:, None]
        self.low = rounded_down(d - k0, like.dtype).to(like.device)
        self.high = rounded_up(d + k0, like.dtype).to(like.device)
        self.k1 = torch.tensor([c.k1 for c in checks], **kw)[:, None]
        self.kw = kw
        self._buffers: dict[int, Tensor] = {}
        self.gaps = self.totals = None

    def begin(self, batch: int) -> None:
        if batch not in self._buffers:  # the buffers and their rows, made once per batch size
            both = torch.empty(2, len(self.checks), batch, **self.kw)
            self._buffers = {batch: (both[0], both[1], list(both[0]), list(both[1]))}
        self.gaps, self.totals, self._gap_rows, self._total_rows = self._buffers[batch]
        self._detach = torch.is_grad_enabled()  # the buffers take no gradient

    def record(self, y: Tensor, source: Tensor, j: int) -> None:
        check = self.checks[j]
        if self._detach:
            y, source = y.detach(), source.detach()
        x = torch.relu(source) if check.relu else source
        if x.dim() != 2:  # a flatten, or a convolution's input
            x = x.reshape(x.shape[0], -1)
        gap = torch.sum(y if y.dim() == 2 else y.flatten(1), 1, out=self._gap_rows[j])
        gap.addmv_(x, self.signs[j], alpha=-1)  # 1^T y - c^T x
        torch.mv(x.abs() if check.absolute else x, self.sizes[j], out=self._total_rows[j])

    def _window(self) -> tuple[Tensor, Tensor]:
        return (torch.addcmul(self.low, self.totals, self.k1, value=-1),
                torch.addcmul(self.high, self.totals, self.k1))  # fmt: skip

    def holds(self) -> bool:
        """Whether every checksum of every sample holds (NaN: not)."""
        low, high = self._window()
        return torch.equal(torch.clamp(self.gaps, low, high), self.gaps)

    def flags(self) -> Tensor:
        """`[batch, checks]`: the failed checksums (NaN fails)."""
        low, high = self._window()
        return (~((self.gaps >= low) & (self.gaps <= high))).T


# `inplace_users` and `relu_call` (verify.monitor.chains) are re-exported for check.py
__all__ = ["SumCheck", "SumRecorder", "inplace_users", "relu_call", "sum_checks"]
