"""Neurons bounded in chunks: unit functionals, chunk sizes under a memory cap, and the
deadline (chunks predicted, from the seconds of earlier ones, to end past it are skipped)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from bounds.graph.graph import Graph
from bounds.methods.backward import LinesFn
from bounds.methods.pacing import passed

# Largest functional (batch x specs x elements of a node) processed at once: 2^25 floats.
MAX_FUNCTIONAL_ELEMENTS = 1 << 25

# Neurons per chunk below which a deadline does not split a layer's bound further.
DEADLINE_CHUNK = 32

ChunkLinesFn = Callable[[int, int], LinesFn]  # (first neuron, count) of a chunk -> lines


def unit_functionals(index: Tensor, shape: tuple[int, ...], batch: int, like: Tensor) -> Tensor:
    """`[batch, 2k, *shape]`: rows `+e_j` then `-e_j` for each flat index `j` in `index`."""
    k = index.numel()
    numel = 1
    for d in shape:
        numel *= d
    eye = like.new_zeros(k, numel)
    eye[torch.arange(k), index] = 1.0
    both = torch.cat([eye, -eye]).reshape(2 * k, *shape)
    return both.unsqueeze(0).expand(batch, *both.shape)


def spec_chunk(graph: Graph, batch: int) -> int:
    """Specs per backward pass so the largest functional stays under MAX_FUNCTIONAL_ELEMENTS."""
    widest = max(int(torch.Size(n.shape).numel()) for n in graph.nodes)
    return max(1, MAX_FUNCTIONAL_ELEMENTS // (batch * widest))


def neuron_chunk(graph: Graph, batch: int, count: int) -> int:
    """Neurons per backward pass (each gives two specs, `+e_j` and `-e_j`), at most `count`."""
    return min(count, max(1, spec_chunk(graph, batch) // 2))


def predicted_past(deadline: float | None, durations: list[float] | None) -> bool:
    """Whether a pass as long as the longest of `durations` would end past `deadline`."""
    if deadline is None or not durations:
        return False
    return time.monotonic() + max(durations) > deadline


def bound_in_chunks(
    graph: Graph, node: str, index: Tensor, batch: int, like: Tensor, lower_bound: Callable,
    step: int | None = None, deadline: float | None = None,
    durations: list[float] | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Lower/upper bounds `[batch, k]` of the flat neurons `index` of `node`, chunked so the
    functionals stay under MAX_FUNCTIONAL_ELEMENTS: `lower_bound(part, offset)` gives lower
    bounds `[batch, 2 count]` of `+e_j` then `-e_j` for the flat neurons `part =
    index[offset:offset+count]` (e.g. `unit_functionals(part, ...)`, or `patch_bound`).
    `step`: neurons per chunk (default `neuron_chunk`; compiled callers fix it outside).
    `deadline` (`time.monotonic()`): at most an eighth of the neurons (and no fewer than
    `DEADLINE_CHUNK`) per chunk, each sized to at most a quarter of the time left at the
    measured seconds per neuron (the slower of the last two chunks; before any measurement of
    this pass, `DEADLINE_CHUNK` neurons), and the chunks left once it has passed, or once the
    next one is predicted to end past it, are not bounded: their neurons get `-inf` / `+inf`
    (no information: the caller's intervals stay as they are). `durations`: the seconds of
    earlier chunks (of other layers too; appended to): a first chunk predicted from them to
    end past the deadline is not started either."""
    count = index.numel()
    step = step or neuron_chunk(graph, batch, count)
    size = step
    if deadline is not None:  # finer chunks: a chunk that crosses the deadline is small
        step = min(step, max(DEADLINE_CHUNK, -(-count // 8)))
        # nothing measured yet in this pass: a first chunk of DEADLINE_CHUNK neurons measures
        # the cost (one first chunk of a large convolution took 5 s against a 0.5 s budget)
        size = step if durations else min(step, DEADLINE_CHUNK)
    lowers, uppers = [], []
    timed = durations is not None or deadline is not None  # no clock in compiled code
    rates: list[float] = []  # seconds per neuron of this layer's chunks
    stop = passed(deadline) or predicted_past(deadline, durations)
    offset = 0
    while offset < count:
        if not stop and deadline is not None and rates:
            left, rate = deadline - time.monotonic(), max(rates[-2:])
            size = int(min(step, max(DEADLINE_CHUNK, 0.25 * left / rate)))
            stop = rate * min(size, count - offset) > left
        part = index[offset : offset + size]
        offset += part.numel()
        if stop:
            lowers.append(like.new_full((batch, part.numel()), -torch.inf))
            uppers.append(like.new_full((batch, part.numel()), torch.inf))
            continue
        tick = time.monotonic() if timed else 0.0
        result = lower_bound(part, offset - part.numel())
        lowers.append(result[:, : part.numel()])
        uppers.append(-result[:, part.numel() :])
        if timed:
            seconds = time.monotonic() - tick
            rates.append(seconds / part.numel())
            if durations is not None:
                durations.append(seconds)
        stop = passed(deadline)
    return torch.cat(lowers, 1), torch.cat(uppers, 1)
