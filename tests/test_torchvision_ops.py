"""The building blocks of torchvision's classification models, written as torchvision writes them
(`tests/torchvision_zoo.py`, narrow): adaptive average pooling of any output size, in-place
ReLUs, `torch.flatten`, global average pooling, padded max pooling, BatchNorm in eval mode and
residual adds with a 1x1 downsample. The bound graph computes each network; IBP and CROWN
bounds contain sampled outputs (float64, no tolerance); the ONNX exports load to the same
function; monitors built on them flag no in-domain sample and clipping moves nothing."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import verify
from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import build_graph
from bounds.ops import AdaptiveAvgPoolOp, ConvOp
from bounds.ops.adaptive_pool import adaptive_windows
from tests.soundness import assert_contains, box_samples
from tests.torchvision_zoo import randomise_batchnorm, resnet18, vgg11
from verify.io.onnx_loader import load_onnx
from verify.monitor import Ball, MonitorOptionError

D = torch.float64

# name -> (constructor, input shape): narrow versions of the benchmark's models
MODELS = {
    "resnet18": (lambda: resnet18(width=2), (3, 16, 16)),  # 7x7 stem, padded max pool
    "resnet18_cifar": (lambda: resnet18(width=2, cifar_stem=True), (3, 8, 8)),
    "vgg11": (lambda: vgg11(width=2, hidden=8), (3, 32, 32)),  # 1x1 pooled to 7x7
    "vgg11_bn_pool3": (lambda: vgg11(width=2, pool=(3, 3), hidden=8, batch_norm=True),
                       (3, 32, 32)),
}


def model(name: str, dtype: torch.dtype = D) -> tuple[nn.Module, tuple[int, ...]]:
    constructor, shape = MODELS[name]
    torch.manual_seed(0)
    net = randomise_batchnorm(constructor()).to(dtype).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net, shape


def ball(shape, eps: float, dtype: torch.dtype = D, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    centre = (torch.rand(1, *shape, generator=gen, dtype=dtype) * (1 - 2 * eps) + eps)
    return centre, centre - eps, centre + eps


@pytest.mark.parametrize("size", [(2, 3), (3, 3), (5, 2), (7, 7), (1, 1), (4, None), 3, (10, 9)])
@pytest.mark.parametrize("spatial", [(5, 7), (4, 6), (1, 1)])
def test_adaptive_pool_is_computed_exactly(size, spatial):
    """Overlapping, repeated (output larger than input) and divisible windows; `None` keeps
    the axis."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 3, 1)  # float64 weights: the graph is built in float64
    x = torch.randn(4, 3, *spatial, dtype=D, generator=torch.Generator().manual_seed(0))
    for pool in (nn.AdaptiveAvgPool2d(size), _Functional(size)):
        net = nn.Sequential(conv, pool).double()
        graph = build_graph(net, (3, *spatial))
        with torch.no_grad():
            torch.testing.assert_close(graph.forward(x), net(x), rtol=0, atol=1e-14)


class _Functional(nn.Module):
    def __init__(self, size) -> None:
        super().__init__()
        self.size = size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.size)


def test_adaptive_pool_ops():
    """Divisible sizes become a strided average pooling, others the separable op; windows as
    torch's `start_index` / `end_index`."""
    assert isinstance(build_graph(nn.AdaptiveAvgPool2d(2), (3, 4, 6)).output.op, ConvOp)
    op = build_graph(nn.AdaptiveAvgPool2d((3, 2)), (3, 5, 7)).to(D).output.op
    assert isinstance(op, AdaptiveAvgPoolOp)
    assert adaptive_windows(5, 3) == [(0, 2), (1, 4), (3, 5)]
    assert adaptive_windows(1, 3) == [(0, 1)] * 3
    assert op.fan_in() == 3 * 4 and op.fan_out() == 2 * 2  # windows (0, 4), (3, 7) along 7
    A = torch.randn(6, *op.out_shape, dtype=D)  # the adjoint is the transpose
    x = torch.randn(6, *op.in_shape, dtype=D)
    lhs = (op.linear(x) * A).sum()
    torch.testing.assert_close(lhs, (x * op.adjoint(A)).sum(), rtol=1e-12, atol=0)


def test_adaptive_pool_needs_spatial_axes():
    with pytest.raises(UnsupportedOperationError) as info:
        build_graph(nn.Sequential(nn.Linear(4, 6), nn.Unflatten(1, (6, 1)),
                                  nn.AdaptiveAvgPool2d(1)), (4,))  # fmt: skip
    assert info.value.operation == "adaptive_avg_pool2d"


