"""A zoo of tiny seeded networks covering every supported layer, for soundness tests."""

from __future__ import annotations

import torch
from torch import nn


class Normalised(nn.Module):
    """Input normalisation with buffers, then conv + BatchNorm + avg-pool + linear."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.3, 0.5]).view(1, 2, 1, 1))
        self.register_buffer("std", torch.tensor([0.2, 0.4]).view(1, 2, 1, 1))
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.pool = nn.AvgPool2d(2)
        self.fc1 = nn.Linear(3 * 3 * 3, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        x = (x - self.mean) / self.std
        h = torch.relu(self.bn(self.conv(x)))
        h = self.pool(h)
        h = torch.flatten(h, 1)
        return self.fc2(torch.relu(self.fc1(h)))


class Residual(nn.Module):
    """Conv with a residual (skip) connection and a dilated, grouped conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2)
        self.conv3 = nn.Conv2d(4, 2, 3, stride=2, padding=1)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(2 * 2 * 2, 3)

    def forward(self, x):
        h = torch.relu(self.conv1(x))
        h = torch.relu(self.conv2(h) + h)
        h = torch.relu(self.conv3(self.drop(h)))
        return self.fc(h.view(h.size(0), -1))


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _conv_net() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(3, 4, 2, stride=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 2 * 2, 6),
        nn.ReLU(),
        nn.Linear(6, 2),
    )


def _bn_mlp() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Identity(), nn.Linear(6, 2)
    )


class ConcatSlice(nn.Module):
    """Two branches concatenated, sliced, permuted and summed (a DAG of shape ops)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(4, 3)
        self.out = nn.Linear(5, 2)

    def forward(self, x):
        h = torch.cat([torch.relu(self.a(x)), self.b(x)], dim=1)  # [B, 9]
        left, right = h[:, :5], h[:, 4:]
        return self.out(torch.relu(left + right[:, [4, 3, 2, 1, 0]]))


class Attention(nn.Module):
    """One self-attention head over 3 tokens: softmax(q k^T / sqrt(d)) v, then a linear head
    (products of two activations, exp, reciprocal)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(4, 3), nn.Linear(4, 3), nn.Linear(4, 3)
        self.out = nn.Linear(9, 2)

    def forward(self, x):  # x: [B, 3, 4]
        scores = self.q(x) @ self.k(x).transpose(1, 2) / 3**0.5
        mixed = torch.softmax(scores, dim=-1) @ self.v(x)
        return self.out(mixed.flatten(1))


def _maxpool_net() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 2)
    )


def _smooth_mlp(activation: type[nn.Module]) -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 6), activation(), nn.Linear(6, 6), activation(),
                         nn.Linear(6, 2))  # fmt: skip


ZOO: dict[str, tuple] = {
    # name: (constructor, input shape)
    "linear": (lambda: nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2)), (3,)),
    "mlp": (lambda: _mlp([4, 8, 8, 3]), (4,)),
    "deep_mlp": (lambda: _mlp([3, 6, 6, 6, 6, 2]), (3,)),
    "conv": (_conv_net, (1, 5, 5)),
    "residual": (Residual, (2, 4, 4)),
    "normalised": (Normalised, (2, 6, 6)),
    "bn_mlp": (_bn_mlp, (4,)),
    "concat_slice": (ConcatSlice, (4,)),
    "maxpool": (_maxpool_net, (1, 4, 4)),
    "sigmoid_mlp": (lambda: _smooth_mlp(nn.Sigmoid), (3,)),
    "tanh_mlp": (lambda: _smooth_mlp(nn.Tanh), (3,)),
    "attention": (Attention, (3, 4)),
}


def _randomise_batchnorm(net: nn.Module, gen: torch.Generator) -> None:
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.3)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.randn(m.num_features, generator=gen))
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) * 0.2)


def make(name: str, seed: int = 0, dtype: torch.dtype = torch.float64) -> tuple[nn.Module, tuple]:
    """The seeded zoo net `name` in eval mode, without gradients, and its input shape."""
    constructor, shape = ZOO[name]
    torch.manual_seed(seed)
    net = constructor()
    gen = torch.Generator().manual_seed(seed + 1)
    _randomise_batchnorm(net, gen)
    net = net.to(dtype).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net, shape


# --- the float-trap zoo: networks whose bounds rounding breaks unless it is accounted for ----
# Each is built from the layer kinds `exact_forward` (tests/test_rounding.py) evaluates in
# mpmath: Linear, ReLU, Square, Shift, Product, and the residual Cancel.


class Square(nn.Module):
    def forward(self, x):
        return x * x


class Shift(nn.Module):
    """`x - c` for a constant vector `c`."""

    def __init__(self, c: list[float]) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor(c, dtype=torch.float64))

    def forward(self, x):
        return x - self.c


