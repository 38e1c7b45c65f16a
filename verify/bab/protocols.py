"""The roles a branch-and-bound search (`verify.bab.search.Search`) is composed of, as
protocols: a `Bounder` bounds the root and batches of domains, a `Brancher` splits parents into
children and has them bounded, an `Attacker` looks for counterexamples near the open children.
`Search.step` is written once over them: pop the parents of smallest margin, ask the brancher
for their open children, try the children's points as counterexamples, attack now and then,
keep the open children. Input splitting (`verify.bab.input`: boxes) and ReLU splitting
(`verify.bab.relu`: split assignments) each provide one of each; the ReLU bounder may be
stratified (a cheap bounder on every domain, a tight one on the open domains predicted hard).
"""

from __future__ import annotations

from collections.abc import Callable
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

    def root(
        self, try_points: Callable[[Tensor], Found], validate: Callable[[Tensor], Found]
    ) -> tuple[D, Found]:
        """The open root domains and the first counterexample found at the root (by
        `try_points` on candidate points, or `validate` of one point), or None."""
        ...

    def retain(self, open_: D) -> None:
        """After a step: drop whatever the bounder keeps that no open domain needs."""
        ...


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
    """Splits each parent into `fanout` children and bounds them with `bounder` (some branchers
    bound trial splits to choose among them)."""

    fanout: int

    def children(self, parents: D, bounder: Bounder[D]) -> Children: ...


class Attacker(Protocol):
    """An attack (PGD) from the open children of a step (`Children`): a validated
    counterexample, or None."""

    def attack(self, children: Children) -> Found: ...
