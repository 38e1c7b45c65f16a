"""Patches mode (`bounds.methods.windows.patch_bound`): the same bounds as the dense backward
pass on `unit_functionals`, for convolutions with strides, paddings, dilations, groups and
rectangular kernels, with shared (CROWN) and per-spec (alpha-CROWN) lines and their gradients,
through the dense fallback (a residual connection, a window as large as its node); and
CROWN's intervals contain sampled values of every node."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bounds.graph.graph import build_graph
from bounds.methods import crown
from bounds.methods import windows as window_module
from bounds.methods.alpha_crown import (
    AlphaCrownConfig,
    _chunk_lines,
    _init_alphas,
    _Problem,
    alpha_crown,
)
from bounds.methods.backward import backward_bound, relaxation_bounds
from bounds.methods.chunks import unit_functionals
from bounds.methods.crown import (
    bound_neurons,
    crown_intervals,
    default_lines,
    needs_crown,
    unstable_indices,
)
from bounds.methods.patches import to_dense
from bounds.methods.windows import (
    patch_bound,
    patches_start,
    window_lines,
    window_walk,
    windowed_activations,
)
from bounds.types import Interval
from tests.model_zoo import make
from tests.soundness import assert_contains, box_samples, spec_values

RTOL = 1e-9


def _chain(*layers: nn.Module) -> nn.Sequential:
    return nn.Sequential(*layers).double().eval()


class YoloBlocks(nn.Module):
    """TinyYOLO's shape (VNN-COMP 2023): a skip convolution beside conv-ReLU-conv, an identity
    skip, average pooling, a residual subtraction, then a strided head."""

    def __init__(self) -> None:
        super().__init__()
        conv = nn.Conv2d
        self.skip, self.c1, self.c3 = (
            conv(2, 3, 3, padding=1),
            conv(2, 3, 3, padding=1),
            conv(3, 3, 3, padding=1),
        )
        self.c5, self.c7 = conv(3, 3, 3, padding=1), conv(3, 3, (3, 1), padding=(1, 0))
        self.pool = nn.AvgPool2d(2)
        self.c12, self.c14 = conv(3, 3, 3, padding=1), conv(3, 3, 1)
        self.head = conv(3, 2, 3, stride=2)

    def forward(self, x):
        a = self.skip(x) + self.c3(torch.relu(self.c1(x)))
        b = torch.relu(a + self.c7(torch.relu(self.c5(a))))
        p = self.pool(b)
        c = torch.relu(p - self.c14(torch.relu(self.c12(p))))
        return self.head(c)


class MixedStrides(nn.Module):
    """A sum of two paths with different strides to the input (a 1x1 convolution of stride 2,
    a 5x5 one of stride 1): their windows are not translates of each other."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(1, 2, 1, stride=2), nn.Conv2d(1, 2, 5)
        self.c1, self.c2 = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x):
        h = torch.relu(self.c1(torch.relu(self.a(x) + self.b(x))))
        return self.c2(h)