class Cancel(nn.Module):
    """`(a + big) - big` and `a - a`, side by side: `[a + big - big, a - a]`."""

    def __init__(self, big: float) -> None:
        super().__init__()
        self.big = big

    def forward(self, x):
        return torch.cat([(x + self.big) - self.big, x - x], dim=1)


class Product(nn.Module):
    """`x[:, :k] * x[:, k:]` of the two halves."""

    def forward(self, x):
        k = x.shape[1] // 2
        return x[:, :k] * x[:, k:]


def _linear(weight: list[list[float]], bias: list[float] | None = None) -> nn.Linear:
    w = torch.tensor(weight, dtype=torch.float64)
    layer = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(w)
        if bias is not None:
            layer.bias.copy_(torch.tensor(bias, dtype=torch.float64))
    return layer


def _trap() -> nn.Sequential:
    """The issue's trap: a wide linear layer, a square, a constant subtracted."""
    w = [[3e6, -2e6, 1e6, 5e5], [1.0, 2.0, -1.0, 0.5], [2e6, 1e6, -3e6, 1e6]]
    return nn.Sequential(_linear(w, [0.0, 0.0, 0.0]), Square(), Shift([9800.75, 3.0, 1.0]))


def _huge_weights() -> nn.Sequential:
    """Weights of 1e6-1e8 next to constants of 1e3-1e4, through a ReLU."""
    gen = torch.Generator().manual_seed(7)
    w1 = (
        torch.randn(6, 4, generator=gen) * 10 ** torch.randint(6, 9, (6, 4), generator=gen)
    ).tolist()
    b1 = (torch.randn(6, generator=gen) * 5e3).tolist()
    w2 = torch.randn(3, 6, generator=gen).tolist()
    return nn.Sequential(_linear(w1, b1), nn.ReLU(), _linear(w2, [1234.5, -4321.25, 7e3]),
                         Shift([1e3, -1e4, 2.5e3]))  # fmt: skip


def _cancellations() -> nn.Sequential:
    """`(a + 1e8) - 1e8` and `a - a` after a linear layer, then a linear mix."""
    return nn.Sequential(_linear([[1.0, -0.5], [0.25, 2.0]], [0.1, -0.2]), Cancel(1e8),
                         _linear([[1.0, 1.0, 1.0, 1.0], [1.0, -1.0, 3.0, -3.0]], [0.0, 0.0]))  # fmt: skip


def _deep_narrow() -> nn.Sequential:
    """Ten layers of width 3 with weights of 1e3: intervals grow to about 1e30."""
    gen = torch.Generator().manual_seed(11)
    layers: list[nn.Module] = []
    for k in range(10):
        w = (torch.rand(3, 3, generator=gen) * 1e3 + 5e2).tolist()
        layers += [_linear(w, (torch.randn(3, generator=gen) * 1e2).tolist())]
        if k < 9:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers, Shift([1e29, -1e29, 3.0]))


def _thin_box() -> nn.Sequential:
    """Meant for the 2-D box with one side of width 0 and one of 1e7 (`FLOAT_TRAPS`)."""
    return nn.Sequential(_linear([[1.0, 1e-3], [-2.0, 3e-7], [1e5, -1.0]], [0.5, 0.0, -1e4]),
                         nn.ReLU(), _linear([[1.0, -1.0, 1e-5]], [2.0]))  # fmt: skip


def _products() -> nn.Sequential:
    """Products and squares of wide intervals."""
    return nn.Sequential(_linear([[1e4, 1.0], [1.0, -1e4], [3e3, 3e3], [-1.0, 1.0]], [1e3, 0.0, 7.0, 0.5]),
                         Product(), Square(), Shift([1e14, 0.125]))  # fmt: skip


# name -> (constructor, input box (lower, upper) as lists)
FLOAT_TRAPS = {
    "trap": (_trap, ([-1.0] * 4, [1.0] * 4)),
    "huge_weights": (_huge_weights, ([-1.0, 0.0, -2.0, 0.5], [1.0, 0.5, 2.0, 0.75])),
    "cancellations": (_cancellations, ([-1.0, -1.0], [1.0, 1.0])),
    "deep_narrow": (_deep_narrow, ([-1.0, -1.0, -1.0], [1.0, 1.0, 1.0])),
    "thin_box": (_thin_box, ([0.25, -5e6], [0.25, 5e6])),
    "products": (_products, ([-1.0, -1.0], [1.0, 1.0])),
}


def make_trap(name: str, dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The float-trap net `name` in `dtype` (eval mode) and its box `[1, n]` twice."""
    constructor, (low, high) = FLOAT_TRAPS[name]
    net = constructor().to(dtype).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net, torch.tensor([low], dtype=dtype), torch.tensor([high], dtype=dtype)
