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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, fx, nn

from bounds.graph.graph import Graph
from bounds.ops import ConvOp, LinearOp
from bounds.types import Interval, rounded_down, rounded_up

FLOAT64_UNIT = 2.0**-53


def _gamma(n: int, unit: float) -> float:
    return n * unit / (1 - n * unit)


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


_RELU_FUNCTIONS = (torch.relu, nn.functional.relu)
_INPLACE_RELU_FUNCTIONS = (torch.relu_, nn.functional.relu_)


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


def _is_relu(node: fx.Node, gm: fx.GraphModule) -> bool:
    return relu_call(node, gm) is not None


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


def _input_chain(node: fx.Node, gm: fx.GraphModule) -> tuple[fx.Node, fx.Node | None, bool] | None:
    """`(source, relu, flatten)`: the layer input is `[flatten](relu(source))` (`relu`: the
    ReLU node) or `[flatten](source)`, peeling at most one flatten and one ReLU (either
    order)."""
    x = node.args[0]
    relu, flatten = None, False
    for _ in range(2):
        if not isinstance(x, fx.Node):
            return None
        if not flatten and _is_flatten(x, gm):
            flatten, x = True, x.args[0]
        elif relu is None and _is_relu(x, gm):
            relu, x = x, x.args[0]
        else:
            break
    return (x, relu, flatten) if isinstance(x, fx.Node) else None


def _tolerance(
    terms: int, outputs: int, inputs: int, folded: int, bias_abs: float, unit: float
) -> tuple[float, float]:
    """`(k1, k0)` of the module docstring: `terms` products per output element (`n_c`),
    `outputs` elements (`M`), `inputs` elements (`N`), `folded` float64 terms of each entry of
    `c`, `a` and of `d` (`r`), `bias_abs` = `B` (float64)."""
    e_c = unit * (1 + _gamma(folded, FLOAT64_UNIT)) + _gamma(folded, FLOAT64_UNIT)
    g_n, g_c1, g_m = _gamma(inputs, unit), _gamma(terms + 1, unit), _gamma(outputs, unit)
    g_n1 = _gamma(inputs + 1, unit)
    s_y = (1 + g_m) * (1 + g_c1)  # |fl(1^T y)| <= s_y (T + B)
    k = (
        g_c1  # the rounding of y
        + g_m * (1 + g_c1)  # of its sum
        + e_c  # of the stored c and d
        + g_n1 * (s_y + 1 + e_c)  # of fl(1^T y) - c^T x (N + 1 terms)
        + unit * (1 + g_n1) * (s_y + 2 * (1 + e_c))  # of the window's arithmetic
    )
    big_b = bias_abs * (1 + 2 * _gamma(folded, FLOAT64_UNIT))
    # underflow: every product of y, c^T x and a^T |x| errs by at most 2^-150 (float32) beyond
    # the relative model (sums of subnormals are exact); 2^-126 each is far more than enough
    tiny = (outputs * terms + 2 * inputs + outputs + 8) * 2.0**-126
    return 2 * k / (1 - g_n), 2 * k * big_b + tiny


def _linear_sums(module: nn.Module, op: LinearOp, shape) -> tuple | None:
    """`(c, a, d, B, n_c, M, N, r)` (float64) of an `nn.Linear` computing `op`, or None."""
    if (
        type(module) is not nn.Linear
        or module.weight.shape != op.weight.shape
        or tuple(shape) != (op.weight.shape[0],)
    ):
        return None
    w64 = op.weight.double()
    b64 = _bias64(op.bias, w64.shape[0], w64)
    if not _same(module, w64, b64):
        return None
    m, n = w64.shape
    a = w64.abs().sum(0)
    return w64.sum(0), a, float(b64.sum()), float(b64.abs().sum()), n, m, n, m