def _nets() -> dict[str, tuple[nn.Module, tuple[int, ...]]]:
    torch.manual_seed(0)
    return {
        "stride_padding": (
            _chain(
                nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.ReLU(),
                nn.Conv2d(4, 5, 3, padding=1), nn.ReLU(),
                nn.Conv2d(5, 3, 2, stride=2),
            ),
            (2, 11, 11),
        ),
        "dilation_groups": (
            _chain(
                nn.Conv2d(2, 4, 3, padding=2, dilation=2), nn.ReLU(),
                nn.Conv2d(4, 6, 3, padding=1, groups=2), nn.ReLU(),
                nn.Conv2d(6, 4, 3, stride=2, padding=3, dilation=2, groups=2), nn.ReLU(),
                nn.Conv2d(4, 2, 1),
            ),
            (2, 9, 10),
        ),
        "rectangular": (
            _chain(
                nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 0)), nn.ReLU(),
                nn.Conv2d(4, 4, (2, 3), stride=(1, 2), padding=(0, 2)), nn.Tanh(),
                nn.Conv2d(4, 3, (3, 3), stride=(2, 3), padding=(2, 1)),
            ),
            (3, 12, 9),
        ),
        "avg_pool": (
            _chain(
                nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                nn.Conv2d(3, 3, 3, padding=1), nn.Sigmoid(), nn.Conv2d(3, 2, 2, stride=2),
            ),
            (1, 12, 12),
        ),
        "window_fills_node": (  # windows reach the node's size: dense from there
            _chain(
                nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Conv2d(2, 2, 3, padding=1),
                nn.ReLU(), nn.Conv2d(2, 2, 3, padding=1), nn.ReLU(), nn.Conv2d(2, 2, 3),
            ),
            (1, 5, 5),
        ),
        "sigmoid_chain": (
            _chain(
                nn.Conv2d(2, 3, 3, padding=1), nn.Sigmoid(),
                nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.Tanh(),
                nn.Conv2d(4, 3, 3, padding=1), nn.Sigmoid(), nn.Conv2d(3, 2, 2),
            ),
            (2, 10, 10),
        ),
        "conv_fc": (
            _chain(
                nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.ReLU(),
                nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 3),
            ),
            (2, 8, 8),
        ),
        "residual": make("residual"),
        "yolo_blocks": (YoloBlocks().double().eval(), (2, 14, 16)),
        "mixed_strides": (MixedStrides().double().eval(), (1, 8, 8)),
    }  # fmt: skip


NETS = _nets()


def _setup(name: str, batch: int = 2, eps: float = 0.3):
    net, shape = NETS[name]
    graph = build_graph(net, shape)
    gen = torch.Generator().manual_seed(1)
    center = torch.randn(batch, *shape, dtype=torch.float64, generator=gen)
    box = Interval(center - eps, center + eps)
    return net, graph, box, crown_intervals(graph, box)


def _conv_targets(graph) -> list[str]:
    """The CROWN targets bounded in patches mode (convolutions, residual sums)."""
    names = [n for n in needs_crown(graph) if patches_start(graph[n])]
    assert names, "the case has no convolution bounded by CROWN"
    return names


def _dense(graph, name, index, box, lines):
    A = unit_functionals(index, graph[name].shape, box.lower.shape[0], box.lower)
    return backward_bound(graph, name, A, box, lines)


@pytest.mark.parametrize("name", sorted(NETS))
def test_patches_equal_dense_crown_lines(name):
    _, graph, box, intervals = _setup(name)
    lines = default_lines(graph, intervals)
    for node in _conv_targets(graph):
        index = torch.arange(int(torch.Size(graph[node].shape).numel()))
        got = patch_bound(graph, node, index, box, lines)
        want = _dense(graph, node, index, box, lines)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("name", ["conv_fc", "residual", "stride_padding", "yolo_blocks"])
def test_bound_neurons_equal_dense(name):
    """Every CROWN target (convolutions in patches mode, fully connected layers from their
    rows) gets the dense pass's bounds on `unit_functionals`."""
    _, graph, box, intervals = _setup(name)
    lines = default_lines(graph, intervals)
    for node in needs_crown(graph):
        index = torch.arange(int(torch.Size(graph[node].shape).numel()))
        low, up = bound_neurons(graph, node, index, box, lambda offset, count: lines)
        want = _dense(graph, node, index, box, lines)
        torch.testing.assert_close(low, want[:, : index.numel()], rtol=RTOL, atol=RTOL)
        torch.testing.assert_close(up, -want[:, index.numel() :], rtol=RTOL, atol=RTOL)


