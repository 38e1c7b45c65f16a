"""Checksum invariants of the linear layers of a monitored network (`verify.monitor`).

For a layer `y = W x + b` (`W` of shape `[m, n]`) the column checksum of algorithm-based fault
tolerance (Huang and Abraham, "Algorithm-Based Fault Tolerance for Matrix Operations", IEEE
Trans. Computers C-33(6), 1984, Sec. III) holds for every input in exact arithmetic:

    1^T y = c^T x + d,    c = W^T 1,  d = 1^T b.

A float evaluation meets it up to its rounding errors; with `T = a^T |x|`, `a = |W|^T 1` and
`B = |b|^T 1` (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Sec. 3.1,
`gamma_k = k u / (1 - k u)` for sums in any order, FMA or not):

    |fl(fl(1^T y) - c^T x) - d| <= K (T + B),
    K = gamma_{n+1} + gamma_m (1 + gamma_{n+1}) + e_c + gamma_{n+1} (s + 1 + e_c)
        + u (1 + gamma_{n+1}) (s + 2 (1 + e_c)),   s = (1 + gamma_m)(1 + gamma_{n+1})

(the rounding of `y`, of its sum, of the stored `c` and `d`, of `fl(1^T y) - c^T x`
computed by one `addmv` of `n + 1` terms, and of the comparison window's arithmetic; `e_c`
bounds the rounding of `c`, `d` computed in float64 and stored in the network's dtype). `T` is
computed by a second matrix-vector product, and `fl(a^T |x|) >= (1 - gamma_n) T` for
non-negative terms, so the check

    |fl(fl(1^T y) - c^T x) - d| <= k1 fl(a^T |x|) + k0,  k1 = 2K / (1 - gamma_n),  k0 = 2K B

(the factor 2 covers the rounding of the tolerance itself and of the higher-order terms) never
fails on a fault-free evaluation of any input: no false positives by construction, not only on
the monitored domain. It fails for a corrupted weight or bias of the layer, a corrupted element
of `y`, and -- when `x = relu(p)` (through a flatten) -- a corrupted element of `x`: the check
recomputes `relu(p)` from the layer's pre-activation `p` instead of reading `x`, so it covers
the activation between the layers too. Its cost: one sum over `y` and two `[batch, n] x [n]`
products per layer (and one ReLU where the input is an activation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, fx, nn

from bounds.graph import Graph
from bounds.ops import LinearOp
from bounds.types import Interval, rounded_down, rounded_up

FLOAT64_UNIT = 2.0**-53
_RELU_FUNCTIONS = (torch.relu, nn.functional.relu)


def _gamma(n: int, unit: float) -> float:
    return n * unit / (1 - n * unit)


@dataclass(frozen=True)
class SumCheck:
    """The checksum of the linear node `node`: its input is `relu(source)` (`relu`) or
    `source`, flattened from dim 1 (`flatten`), its absolute value taken unless certified
    non-negative (`absolute`); `weights [2, n] = [c, a]`, `bias_sum = d`, tolerance
    `k1 * (a^T |x|) + k0`; all in the network's dtype."""

    node: str
    source: str
    relu: bool
    flatten: bool
    absolute: bool
    weights: Tensor
    bias_sum: float
    k1: float
    k0: float


def _is_relu(node: fx.Node, gm: fx.GraphModule) -> bool:
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)) is nn.ReLU
    return node.op == "call_function" and node.target in _RELU_FUNCTIONS and not node.kwargs


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