class InPlace(nn.Module):
    """Every in-place ReLU spelling, and a tensor read again after its in-place ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = F.relu(self.conv1(x), inplace=True)
        g = self.conv2(h)
        a = g.relu_()
        s = torch.relu_(a - 0.1) + g  # g was overwritten by relu_
        s = self.relu(s)
        return self.fc(torch.flatten(s.mean((2, 3)), 1))


def test_in_place_relus_are_computed():
    torch.manual_seed(0)
    net = InPlace().double().eval()
    graph = build_graph(net, (3, 5, 5))
    x = torch.randn(6, 3, 5, 5, dtype=D)
    torch.testing.assert_close(graph.forward(x), net(x), rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_graph_computes_the_model(name):
    net, shape = model(name)
    graph = build_graph(net, shape)
    x = torch.rand(3, *shape, dtype=D, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(graph.forward(x), net(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bounds_contain_samples(name):
    net, shape = model(name)
    _, lower, upper = ball(shape, 0.02)
    assert_bounds_contain_samples(net, shape, lower, upper, 200, seed=3)


def assert_bounds_contain_samples(net, shape, lower, upper, count: int, seed: int) -> None:
    """IBP's and CROWN's bounds on `net`'s graph over the box contain its values at `count`
    sampled points and corners (float64, no tolerance)."""
    graph = build_graph(net, shape)
    points = box_samples(lower, upper, count, seed=seed)
    with torch.no_grad():
        values = net(points[0]).unsqueeze(0)
    for method in ("ibp", "crown"):
        found = verify.bounds(graph, lower=lower, upper=upper, method=method)
        assert_contains(found.lower, found.upper, values, tol=0.0)


def export(net: nn.Module, shape, preserve_batchnorm: bool = False) -> bytes:
    """`torch.onnx.export` (TorchScript exporter, offline), opset 13; the eval-mode BatchNorms
    kept as BatchNormalization nodes when asked (else folded into the convolutions)."""
    data = io.BytesIO()
    mode = torch.onnx.TrainingMode.PRESERVE if preserve_batchnorm else torch.onnx.TrainingMode.EVAL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net.float(), (torch.zeros(1, *shape),), data, dynamo=False,
                          opset_version=13, training=mode)  # fmt: skip
    return data.getvalue()


ONNX_MODELS = {  # torch's exporter refuses adaptive pooling whose sizes do not divide
    "resnet18": (lambda: resnet18(width=2), (3, 16, 16), {"GlobalAveragePool", "MaxPool", "Add"}),
    "vgg11_bn": (lambda: vgg11(width=2, pool=(1, 1), hidden=8, batch_norm=True), (3, 32, 32),
                 {"GlobalAveragePool", "BatchNormalization", "MaxPool", "Flatten"}),
    "divisible_pool": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                                             nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(2),
                                             nn.Flatten(), nn.Linear(16, 3)),
                       (3, 8, 6), {"AveragePool", "BatchNormalization", "Flatten"}),
}


@pytest.mark.parametrize("name", sorted(ONNX_MODELS))
def test_onnx_export_loads_to_the_same_function(name, tmp_path):
    import onnx

    constructor, shape, ops = ONNX_MODELS[name]
    torch.manual_seed(0)
    net = randomise_batchnorm(constructor()).eval().requires_grad_(False)
    data = export(net, shape, preserve_batchnorm=True)
    assert ops <= {n.op_type for n in onnx.load_from_string(data).graph.node}
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(data)
    loaded = load_onnx(path).double()
    reference = net.double()
    x = torch.rand(4, *shape, dtype=D, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():  # float32 weights, evaluated in float64 by both
        torch.testing.assert_close(loaded(x), reference(x), rtol=1e-12, atol=1e-12)
    _, lower, upper = ball(shape, 0.02)
    assert_bounds_contain_samples(loaded, shape, lower, upper, 100, seed=5)
    mon = verify.monitor(loaded.float(), Ball(((lower + upper) / 2)[0].float(), 0.02),
                         method="ibp", input_shape=shape)  # fmt: skip
    _no_false_positives(mon, loaded.float(), lower.float(), upper.float())


def _no_false_positives(mon, net: nn.Module, lower, upper) -> None:
    inside = torch.cat([lower, upper, box_samples(lower, upper, 64, seed=6)[0]])
    inside = torch.minimum(torch.maximum(inside, lower), upper)
    with torch.no_grad():
        plain = net(inside)
        for checksums in (True, False):
            for through in (False, True):
                detect = mon.wrap(net, "detect", checksums=checksums, through_relu=through)
                assert torch.equal(detect(inside), plain)
                assert not bool(detect.report.flagged.any()), detect.report.first_node
        clip = mon.wrap(net, "clip")
        assert torch.equal(clip(inside), plain)


MONITOR_CASES = [
    pytest.param(name, method, marks=[pytest.mark.slow] if slow else [])
    for name in sorted(MODELS)
    for method in ("ibp", "crown")
    for slow in [method == "crown" and name.startswith("vgg")]
]


@pytest.mark.parametrize(("name", "method"), MONITOR_CASES)
def test_monitor_has_no_false_positives(name, method):
    """float32 inference, ranges over an eps ball; the pre-activations before in-place ReLUs
    are monitored too (and checked with their checksums)."""
    net, shape = model(name, torch.float32)
    centre, lower, upper = ball(shape, 0.02, torch.float32)
    mon = verify.monitor(net, Ball(centre[0], 0.02), method=method, input_shape=shape)
    assert any(n.endswith("bn1") or n.endswith("_0") for n in mon.affine), mon.affine
    _no_false_positives(mon, net, lower, upper)


def test_monitor_sees_faults_on_the_model():
    """A large weight fault in a downsample convolution is flagged by detection."""
    net, shape = model("resnet18_cifar", torch.float32)
    centre, lower, upper = ball(shape, 0.02, torch.float32)
    mon = verify.monitor(net, Ball(centre[0], 0.02), method="ibp", input_shape=shape)
    detect = mon.wrap(net, "detect")
    x = box_samples(lower, upper, 16, seed=8)[0]
    with torch.no_grad():
        detect(x)
        assert not bool(detect.report.flagged.any())
        weight = net.layer2[0].downsample[0].weight
        saved = weight.clone()
        weight[0, 0, 0, 0] = 1e4
        try:
            detect(x)
            assert bool(detect.report.flagged.all())
        finally:
            weight.copy_(saved)


def _twins(dtype=torch.float32):
    """The narrow CIFAR ResNet-18 with in-place ReLUs and the same network with out-of-place
    ones (the same weights): the monitors' checks must not depend on how the ReLU is spelled."""
    net, shape = model("resnet18_cifar", dtype)
    plain = model("resnet18_cifar", dtype)[0]
    for m in plain.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False
    return net, plain, shape


