"""The two roles of a branch-and-bound step, as protocols: a `Bounder` bounds a batch of domains,
a `Brancher` splits parents into children and has them bounded. `RegionSearch.step`
(`verify/bab/common.py`) is written once over them: pop the parents of smallest margin, ask the
brancher for their open children, try the children's points as counterexamples, attack now and
then, keep the open children. Input splitting (`input_split.py`: boxes) and ReLU splitting
(`relu_split.py`: split assignments) each provide one bounder and one brancher; the ReLU
bounder may be stratified (a cheap bounder on every domain, a tight one on the open domains
predicted hard).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, TypeVar

from torch import Tensor

from verify.bab.common import DomainBatch, Found

D = TypeVar("D", bound=DomainBatch)


class Bounder(Protocol[D]):
    """Bounds domains: returns them with their `rows` (lower bounds of `C y - b` per row of
    their unsafe polytopes) and `margin` (> 0: excluded) set, every closing bound confirmed in
    float64 (a domain whose confirmation fails stays open), and per domain the candidate points
    of its bound (`[N, k, *input_shape]`: e.g. the box minimisers of its functionals)."""

    def bound(self, domains: D) -> tuple[D, Tensor]: ...


class Children(NamedTuple):
    """What a brancher gives back for a batch of parents: the open children (bounded; the
    closed ones are dropped), the candidate counterexample points `[M, *input_shape]` found
    while bounding them, one representative point per open child `[N, *input_shape]` (to
    start attacks from), how many domains were bounded (for the batch sizer) and a
    counterexample found on the way (or None)."""

    domains: DomainBatch
    points: Tensor
    starts: Tensor
    bounded: int
    found: Found = None


class Brancher(Protocol[D]):
    """Splits each parent into children and bounds them with `bounder` (some branchers bound
    trial splits to choose among them)."""

    def children(self, parents: D, bounder: Bounder[D]) -> Children: ...