def _tolerance(weight: Tensor, bias: Tensor, unit: float) -> tuple[float, float]:
    """`(k1, k0)` of the module docstring for a float64 `weight [m, n]`, `bias [m]`."""
    m, n = weight.shape
    e_c = unit * (1 + _gamma(m, FLOAT64_UNIT)) + _gamma(m, FLOAT64_UNIT)
    g_n, g_n1, g_m = _gamma(n, unit), _gamma(n + 1, unit), _gamma(m, unit)
    s_y = (1 + g_m) * (1 + g_n1)  # |fl(1^T y)| <= s_y (T + B)
    k = (
        g_n1  # the rounding of y
        + g_m * (1 + g_n1)  # of its sum
        + e_c  # of the stored c and d
        + g_n1 * (s_y + 1 + e_c)  # of fl(1^T y) - c^T x (one addmv: n + 1 terms)
        + unit * (1 + g_n1) * (s_y + 2 * (1 + e_c))  # of the window's arithmetic
    )
    big_b = float(bias.abs().sum()) * (1 + _gamma(m, FLOAT64_UNIT))
    tiny = (n + m + 8) * 2.0**-126  # underflow of the products and sums (float32's smallest)
    return 2 * k / (1 - g_n), 2 * k * big_b + tiny


def sum_checks(
    net: nn.Module,
    gm: fx.GraphModule,
    graph: Graph,
    names: list[str],
    bounds: dict[str, Interval],
    unit: float,
) -> dict[str, SumCheck]:
    """The checksums of the monitored nodes `names` that an `nn.Linear` of `net` computes
    with the bound graph's weights (compared exactly; `net` holds the certified weights when
    the monitor is built), keyed by node name; `bounds`: the float bounds of the graph nodes
    (a non-negative input needs no absolute value)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    dtype = next((t.dtype for t in net.parameters() if t.is_floating_point()), torch.float32)
    out = {}
    for name in names:
        node = by_name.get(name)
        if node is None or node.op != "call_module" or not isinstance(graph[name].op, LinearOp):
            continue
        module = gm.get_submodule(node.target)
        op = graph[name].op
        if (
            type(module) is not nn.Linear
            or module.weight.shape != op.weight.shape
            or tuple(graph[name].shape) != (op.weight.shape[0],)
        ):
            continue
        bias = op.bias if op.bias is not None else op.weight.new_zeros(op.weight.shape[0])
        own_bias = module.bias if module.bias is not None else torch.zeros_like(bias)
        if not (
            torch.equal(module.weight.detach().double(), op.weight.double())
            and torch.equal(own_bias.detach().double(), bias.double())
        ):
            continue
        chain = _input_chain(node, gm)
        if chain is None or inplace_users(chain[0], gm, allowed=chain[1]):
            continue
        source, relu_node, flatten = chain
        relu = relu_node is not None
        w64, b64 = op.weight.double(), bias.double()
        k1, k0 = _tolerance(w64, b64, unit)
        c = w64.sum(0)
        a = w64.abs().sum(0) * (1 + _gamma(w64.shape[0], FLOAT64_UNIT))
        weights = torch.stack([c.to(dtype), rounded_up(a, dtype)]).contiguous()
        held = graph[name].inputs[0]
        absolute = not relu and not (held in bounds and bool((bounds[held].lower >= 0).all()))
        out[name] = SumCheck(name, source.name, relu, flatten, absolute, weights,
                             float(b64.sum()), float(rounded_up(torch.tensor(k1), dtype)),
                             float(rounded_up(torch.tensor(k0), dtype)))  # fmt: skip
    return out


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
        if batch not in self._buffers:
            self._buffers = {batch: torch.empty(2, len(self.checks), batch, **self.kw)}
        self.gaps, self.totals = self._buffers[batch]

    def record(self, y: Tensor, source: Tensor, j: int) -> None:
        check, y, source = self.checks[j], y.detach(), source.detach()
        x = torch.relu(source) if check.relu else source
        if check.flatten:
            x = x.reshape(x.shape[0], -1)
        gap = torch.sum(y, 1, out=self.gaps[j])
        gap.addmv_(x, self.signs[j], alpha=-1)  # 1^T y - c^T x
        torch.mv(x.abs() if check.absolute else x, self.sizes[j], out=self.totals[j])

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
