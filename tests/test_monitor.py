"""Verified activation monitors (`verify.monitor`): no false positives on valid inputs (random,
box corners, PGD-maximised activations; zoo nets in float64 and float32, real nets in float32),
clipping changes no fault-free output (bitwise, float64), planted faults are detected at the
node they corrupt, and the domain forms (box, ball, several regions) keep their semantics."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from bounds.errors import UnsupportedOperationError
from tests.model_zoo import ZOO, make
from verify.api import network_graph
from verify.monitor import Ball, Box, monitor
from verify.monitor.faults import Fault, inject


def relu_like(name: str) -> bool:
    """Whether every activation of the zoo net is a selection: pieces of slope 0 or 1 through
    the origin (what the monitors support)."""
    net, shape = make(name)
    for node in network_graph(net, shape).activations():
        pieces = getattr(node.op.relaxation, "pieces", None)
        if len(node.inputs) != 1 or not pieces:
            return False
        if not all(p.slope in (0.0, 1.0) and p.intercept == 0.0 for p in pieces):
            return False
    return True


ZOO_NAMES = sorted(n for n in ZOO if relu_like(n))
OTHER_NAMES = sorted(n for n in ZOO if n not in ZOO_NAMES)


def uniform(lower: torch.Tensor, upper: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    """`n` points uniform in the box `[1, *shape]` (plus its two extreme corners)."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.rand(n, *lower.shape[1:], dtype=lower.dtype, generator=gen)
    return torch.cat([lower, upper, lower + (upper - lower) * t])


def corners(lower: torch.Tensor, upper: torch.Tensor, limit: int = 256) -> torch.Tensor:
    """Vertices of a small box (at most `limit`)."""
    n = lower[0].numel()
    picks = list(itertools.islice(itertools.product((0, 1), repeat=n), limit))
    mask = torch.tensor(picks, dtype=lower.dtype).reshape(-1, *lower.shape[1:])
    return lower + (upper - lower) * mask


def pgd_extremes(mon, net, lower, upper, steps: int = 25, per_node: int = 4, seed: int = 0):
    """Points of the box found by PGD (signed steps, projection) maximising and minimising
    `per_node` random neurons of every monitored node: the hardest valid inputs we can find."""
    wrapped = mon.wrap(net, "detect", nodes="all", keep_values=True)
    gen = torch.Generator().manual_seed(seed)
    found = []
    for name in mon.nodes:
        numel = int(np.prod(mon.graph[name].shape))
        neurons = torch.randint(numel, (per_node,), generator=gen)
        for sign in (1.0, -1.0):
            x = uniform(lower, upper, per_node, seed)[2:].requires_grad_(True)
            step = (upper - lower) / 8
            for _ in range(steps):
                values = wrapped.run(x)[1].values[name].reshape(per_node, -1)
                goal = sign * values[torch.arange(per_node), neurons].sum()
                (grad,) = torch.autograd.grad(goal, x)
                with torch.no_grad():
                    x = torch.maximum(torch.minimum(x + step * grad.sign(), upper), lower)
                x.requires_grad_(True)
                step = step * 0.85
            found.append(x.detach())
    return torch.cat(found)


def box_of(shape, dtype, low=-1.0, high=1.0):
    return torch.full((1, *shape), low, dtype=dtype), torch.full((1, *shape), high, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ZOO_NAMES)
@pytest.mark.parametrize("method", ["crown", "ibp"])
def test_zoo_no_false_positives(name, dtype, method):
    net, shape = make(name, dtype=dtype)
    lower, upper = box_of(shape, dtype)
    mon = monitor(net, Box(lower[0], upper[0]), method=method)
    points = [uniform(lower, upper, 1500), pgd_extremes(mon, net, lower, upper)]
    if lower[0].numel() <= 8:
        points.append(corners(lower, upper))
    report = mon.check(net, torch.cat(points), nodes="all")
    assert not report.flagged.any(), report.first_node
    assert report.first_node == [None] * report.flagged.shape[0]


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_ranges_contain_every_sampled_value(name):
    """The stored ranges themselves (not only the flags) hold every node value sampled."""
    net, shape = make(name)
    lower, upper = box_of(shape, torch.float64, 0.0, 0.5)
    mon = monitor(net, Box(lower[0], upper[0]))
    values = mon.wrap(net, nodes="all", keep_values=True).run(uniform(lower, upper, 500))[1].values
    for node, v in values.items():
        lo, hi = mon.ranges[node]
        assert (v >= lo).all() and (v <= hi).all(), node
        assert (mon.bounds[node].lower <= v.min(0).values).all()


