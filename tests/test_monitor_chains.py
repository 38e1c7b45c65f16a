"""Checksums through a BatchNorm and an average pooling (`verify.monitor.stages`, `chains`):
the chain's sums are the modules' own (float64), the float tolerance never fails on any input
(wild, in-domain, box corners, PGD-maximised; BatchNorm statistics that cancel; padded,
overlapping and repeated pooling windows), and an
in-range fault at each site the chains newly cover (a BatchNorm's output and parameters, a
pooled value, the ReLU before the pooling, a ReLU behind an identity) is caught while the
ranges alone miss it. Fault-free outputs are bitwise those of the network."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import verify
from tests.test_monitor import pgd_extremes
from tests.torchvision_zoo import BasicBlock, randomise_batchnorm, resnet18
from verify.monitor import Box
from verify.monitor.faults import Fault, inject

SHAPE = (3, 16, 16)


def extreme_batchnorm(net: nn.Module, seed: int = 2) -> nn.Module:
    """Running statistics whose shift cancels (`beta ~ s mean`, means far from 0), scales over
    several orders of magnitude."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 30)
                m.running_var.copy_(torch.exp(torch.rand(n, generator=gen) * 10 - 6))
                m.weight.copy_(torch.randn(n, generator=gen) * 0.05)
                scale = m.weight / torch.sqrt(m.running_var + m.eps)
                m.bias.copy_(scale * m.running_mean + torch.randn(n, generator=gen) * 0.1)
    return net


def cnn(dtype: torch.dtype, extreme: bool = True):
    """A torchvision-style CIFAR ResNet-18 of width 2 (the stem's max pooling an identity),
    its BatchNorms extreme (else `randomise_batchnorm`'s), and its monitor over the [0, 1] box
    (IBP)."""
    torch.manual_seed(0)
    net = resnet18(width=2, cifar_stem=True)
    net = (extreme_batchnorm(net) if extreme else randomise_batchnorm(net)).to(dtype).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    mon = verify.monitor(net, Box(torch.zeros(SHAPE), torch.ones(SHAPE)), method="ibp")
    return net, mon


def wild(dtype: torch.dtype, n: int = 300) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    scale = torch.logspace(-3, 3, n, dtype=dtype).reshape(-1, 1, 1, 1)
    return torch.randn(n, *SHAPE, dtype=dtype, generator=gen) * scale


def box_points(dtype: torch.dtype, n: int = 200) -> torch.Tensor:
    """Uniform points of the box and as many random corners, and the two extreme corners."""
    gen = torch.Generator().manual_seed(3)
    u = torch.rand(n, *SHAPE, dtype=dtype, generator=gen)
    corners = torch.randint(0, 2, (n, *SHAPE), generator=gen).to(dtype)
    return torch.cat([u, corners, torch.zeros(1, *SHAPE, dtype=dtype),
                      torch.ones(1, *SHAPE, dtype=dtype)])  # fmt: skip


def test_chains_cover_every_batchnorm_and_the_pooled_classifier():
    net, mon = cnn(torch.float64)
    bns = [n.replace(".", "_") for n, m in net.named_modules() if isinstance(m, nn.BatchNorm2d)]
    for name in bns:  # y read after the BatchNorm, flagged there
        assert mon.sums[name].node == name and mon.sums[name].monitored == name
    assert mon.sums["layer1_0_bn1"].source == "bn1"  # the stem's ReLU through its identity
    fc = mon.sums["fc"]
    assert (fc.source, fc.relu, fc.flatten) == ("add_7", True, True)  # through the pooling
    assert fc.weights.shape[1] == 16 * 2 * 2  # the pooling's input