def _alpha_lines(graph, intervals, specs: int, batch: int, seed: int):
    """Lines with a random lower slope per spec and neuron (alpha-CROWN's), as leaf tensors."""
    gen = torch.Generator().manual_seed(seed)
    alphas = {}
    for act in graph.activations():
        shape = (batch, specs, *act.shape)
        alphas[act.name] = torch.rand(shape, dtype=torch.float64, generator=gen).requires_grad_()

    def lines(act: str, windows=None):
        lower, upper = relaxation_bounds(graph, act, intervals, unsqueeze=True)
        relaxation = graph[act].op.relaxation
        params = alphas[act] if relaxation.name == "relu" else None
        line = relaxation.linear_bounds(lower, upper, params)
        return line if windows is None else window_lines(line, windows, graph[act].shape)

    return lines, alphas


@pytest.mark.parametrize(
    "name",
    ["stride_padding", "dilation_groups", "residual", "avg_pool", "rectangular", "yolo_blocks"],
)
def test_patches_equal_dense_per_spec_lines_and_gradients(name):
    _, graph, box, intervals = _setup(name)
    for node in _conv_targets(graph):
        numel = int(torch.Size(graph[node].shape).numel())
        index = torch.randperm(numel, generator=torch.Generator().manual_seed(2))[: numel // 2]
        lines, alphas = _alpha_lines(graph, intervals, 2 * index.numel(), 2, seed=3)
        got = patch_bound(graph, node, index, box, lines)
        want = _dense(graph, node, index, box, lines)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=RTOL)
        used = [a for a in alphas.values()]
        weights = torch.linspace(-1, 2, got.numel(), dtype=got.dtype).reshape(got.shape)
        g_got = torch.autograd.grad((got * weights).sum(), used, allow_unused=True)
        g_want = torch.autograd.grad((want * weights).sum(), used, allow_unused=True)
        for a, b in zip(g_got, g_want):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=RTOL, atol=RTOL)


def test_chain_stays_in_windows(monkeypatch):
    """A plain chain of convolutions and activations never builds a dense functional."""
    _, graph, box, intervals = _setup("stride_padding")
    lines = default_lines(graph, intervals)

    def refuse(*args):
        raise AssertionError("dense fallback on a chain")

    monkeypatch.setattr(window_module, "to_dense", refuse)
    monkeypatch.setattr(crown, "unit_functionals", refuse)
    for node in _conv_targets(graph):
        patch_bound(graph, node, torch.arange(10), box, lines)


