"""Seeded fault injection into a network's float weights and activations.

A `Fault` corrupts one element: `xor` flips the set bits of its IEEE-754 word, or `value`
replaces it. Sites: a parameter (`target="weight"`, `site` its `named_parameters` name,
`index` the flat element) or the output of a submodule (`target="activation"`, `site` its
`named_modules` name, `index` the flat element of one sample, `sample` the batch row; None:
every row). `inject(net, faults)` applies them for the duration of a `with` block and restores
the clean model afterwards, bitwise (weights: the saved words are written back and compared;
activations: forward hooks, prepended so that they run before any other hook, and removed).

Fault models (`sample_faults`):
- "bitflip": `flips` distinct (element, bit) positions drawn uniformly among all allowed
  positions of the sites; `bits` restricts the bit positions to "sign", "exponent",
  "mantissa" or "any" (float32: bit 31, bits 23-30, bits 0-22; float64: 63, 52-62, 0-51);
- "value": one element replaced by a value drawn uniformly from `[-value_range, value_range]`;
- "exponent": one element's exponent field replaced by a different, uniformly drawn one (the
  XOR with a uniform non-zero pattern of the exponent's width); sign and mantissa kept.
The last two follow the random-value and exponent-only error models of the fault-injection
study of deep recommendation models (Ma et al., "Evaluating and Enhancing Robustness of Deep
Recommendation Systems Against Hardware Errors", 2023); the value range is ours.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from bounds.errors import InvalidLimitError, VerificationInputError

TARGETS = ("weight", "activation")
MODELS = ("bitflip", "value", "exponent")
# (word bits, exponent width, mantissa width) per float dtype.
LAYOUT = {torch.float32: (32, 8, 23), torch.float64: (64, 11, 52)}
_INT = {torch.float32: torch.int32, torch.float64: torch.int64}
_SKIPPED_MODULES = (nn.Flatten, nn.Unflatten, nn.Identity, nn.Dropout, nn.Sequential)


class FaultSiteError(VerificationInputError):
    """A fault names a site, element, sample or dtype the network does not have."""


@dataclass(frozen=True)
class Fault:
    """One corrupted element; see the module docstring. `bits`: the flipped bit positions."""

    target: str
    site: str
    index: int
    xor: int = 0
    value: float | None = None
    sample: int | None = None
    bits: tuple[int, ...] = ()


def bit_positions(dtype: torch.dtype, bits: str) -> list[int]:
    """The bit positions of a float word of `dtype` in the class `bits`."""
    if dtype not in LAYOUT:
        raise FaultSiteError(f"bit flips need float32 or float64 values, got {dtype}")
    width, exp, man = LAYOUT[dtype]
    classes = {
        "any": list(range(width)),
        "sign": [width - 1],
        "exponent": list(range(man, man + exp)),
        "mantissa": list(range(man)),
    }
    if bits not in classes:
        raise InvalidLimitError(f"bits must be one of {', '.join(classes)}; got {bits!r}")
    return classes[bits]


def _signed(mask: int, width: int) -> int:
    """`mask` as the signed integer of the same bits (for int32/int64 tensors)."""
    return mask - (1 << width) if mask >= 1 << (width - 1) else mask


def corrupt(values: Tensor, fault: Fault) -> Tensor:
    """`values` (1-D, float32/float64) with `fault` applied to `values[fault.index]` (a copy)."""
    out = values.clone()
    if fault.value is not None:
        out[fault.index] = fault.value
        return out
    width = LAYOUT[values.dtype][0]
    words = out.view(_INT[values.dtype])
    words[fault.index] ^= _signed(fault.xor, width)
    return out


def weight_sites(net: nn.Module) -> dict[str, tuple[int, torch.dtype]]:
    """`{parameter name: (elements, dtype)}` of the float32/float64 parameters."""
    return {name: (p.numel(), p.dtype) for name, p in net.named_parameters() if p.dtype in LAYOUT}


def activation_sites(net: nn.Module, example: Tensor) -> dict[str, tuple[int, torch.dtype]]:
    """`{module name: (elements per sample, dtype)}` of the submodules that compute a float
    tensor on `example` (`[batch, *input_shape]`); containers and reshapes left out."""
    found: dict[str, tuple[int, torch.dtype]] = {}
    handles = []
    for name, sub in net.named_modules():
        if not name or isinstance(sub, _SKIPPED_MODULES) or list(sub.children()):
            continue

        def hook(module, args, out, name=name):
            if isinstance(out, Tensor) and out.dtype in LAYOUT:
                found[name] = (out[0].numel(), out.dtype)

        handles.append(sub.register_forward_hook(hook))
    try:
        with torch.no_grad():
            net(example)
    finally:
        for h in handles:
            h.remove()
    return found


def sample_faults(
    sites: dict[str, tuple[int, torch.dtype]],
    count: int,
    *,
    target: str,
    model: str = "bitflip",
    bits: str = "any",
    flips: int = 1,
    value_range: float = 1e3,
    seed: int = 0,
) -> list[tuple[Fault, ...]]:
    """`count` trials, each a tuple of faults, drawn from `sites` (see `weight_sites`,
    `activation_sites`) with a seeded generator: the same arguments give the same faults."""
    _check_options(sites, count, target, model, flips)
    rng = np.random.default_rng(seed)
    names = list(sites)
    sizes = np.array([sites[n][0] for n in names], dtype=np.float64)
    trials = []
    for _ in range(count):
        if model == "bitflip":
            trials.append(_bitflips(rng, names, sizes, sites, target, bits, flips))
            continue
        k = int(rng.choice(len(names), p=sizes / sizes.sum()))
        index = int(rng.integers(sites[names[k]][0]))
        if model == "value":
            value = float(rng.uniform(-value_range, value_range))
            trials.append((Fault(target, names[k], index, value=value),))
        else:
            _, exp, man = LAYOUT[sites[names[k]][1]]
            pattern = int(rng.integers(1, 1 << exp))
            flipped = tuple(b + man for b in range(exp) if pattern >> b & 1)
            trials.append((Fault(target, names[k], index, xor=pattern << man, bits=flipped),))
    return trials


def _check_options(sites, count: int, target: str, model: str, flips: int) -> None:
    if target not in TARGETS:
        raise InvalidLimitError(f"target must be one of {', '.join(TARGETS)}; got {target!r}")
    if model not in MODELS:
        raise InvalidLimitError(f"model must be one of {', '.join(MODELS)}; got {model!r}")
    for what, value in (("count", count), ("flips", flips)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidLimitError(f"{what} must be an integer >= 1, got {value!r}")
    if not sites:
        raise FaultSiteError(f"the network has no {target} sites with float32/float64 values")


def _bitflips(rng, names, sizes, sites, target, bits, flips) -> tuple[Fault, ...]:
    """`flips` distinct (element, bit) positions, uniform over the allowed positions."""
    per_site = [len(bit_positions(sites[n][1], bits)) for n in names]
    weights = sizes * np.array(per_site)
    chosen: dict[tuple[int, int], list[int]] = {}
    taken: set[tuple[int, int, int]] = set()
    if flips > weights.sum():
        raise InvalidLimitError(f"flips = {flips} exceeds the {int(weights.sum())} positions")
    while len(taken) < flips:
        k = int(rng.choice(len(names), p=weights / weights.sum()))
        index = int(rng.integers(sites[names[k]][0]))
        bit = int(rng.choice(bit_positions(sites[names[k]][1], bits)))
        if (k, index, bit) not in taken:
            taken.add((k, index, bit))
            chosen.setdefault((k, index), []).append(bit)
    return tuple(
        Fault(target, names[k], index, xor=sum(1 << b for b in bs), bits=tuple(sorted(bs)))
        for (k, index), bs in chosen.items()
    )


def _parameter(net: nn.Module, name: str) -> nn.Parameter:
    params = dict(net.named_parameters())
    if name not in params:
        raise FaultSiteError(f"the network has no parameter {name!r}")
    return params[name]


def _check_index(fault: Fault, numel: int) -> None:
    if not 0 <= fault.index < numel:
        raise FaultSiteError(f"{fault.target} fault at {fault.site!r}: element {fault.index} "
                             f"is out of range ({numel} elements)")  # fmt: skip


@contextlib.contextmanager
def inject(net: nn.Module, faults: Sequence[Fault]) -> Iterator[None]:
    """Applies `faults` to `net` inside the block; the clean model is restored on exit (even
    when the block raises). Checks every site before changing anything."""
    weights = [f for f in faults if f.target == "weight"]
    acts = [f for f in faults if f.target == "activation"]
    bad = [f for f in faults if f.target not in TARGETS]
    if bad:
        raise FaultSiteError(f"unknown fault target {bad[0].target!r}")
    params = [_parameter(net, f.site) for f in weights]
    for f, p in zip(weights, params):
        _check_index(f, p.numel())
        if p.dtype not in LAYOUT or not p.is_contiguous():
            raise FaultSiteError(f"parameter {f.site!r} must be a contiguous float32/float64 "
                                 f"tensor (it is {p.dtype})")  # fmt: skip
    modules = dict(net.named_modules())
    for f in acts:
        if f.site not in modules or not f.site:
            raise FaultSiteError(f"the network has no submodule {f.site!r}")
    saved = [(p, f.index, p.detach().reshape(-1)[f.index].clone()) for f, p in zip(weights, params)]
    handles = []
    try:
        with torch.no_grad():
            for f, p in zip(weights, params):
                flat = p.data.view(-1)
                flat[f.index] = corrupt(flat[f.index : f.index + 1], _at_zero(f))[0]
        for site in dict.fromkeys(f.site for f in acts):
            mine = [f for f in acts if f.site == site]
            handles.append(modules[site].register_forward_hook(_activation_hook(mine),
                                                               prepend=True))  # fmt: skip
        yield
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for p, index, old in reversed(saved):
                p.data.view(-1)[index] = old
        for p, index, old in saved:
            word = p.detach().reshape(-1)[index : index + 1].view(_INT[p.dtype])
            if not torch.equal(word, old.reshape(1).view(_INT[p.dtype])):
                raise RuntimeError(f"internal error: weight {index} was not restored")


def _corrupt_all(values: Tensor, fault: Fault) -> Tensor:
    """`values` (1-D) with `fault` applied to every element, as `corrupt` applies it to one."""
    if fault.value is not None:
        return torch.full_like(values, fault.value)
    width = LAYOUT[values.dtype][0]
    return (values.view(_INT[values.dtype]) ^ _signed(fault.xor, width)).view(values.dtype)


def _at_zero(fault: Fault) -> Fault:
    return Fault(fault.target, fault.site, 0, fault.xor, fault.value, fault.sample, fault.bits)


def _activation_hook(faults: list[Fault]):
    """A forward hook returning a corrupted copy of the output (never changing it in place)."""

    def hook(module, args, out):
        if not isinstance(out, Tensor) or out.dtype not in LAYOUT:
            raise FaultSiteError(f"submodule {faults[0].site!r} does not output float32/64")
        out = out.clone()
        rows = out.view(out.shape[0], -1)
        for f in faults:
            _check_index(f, rows.shape[1])
            if f.sample is None:  # every row at once (the same corruption of each element)
                rows[:, f.index] = _corrupt_all(rows[:, f.index].contiguous(), f)
                continue
            s = f.sample
            if not 0 <= s < rows.shape[0]:
                raise FaultSiteError(f"activation fault at {f.site!r}: sample {s} is out "
                                     f"of range (batch {rows.shape[0]})")  # fmt: skip
            rows[s, f.index] = corrupt(rows[s, f.index : f.index + 1], _at_zero(f))[0]
        return out

    return hook


__all__ = [
    "Fault",
    "FaultSiteError",
    "activation_sites",
    "bit_positions",
    "corrupt",
    "inject",
    "sample_faults",
    "weight_sites",
]