@pytest.mark.parametrize("name", ZOO_NAMES)
@pytest.mark.parametrize("action", ["clip", "both"])
def test_clipping_leaves_fault_free_outputs_bitwise_equal(name, action):
    net, shape = make(name, dtype=torch.float64)
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    x = uniform(lower, upper, 1000, seed=3)
    wrapped = mon.wrap(net, action, nodes="all")
    with torch.no_grad():
        assert torch.equal(wrapped(x), net(x))
    if action == "both":
        assert not wrapped.report.flagged.any()


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_planted_weight_fault_is_detected_at_its_node(name):
    net, shape = make(name)
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    x = uniform(lower, upper, 64, seed=5)
    first_param = next(n for n, p in net.named_parameters() if p.dim() > 1)
    fault = Fault("weight", first_param, 0, value=1e9)
    with inject(net, [fault]):
        report = mon.check(net, x)
    assert report.flagged.all()
    assert len(set(report.first_node)) == 1
    own = "bn" if name == "normalised" else mon.affine[0]  # conv + BatchNorm, folded: "bn"
    assert report.first_node[0] == own  # the node the faulted layer computes
    assert not mon.check(net, x).flagged.any()  # restored


def test_planted_activation_fault_is_detected_only_in_its_sample():
    net, shape = make("conv")
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    x = uniform(lower, upper, 8, seed=2)[2:]
    fault = Fault("activation", "2", 5, value=-1e6, sample=3)  # the second conv's output
    with inject(net, [fault]):
        report = mon.check(net, x, nodes="all")
        clipped = mon.wrap(net, "clip", nodes="all")(x)
    assert report.flagged.tolist() == [i == 3 for i in range(8)]
    assert report.first_node[3] == "_2"
    assert report.node_flags[3].tolist() == [n == "_2" for n in report.nodes]
    with torch.no_grad():
        clean = net(x)
    assert torch.equal(clipped[:3], clean[:3]) and torch.equal(clipped[4:], clean[4:])


def test_nan_and_inf_are_flagged_and_clipped_into_range():
    net, shape = make("mlp")
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    x = uniform(lower, upper, 4)
    for bad in (float("nan"), float("inf"), -float("inf")):
        with inject(net, [Fault("activation", "0", 1, value=bad, sample=0)]):
            report = mon.check(net, x)
            out = mon.wrap(net, "clip")(x)
        assert report.flagged.tolist() == [True, False, False, False, False, False]
        assert torch.isfinite(out).all()


def test_layer_granularity_is_coarser_and_still_sound():
    net, shape = make("deep_mlp")
    lower, upper = box_of(shape, torch.float64)
    fine = monitor(net, Box(lower[0], upper[0]))
    coarse = monitor(net, Box(lower[0], upper[0]), granularity="layer")
    for node in fine.nodes:
        assert coarse.ranges[node][0].shape == (1, 1)
        assert (coarse.ranges[node][0] <= fine.ranges[node][0]).all()
        assert (coarse.ranges[node][1] >= fine.ranges[node][1]).all()
    assert not coarse.check(net, uniform(lower, upper, 2000), nodes="all").flagged.any()


def test_regions_per_sample_and_union():
    """Two disjoint boxes: each sample passes with its own region index, and without an index
    (a sample passes when one region contains all its values); clipping to a sample's region
    changes nothing for it."""
    net, shape = make("mlp")
    f64 = dict(dtype=torch.float64)
    low_box = (torch.full(shape, -1.0, **f64), torch.full(shape, -0.5, **f64))
    high_box = Box(torch.full(shape, 0.5, **f64), torch.full(shape, 1.0, **f64))
    mon = monitor(net, [low_box, high_box])
    assert mon.regions == 2
    a = uniform(low_box[0][None], low_box[1][None], 200, seed=1)
    b = uniform(high_box.lower[None], high_box.upper[None], 200, seed=2)
    x = torch.cat([a, b])
    region = torch.cat([torch.zeros(len(a)), torch.ones(len(b))]).long()
    assert not mon.check(net, x, region=region).flagged.any()
    assert not mon.check(net, x).flagged.any()
    with torch.no_grad():
        assert torch.equal(mon.wrap(net, "clip")(x, region), net(x))
        assert torch.equal(mon.wrap(net, "clip")(x), net(x))  # the hull


