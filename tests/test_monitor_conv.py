"""Checksums of convolution layers in monitors (`verify.monitor_sums`): the adjoint checksum
`1^T y = <L^T 1, x> + (H' W') 1^T b` is the convolution's own (float64, strided, padded,
dilated, grouped), its float tolerance never fails on any input (random, far outside the
domain, PGD-maximised), and it catches a moderate weight fault and an in-range activation fault
that no range sees; on OVAL cifar_base in float32 too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.model_zoo import make
from tests.test_monitor import box_of, pgd_extremes, uniform
from verify.monitor import Box, monitor
from verify.monitor.faults import Fault, inject

CIFAR_MEAN = (0.485, 0.456, 0.406)
CIFAR_STD = 0.225


def odd_conv_net(dtype: torch.dtype) -> tuple[nn.Module, tuple[int, ...]]:
    """Strided, padded, dilated and grouped convolutions on odd input sizes."""
    torch.manual_seed(3)
    shape = (2, 7, 9)
    body = nn.Sequential(
        nn.Conv2d(2, 4, 3, stride=2, padding=(1, 2), dilation=(1, 2), groups=2),
        nn.ReLU(),
        nn.Conv2d(4, 3, (2, 3), stride=(1, 2), padding=(1, 0)),
        nn.ReLU(),
        nn.Flatten(),
    )
    width = body(torch.zeros(1, *shape)).shape[1]
    net = nn.Sequential(*body, nn.Linear(width, 5)).to(dtype).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net, shape


def wild_points(shape, dtype, n: int = 600) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    scale = torch.logspace(-3, 3, n, dtype=dtype).reshape(-1, *[1] * len(shape))
    return torch.randn(n, *shape, dtype=dtype, generator=gen) * scale


def test_conv_checksum_is_the_convolutions_own():
    """`c = L^T 1`, `a = |L|^T 1` and `d` reproduce the sums of the convolution's outputs."""
    net, shape = odd_conv_net(torch.float64)
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    assert {"_0", "_2", "_5"} <= set(mon.sums)
    x = wild_points(shape, torch.float64, 50)
    for name, conv in (("_0", net[0]), ("_2", net[2])):
        check = mon.sums[name]
        inputs = x if name == "_0" else torch.relu(net[:2](x))
        y = conv(inputs)
        c, a = check.weights
        flat = inputs.reshape(len(x), -1)
        assert torch.allclose(y.sum((1, 2, 3)), flat @ c + check.bias_sum, rtol=1e-12, atol=1e-9)
        size = nn.functional.conv2d(inputs.abs(), conv.weight.abs(), None, conv.stride,
                                    conv.padding, conv.dilation, conv.groups)  # fmt: skip
        assert (flat.abs() @ a >= size.sum((1, 2, 3))).all()
        assert check.relu == (name == "_2") and check.absolute == (name == "_0")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ["odd", "conv", "residual", "normalised", "bn_mlp"])
