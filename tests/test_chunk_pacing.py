"""CROWN's neuron chunks under a deadline (`bounds.methods.chunks.bound_in_chunks`): a pass
that has measured nothing starts small, later chunks are sized from the measured seconds per
neuron, the pass ends before the deadline, and the neurons left get no information."""

from __future__ import annotations

import time

import torch
from torch import nn

from bounds.graph.graph import build_graph
from bounds.methods.chunks import DEADLINE_CHUNK, bound_in_chunks


def _graph():
    return build_graph(nn.Sequential(nn.Linear(4, 4)).eval(), (4,))


def slow_bound(seconds_per_neuron: float, sizes: list[int]):
    def lower_bound(part: torch.Tensor, offset: int) -> torch.Tensor:
        sizes.append(part.numel())
        time.sleep(seconds_per_neuron * part.numel())
        return torch.zeros(1, 2 * part.numel())

    return lower_bound


def test_an_unmeasured_pass_starts_small_and_ends_before_its_deadline():
    sizes: list[int] = []
    index = torch.arange(40_000)
    start = time.monotonic()
    deadline = start + 0.4
    lower, upper = bound_in_chunks(_graph(), "x", index, 1, torch.zeros(1),
                                   slow_bound(2e-5, sizes), deadline=deadline)  # fmt: skip
    assert time.monotonic() <= deadline + 0.1
    assert sizes[0] == DEADLINE_CHUNK and max(sizes) <= 40_000 // 8
    assert len(sizes) >= 3  # sized from the measured cost, not one eighth at once
    done = sum(sizes)
    assert done < 40_000  # 0.8 s of work does not fit in 0.4 s
    assert (lower[0, :done] == 0).all() and (upper[0, :done] == 0).all()
    assert torch.isinf(lower[0, done:]).all() and torch.isinf(upper[0, done:]).all()


def test_without_a_deadline_the_chunks_are_the_memory_cap():
    sizes: list[int] = []
    index = torch.arange(1000)
    lower, _ = bound_in_chunks(_graph(), "x", index, 1, torch.zeros(1), slow_bound(0, sizes))
    assert sizes == [1000] and (lower == 0).all()


def test_earlier_chunks_of_the_pass_let_the_first_chunk_be_whole():
    sizes: list[int] = []
    index = torch.arange(800)
    durations = [1e-4]
    bound_in_chunks(_graph(), "x", index, 1, torch.zeros(1), slow_bound(0, sizes),
                    deadline=time.monotonic() + 10, durations=durations)  # fmt: skip
    assert sizes[0] == 100 and sum(sizes) == 800  # an eighth of the layer
    assert len(durations) == 1 + len(sizes)