def _conv_sums(module: nn.Module, op: ConvOp, shape) -> tuple | None:
    """`(c, a, d, B, n_c, M, N, r)` (float64) of an `nn.Conv2d` computing `op`, or None: `c =
    L^T 1` and `a = |L|^T 1` (the adjoint of the convolution, and of its absolute kernel,
    applied to an all-ones output: input-shaped, flattened), `d = (H' W') 1^T b`."""
    if (
        type(module) is not nn.Conv2d
        or module.padding_mode != "zeros"
        or isinstance(module.padding, str)
        or module.weight.shape != op.weight.shape
        or tuple(module.stride) != tuple(op.stride)
        or tuple(module.padding) != tuple(op.padding)
        or tuple(module.dilation) != tuple(op.dilation)
        or module.groups != op.groups
        or tuple(shape) != tuple(op.out_shape)
    ):
        return None
    w64 = op.weight.double()
    b64 = _bias64(op.bias, w64.shape[0], w64)
    if not _same(module, w64, b64):
        return None
    ones = torch.ones(1, *op.out_shape, dtype=torch.float64)
    signed = ConvOp(w64, None, op.in_shape, op.stride, op.padding, op.dilation, op.groups)
    size = ConvOp(w64.abs(), None, op.in_shape, op.stride, op.padding, op.dilation, op.groups)
    c, a = signed.adjoint(ones).reshape(-1), size.adjoint(ones).reshape(-1)
    spatial = op.out_shape[1] * op.out_shape[2]
    outputs = op.out_shape[0] * spatial
    terms = int(w64[0].numel())  # (C_in / groups) kh kw products per output element
    folded = max(int(w64.shape[0]) * int(w64[0, 0].numel()), outputs)
    return (c, a, float(b64.sum()) * spatial, float(b64.abs().sum()) * spatial, terms, outputs,
            int(c.numel()), folded)  # fmt: skip


def _bias64(bias: Tensor | None, rows: int, like: Tensor) -> Tensor:
    return bias.double() if bias is not None else like.new_zeros(rows)


def _same(module: nn.Module, w64: Tensor, b64: Tensor) -> bool:
    """Whether the module holds the bound graph's weights (exactly)."""
    own = module.bias if module.bias is not None else torch.zeros_like(b64)
    return torch.equal(module.weight.detach().double(), w64) and torch.equal(
        own.detach().double(), b64
    )


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
    layer as the module computes it, before the BatchNorm (its own weights), flagged at the
    BatchNorm's node."""
    by_name = {n.name: n for n in gm.graph.nodes}
    dtype = next((t.dtype for t in net.parameters() if t.is_floating_point()), torch.float32)
    out = {}
    for name in names:
        node = by_name.get(name)
        op = graph[name].op
        if node is None or node.op != "call_module" or not isinstance(op, (LinearOp, ConvOp)):
            continue
        layer = _normalised_layer(node, gm)
        if layer is not None:  # the layer before the BatchNorm, with the module's weights
            node, op = layer, _own_op(gm.get_submodule(layer.target), op)
            if op is None:
                continue
        module = gm.get_submodule(node.target)
        shape = graph[name].shape
        found = (_linear_sums if isinstance(op, LinearOp) else _conv_sums)(module, op, shape)
        if found is None:
            continue
        chain = _input_chain(node, gm)
        if chain is None or inplace_users(chain[0], gm, allowed=chain[1]):
            continue
        source, relu_node, flatten = chain
        if isinstance(op, ConvOp) and flatten:
            continue
        c, a, d, big_b, terms, outputs, inputs, folded = found
        relu = relu_node is not None
        k1, k0 = _tolerance(terms, outputs, inputs, folded, big_b, unit)
        a = a * (1 + 2 * _gamma(folded, FLOAT64_UNIT))
        weights = torch.stack([c.to(dtype), rounded_up(a, dtype)]).contiguous()
        held = graph[name].inputs[0]
        absolute = not relu and not (held in bounds and bool((bounds[held].lower >= 0).all()))
        out[name] = SumCheck(node.name, source.name, relu, flatten, absolute, weights, d,
                             float(rounded_up(torch.tensor(k1), dtype)),
                             float(rounded_up(torch.tensor(k0), dtype)),
                             (outputs + 2 * inputs) / (outputs * terms),
                             None if node.name == name else name)  # fmt: skip
    return out


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


def inplace_users(node: fx.Node, gm: fx.GraphModule, allowed: fx.Node | None = None) -> bool:
    """Whether a user of `node` (other than `allowed`) may modify its value in place (a check
    then keeps a copy)."""
    for user in node.users:
        if user is allowed:
            continue
        if user.op == "call_module" and getattr(gm.get_submodule(user.target), "inplace", False):
            return True
        name = user.target if isinstance(user.target, str) else getattr(user.target, "__name__", "")
        if user.kwargs.get("inplace") or (name.endswith("_") and not name.endswith("__")):
            return True
    return False


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