def test_chain_sums_are_the_modules_own():
    """`1^T y = c^T x + d` in float64 for a convolution with its BatchNorm and for the
    classifier through the pooling; `a^T |x|` bounds the magnitudes the tolerance covers."""
    net, mon = cnn(torch.float64)
    x = box_points(torch.float64, 20)
    block = net.layer2[0]
    with torch.no_grad():
        inner = torch.relu(block.bn1(block.conv1(net.layer1(net.relu(net.bn1(net.conv1(x)))))))
        y = block.bn2(block.conv2(inner))
        feats = net.layer4(net.layer3(net.layer2(net.layer1(net.relu(net.bn1(net.conv1(x)))))))
        logits = net(x)
    pairs = ((mon.sums["layer2_0_bn2"], inner, y), (mon.sums["fc"], feats, logits))
    for check, source, out in pairs:
        c, a = check.weights
        flat = source.reshape(len(x), -1)
        sums = out.reshape(len(x), -1).sum(1)
        assert torch.allclose(sums, flat @ c + check.bias_sum, rtol=1e-9, atol=1e-9)
        assert (flat.abs() @ a > 0).all()
    bn = block.bn2
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    size = nn.functional.conv2d(inner.abs(), block.conv2.weight.abs(), None, 1, 1)
    size = (size * scale.abs()[:, None, None]).sum((1, 2, 3))
    assert (inner.reshape(len(x), -1) @ mon.sums["layer2_0_bn2"].weights[1] >= size).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_chain_checksums_hold_for_any_input(dtype):
    """No checksum fails on wild inputs (ranges off), and ranges and checksums together flag no
    point of the box: uniform, corners, PGD-maximised activations. Outputs are the network's,
    to the bit."""
    net, mon = cnn(dtype)
    free = {n: (-float("inf"), float("inf")) for n in mon.affine}
    lower, upper = torch.zeros(1, *SHAPE, dtype=dtype), torch.ones(1, *SHAPE, dtype=dtype)
    inside = torch.cat([box_points(dtype), pgd_extremes(mon, net, lower, upper, steps=10,
                                                        per_node=2)])  # fmt: skip
    with torch.no_grad():
        y, report = mon.wrap(net, "detect", ranges=free).run(wild(dtype))
        assert not report.flagged.any(), report.first_node
        y, report = mon.wrap(net, "detect").run(inside)
        assert not report.flagged.any(), report.first_node
        assert torch.equal(y, net(inside))


def _in_range(mon, net, x, site: str, node: str) -> Fault:
    """A fault at module `site` moving the element of graph node `node` with the most room
    halfway to its upper end (sample 0): inside every range."""
    with torch.no_grad():
        value = mon.wrap(net, nodes="all", keep_values=True).run(x)[1].values[node][0]
    room = (mon.ranges[node][1][0] - value).reshape(-1)
    index = int(room.argmax())
    return Fault("activation", site, index, value=float(value.reshape(-1)[index] + room[index] / 2),
                 sample=0)  # fmt: skip


@pytest.mark.parametrize(
    ("site", "node", "caught"),
    [
        ("layer2.0.bn2", "layer2_0_bn2", "layer2_0_bn2"),  # a BatchNorm's output
        ("layer3.1.bn1", "layer3_1_bn1", "layer3_1_bn1"),
        ("layer4.0.downsample.1", "layer4_0_downsample_1", "layer4_0_downsample_1"),
        ("avgpool", "avgpool", "fc"),  # a pooled value
        ("relu", "relu", "layer1_0_bn1"),  # the stem's ReLU, read through an identity
    ],
)
def test_in_range_activation_faults_are_caught_by_the_chains(site, node, caught):
    net, mon = cnn(torch.float32, extreme=False)
    x = box_points(torch.float32, 3)[:4]
    fault = _in_range(mon, net, x, site, node)
    with inject(net, [fault]), torch.no_grad():
        ranges_only = mon.wrap(net, "detect", nodes="all", checksums=False).run(x)[1]
        report = mon.check(net, x)
    assert not ranges_only.flagged.any()
    assert report.flagged.tolist() == [True, False, False, False]
    assert report.first_node[0] == caught


class _Block(BasicBlock):
    """torchvision's block with a ReLU module of its own after the add (a fault site of its
    own: the shared one runs twice)."""

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu2(out)


