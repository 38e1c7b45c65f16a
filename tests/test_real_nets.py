"""Bounds on the real VNN-COMP networks (skipped when ../shared/data is absent): sampled
outputs inside the bounds of every fast method."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import verify
from tests.soundness import assert_contains, box_samples, spec_values
from verify.specs import region_box, region_spec

pytestmark = pytest.mark.data
CIFAR_MEAN = (0.485, 0.456, 0.406)
CIFAR_STD = 0.225


def _acas(shared_data, net_id="1_1"):
    path = shared_data / f"vnncomp2022/acasxu/onnx/ACASXU_run2a_{net_id}_batch_2000.onnx.gz"
    return verify.load_onnx(path)


@pytest.mark.parametrize("prop", [1, 2, 3, 4])
@pytest.mark.parametrize("method", ["crown", "alpha-crown"])
def test_acasxu_bounds_contain_samples(shared_data, prop, method):
    net = _acas(shared_data)
    spec = verify.load_vnnlib(shared_data / f"vnncomp2022/acasxu/vnnlib/prop_{prop}.vnnlib.gz")
    region = spec.regions[0]
    lower, upper = region_box(region, net.input_shape)
    C, _, _ = region_spec(region)
    result = verify.bounds(net, lower=lower, upper=upper, C=C, method=method)
    points = box_samples(lower, upper, 3000)
    assert_contains(result.lower, result.upper, spec_values(net, points, C), tol=1e-4)


def test_mnist_fc_bounds_contain_samples(shared_data):
    net = verify.load_onnx(shared_data / "vnncomp2022/mnist_fc/onnx/mnist-net_256x4.onnx.gz")
    spec = verify.load_vnnlib(shared_data / "vnncomp2022/mnist_fc/vnnlib/prop_0_0.03.vnnlib.gz")
    region = spec.regions[0]
    lower, upper = region_box(region, net.input_shape)
    C, _, _ = region_spec(region)
    result = verify.bounds(net, lower=lower, upper=upper, C=C, method="alpha-crown", iterations=5)
    points = box_samples(lower, upper, 500)
    assert_contains(result.lower, result.upper, spec_values(net, points, C), tol=1e-4)


def test_oval_cifar_crown_contains_samples(shared_data):
    net = verify.load_onnx(shared_data / "vnncomp2022/oval21/onnx/cifar_base_kw.onnx.gz")
    row = np.loadtxt(shared_data / "oval/cifar10_test_first100.csv", delimiter=",", max_rows=1)
    image = torch.tensor(row[1:], dtype=torch.float32).reshape(32, 32, 3).permute(2, 0, 1) / 255
    eps = 2 / 255
    mean = torch.tensor(CIFAR_MEAN).view(3, 1, 1)
    lower = ((image - eps).clamp(0, 1) - mean) / CIFAR_STD
    upper = ((image + eps).clamp(0, 1) - mean) / CIFAR_STD
    result = verify.bounds(net, lower=lower[None], upper=upper[None], method="crown")
    points = box_samples(lower[None], upper[None], 200)
    C = torch.eye(10)[None]
    assert_contains(result.lower, result.upper, spec_values(net, points, C), tol=1e-4)
