"""The compiled detection path (`Monitor.wrap(net, "detect", compile=True)`,
`verify.monitor_compiled`): the same flags and first nodes as the eager wrapper on clean inputs
(none), under a planted weight fault (in place: the compiled graph reads the live parameters)
and with per-sample regions; activation faults (hooks) and gradients go to the eager wrapper."""

from __future__ import annotations

import pytest
import torch

from tests.model_zoo import make
from tests.test_monitor import box_of, uniform
from verify.monitor import Ball, Box, MonitorOptionError, monitor
from verify.monitor.faults import Fault, inject


def _same(a, b) -> None:
    assert torch.equal(a.flagged, b.flagged)
    assert torch.equal(a.node_flags, b.node_flags)
    assert a.first_node == b.first_node


@pytest.mark.parametrize("name", ["mlp", "conv"])
def test_compiled_flags_equal_eager_clean_and_faulty(name):
    net, shape = make(name, dtype=torch.float32)
    lower, upper = box_of(shape, torch.float32)
    mon = monitor(net, Box(lower[0], upper[0]))
    fast = mon.wrap(net, "detect", compile=True)
    slow = mon.wrap(net, "detect")
    x = uniform(lower, upper, 300, seed=1)
    with torch.no_grad():
        clean = fast.run(x)[1]
        assert not clean.flagged.any()
        _same(clean, slow.run(x)[1])
        # the network's output, up to rounding: Inductor may order a convolution's sums
        # otherwise than eager (measured: 1 ulp on an AMD EPYC, bitwise equal elsewhere)
        torch.testing.assert_close(fast(x), net(x), rtol=1e-5, atol=1e-6)
        site = next(n for n, p in net.named_parameters() if p.dim() > 1)
        for fault in (Fault("weight", site, 0, value=1e4), Fault("weight", site, 1, xor=1 << 29)):
            with inject(net, [fault]):
                report = fast.run(x)[1]
                _same(report, slow.run(x)[1])
                assert report.flagged.any()
        assert not fast.run(x)[1].flagged.any()  # restored
        with inject(net, [Fault("activation", site.split(".")[0], 2, value=1e6, sample=4)]):
            hooked = fast.run(x)[1]  # a hook: the eager wrapper runs
        assert hooked.flagged.tolist() == [i == 4 for i in range(len(x))]
    assert fast.compiled_calls == 5


def test_compiled_per_sample_regions_and_bad_options():
    net, shape = make("mlp", dtype=torch.float32)
    centers = torch.rand(3, *shape, generator=torch.Generator().manual_seed(0))
    mon = monitor(net, Ball(centers, 0.1))
    fast = mon.wrap(net, "detect", compile=True)
    x = torch.cat([uniform(centers[r : r + 1] - 0.1, centers[r : r + 1] + 0.1, 40, seed=r)
                   for r in range(3)])  # fmt: skip
    region = torch.arange(3).repeat_interleave(42)
    with torch.no_grad():
        assert not fast.run(x, region)[1].flagged.any()
        wrong = fast.run(x, (region + 1) % 3)[1]  # each sample checked against another ball
        _same(wrong, mon.wrap(net, "detect").run(x, (region + 1) % 3)[1])
        assert wrong.flagged.any()
        assert not fast.run(x)[1].flagged.any()  # no index: the union, eagerly
    assert fast.compiled_calls == 2
    assert not fast.run(x, region)[1].flagged.any()  # gradients on: eagerly
    assert fast.compiled_calls == 2
    with pytest.raises(MonitorOptionError, match="compile=True"):
        mon.wrap(net, "clip", compile=True)
