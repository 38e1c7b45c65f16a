"""`verify.monitor` as a name (the public function, next to the `verify.monitor` package) and
the one convention for a monitor's domain shapes: one sample's box (`(64,)`), where
`verify.bounds` takes a batch axis (`[1, 64]`); a `[1, 64]` box is accepted when the network's
input shape says so or only one reading runs, and refused with a typed error naming the expected
shape when it is ambiguous or wrong."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import verify
from bounds.errors import ShapeMismatchError
from verify.monitor import Ball, Box, Monitor, MonitorMismatchError, monitor
from verify.monitor.api import monitor as monitor_function

D = torch.float64


def test_verify_monitor_is_the_function() -> None:
    assert callable(verify.monitor)
    assert verify.monitor is monitor_function
    assert monitor is monitor_function
    assert verify.Box is Box and verify.Ball is Ball and verify.Monitor is Monitor
    assert issubclass(MonitorMismatchError, Exception)


def _box(n: int, batch: bool) -> Box:
    lower, upper = -torch.ones(n, dtype=D), torch.ones(n, dtype=D)
    return Box(lower[None], upper[None]) if batch else Box(lower, upper)


def _same_ranges(a: Monitor, b: Monitor) -> None:
    assert a.input_shape == b.input_shape
    assert a.ranges.keys() == b.ranges.keys()
    for name in a.ranges:
        for x, y in zip(a.ranges[name], b.ranges[name], strict=True):
            assert torch.equal(x, y), name


def _only_vectors(n: int = 64) -> nn.Module:
    """Takes `(n,)` and nothing else (BatchNorm1d refuses `[batch, 1, 16]`)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(n, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    return net.to(D).eval()


def _linear(n: int = 64) -> nn.Module:
    """Takes `(n,)` and also `(1, n)` (a Linear maps the last axis)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(n, 16), nn.ReLU(), nn.Linear(16, 3)).to(D).eval()


def test_a_batch_axis_of_one_is_one_sample() -> None:
    net = _only_vectors()
    plain, batched = monitor(net, _box(64, False)), monitor(net, _box(64, True))
    assert batched.input_shape == (64,)
    _same_ranges(plain, batched)
    x = torch.rand(32, 64, dtype=D) * 2 - 1
    assert not batched.check(net, x).flagged.any()


def test_a_batch_axis_of_one_with_the_declared_shape() -> None:
    net = _linear()
    plain = monitor(net, _box(64, False), input_shape=(64,))
    _same_ranges(plain, monitor(net, _box(64, True), input_shape=(64,)))
    net.input_shape = (64,)
    _same_ranges(plain, monitor(net, _box(64, True)))


def test_a_conv_net_takes_a_batched_image_box() -> None:
    """The issue's failure: a `[1, 1, 8, 8]` box made the monitor expect `[batch, 1, 1, 8, 8]`
    inputs, and the net failed inside conv2d."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(72, 3))
    net = net.to(D).eval()
    lower, upper = torch.zeros(1, 8, 8, dtype=D), torch.ones(1, 8, 8, dtype=D)
    plain, batched = monitor(net, Box(lower, upper)), monitor(net, Box(lower[None], upper[None]))
    assert batched.input_shape == (1, 8, 8)
    _same_ranges(plain, batched)


def test_an_ambiguous_box_is_refused_naming_the_expected_shape() -> None:
    with pytest.raises(ShapeMismatchError) as info:
        monitor(_linear(), _box(64, True))
    message = str(info.value)
    assert "(64,)" in message and "(1, 64)" in message and "input_shape" in message


@pytest.mark.parametrize("shape", [(1, 32), (2, 1, 64), (32,)])
def test_a_wrong_shape_is_refused_naming_the_expected_shape(shape: tuple[int, ...]) -> None:
    lower, upper = torch.zeros(shape, dtype=D), torch.ones(shape, dtype=D)
    with pytest.raises(ShapeMismatchError) as info:
        monitor(_linear(), Box(lower, upper), input_shape=(64,))
    assert "(64,)" in str(info.value)