def _planted(net: nn.Module, value: float):
    """A fault in the first block's first convolution (its BatchNorm and ReLU follow): the
    kernel of output channel 0 set to `value` (its inputs are ReLU outputs: the channel moves
    in the direction of `value`'s sign)."""
    weight = net.layer1[0].conv1.weight
    saved = weight.clone()
    weight[0] = value
    return weight, saved


@pytest.mark.parametrize("value", [3e3, -3e3])
def test_in_place_relus_clip_and_detect_as_out_of_place(value):
    """Under a planted fault, clipping (clamps in place) gives the same output to the bit and
    detection the same per-node flags on both twins; with `through_relu` a value driven far
    below a lower end that only a ReLU reads is not flagged there."""
    net, plain, shape = _twins()
    centre, lower, upper = ball(shape, 0.02, torch.float32)
    mon = verify.monitor(net, Ball(centre[0], 0.02), method="ibp", input_shape=shape)
    x = box_samples(lower, upper, 32, seed=9)[0]
    results = {}
    with torch.no_grad():
        for tag, module in (("inplace", net), ("plain", plain)):
            wrapped = {through: mon.wrap(module, "detect", through_relu=through)
                       for through in (False, True)}  # fmt: skip
            wrapped["clip"] = mon.wrap(module, "clip")  # wrapped before the fault is planted
            wrapped["values"] = mon.wrap(module, "detect", keep_values=True)
            weight, saved = _planted(module, value)
            try:
                for key, w in wrapped.items():
                    y = w(x)
                    results[tag, key] = y if key == "clip" else w.report.node_flags
                values = wrapped["values"].report.values
            finally:
                weight.copy_(saved)
    for key in (False, True, "clip"):
        assert torch.equal(results["inplace", key], results["plain", key])
    name = "layer1_0_bn1"  # read only by its (in-place) ReLU
    node = mon.nodes.index(name)
    v = values[name].flatten(1)
    lo, hi = (t.flatten(1) for t in mon.ranges[name])
    strict = ((v < lo) | (v > hi)).any(1)
    relaxed = ((v < torch.where(lo > 0, lo, -torch.inf)) | (v > hi.clamp(min=0))).any(1)
    assert bool(strict.any())
    assert torch.equal(results["plain", False][:, node], strict)
    assert torch.equal(results["plain", True][:, node], relaxed)
    if value > 0:
        assert torch.equal(relaxed, strict)


