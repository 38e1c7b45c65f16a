"""ResNet and VGG written out as torchvision writes them (`torchvision.models.resnet` /
`torchvision.models.vgg`, torchvision 0.2x; torchvision does not install beside the CPU torch
here): `nn.ReLU(inplace=True)`, `out += identity`, the 1x1 downsample convolution with its
BatchNorm, `nn.MaxPool2d(3, 2, padding=1)`, `nn.AdaptiveAvgPool2d` and `torch.flatten(x, 1)`.

`width` scales every channel count (64 in torchvision) so that tests stay small; `cifar_stem`
replaces the 7x7 stride-2 stem and its max pooling by a 3x3 stride-1 convolution (the usual
CIFAR ResNet-18, 11M parameters at width 64). `vgg11(...)` with `pool=(7, 7)`, `hidden=4096`
is torchvision's VGG-11; the CIFAR-sized one pools to 1x1 and has 512-wide hidden layers.
Used by tests/test_torchvision_ops.py and benchmarks/sdc_campaign.py.
"""

from __future__ import annotations

import torch
from torch import nn


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:  # fmt: skip
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, layers: list[int], num_classes: int = 10, width: int = 64,
                 cifar_stem: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.inplanes = width
        if cifar_stem:
            self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        else:
            self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity() if cifar_stem else nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(8 * width, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width * BasicBlock.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes, stride),
                                       nn.BatchNorm2d(planes))  # fmt: skip
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


def resnet18(width: int = 64, num_classes: int = 10, cifar_stem: bool = False) -> ResNet:
    return ResNet([2, 2, 2, 2], num_classes, width, cifar_stem)


VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


def make_layers(cfg: list, width: int = 64, batch_norm: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    in_channels = 3
    for v in cfg:
        if v == "M":
            layers += [nn.MaxPool2d(kernel_size=2, stride=2)]
        else:
            out = v * width // 64
            conv2d = nn.Conv2d(in_channels, out, kernel_size=3, padding=1)
            if batch_norm:
                layers += [conv2d, nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            else:
                layers += [conv2d, nn.ReLU(inplace=True)]
            in_channels = out
    return nn.Sequential(*layers)


class VGG(nn.Module):
    def __init__(self, features: nn.Module, channels: int, pool: tuple[int, int] = (7, 7),
                 hidden: int = 4096, num_classes: int = 10) -> None:  # fmt: skip
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d(pool)
        self.classifier = nn.Sequential(
            nn.Linear(channels * pool[0] * pool[1], hidden),
            nn.ReLU(True),
            nn.Dropout(p=0.5),
            nn.Linear(hidden, hidden),
            nn.ReLU(True),
            nn.Dropout(p=0.5),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.classifier(x)
        return x


def vgg11(width: int = 64, pool: tuple[int, int] = (7, 7), hidden: int = 4096,
          num_classes: int = 10, batch_norm: bool = False) -> VGG:  # fmt: skip
    """VGG-11 (configuration "A"); `batch_norm`: VGG-11-BN."""
    return VGG(make_layers(VGG11, width, batch_norm), 512 * width // 64, pool, hidden,
               num_classes)  # fmt: skip


def randomise_batchnorm(net: nn.Module, seed: int = 1) -> nn.Module:
    """Non-trivial running statistics and affine parameters for every BatchNorm of `net`."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
    return net