def test_fault_before_the_pooling_is_caught_by_the_classifier():
    """The last ReLU's output (read only by the pooling) moved halfway to its upper end:
    inside every range, caught at `fc`, whose checksum reads the ReLU's input."""
    net, _ = cnn(torch.float32, extreme=False)
    last = net.layer4[1]
    last.__class__, last.relu2 = _Block, nn.ReLU(inplace=True).eval()
    mon = verify.monitor(net, Box(torch.zeros(SHAPE), torch.ones(SHAPE)), method="ibp")
    assert (mon.sums["fc"].source, mon.sums["fc"].relu) == ("add_7", True)
    x = box_points(torch.float32, 3)[:4]
    fault = _in_range(mon, net, x, "layer4.1.relu2", "layer4_1_relu2")
    with inject(net, [fault]), torch.no_grad():
        ranges_only = mon.wrap(net, "detect", nodes="all", checksums=False).run(x)[1]
        report = mon.check(net, x)
    assert not ranges_only.flagged.any()
    assert report.flagged.tolist() == [True, False, False, False]
    assert report.first_node[0] == "fc"


@pytest.mark.parametrize("buffer", ["weight", "bias", "running_mean", "running_var"])
def test_batchnorm_parameter_faults_are_caught(buffer):
    """A 1% change of one channel's BatchNorm parameter or statistic: inside every range,
    caught at the BatchNorm's node on every sample."""
    net, mon = cnn(torch.float32, extreme=False)
    x = box_points(torch.float32, 6)[:8]
    bn = net.layer2[1].bn1
    tensor = getattr(bn, buffer)
    saved = tensor.clone()
    try:
        with torch.no_grad():
            tensor[0] *= 1.01 if buffer != "bias" else 1.5
            ranges_only = mon.wrap(net, "detect", checksums=False).run(x)[1]
            report = mon.wrap(net, "detect").run(x)[1]
    finally:
        tensor.copy_(saved)
    assert not ranges_only.flagged.any()
    assert report.flagged.all()
    assert set(report.first_node) == {"layer2_1_bn1"}


def pooled_net(pool: nn.Module, dtype: torch.dtype) -> nn.Module:
    """conv -> ReLU -> `pool` -> flatten -> linear, and conv -> ReLU -> `pool` -> conv, summed:
    both layers' checksums go through the pooling."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.relu, self.pool = nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), pool
            self.after = nn.Conv2d(3, 2, 1)
            width = pool(torch.zeros(1, 3, 5, 7)).numel()
            self.fc, self.fc2 = nn.Linear(width, 4), nn.Linear(2 * width // 3, 4)

        def forward(self, x):
            pooled = self.pool(self.relu(self.conv(x)))
            return self.fc(torch.flatten(pooled, 1)) + self.fc2(
                torch.flatten(self.after(pooled), 1)
            )

    torch.manual_seed(1)
    net = Net().to(dtype).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


POOLS = {
    "avg_pad": lambda: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
    "avg_overlap": lambda: nn.AvgPool2d(2, stride=1, padding=1),
    "adaptive": lambda: nn.AdaptiveAvgPool2d((3, 2)),  # overlapping windows
    "adaptive_up": lambda: nn.AdaptiveAvgPool2d((6, 9)),  # repeated windows
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_checksums_through_poolings_hold_for_any_input(pool, dtype):
    """Padded, overlapping and repeated windows: the checksums
    through the pooling are the modules' own (float64) and never fail on wild inputs."""
    net = pooled_net(POOLS[pool](), dtype)
    shape = (2, 5, 7)
    mon = verify.monitor(net, Box(-torch.ones(shape), torch.ones(shape)))
    for name in ("fc", "after"):
        assert (mon.sums[name].source, mon.sums[name].relu) == ("conv", True)
    gen = torch.Generator().manual_seed(4)
    scale = torch.logspace(-3, 3, 400, dtype=dtype).reshape(-1, 1, 1, 1)
    x = torch.randn(400, *shape, dtype=dtype, generator=gen) * scale
    free = {n: (-float("inf"), float("inf")) for n in mon.affine}
    with torch.no_grad():
        assert not mon.wrap(net, "detect", ranges=free).run(x)[1].flagged.any()
        if dtype == torch.float64:
            inner = torch.relu(net.conv(x[:20])).reshape(20, -1)
            c = mon.sums["fc"].weights[0]
            y = net.fc(torch.flatten(net.pool(torch.relu(net.conv(x[:20]))), 1)).sum(1)
            torch.testing.assert_close(y, inner @ c + mon.sums["fc"].bias_sum, rtol=1e-9, atol=1e-6)
