"""The monitor's checks fused into the passes that write the activations
(`verify/monitor/fused.py`, `kernels/range_check.py`): the C kernels agree with their torch
references to the bit (NaN, infinities, -0.0, regions, in place, split over threads); the fused
wrapper gives the eager wrapper's outputs (to the bit, the plain network's on clean inputs) and
per-node flags on the torchvision-style models of `tests/torchvision_zoo.py` (in-place and
out-of-place ReLUs), at each kind of node (a ReLU's input, a residual add's operands, the add,
the classifier), for detection, clipping and both; the calls it cannot serve go to the eager
wrapper."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import kernels.range_check as rc
import verify
from kernels.range_check import Side, add_check, add_check_reference, range_check
from tests.soundness import box_samples
from tests.test_torchvision_ops import ball, model
from verify.monitor import Ball, MonitorOptionError
from verify.monitor.fused import FUSED_MIN_VALUES, FusedMonitoredNet

F32 = torch.float32
needs_kernel = pytest.mark.skipif(not rc.available(), reason="no C compiler: reference only")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.dtype == F32 else torch.int64)


def _special(rows: int, n: int, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(rows, n, generator=gen, dtype=torch.float64)).to(dtype)
    x[0, 0], x[1, 1], x[2, 2], x[3, 3], x[0, 4] = (
        float("nan"),
        float("inf"),
        -float("inf"),
        -0.0,
        0.0,
    )
    return x


def _tables(regions: int, n: int, dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lo = (torch.randn(regions, n, generator=gen, dtype=torch.float64) - 2).to(dtype)
    return lo, lo + 4


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("regional", [False, True])
def test_range_check_kernel_equals_its_reference(dtype, regional):
    rows, n = 6, 37
    x = _special(rows, n, dtype, 0)
    region = torch.tensor([0, 2, 1, 1, 0, 2]) if regional else None
    det_lo, det_hi = _tables(3, n, dtype, 1)
    clip_lo, clip_hi = _tables(3, n, dtype, 2)
    for lower, detect, write in itertools.product((None, det_lo), (None, det_hi),
                                                  ("none", "relu", "clamp")):  # fmt: skip
        results = []
        for fn in (range_check, rc.range_check_reference):
            flags = torch.full((rows,), 7, dtype=torch.uint8)
            out = x.clone()  # in place
            kw = dict(det_lo=lower, det_hi=detect, clip_lo=clip_lo, clip_hi=clip_hi)
            if fn is range_check:
                fn(out, flags, **kw, write=write, out=out if write != "none" else None,
                   region=region)  # fmt: skip
            else:
                fn(out, flags, lower, detect, clip_lo, clip_hi, write,
                   out if write != "none" else None, region)  # fmt: skip
            results.append((out, flags))
        (a, fa), (b, fb) = results
        assert torch.equal(bits(a), bits(b)), (lower is None, detect is None, write)
        assert torch.equal(fa, fb)
        if detect is not None:
            assert fa[0] == 1 and fa[1] == 1  # NaN and +inf leave every range
    relu = range_check(x, write="relu", out=torch.empty_like(x))
    assert torch.equal(bits(relu), bits(torch.relu(x)))  # -0.0 and NaN kept as torch keeps them


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_add_check_kernel_equals_its_reference(dtype):
    rows, n = 6, 29
    a, b = _special(rows, n, dtype, 3), _special(rows, n, dtype, 4).flip(0)
    for region in (None, torch.tensor([0, 1, 2, 2, 1, 0])):
        for mode, relu in itertools.product("dcb", (False, True)):
            for ma, mb in itertools.product(("n", mode), repeat=2):
                seeds = iter(range(10, 20))

                def side(m: str, seeds=seeds) -> Side:
                    det = _tables(3, n, dtype, next(seeds)) if m in "db" else None
                    return Side(det, _tables(3, n, dtype, next(seeds)) if m in "cb" else None)

                sides = (side(ma), side(mb), side(mode))
                got = []
                for fn in (add_check, add_check_reference):
                    flagged = tuple(Side(s.det, s.clamp, torch.full((rows,), 7, dtype=torch.uint8)
                                         if s.det is not None else None) for s in sides)  # fmt: skip
                    out = a.clone()  # in place into a
                    if fn is add_check:
                        fn(out, b, out, flagged, relu=relu, region=region)
                    else:
                        fn(out, b, out, flagged, relu, region)
                    got.append((out, [s.flags for s in flagged]))
                assert torch.equal(bits(got[0][0]), bits(got[1][0])), (mode, ma, mb, relu)
                for f, g in zip(got[0][1], got[1][1]):
                    assert (f is None and g is None) or torch.equal(f, g)


@needs_kernel
def test_kernels_split_over_threads_as_one(monkeypatch):
    x = _special(64, 300, F32, 5)
    lo, hi = torch.full((1, 300), -20.0), torch.full((1, 300), 20.0)  # NaN and inf leave it

    def run() -> list[torch.Tensor]:
        flags = [torch.empty(64, dtype=torch.uint8) for _ in range(3)]
        out = range_check(x, flags[0], det_lo=lo, det_hi=hi, clip_lo=lo, clip_hi=hi,
                          write="clamp", out=torch.empty_like(x))  # fmt: skip
        sides = (Side((lo, hi), None, flags[1]), Side(), Side((lo, hi), None, flags[2]))
        summed = add_check(x, x.flip(0), torch.empty_like(x), sides, relu=True)
        return [bits(out), bits(summed), *flags]

    one = run()
    monkeypatch.setattr(rc, "_SPLIT_AT", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        split = run()
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, split))
    assert bool(one[2].any()) and not bool(one[2].all())


# --- the fused wrapper on torchvision-style models ---------------------------------------------

NETS = ["resnet18_cifar", "resnet18", "vgg11_bn_pool3", "vgg11"]


def _setup(name: str, inplace: bool = True):
    net, shape = model(name, F32)
    if not inplace:
        for m in net.modules():
            if isinstance(m, nn.ReLU):
                m.inplace = False
    centre, lower, upper = ball(shape, 0.02, F32)
    mon = verify.monitor(net, Ball(centre[0], 0.02), method="ibp", input_shape=shape)
    x = torch.cat([lower, upper, box_samples(lower, upper, 14, seed=3)[0]])
    return net, mon, torch.minimum(torch.maximum(x, lower), upper)


def _both(mon, net, action: str, **kw):
    return (mon.wrap(net, action, fused=True, **kw), mon.wrap(net, action, fused=False, **kw))


def _agree(fused, eager, x, region=None, nodes: bool = True) -> tuple[torch.Tensor, object]:
    """Runs both; asserts equal outputs (to the bit) and flags (per node unless `nodes` is
    False: per sample and the first node); returns the fused output and report."""
    calls = fused.fused_calls
    with torch.no_grad():
        y, report = fused.run(x, region)
        z, expected = eager.run(x, region)
    assert fused.fused_calls == calls + 1
    assert torch.equal(bits(y), bits(z))
    assert torch.equal(report.flagged, expected.flagged)
    # `nodes=False` for "both" where a clamp changes what later nodes see: the fused report
    # is that of the clipped forward, the eager wrapper's that of its first, unclipped pass
    assert not nodes or torch.equal(report.node_flags, expected.node_flags)
    assert report.first_node == expected.first_node
    return y, report


@pytest.mark.parametrize("name", NETS)
@pytest.mark.parametrize("inplace", [True, False])
def test_fused_clean_outputs_are_the_plain_ones(name, inplace):
    net, mon, x = _setup(name, inplace)
    with torch.no_grad():
        plain = net(x)
    for action, kw in (("detect", {}), ("detect", {"checksums": False}),
                       ("detect", {"through_relu": True}), ("clip", {}), ("both", {})):  # fmt: skip
        fused, eager = _both(mon, net, action, **kw)
        assert isinstance(fused, FusedMonitoredNet)
        y, report = _agree(fused, eager, x)
        assert torch.equal(bits(y), bits(plain)), (action, kw)
        assert not bool(report.flagged.any()), report.first_node
        _agree(fused, eager, x[:1])  # batch 1


def _kinds(mon, name: str) -> list[str]:
    """One monitored node of each kind the network has: read by a ReLU, an operand of a
    residual add, a downsample, the add itself, the last layer."""
    wanted = {"resnet18_cifar": ["layer1_0_bn1", "layer1_0_bn2", "layer2_0_downsample_1", "add",
                                 "fc"],
              "vgg11_bn_pool3": ["features_1", "classifier_0", "classifier_6"]}[name]  # fmt: skip
    assert set(wanted) <= set(mon.nodes), mon.nodes
    return wanted


@pytest.mark.parametrize("name", ["resnet18_cifar", "vgg11_bn_pool3"])
@pytest.mark.parametrize("end", ["upper", "lower"])
def test_a_value_out_of_a_narrowed_range_is_flagged_and_clipped_as_eager(name, end):
    """Each kind of node in turn gets a range narrower than its values (as a fault would push
    them out of the certified one): fused detection flags it where eager detection does, and
    clipping writes the eager clamps, to the bit."""
    net, mon, x = _setup(name)
    for node in _kinds(mon, name):
        ranges = {n: (lo[0], hi[0]) for n, (lo, hi) in mon.ranges.items() if n in mon.affine}
        lo, hi = ranges[node]
        mid = lo + (hi - lo) / 2
        ranges[node] = (lo, mid) if end == "upper" else (mid, hi)
        for action in ("detect", "clip", "both"):
            # (the eager wrapper's checksums after a clamp that is not in place see the
            # unclamped value: compared without them)
            fused, eager = _both(mon, net, action, ranges=ranges, checksums=False)
            _, report = _agree(fused, eager, x)
            if action != "clip":
                column = report.node_flags[:, report.nodes.index(node)]
                assert bool(column.any()), (node, action)
        with torch.no_grad():  # the checksums check what the layers read: the clamped values
            report = mon.wrap(net, "both", ranges=ranges, fused=True).run(x)[1]
        assert set(report.first_node) == {node}
        assert report.node_flags.any(0).nonzero().flatten().tolist() == [mon.affine.index(node)]


@pytest.mark.parametrize("value", [1e4, float("nan")])
def test_planted_weight_fault_is_detected_and_clipped_as_eager(value):
    net, mon, x = _setup("resnet18_cifar")
    wrapped = {a: _both(mon, net, a) for a in ("detect", "clip", "both")}
    weight = net.layer1[0].conv2.weight
    saved = weight.clone()
    try:
        with torch.no_grad():
            weight[0, 0, 0, 0] = value
        for action, (fused, eager) in wrapped.items():
            y, report = _agree(fused, eager, x, nodes=action != "both" or value == value)
            if action != "clip":
                assert bool(report.flagged.all())
                assert set(report.first_node) == {"layer1_0_bn2"}
            else:
                assert not bool(y.isnan().any())
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def test_regions_by_index_fused_union_eager():
    net, shape = model("resnet18_cifar", F32)
    balls = [ball(shape, 0.02, F32, seed=s) for s in (1, 2)]
    mon = verify.monitor(net, [Ball(c[0], 0.02) for c, _, _ in balls], method="ibp",
                         input_shape=shape)  # fmt: skip
    x = torch.cat([box_samples(lo, hi, 4, seed=5)[0][:4] for _, lo, hi in balls])
    region = torch.tensor([0] * 4 + [1] * 4)
    for action in ("detect", "clip", "both"):
        fused, eager = _both(mon, net, action)
        _, report = _agree(fused, eager, x, region)
        assert not bool(report.flagged.any())
        _, report = _agree(fused, eager, x, 1 - region, nodes=action != "both")  # the other's
        assert action == "clip" or bool(report.flagged.all())
    fused, eager = _both(mon, net, "clip")
    _agree(fused, eager, x)  # no index: the hull's clamps
    fused = mon.wrap(net, "detect", fused=True)
    with torch.no_grad():
        fused.run(x)  # no index: the union of the regions (eager)
    assert fused.fused_calls == 0


def test_calls_the_fused_trace_cannot_serve_go_to_the_eager_wrapper():
    net, mon, x = _setup("resnet18_cifar")
    fused = mon.wrap(net, "detect")
    assert isinstance(fused, FusedMonitoredNet) == rc.available()
    fused = mon.wrap(net, "detect", fused=True)
    net.layer1[0].conv1.weight.requires_grad_(True)
    try:
        y = fused(x)  # gradients: eager
        assert y.requires_grad and fused.fused_calls == 0
    finally:
        net.layer1[0].conv1.weight.requires_grad_(False)
    seen = []
    handle = net.relu.register_forward_hook(lambda m, i, o: seen.append(1))  # a fused-away ReLU
    try:
        with torch.no_grad():
            fused(x)
    finally:
        handle.remove()
    assert seen and fused.fused_calls == 0
    # a hook on a BatchNorm (the fault injector's activation faults) runs in the fused trace
    handle = net.layer1[0].bn1.register_forward_hook(
        lambda m, i, o: o.index_fill_(0, torch.tensor([3]), 1e6)
    )
    try:
        with torch.no_grad():
            fused(x)
    finally:
        handle.remove()
    assert fused.fused_calls == 1
    assert fused.report.flagged.tolist() == [i == 3 for i in range(len(x))]
    with pytest.raises(MonitorOptionError, match="keeps no values"):
        mon.wrap(net, "detect", fused=True, keep_values=True)
    assert not isinstance(mon.wrap(net, "detect", keep_values=True), FusedMonitoredNet)


def test_without_the_kernel_the_reference_serves(monkeypatch):
    monkeypatch.setattr(rc, "_LIB", [None])
    net, mon, x = _setup("resnet18_cifar")
    assert not isinstance(mon.wrap(net, "clip"), FusedMonitoredNet)  # default: eager
    ranges = {n: (lo[0], (lo[0] + hi[0]) / 2) for n, (lo, hi) in mon.ranges.items()
              if n in mon.affine}  # fmt: skip
    for action in ("detect", "clip", "both"):
        _agree(*_both(mon, net, action, ranges=ranges), x)


def test_the_default_fuses_the_calls_large_enough_to_pay(monkeypatch):
    """`fused=None` runs a call fused from `FUSED_MIN_VALUES` values a node (batch x the
    nodes' mean size) and small calls eagerly, with the same outputs; `fused=True` fuses all."""
    net, mon, x = _setup("resnet18_cifar")
    if not rc.available():
        pytest.skip("no C compiler: the default is the eager wrapper")
    auto, forced = mon.wrap(net, "detect"), mon.wrap(net, "detect", fused=True)
    per_call = auto._values * len(x)
    with torch.no_grad():
        monkeypatch.setattr(auto, "_min_values", per_call + 1)
        y_small = auto(x)
        assert auto.fused_calls == 0
        monkeypatch.setattr(auto, "_min_values", per_call)
        y_large = auto(x)
        assert auto.fused_calls == 1
        forced(x[:1])
        assert forced.fused_calls == 1
    assert torch.equal(y_small, y_large)
    assert mon.wrap(net, "detect")._min_values == FUSED_MIN_VALUES