def test_conv_checksums_hold_for_any_input(name, dtype):
    net, shape = odd_conv_net(dtype) if name == "odd" else make(name, dtype=dtype)
    lower, upper = box_of(shape, dtype)
    mon = monitor(net, Box(lower[0], upper[0]))
    layers = [n for n, m in net.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert len([s for s in mon.sums if s in mon.affine]) >= len(layers)
    free = {n: (-float("inf"), float("inf")) for n in mon.affine}
    wrapped = mon.wrap(net, "detect", ranges=free)
    points = torch.cat([wild_points(shape, dtype), uniform(lower, upper, 1500),
                        pgd_extremes(mon, net, lower, upper)])  # fmt: skip
    with torch.no_grad():
        report = wrapped.run(points)[1]
    assert not report.flagged.any(), report.first_node


def _largest(net: nn.Module, site: str) -> tuple[int, float]:
    weight = dict(net.named_parameters())[site]
    index = int(weight.abs().reshape(-1).argmax())
    return index, float(weight.reshape(-1)[index])


def test_moderate_conv_weight_fault_is_caught_by_the_checksum_only():
    """The second convolution's largest weight 10% larger: inside every range, caught by the
    checksum of its node on every sample whose output it changes (the others have zeros
    where the weight reads)."""
    net, shape = make("conv")
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    x = uniform(lower, upper, 64, seed=8)
    index, w = _largest(net, "2.weight")
    with torch.no_grad():
        clean = net[:3](x)
    with inject(net, [Fault("weight", "2.weight", index, value=1.1 * w)]):
        with torch.no_grad():
            changed = (net[:3](x) != clean).flatten(1).any(1)
            ranges_only = mon.wrap(net, "detect", checksums=False).run(x)[1]
        report = mon.check(net, x)
    assert not ranges_only.flagged.any()
    assert changed.sum() >= 32
    assert torch.equal(report.flagged, changed)
    assert {report.first_node[i] for i in changed.nonzero()[:, 0].tolist()} == {"_2"}
    assert not mon.check(net, x).flagged.any()  # restored


def test_in_range_activation_fault_before_a_conv_is_caught_by_its_checksum():
    """A small change of one element of the first ReLU's output stays inside every range; the
    second convolution's checksum (the ReLU recomputed from the pre-activation) catches it."""
    net, shape = make("conv")
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    x = uniform(lower, upper, 6, seed=4)
    with torch.no_grad():
        values = mon.wrap(net, nodes="all", keep_values=True).run(x)[1].values["_1"][0]
    hi = mon.ranges["_1"][1][0]
    room = torch.where(values > 0, hi - values, -1.0).reshape(-1)
    index = int(room.argmax())
    new = float(values.reshape(-1)[index] + room[index] / 2)
    with inject(net, [Fault("activation", "1", index, value=new, sample=0)]):
        with torch.no_grad():
            ranges_only = mon.wrap(net, "detect", nodes="all", checksums=False).run(x)[1]
        report = mon.check(net, x)
    assert not ranges_only.flagged.any()
    assert report.flagged.tolist() == [True] + [False] * (len(x) - 1)
    assert report.first_node[0] == "_2"


@pytest.mark.data
def test_cifar_base_conv_checksums_float32(shared_data):
    """OVAL cifar_base, eps 8/255 balls around 3 test images: no false positives on 3 x 1000
    random and PGD points of each ball (ranges and checksums), and a 10% change of the second
    convolution's largest weight, inside every range, is caught on every sample."""
    from verify.io.onnx_loader import load_onnx

    net = load_onnx(shared_data / "vnncomp2022/oval21/onnx/cifar_base_kw.onnx.gz").eval()
    rows = np.loadtxt(shared_data / "oval/cifar10_test_first100.csv", delimiter=",", max_rows=3)
    images = torch.tensor(rows[:, 1:] / 255.0, dtype=torch.float32)
    images = images.reshape(-1, 32, 32, 3).permute(0, 3, 1, 2)
    mean, eps = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), 8 / 255
    lower = ((images - eps).clamp(0, 1) - mean) / CIFAR_STD
    upper = ((images + eps).clamp(0, 1) - mean) / CIFAR_STD
    mon = monitor(net, Box(lower, upper))  # one box per image
    assert {"conv_0", "conv_2", "gemm_5", "gemm_7"} <= set(mon.sums)
    inside, region = [], []
    for r in range(len(images)):
        lo, up = lower[r : r + 1], upper[r : r + 1]
        points = torch.cat([uniform(lo, up, 1000, seed=r), pgd_extremes(mon, net, lo, up, 10, 1)])
        inside.append(points)
        region.append(torch.full((len(points),), r))
    x, region = torch.cat(inside), torch.cat(region)
    assert len(x) >= 3000
    assert not mon.check(net, x, region=region, nodes="all").flagged.any()
    index, w = _largest(net, "conv_2.weight")
    with inject(net, [Fault("weight", "conv_2.weight", index, value=1.1 * w)]):
        with torch.no_grad():
            ranges_only = mon.wrap(net, "detect", checksums=False).run(x[:200], region[:200])[1]
        report = mon.check(net, x[:200], region=region[:200])
    assert not ranges_only.flagged.any()
    assert report.flagged.all() and set(report.first_node) == {"conv_2"}