def test_ball_domain_contains_clipped_balls():
    net, shape = make("conv")
    centers = torch.rand(3, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mon = monitor(net, Ball(centers, 0.1, within=(0.0, 1.0)))
    assert mon.regions == 3
    for r in range(3):
        lower = (centers[r : r + 1] - 0.1).clamp(0, 1)
        upper = (centers[r : r + 1] + 0.1).clamp(0, 1)
        x = torch.cat([uniform(lower, upper, 300, seed=r), pgd_extremes(mon, net, lower, upper)])
        assert not mon.check(net, x, region=torch.full((len(x),), r)).flagged.any()


def test_wrapped_module_runs_the_users_weights_and_accepts_copies():
    net, shape = make("mlp")
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    twin = copy.deepcopy(net)  # the same graph and weights: accepted
    x = uniform(lower, upper, 16)
    assert not mon.check(twin, x).flagged.any()
    wrapped = mon.wrap(net)
    clean = net[0].weight[0, 0].clone()
    with torch.no_grad():
        net[0].weight[0, 0] = 1e7  # a fault after wrapping reaches the wrapped module
        wrapped(x)
        net[0].weight[0, 0] = clean
    assert wrapped.report.flagged.all()


@pytest.mark.data
@pytest.mark.parametrize("width", ["256x2"])
def test_mnist_fc_float32_no_false_positives(shared_data, width):
    path = shared_data / f"vnncomp2022/mnist_fc/onnx/mnist-net_{width}.onnx.gz"
    from verify.io.onnx_loader import load_onnx

    net = load_onnx(path).eval()
    rows = np.loadtxt(shared_data / "oval/mnist_test_first100.csv", delimiter=",", max_rows=4)
    images = torch.tensor(rows[:, 1:] / 255.0, dtype=torch.float32).reshape(-1, 784, 1)
    lower, upper = torch.zeros(1, 784, 1), torch.ones(1, 784, 1)
    mon = monitor(net, Box(lower[0], upper[0]))
    points = torch.cat([images, uniform(lower, upper, 2000), pgd_extremes(mon, net, lower, upper,
                                                                          per_node=2)])  # fmt: skip
    assert not mon.check(net, points, nodes="all").flagged.any()
    ball = monitor(net, Ball(images, 0.05, within=(0.0, 1.0)))
    for r in range(len(images)):
        lo, up = (images[r : r + 1] - 0.05).clamp(0, 1), (images[r : r + 1] + 0.05).clamp(0, 1)
        x = torch.cat([uniform(lo, up, 500, seed=r), pgd_extremes(ball, net, lo, up, 15, 2)])
        assert not ball.check(net, x, region=torch.full((len(x),), r), nodes="all").flagged.any()


@pytest.mark.parametrize("name", OTHER_NAMES or ["none"])
def test_other_activations_are_refused_by_name(name):
    if name == "none":
        pytest.skip("the zoo has no net with other activations")
    net, shape = make(name)
    lower, upper = box_of(shape, torch.float64)
    with pytest.raises(UnsupportedOperationError, match="ReLU-like activations only"):
        monitor(net, Box(lower[0], upper[0]))


def test_tf32_ranges_contain_the_float32_ranges():
    net, shape = make("conv", dtype=torch.float32)
    lower, upper = box_of(shape, torch.float32)
    f32 = monitor(net, Box(lower[0], upper[0]))
    tf32 = monitor(net, Box(lower[0], upper[0]), precision="tf32")
    for node in f32.nodes:
        assert (tf32.ranges[node][0] <= f32.ranges[node][0]).all()
        assert (tf32.ranges[node][1] >= f32.ranges[node][1]).all()
    assert (tf32.ranges["_7"][1] > f32.ranges["_7"][1]).any()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_checksums_hold_for_any_input(name, dtype):
    """The checksum invariants are proven for every input, not only the domain's: with the
    ranges out of the way (unbounded baseline ranges), inputs far outside the box, PGD points
    and large-magnitude noise never fail them."""
    net, shape = make(name, dtype=dtype)
    lower, upper = box_of(shape, dtype)
    mon = monitor(net, Box(lower[0], upper[0]))
    assert mon.sums or name in ("residual",)  # every zoo net but one has a checked nn.Linear
    free = {n: (-float("inf"), float("inf")) for n in mon.affine}
    wrapped = mon.wrap(net, "detect", ranges=free)
    gen = torch.Generator().manual_seed(7)
    wild = torch.randn(600, *shape, dtype=dtype, generator=gen) * torch.logspace(
        -3, 3, 600, dtype=dtype
    ).reshape(-1, *[1] * len(shape))
    points = torch.cat([wild, uniform(lower, upper, 500), pgd_extremes(mon, net, lower, upper)])
    with torch.no_grad():
        report = wrapped.run(points)[1]
    assert not report.flagged.any(), report.first_node


def _in_range_relu_fault(mon, net, x, site: str, node: str, bit: int):
    """A mantissa flip of ReLU module `site`'s output on sample 0 (at the positive value farthest
    below its upper bound) that keeps the value inside the certified range of `node`."""
    with torch.no_grad():
        values = mon.wrap(net, nodes="all", keep_values=True).run(x)[1].values[node][0]
    lo, hi = mon.ranges[node]
    room = torch.where(values > 0, hi[0] - values, -1.0).reshape(-1)
    index = int(room.argmax())
    fault = Fault("activation", site, index, xor=1 << bit, sample=0)
    flipped = values.clone().reshape(-1)
    flipped.view(torch.int64)[index] ^= 1 << bit
    assert lo.reshape(-1)[index] <= flipped[index] <= hi.reshape(-1)[index]
    return fault


def test_checksum_detects_an_in_range_fault_of_an_activation():
    """A mantissa flip of a ReLU output stays inside every range, yet the next layer's checksum
    (computed from the recomputed ReLU of the pre-activation) fails, at that layer's node."""
    net, shape = make("mlp")
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    x = uniform(lower, upper, 6, seed=4)
    fault = _in_range_relu_fault(mon, net, x, "1", "_1", 49)  # the first ReLU's output
    with inject(net, [fault]):
        ranges_only = mon.wrap(net, "detect", checksums=False)
        with torch.no_grad():
            ranges_report = ranges_only.run(x)[1]
        report = mon.check(net, x)
    assert not ranges_report.flagged.any()
    assert report.flagged.tolist() == [True] + [False] * (len(x) - 1)
    assert report.first_node[0] == "_2"


def test_checksum_detects_an_in_range_weight_fault():
    net, shape = make("deep_mlp")
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    x = uniform(lower, upper, 32, seed=6)
    fault = Fault("weight", "4.weight", 3, xor=1 << 50)  # a mantissa bit: a small change
    with inject(net, [fault]):
        with torch.no_grad():
            ranges_report = mon.wrap(net, "detect", checksums=False).run(x)[1]
        report = mon.check(net, x)
    assert not ranges_report.flagged.any()
    assert report.flagged.any()
    assert {n for n in report.first_node if n} == {"_4"}


def test_fused_clip_runs_hooks_and_clips_the_relu_output():
    """Clip fuses ReLU and clamp when the ReLU runs no hooks; with a hook (an injected fault in
    the ReLU's output) the module runs and its output is clamped to the ReLU's range."""
    net, shape = make("mlp")
    lower, upper = box_of(shape, torch.float64)
    mon = monitor(net, Box(lower[0], upper[0]))
    x = uniform(lower, upper, 8, seed=1)
    clip = mon.wrap(net, "clip")
    with torch.no_grad():
        clean = net(x)
        assert torch.equal(clip(x), clean)
        with inject(net, [Fault("activation", "1", 0, value=1e6, sample=2)]):
            faulty, clipped = net(x), clip(x)
    hi = mon.ranges["_1"][1].reshape(-1)[0]
    assert hi < 1e6 and not torch.equal(faulty[2], clean[2])
    assert torch.equal(clipped[:2], clean[:2]) and torch.equal(clipped[3:], clean[3:])
    assert (clipped[2] - clean[2]).abs().max() < (faulty[2] - clean[2]).abs().max()


def test_per_region_fault_is_flagged_and_clipped_in_its_sample_only():
    """With a region index per sample, a value inside the hull of all regions but outside its
    own region's range is flagged in that sample alone, and clipping (a second, clamping pass)
    leaves the other samples bitwise unchanged; a NaN is flagged and clipped too."""
    net, shape = make("mlp")
    f64 = dict(dtype=torch.float64)
    low_box = (torch.full(shape, -1.0, **f64), torch.full(shape, -0.5, **f64))
    high_box = (torch.full(shape, 0.5, **f64), torch.full(shape, 1.0, **f64))
    mon = monitor(net, [low_box, high_box])
    x = torch.cat([uniform(low_box[0][None], low_box[1][None], 4, seed=1),
                   uniform(high_box[0][None], high_box[1][None], 4, seed=2)])  # fmt: skip
    region = torch.tensor([0] * 6 + [1] * 6)
    lo = torch.minimum(mon.ranges["_0"][0][0], mon.ranges["_0"][0][1])
    hi = torch.maximum(mon.ranges["_0"][1][0], mon.ranges["_0"][1][1])
    gap = int(((hi - lo) > 0).nonzero()[0, 0])  # a neuron whose hull has room
    with torch.no_grad():
        clean = net(x)
    for bad in (float(lo[gap] - 1.0), float("nan")):
        with inject(net, [Fault("activation", "0", gap, value=bad, sample=7)]):
            report = mon.check(net, x, region=region)
            with torch.no_grad():
                clipped = mon.wrap(net, "clip")(x, region)
        assert report.flagged.tolist() == [i == 7 for i in range(12)]
        assert torch.equal(clipped[:7], clean[:7]) and torch.equal(clipped[8:], clean[8:])
        assert torch.isfinite(clipped).all()
