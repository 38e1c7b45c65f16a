"""Properties over several networks (VNN-LIB 2.0: several `declare-network`s): the bound engine
sees one graph, the product `x -> [f_1(x_1), ..., f_k(x_k)]` (`Product`), where `x` is the
property's flat input and `x_k` the k-th network's part of it (`NetworkDecl.input_offset`; a
network `equal-to` another reads the same part: one input, two networks, as equivalence is
stated). Each part is taken by a 0/1 selection matrix (exact in floating point: one product by
1 and zeros per entry), so the product computes exactly what each network computes."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from verify.errors import ShapeMismatchError
from verify.property import NetworkDecl, VnnlibProperty


class Product(nn.Module):
    """`x -> cat(f_k(S_k x).flatten(1))` over the declared networks (module docstring)."""

    def __init__(self, nets: Sequence[nn.Module], decls: Sequence[NetworkDecl], n_inputs: int):
        super().__init__()
        self.nets = nn.ModuleList(nets)
        self.shapes = [tuple(getattr(n, "input_shape", None) or d.input_shape) for n, d in
                       zip(nets, decls)]  # fmt: skip
        for k, d in enumerate(decls):
            select = torch.zeros(d.n_inputs, n_inputs)
            select[torch.arange(d.n_inputs), d.input_offset + torch.arange(d.n_inputs)] = 1.0
            self.register_buffer(f"select{k}", select)
        self.input_shape = (n_inputs,)
        self.output_shape = (sum(d.n_outputs for d in decls),)

    def forward(self, x: Tensor) -> Tensor:
        x = x.flatten(1)
        outs = []
        for k, (net, shape) in enumerate(zip(self.nets, self.shapes)):
            part = F.linear(x, getattr(self, f"select{k}")).reshape(-1, *shape)
            outs.append(net(part).flatten(1))
        return torch.cat(outs, 1)


def product_network(nets: Sequence[nn.Module | None], spec: VnnlibProperty) -> nn.Module:
    """The product of one model per declared network (`None` for a network `equal-to`
    another: that one's model; or one model per network not `equal-to` another);
    `ShapeMismatchError` naming the networks when the count is neither."""
    decls = spec.networks
    names = ", ".join(d.name for d in decls)
    own = [d for d in decls if d.equal_to is None]
    if len(nets) == len(own) < len(decls):  # models of the networks not equal-to another
        given = iter(nets)
        nets = [None if d.equal_to is not None else next(given) for d in decls]
    if len(nets) != len(decls):
        raise ShapeMismatchError(
            f"{spec.path} declares {len(decls)} networks ({names}); {len(nets)} models given "
            "(one per network, in declaration order; None reuses an equal-to network's model)"
        )
    models: dict[str, nn.Module] = {}
    chosen = []
    for decl, net in zip(decls, nets):
        if net is None:
            if decl.equal_to is None or decl.equal_to not in models:
                raise ShapeMismatchError(f"{spec.path}: no model given for network {decl.name}")
            net = models[decl.equal_to]
        models[decl.name] = net
        chosen.append(net)
    return Product(chosen, decls, spec.n_inputs)


def is_several(net: object) -> bool:
    """Whether `net` is a sequence of networks (models or paths), not one network."""
    return isinstance(net, (list, tuple)) and not isinstance(net, (str, os.PathLike))