@pytest.mark.parametrize("name", ["mixed_strides", "window_fills_node"])
def test_fallback_is_taken(monkeypatch, name):
    """Two paths to one node with different strides, or a window filling its node, go dense."""
    _, graph, box, intervals = _setup(name)
    calls = []
    original = window_module.to_dense

    def counted(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(window_module, "to_dense", counted)
    for node in _conv_targets(graph):
        index = torch.arange(int(torch.Size(graph[node].shape).numel()))
        patch_bound(graph, node, index, box, default_lines(graph, intervals))
    assert calls


def test_residual_blocks_stay_in_windows(monkeypatch):
    """Through residual sums (an identity skip, a convolution beside the branch, a
    subtraction) and pooling, every neuron's functional stays on windows to the input; each
    node is visited once, after all its consumers on the way."""
    monkeypatch.setattr(window_module, "WINDOW_SHARE", 1.0)  # windows up to their nodes' size
    _, graph, box, intervals = _setup("yolo_blocks")
    lines = default_lines(graph, intervals)
    position = {node.name: i for i, node in enumerate(graph.nodes)}
    for node in _conv_targets(graph):
        walk = window_walk(graph, node)
        names = [n.name for n, _ in walk.steps]
        assert not walk.cut and names[-1] == graph.input.name
        assert len(set(names)) == len(names)
        assert [position[n] for n in names] == sorted((position[n] for n in names), reverse=True)

    def refuse(*args):
        raise AssertionError("dense functional on residual blocks")

    monkeypatch.setattr(window_module, "to_dense", refuse)
    monkeypatch.setattr(crown, "unit_functionals", refuse)
    for node in _conv_targets(graph):
        index = torch.arange(int(torch.Size(graph[node].shape).numel()))
        patch_bound(graph, node, index, box, lines)


@pytest.mark.parametrize("share", [0.1, 0.5])
def test_a_cut_of_several_nodes_equals_dense(monkeypatch, share):
    """Windows that outgrow `WINDOW_SHARE` while several nodes are left (both branches of a
    residual block) make every one of those nodes dense at once: the dense pass's bounds."""
    monkeypatch.setattr(window_module, "WINDOW_SHARE", share)
    _, graph, box, intervals = _setup("yolo_blocks")
    lines = default_lines(graph, intervals)
    cuts = 0
    for node in _conv_targets(graph):
        cuts += len(window_walk(graph, node).cut) > 1
        index = torch.arange(int(torch.Size(graph[node].shape).numel()))
        got = patch_bound(graph, node, index, box, lines)
        torch.testing.assert_close(
            got, _dense(graph, node, index, box, lines), rtol=RTOL, atol=RTOL
        )
    assert cuts, "no cut of several nodes"


def test_residual_windows_sound_in_floating_point():
    """A float32 network's residual blocks with the rounding tracked (`intervals`: each step's
    and each merge's): every bound lies on the right side of the neurons' float64 values at
    sampled points and box corners."""
    _, graph, box, _ = _setup("yolo_blocks", eps=0.5)
    g32 = graph.to(torch.float32, "cpu")
    box32 = Interval(box.lower.float(), box.upper.float())
    iv32 = crown_intervals(g32, box32)  # sound in floating point, rounded outward
    lines = default_lines(g32, iv32)
    values = graph.forward(
        box_samples(box32.lower.double(), box32.upper.double(), 300).flatten(0, 1),
        all_values=True,
    )
    for node in _conv_targets(g32):
        numel = int(torch.Size(g32[node].shape).numel())
        index = torch.arange(numel)
        got = patch_bound(g32, node, index, box32, lines, iv32).double()
        v = values[node].reshape(2, -1, numel)
        assert (got[:, None, :numel] <= v).all() and (-got[:, None, numel:] >= v).all(), node


@pytest.mark.parametrize("name", sorted(NETS))
def test_crown_bounds_contain_samples(name):
    """CROWN's intervals of every node and its output bounds contain sampled values."""
    net, graph, box, intervals = _setup(name, eps=0.5)
    points = box_samples(box.lower, box.upper, 200)
    batch, n = points.shape[:2]
    flat = points.reshape(batch * n, *points.shape[2:])
    values = graph.forward(flat, all_values=True)
    for node in graph.nodes[1:]:
        v = values[node.name].reshape(batch, n, -1)
        iv = intervals[node.name]
        assert (iv.lower.reshape(batch, 1, -1) <= v + 1e-9).all(), node.name
        assert (v <= iv.upper.reshape(batch, 1, -1) + 1e-9).all(), node.name
    outputs = int(torch.Size(graph.output.shape).numel())
    C = torch.eye(outputs, dtype=torch.float64).expand(batch, outputs, outputs)
    lower, upper, _ = crown.crown(graph, box, C)
    with torch.no_grad():
        assert_contains(lower, upper, spec_values(net, points, C))


def _alpha_problem(graph, box, intervals):
    targets = {n: unstable_indices(graph, n, intervals[n]) for n in needs_crown(graph)}
    targets = {n: index for n, index in targets.items() if index.numel()}
    chunks = {n: index.numel() for n, index in targets.items()}
    outputs = int(torch.Size(graph.output.shape).numel())
    C = torch.eye(outputs, dtype=torch.float64).expand(box.lower.shape[0], outputs, outputs)
    return _Problem(graph, box, C, intervals, targets, (), chunks)


@pytest.mark.parametrize("name", ["stride_padding", "sigmoid_chain", "avg_pool", "yolo_blocks"])
def test_window_slopes_equal_dense_slopes(monkeypatch, name):
    """alpha-CROWN's slopes on the windows (`_init_alphas`) give each convolution's bounds and
    their gradients of the dense slopes (scattered back, zero outside the windows)."""
    _, graph, box, intervals = _setup(name)
    problem = _alpha_problem(graph, box, intervals)
    windowed = _init_alphas(problem)
    with monkeypatch.context() as m:
        m.setattr(window_module, "_window_step", lambda node, w: False)
        dense = _init_alphas(problem)
    checked = 0
    for start in _conv_targets(graph):
        index = problem.targets.get(start)
        if index is None:
            continue
        results, grads = [], []
        for alphas, patch in ((windowed, True), (dense, False)):
            with monkeypatch.context() as m:
                if not patch:
                    m.setattr(window_module, "_window_step", lambda node, w: False)
                lines = _chunk_lines(problem, intervals, alphas, start)(0, index.numel())
                result = patch_bound(graph, start, index, box, lines)
            keys = [k for k in alphas if k[0] == start]
            weights = torch.linspace(-1, 2, result.numel(), dtype=result.dtype)
            total = (result * weights.reshape(result.shape)).sum()
            results.append(result)
            grads.append(dict(zip(keys, torch.autograd.grad(total, [alphas[k] for k in keys]))))
        torch.testing.assert_close(results[0], results[1], rtol=RTOL, atol=RTOL)
        windows = windowed_activations(graph, start, index)
        for key, want in grads[1].items():
            got = grads[0][key]
            if key[1] in windows:  # [B, 2, k, C, Mh, Mw, ...] -> dense
                act = graph[key[1]]
                batch, specs = got.shape[0], 2 * index.numel()
                flat = got.reshape(batch, specs, *got.shape[3:6], -1).movedim(-1, 1)
                flat = flat.reshape(-1, specs, *got.shape[3:6])
                scattered = to_dense(flat, windows[key[1]], act.shape)
                got = scattered.reshape(batch, -1, specs, *act.shape).movedim(1, -1)
                got = got.reshape(want.shape)
                checked += 1
            torch.testing.assert_close(got, want, rtol=RTOL, atol=RTOL)
    assert checked, "no slopes on windows"


@pytest.mark.parametrize("name", ["stride_padding", "dilation_groups", "yolo_blocks"])
def test_alpha_crown_windows_equal_dense(monkeypatch, name):
    """alpha-CROWN with its intermediate slopes on the windows gives the dense run's bounds
    (slopes outside the windows get no gradient, so Adam never moves them). Two steps: Adam
    divides each gradient by its own size, so a gradient that is zero in one summation order
    and a rounding residue (1e-17) in the other moves a slope by up to `lr * 1e-9` per step;
    over many steps the two runs drift apart by more than rounding (1e-8 after 6 steps here),
    both valid; so do kinks of a relaxation (an S-shape's case split) that a bound equal up to
    rounding falls on either side of."""
    _, graph, box, _ = _setup(name)
    outputs = int(torch.Size(graph.output.shape).numel())
    C = torch.eye(outputs, dtype=torch.float64).expand(2, outputs, outputs)
    config = AlphaCrownConfig(iterations=2, lr=0.2, compile=False)
    windows = alpha_crown(graph, box, C, config)
    monkeypatch.setattr(window_module, "_window_step", lambda node, w: False)
    dense = alpha_crown(graph, box, C, config)
    assert windows[3]["iterations"] == dense[3]["iterations"]
    for got, want in zip(windows[:2], dense[:2]):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=RTOL)
    for node in graph.nodes:
        torch.testing.assert_close(windows[2][node.name].lower, dense[2][node.name].lower)
        torch.testing.assert_close(windows[2][node.name].upper, dense[2][node.name].upper)
