"""The kernel tests' seeded data builders work under a non-CPU default device, as on a GPU
machine (tests/kernels/conftest.py makes CUDA the default there): CUDA refuses a CPU
`torch.Generator` for a CUDA tensor, a check that CPU and meta tensors skip, so it is emulated
here on the meta device to catch on a CPU machine what only a GPU machine would."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.kernels import test_crf_updates as crf
from tests.kernels import test_lattice_filter as lattice
from tests.kernels import test_prox_relu_block as prox


class GeneratorDeviceCheck(TorchFunctionMode):
    """Raises CUDA's error when a random op's generator is not on the device its output (or,
    for in-place ops, its tensor) is on."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        if generator is not None:
            if args and isinstance(args[0], torch.Tensor) and func.__name__.endswith("_"):
                device = args[0].device
            else:
                device = torch.device(kwargs.get("device") or torch.get_default_device())
            if device.type != generator.device.type:
                raise RuntimeError(
                    f"Expected a '{device.type}' device type for generator but found "
                    f"'{generator.device.type}'"
                )
        return func(*args, **kwargs)


@pytest.fixture
def meta_default() -> Iterator[None]:
    """The meta device as the default one, and the generator check on."""
    previous = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        with GeneratorDeviceCheck():
            yield
    finally:
        torch.set_default_device(previous)


BUILDERS: dict[str, Callable[..., object]] = {  # each takes the builders' `device=` keyword
    "crf randn": lambda **kw: crf._randn((3, 11, 5), torch.float32, 0, **kw),
    "crf randint": lambda **kw: crf._randint(3, (3, 11, 5), 2, **kw),
    "lattice": lambda **kw: lattice.random_lattice(7, 3, 3, 5, torch.float64, **kw),
    "lattice features": lambda **kw: lattice._features_and_values(2, 23, 5, 3, torch.float32, **kw),
    "prox argmin": lambda **kw: prox._argmin_inputs("degenerate", **kw),
    "prox update": lambda **kw: prox._update_inputs(torch.float32, **kw),
    "prox line search": lambda **kw: prox._line_search_inputs(False, **kw),
    "prox compile": lambda **kw: prox._compile_inputs(**kw),
    **{
        f"prox oracle {kind}": (
            lambda kind=kind, **kw: prox._oracle_inputs(
                2, 3, (4, 5), kind, "full", torch.float64, **kw
            )
        )
        for kind in prox.KINDS
    },
}


def _tensors(tree: object) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (tuple, list)):
        return [t for item in tree for t in _tensors(item)]
    return []


def test_the_check_catches_a_cpu_generator(meta_default):
    with pytest.raises(RuntimeError, match="Expected a 'meta' device type for generator"):
        torch.randn(3, generator=torch.Generator())
    with pytest.raises(RuntimeError, match="for generator"):
        torch.empty(3).uniform_(generator=torch.Generator())


@pytest.mark.parametrize("name", BUILDERS)
def test_builders_generate_on_the_cpu_and_move(name, meta_default):
    tensors = _tensors(BUILDERS[name]())
    assert tensors and all(t.device.type == "meta" for t in tensors)


@pytest.mark.parametrize("name", BUILDERS)
def test_builders_give_the_cpu_data_on_the_default_device(name):
    """On the default device (CUDA on a GPU machine) a builder's data is the CPU's for the
    same seed, so that both machines check the kernels on the same numbers."""
    here, cpu = _tensors(BUILDERS[name]()), _tensors(BUILDERS[name](device="cpu"))
    assert len(here) == len(cpu) and all(t.device.type == "cpu" for t in cpu)
    assert all(a.device == torch.get_default_device() for a in here)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(here, cpu))
