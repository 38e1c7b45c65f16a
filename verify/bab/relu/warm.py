"""The warm starts of ReLU-split domains for the hard bounder: the Anderson duals and active sets
of the domains the active set bounded, which their children start from (De Palma, Behl, Bunel,
Torr, Kumar, "Scaling the Convex Barrier with Active Sets", ICLR 2021, Sec. 5: in branch and
bound, "children inherit the parent's duals and active sets"; the validity argument is in
`verify.bab.relu.hard_bounder`).

Bookkeeping: a domain holds only an id, `ReluDomains.warm [N]` int64 (-1: none), of the start
its hard bound may begin from: its own once the hard bounder has bounded it, else its nearest
such ancestor's (children copy their parent's id, `ReluBrancher.split`). Being a plain
per-domain tensor, the id survives `take`, `put`, `cat`, `pop` and the out-of-memory chunking
like every other field. The starts themselves stay here, in the process and on the device of the
search, only for the domains the hard bounder touched: a search step ends by dropping those no
open domain refers to (`keep`), and past `max_bytes` the oldest are dropped (their domains start
cold). Domains sent to another process (distributed shards) lose their id there
(`verify.distributed.searches.ReluShard.receive`): they start cold, never from another
worker's store.

Memory per stored domain, with S rows per polytope, n ReLUs, `R_k` cuts kept in hidden layer k
(those with a positive multiplier, at most `max_cuts`, `MAX_CUTS` by default) and `m_k` its
fan-in, in the network's dtype (`e` bytes): `3 S n e` (alpha, beta_u, beta_l) plus
`S sum_k R_k (e + 9 + m_k)` (multiplier, neuron index, active flag and the mask of the set I,
one byte per input). mnist_fc 256x6 (S = 1, n = 1536, float32): 18 KB of duals and at most
192 x 797 B + 5 x 192 x 269 B = 411 KB of cuts; measured: about 57 KB per stored domain on
256x4 and 74 KB on 256x6 (`benchmarks/results/vnncomp_mnist_fc_warm.md`). The store is not
counted in `ReluSplitConfig.max_memory_gb` (the open domains' slopes and multipliers)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bounds.dual.anderson.cuts import Cuts, gather_slots
from bounds.dual.anderson.evaluation import AndersonDuals
from verify.bab.relu.hard_bounder import AndersonStart

# the active set's default schedule adds at most max_cuts x restrict = 6 x 32 cuts per layer
MAX_CUTS = 192


def select(start: AndersonStart, index: Tensor) -> AndersonStart:
    """The domains `index` of `start`."""
    cuts = tuple(c.select(index) for c in start.cuts)
    return AndersonStart(start.duals.select(index), cuts, start.given.index_select(0, index))


def compact(start: AndersonStart, max_cuts: int = MAX_CUTS) -> AndersonStart:
    """`start` with, per domain, spec and layer, only the cuts whose multiplier is positive (at
    most `max_cuts`, the largest), moved to the front, and the slots no problem uses dropped;
    the other multipliers set to 0. Still a nonnegative dual point: a valid start."""
    cuts, betas = [], []
    for c, beta in zip(start.cuts, start.duals.beta_cut):
        kept = c.active & (beta > 0)
        count = min(max_cuts, int(kept.sum(-1).amax())) if kept.numel() else 0
        order = torch.where(kept, beta, -torch.ones_like(beta)).topk(count, dim=2).indices
        gather = gather_slots(order)
        chosen = gather(kept)
        cuts.append(Cuts(gather(c.rows), gather(c.mask), chosen))
        betas.append(gather(beta) * chosen)
    d = start.duals
    return AndersonStart(
        AndersonDuals(d.alpha, d.beta_u, d.beta_l, tuple(betas)), tuple(cuts), start.given
    )


def nbytes(start: AndersonStart) -> int:
    tensors = (*_tensors(start.duals, start.cuts), start.given)
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class _Block:
    """The starts of the domains `ids [n]` (ascending) bounded together."""

    ids: Tensor
    start: AndersonStart
    size: int


class WarmStarts:
    """The store (module docstring): `add` the starts of bounded domains (their new ids),
    `get` those of ids, `keep` only those of live ids; at most `max_bytes` (oldest dropped)."""

    def __init__(self, max_bytes: float, max_cuts: int = MAX_CUTS):
        self.max_bytes, self.max_cuts = max_bytes, max_cuts
        self.blocks: list[_Block] = []
        self.next_id = 0
        self.size = self.peak = 0

    def __len__(self) -> int:
        return sum(len(b.ids) for b in self.blocks)

    def add(self, start: AndersonStart) -> Tensor:
        """Store `start` (N domains, compacted); their ids `[N]`."""
        n = start.given.shape[0]
        ids = torch.arange(self.next_id, self.next_id + n, device=start.given.device)
        self.next_id += n
        start = compact(start, self.max_cuts)
        self._append(_Block(ids, start, nbytes(start)))
        while self.size > self.max_bytes and self.blocks:
            self.size -= self.blocks.pop(0).size
        return ids

    def _append(self, block: _Block) -> None:
        self.blocks.append(block)
        self.size += block.size
        self.peak = max(self.peak, self.size)

    def get(self, ids: Tensor) -> AndersonStart | None:
        """The starts of `ids [N]` (`given` False where -1 or no longer stored: zeros there), the
        cuts padded to the most any of them has; None when none is stored."""
        parts = []
        for block in self.blocks:
            pos = torch.searchsorted(block.ids, ids).clamp(max=len(block.ids) - 1)
            where = (block.ids[pos] == ids).nonzero().flatten()
            if len(where):
                parts.append((where, select(block.start, pos[where])))
        if not parts:
            return None
        slots = tuple(max(p.cuts[k].rows.shape[2] for _, p in parts)
                      for k in range(len(parts[0][1].cuts)))  # fmt: skip
        out: list[Tensor] = []
        given = torch.zeros(len(ids), dtype=torch.bool, device=ids.device)
        for where, part in parts:
            cuts = tuple(c.padded(s) for c, s in zip(part.cuts, slots))
            tensors = _tensors(part.duals.padded(slots), cuts)
            out = out or [t.new_zeros(len(ids), *t.shape[1:]) for t in tensors]
            for o, t in zip(out, tensors):
                o[where] = t
            given[where] = True
        H = len(slots)
        duals = AndersonDuals.unflat(tuple(out[: 4 * H]))
        cuts = tuple(Cuts(*out[4 * H + 3 * k : 4 * H + 3 * k + 3]) for k in range(H))
        return AndersonStart(duals, cuts, given)

    def keep(self, live: Tensor) -> None:
        """Drop the starts of ids not in `live` (the open domains' `warm`): a block none of
        whose ids is live goes, one with at most half of them live is cut down to those."""
        blocks, self.blocks, self.size = self.blocks, [], 0
        for block in blocks:
            hit = torch.isin(block.ids, live)
            count = int(hit.sum())
            if count == 0:
                continue
            if 2 * count <= len(block.ids):
                index = hit.nonzero().flatten()
                start = compact(select(block.start, index), self.max_cuts)
                block = _Block(block.ids[index], start, nbytes(start))
            self._append(block)


def _tensors(duals: AndersonDuals, cuts: tuple[Cuts, ...]) -> list[Tensor]:
    return [*duals.flat(), *(t for c in cuts for t in c)]
