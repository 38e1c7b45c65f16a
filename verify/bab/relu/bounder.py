"""The bounder of ReLU splitting (`ReluBounder`): domains bounded by alpha-beta-CROWN
(`bounds/methods/beta_crown.py`: the split constraints enter both the intervals, `l = 0` for
active and `u = 0` for inactive neurons, and the bound through their Lagrange multipliers
`beta`) with the intermediate bounds of the root (`verify.bab.relu.root`: alpha-CROWN- and
dual-tightened, clamped by the domain's splits), so one bound costs one backward pass per Adam
step. Children continue their parent's optimisation: its last slopes `alpha` and multipliers
`beta`, the new split's `beta` chosen so that the child's functional equals the parent's where
that is possible (see `verify.bab.relu.branching.with_split`), and a child's bound is never
reported below its parent's (valid on the child, which is a subset).

Float32 networks are searched in float32 on float64 foundations: the root's intermediate bounds
are computed in float64 and rounded outwards to float32, and a domain is pruned only once its
closing bound, evaluated again in float64 at the same slopes and multipliers (`SplitResult.
best_alpha`, `best_beta`) on the same intervals, still excludes its polytope
(`ReluBounder.confirmed`; a domain that fails stays open). See `common.Float64Check`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from bounds.methods import beta_crown
from bounds.methods.beta_crown import SplitResult
from bounds.rounding import outward
from bounds.types import Interval, rounded_down
from verify.bab.common import DeadlineReachedError, Found, in_chunks
from verify.bab.config import ReluSplitConfig
from verify.bab.relu.domains import ReluDomains, Target
from verify.bab.relu.root import root_domains


class ReluBounder:
    """Bounder of ReLU-split domains by alpha-beta-CROWN against the root's intermediate bounds
    (`base`, flat `[1, n]`; `base64` its float64 twin), set by `root`."""

    def __init__(self, target: Target, settings: ReluSplitConfig) -> None:
        self.t, self.settings = target, settings
        self.base = Interval(target.box.lower, target.box.upper)
        self.base64 = self.base

    def root(self, try_points: Callable[[Tensor], Found]) -> tuple[ReluDomains, Found]:
        """The root domains and the first counterexample `try_points` finds among the root's
        primal points (`verify.bab.relu.root.root_domains`)."""
        return root_domains(self, try_points)

    def set_base(self, flat: Interval) -> None:
        """The root's flat intervals `[1, n]` (float64 when rechecking): `base` for the search,
        rounded outwards to the network's dtype, and `base64`, the same values in float64."""
        if not self.t.check.active:
            self.base = self.base64 = flat
            return
        self.base = outward(flat, self.t.box.lower.dtype)
        self.base64 = Interval(self.base.lower.double(), self.base.upper.double())

    # ----- bounding -----

    def _flat(self, per_layer: dict[str, Tensor]) -> Tensor:
        return self.t.layout.flatten(per_layer, self.t.layout.acts)

    def intervals(self, splits: Tensor, base: Interval | None = None) -> dict[str, Interval]:
        """Per pre-activation node the root intervals (`base`, default `self.base`) clamped by
        `splits [N, n]`."""
        layout = self.t.layout
        flat = beta_crown.clamp_by_splits(self.base if base is None else base, splits)
        lower = layout.views(flat.lower, layout.pres)
        upper = layout.views(flat.upper, layout.pres)
        return {p: Interval(lower[p], upper[p]) for p in layout.pres}

    def flat_intervals(self, splits: Tensor) -> Interval:
        """The flat root intervals `[N, n]` clamped by `splits [N, n]`."""
        return beta_crown.clamp_by_splits(self.base, splits)

    def optimise(
        self, splits: Tensor, alpha: Tensor, beta: Tensor, C: Tensor, target: Tensor | None,
        iterations: int,
    ) -> SplitResult:  # fmt: skip
        """alpha-beta-CROWN on the domains `splits [N, n]` from `alpha`, `beta [N, S, n]`."""
        t, layout = self.t, self.t.layout
        return beta_crown.optimise(
            t.graph, t.box, C, self.intervals(splits), layout.views(splits, layout.pres),
            layout.views(alpha, layout.acts), layout.views(beta, layout.acts),
            self.settings.bound_config(iterations), target=target, deadline=t.deadline,
            keep_best=t.check.active,
        )  # fmt: skip

    def bound(
        self, domains: ReluDomains, iterations: int | None = None
    ) -> tuple[ReluDomains, Tensor]:
        """`domains` with fresh bounds (never below their `rows`, which must be valid on them,
        e.g. the parent's), slopes and multipliers, and their primal points
        `[N, r, *input_shape]`; `iterations` Adam steps (default: the children's); in chunks of
        the batch size (halved on out-of-memory), checking the deadline between chunks. A
        margin > 0 (closed) is confirmed in float64."""
        t = self.t
        iterations = self.settings.iterations if iterations is None else iterations

        def chunk(part: slice) -> tuple[ReluDomains, Tensor]:
            return self.bound_chunk(domains.take(torch.arange(len(domains))[part]), iterations)

        parts = in_chunks(len(domains), t.sizer, t.deadline, chunk)
        t.stats["domains"] += len(domains)
        return ReluDomains.cat([d for d, _ in parts]), torch.cat([x for _, x in parts])

    def bound_chunk(self, d: ReluDomains, iterations: int) -> tuple[ReluDomains, Tensor]:
        """`bound` on one chunk of domains."""
        t = self.t
        rows = t.rows_of[d.poly]  # [N, r]
        b, tol = t.spec.b[rows], t.tol[rows]
        C = t.spec.C[rows]  # [N, r, n_out]
        result = self.optimise(d.splits, d.alpha, d.beta, C, b + tol, iterations)
        values = torch.maximum(result.lower - b, d.rows)  # the parent's bounds hold here too
        alpha, beta = self._flat(result.alpha), self._flat(result.beta)
        margin = (values - tol).amax(1)
        stall = self._stall(d, margin)
        t.stats["batches"] += 1
        bounded = ReluDomains(d.splits, alpha, beta, d.poly, values, margin, d.depth, stall,
                              d.warm)  # fmt: skip
        if result.best_alpha is not None:
            best = (self._flat(result.best_alpha), self._flat(result.best_beta))
            bounded = self.confirmed(bounded, *best)
        return bounded, beta_crown.minimiser(result.last.input_coeff, t.box)

    def _stall(self, d: ReluDomains, margin: Tensor) -> Tensor:
        """`[N]` the stall counts after re-bounding `d` (whose `margin` is the parent's) to
        `margin`: one more where it improved by less than `stall_gain * |parent margin|`."""
        gain = self.settings.stall_gain * d.margin.abs()
        return torch.where(margin - d.margin < gain, d.stall + 1, torch.zeros_like(d.stall))

    def confirmed(self, d: ReluDomains, alpha: Tensor, beta: Tensor) -> ReluDomains:
        """`d` with each closed domain (margin > 0) confirmed: one float64 backward pass at the
        slopes `alpha` and multipliers `beta [N, r, n]` that gave its bound, on the same box and
        intervals (`base64`, clamped by its splits), for the rows of `C y - b` as written in the
        VNN-LIB file; a domain whose float64 bound does not exceed `b + tol` stays open, with
        its float64 rows (rounded down) and a margin <= 0."""
        t = self.t
        closed = (d.margin > 0).nonzero().flatten()
        if not t.check.active or not len(closed):
            return d
        if not t.check.fits(len(closed), t.deadline):  # unconfirmed: they must not count
            raise DeadlineReachedError
        tick = time.perf_counter()
        rows = t.rows_of[d.poly[closed]]
        spec, layout, f64 = t.check.spec, t.layout, torch.float64
        splits = d.splits[closed]
        result = beta_crown.backward(
            t.check.graph, t.box64, spec.C[rows], self.intervals(splits, self.base64),
            layout.views(splits, layout.pres), layout.views(alpha[closed].to(f64), layout.acts),
            layout.views(beta[closed].to(f64), layout.acts), tracked=True,
        )  # fmt: skip
        values64 = result.lower - spec.b[rows]
        bad = (values64 - t.check.tol[rows]).amax(1) <= 0
        failed = closed[bad]
        values, margin = d.rows.clone(), d.margin.clone()
        values[failed] = rounded_down(values64[bad], values.dtype)
        margin[failed] = (values[failed] - t.tol[t.rows_of[d.poly[failed]]]).amax(1)
        margin[failed] = margin[failed].clamp(max=0)
        t.check.record(len(closed), len(failed), time.perf_counter() - tick)
        return ReluDomains(d.splits, d.alpha, d.beta, d.poly, values, margin, d.depth, d.stall,
                           d.warm)  # fmt: skip

    def one_pass(
        self, splits: Tensor, alpha: Tensor, beta: Tensor, C: Tensor
    ) -> beta_crown.SplitBackward:
        """One alpha-beta-CROWN backward pass (no optimisation) on the domains `splits`."""
        t, layout = self.t, self.t.layout
        return beta_crown.backward(
            t.graph, t.box, C, self.intervals(splits), layout.views(splits, layout.pres),
            layout.views(alpha, layout.acts), layout.views(beta, layout.acts),
        )  # fmt: skip

    def coefficients(self, parents: ReluDomains) -> Tensor:
        """`[N, r, n]` the coefficients at the ReLU outputs of each parent's rows."""
        rows = self.t.rows_of[parents.poly]
        result = self.one_pass(parents.splits, parents.alpha, parents.beta, self.t.spec.C[rows])
        return self.t.layout.flatten(result.act_coeffs, self.t.layout.acts)