def test_checksums_chosen_by_cost_or_name():
    net, shape = model("vgg11", torch.float32)
    centre, _, _ = ball(shape, 0.02, torch.float32)
    mon = verify.monitor(net, Ball(centre[0], 0.02), method="ibp", input_shape=shape)
    costs = {n: c.cost for n, c in mon.sums.items()}
    assert costs and all(c > 0 for c in costs.values())
    cheap = sorted(costs.values())[len(costs) // 2]
    for option, expected in ((True, set(costs)), (False, set()), (0.0, set()),
                             (cheap, {n for n, c in costs.items() if c <= cheap}),
                             (["classifier_0"], {"classifier_0"})):  # fmt: skip
        wrapped = mon.wrap(net, "detect", checksums=option)
        recorder = wrapped._checker.sums
        found = {c.monitored for c in recorder.checks} if recorder is not None else set()
        assert found == expected, option
    with pytest.raises(MonitorOptionError):
        mon.wrap(net, "detect", checksums="classifier_0")
    with pytest.raises(MonitorOptionError, match="features_1"):
        mon.wrap(net, "detect", checksums=["features_1"])  # a ReLU: no checksum


@pytest.mark.parametrize("value", [3e3, -3e3])
def test_detection_of_one_sample_as_in_a_batch(value):
    """Batch 1 (the values copied as the extremes) flags what a larger batch flags per row."""
    net, shape = model("resnet18_cifar", torch.float32)
    centre, lower, upper = ball(shape, 0.02, torch.float32)
    mon = verify.monitor(net, Ball(centre[0], 0.02), method="ibp", input_shape=shape)
    x = box_samples(lower, upper, 6, seed=10)[0]
    detect = mon.wrap(net, "detect")
    weight, saved = _planted(net, value)
    try:
        with torch.no_grad():
            detect(x)
            batch = detect.report
            for i in range(len(x)):
                detect(x[i : i + 1])
                assert torch.equal(detect.report.node_flags[0], batch.node_flags[i])
                assert detect.report.first_node[0] == batch.first_node[i]
    finally:
        weight.copy_(saved)
    assert bool(batch.flagged.all())


def test_checksums_of_convolutions_before_batchnorm():
    """The convolutions whose BatchNorm the graph folds get the checksum of the convolution
    and the BatchNorm as the module computes them, read after the BatchNorm and flagged at its
    node: a small kernel fault that stays inside every range is caught there."""
    net, shape = model("resnet18_cifar", torch.float32)
    centre, lower, upper = ball(shape, 0.02, torch.float32)
    mon = verify.monitor(net, Ball(centre[0], 0.02), method="ibp", input_shape=shape)
    check = mon.sums["layer1_0_bn1"]
    assert check.node == "layer1_0_bn1" and check.monitored == "layer1_0_bn1"
    assert {"bn1", "layer2_0_downsample_1", "fc"} <= set(mon.sums)
    x = box_samples(lower, upper, 16, seed=11)[0]
    ranges_only = mon.wrap(net, "detect", checksums=False)
    detect = mon.wrap(net, "detect")
    weight = net.layer1[0].conv1.weight
    saved = weight.clone()
    weight[0] += 1e-3
    try:
        with torch.no_grad():
            ranges_only(x)
            detect(x)
    finally:
        weight.copy_(saved)
    assert not bool(ranges_only.report.flagged.any())
    assert bool(detect.report.flagged.all())
    assert set(detect.report.first_node) == {"layer1_0_bn1"}


class _Aliased(nn.Module):
    """An in-place ReLU through an alias (`nn.Identity`), and one on a view (refused)."""

    def __init__(self, view: bool) -> None:
        super().__init__()
        self.fc1, self.fc2, self.alias, self.view = nn.Linear(4, 6), nn.Linear(6, 2), nn.Identity(), view

    def forward(self, x):
        h = self.fc1(x)
        if self.view:
            h[:, :3].relu_()
        else:
            self.alias(h).relu_()
        return self.fc2(h)


def test_in_place_through_an_alias_and_on_a_view():
    torch.manual_seed(0)
    net = _Aliased(view=False).double()
    graph = build_graph(net, (4,))
    x = torch.randn(5, 4, dtype=D)
    with torch.no_grad():
        torch.testing.assert_close(graph.forward(x), net(x), rtol=0, atol=1e-14)
    with pytest.raises(UnsupportedOperationError, match="view"):
        build_graph(_Aliased(view=True).double(), (4,))


@pytest.mark.slow
def test_compiled_detection_with_in_place_relus():
    """The compiled detection path reads each layer before the in-place ReLU after it: no
    false positives (ranges and checksums), the flags of the eager wrapper under a fault."""
    net, shape = model("resnet18_cifar", torch.float32)
    centre, lower, upper = ball(shape, 0.02, torch.float32)
    mon = verify.monitor(net, Ball(centre[0], 0.02), method="ibp", input_shape=shape)
    x = box_samples(lower, upper, 16, seed=12)[0]
    eager, fast = mon.wrap(net, "detect"), mon.wrap(net, "detect", compile=True)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), net(x))  # Inductor rounds differently
        assert not bool(fast.report.flagged.any())
        weight, saved = _planted(net, 3e3)
        try:
            fast(x)
            eager(x)
        finally:
            weight.copy_(saved)
    assert fast.compiled_calls == 2
    assert torch.equal(fast.report.node_flags, eager.report.node_flags)
