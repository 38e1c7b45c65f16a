"""Counterexample search: projected gradient descent with random restarts on an input box.

A VNN-LIB region is violated by `x` in its box when `y = net(x)` lies in one of the unsafe
polytopes `{y : A y <= b}`. The attack minimises the violation objective

    v(x) = min over polytopes p of max over the rows i of p of (A_i y - b_i),

which is `<= 0` exactly at the violating points (Madry et al. 2018, PGD with signed steps and
restarts). The search evaluates it on the attack's view of the network (`verify.attack_mode`):
piecewise-constant activations differentiated as the identity (BPDA), and a final softmax
peeled off when every row compares two outputs. A point is reported only after a float64
forward pass of the network itself confirms it (`validate`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from verify.attack_mode import attack_outputs, uses_surrogates
from verify.errors import ShapeMismatchError
from verify.property import Region
from verify.specs import region_box, region_spec


@dataclass(frozen=True)
class UnsafeSpec:
    """All unsafe polytopes' rows stacked: `C [m, n_out]`, `b [m]`, `owner [m]` (polytope id of
    each row, long) and the number of polytopes (a polytope without rows is the whole space)."""

    C: Tensor
    b: Tensor
    owner: Tensor
    n_polytopes: int

    @staticmethod
    def of(
        region: Region, dtype: torch.dtype = torch.float32, device: torch.device | None = None
    ) -> UnsafeSpec:
        C, b, owner = region_spec(region, dtype)
        return UnsafeSpec(
            C[0].to(device),
            b.to(device),
            torch.tensor(owner, dtype=torch.long, device=device),
            len(region.unsafe),
        )

    def comparisons_only(self) -> bool:
        """Whether every row compares two outputs, `c (y_j - y_k) <= 0` (two nonzeros of
        opposite sign and one magnitude, bound 0): then each row's sign is that of the same
        row on any order-preserving map of `y`, such as the logits of a final softmax
        (`verify.attack_mode`)."""
        if self.C.numel() == 0:
            return False
        nonzero = self.C != 0
        pair = nonzero.sum(1) == 2
        sums = self.C.sum(1)
        return bool((pair & (sums == 0) & (self.b == 0)).all())

    def value_tolerance(self) -> float:
        """Points whose float32 `violation` is below this are worth validating in float64."""
        scale = float(self.b.abs().max()) if self.b.numel() else 0.0
        return 1e-4 * (1 + scale)

    def with_combinations(self, max_rows: int = 6) -> UnsafeSpec:
        """The same polytopes with redundant rows added: for each polytope of 2..max_rows rows
        the midpoint of every pair of rows and (3+ rows) their mean. A convex combination of
        `C y <= b` rows holds wherever they all do, so the sets (and `violation`) are unchanged,
        but a bound can exclude a combination where it excludes no single row: the polytope is
        then proven empty on that domain (a cheap part of the LP over the rows' multipliers)."""
        extra_C, extra_b, extra_owner = [], [], []
        for poly in range(self.n_polytopes):
            index = (self.owner == poly).nonzero().flatten().tolist()
            if not 2 <= len(index) <= max_rows:
                continue
            for group in combination_groups(index):
                extra_C.append(self.C[group].mean(0))
                extra_b.append(self.b[group].mean(0))
                extra_owner.append(poly)
        if not extra_C:
            return self
        owner = torch.tensor(extra_owner, dtype=self.owner.dtype, device=self.owner.device)
        return UnsafeSpec(
            torch.cat([self.C, torch.stack(extra_C)]),
            torch.cat([self.b, torch.stack(extra_b)]),
            torch.cat([self.owner, owner]),
            self.n_polytopes,
        )


def combination_groups(index: list[int]) -> list[list[int]]:
    """The rows `UnsafeSpec.with_combinations` averages for one polytope's rows `index`, in its
    order: every pair, then (3+ rows) all of them."""
    groups = [[i, j] for a, i in enumerate(index) for j in index[a + 1 :]]
    return groups + ([index] if len(index) >= 3 else [])


def min_max(values: Tensor, owner: Tensor, n_polytopes: int) -> Tensor:
    """`values [B, m]` -> `[B]`: min over polytopes of the max over each polytope's rows (a
    polytope without rows gives -inf)."""
    init = values.new_full((values.shape[0], n_polytopes), -torch.inf)
    index = owner.unsqueeze(0).expand_as(values)
    per_poly = init.scatter_reduce(1, index, values, reduce="amax", include_self=True)
    return per_poly.min(dim=1).values


def violation(y: Tensor, spec: UnsafeSpec) -> Tensor:
    """`y [B, n_out]` -> `[B]` the objective `v`; `<= 0` iff `y` lies in an unsafe polytope."""
    values = y.flatten(1) @ spec.C.to(y.dtype).T - spec.b.to(y.dtype)
    return min_max(values, spec.owner, spec.n_polytopes)


def double_net(net: nn.Module) -> nn.Module:
    """A float64 deep copy of `net` on the CPU, in eval mode (the caller's module is untouched).

    Made anew on every call: a cache keyed on the module could hand back a stale copy after the
    module changed (a replaced layer, weights assigned anew), and a counterexample validated on
    a stale copy is a wrong "sat". Validation runs only for candidates the float32 search found
    (a few per region), so the copy's cost (milliseconds) does not matter."""
    return copy.deepcopy(net).to("cpu", torch.float64).eval()


def validate(net: nn.Module, region: Region, x: Tensor) -> tuple[Tensor, Tensor] | None:
    """`(x, y)` in float64 (flattened `[n_in]`, `[n_out]`) if `x` (clipped to the box in float64)
    lies in the region's box and `net(x)` in float64 satisfies every row of some unsafe polytope;
    else None."""
    lower = torch.tensor(np.asarray(region.lower), dtype=torch.float64)
    upper = torch.tensor(np.asarray(region.upper), dtype=torch.float64)
    point = x.detach().to("cpu", torch.float64).reshape(-1)
    point = torch.minimum(torch.maximum(point, lower), upper)
    if not (bool((point >= lower).all()) and bool((point <= upper).all())):
        return None
    shape = getattr(net, "input_shape", None) or (point.numel(),)
    with torch.no_grad():
        y = double_net(net)(point.reshape(1, *shape)).reshape(-1)
    y_np = y.numpy()
    if any(poly.contains(y_np) for poly in region.unsafe if poly.A_x is None):
        return point, y
    return None


@dataclass(frozen=True)
class AttackConfig:
    """restarts: random starts besides the centre and the given points; steps: PGD iterations;
    step_fraction: first step as a fraction of the box width (halved on a cosine schedule),
    for every third start; the others start at 3x and 9x it (clipped to the box: a far-away
    unsafe set needs the long steps);
    max_corner_dims: the box's corners are starts too when it has at most this many inputs;
    samples: uniform points evaluated once, the best `restarts` of them start PGD;
    targeted_runs: PGD runs one descent per start and unsafe polytope while that makes at most
    this many runs, else one untargeted descent per start (`pgd`'s `targeted`);
    surrogate_share: on a network the attack differentiates through surrogate derivatives
    (`verify.attack_mode.uses_surrogates`: sign, floor), where one descent often stalls, the
    attack starts again with the next seed until it finds a point or this share of the time
    left at its start is spent (`find_counterexample`); 0: one attack."""

    restarts: int = 32
    samples: int = 4096
    steps: int = 50
    step_fraction: float = 0.1
    max_corner_dims: int = 8
    targeted_runs: int = 512
    surrogate_share: float = 0.5

    def __post_init__(self) -> None:
        if min(self.restarts, self.steps, self.samples) < 0 or not self.step_fraction > 0:
            raise ValueError("restarts and steps must be >= 0 and step_fraction > 0")
        if not 0 <= self.surrogate_share <= 1:
            raise ValueError(f"surrogate_share must be in [0, 1], got {self.surrogate_share}")


def per_polytope(y: Tensor, spec: UnsafeSpec) -> Tensor:
    """`y [B, n_out]` -> `[B, P]`: per polytope the max over its rows of `A_i y - b_i`."""
    values = y.flatten(1) @ spec.C.to(y.dtype).T - spec.b.to(y.dtype)
    init = values.new_full((values.shape[0], spec.n_polytopes), -torch.inf)
    index = spec.owner.unsqueeze(0).expand_as(values)
    return init.scatter_reduce(1, index, values, reduce="amax", include_self=True)


def pgd(
    net: nn.Module,
    lower: Tensor,
    upper: Tensor,
    spec: UnsafeSpec,
    starts: Tensor,
    steps: int,
    step_fraction: float | Tensor = 0.1,
    deadline: float | None = None,
    targeted: bool = True,
) -> tuple[Tensor, Tensor]:
    """Signed-gradient descent from `starts [N, *shape]` inside the boxes `lower`/`upper`
    (`[N, *shape]` or `[1, *shape]`): `targeted`, one run per start and unsafe polytope, each
    descending its polytope's max-row objective; else one run per start descending `v`, the
    min over the polytopes (untargeted: the gradient follows the polytope nearest at each
    step, a run per start instead of one per start and polytope). `step_fraction`: one for all
    starts, or one per start `[N]`. Returns per start the best point over its runs and its
    value `v` `[N]` (`+inf` when there is no unsafe polytope). `deadline`
    (`time.monotonic()`): no step starts once the next one, as long as the slower of the last
    two, would end past it (host clock; the starts themselves are always evaluated)."""
    n, n_poly = starts.shape[0], spec.n_polytopes
    if n_poly == 0:
        return starts.clone(), starts.new_full((n,), torch.inf)
    if not targeted:
        return _descend(net, lower, upper, spec, starts.detach(), None, steps, step_fraction,
                        deadline)  # fmt: skip
    ones = [1] * (starts.dim() - 1)
    if isinstance(step_fraction, Tensor):
        step_fraction = step_fraction.repeat(n_poly)
    x = starts.detach().repeat(n_poly, *ones)
    lower, upper = (t.repeat(n_poly if len(t) == n else 1, *ones) for t in (lower, upper))
    target = torch.arange(n_poly, device=x.device).repeat_interleave(n)[:, None]
    best_x, best_v = _descend(net, lower, upper, spec, x, target, steps, step_fraction, deadline)
    best_v, which = best_v.reshape(n_poly, n).min(dim=0)
    best_x = best_x.reshape(n_poly, n, *x.shape[1:])[which, torch.arange(n, device=x.device)]
    return best_x, best_v


def _descend(
    net: nn.Module,
    lower: Tensor,
    upper: Tensor,
    spec: UnsafeSpec,
    x: Tensor,
    target: Tensor | None,
    steps: int,
    step_fraction: float | Tensor,
    deadline: float | None,
) -> tuple[Tensor, Tensor]:
    """`pgd`'s runs from `x [R, *shape]`: run `r` descends its polytope `target[r]`'s max-row
    objective, or `v` (`target` None). Returns each run's best point and its `v` `[R]`."""
    best_x, best_v = x.clone(), x.new_full((len(x),), torch.inf)
    peel = spec.comparisons_only()
    if isinstance(step_fraction, Tensor):  # one per run: [R, 1, ...]
        step_fraction = step_fraction.to(x.device, x.dtype).reshape(-1, *[1] * (x.dim() - 1))
    durations, last = [0.0], time.monotonic()
    for k in range(steps + 1):
        x.requires_grad_(True)
        with torch.enable_grad():
            values = per_polytope(attack_outputs(net, x, peel), spec)
            value = values.min(dim=1).values
            objective = value if target is None else values.gather(1, target)
            (grad,) = torch.autograd.grad(objective.sum(), x)
        value = value.detach()
        better = value < best_v
        best_v = torch.where(better, value, best_v)
        best_x[better] = x.detach()[better]
        now = time.monotonic()
        durations, last = [durations[-1], now - last], now
        if k == steps or bool((best_v <= 0).any()):
            break
        if deadline is not None and now + max(durations) > deadline:
            break
        scale = step_fraction * 0.5 * (1 + np.cos(np.pi * k / max(steps, 1)))
        x = x.detach() - (scale + 1e-3) * (upper - lower) * grad.sign()
        x = torch.minimum(torch.maximum(x, lower), upper)
    return best_x, best_v


def corners(lower: Tensor, upper: Tensor) -> Tensor:
    """The `2^n` corners of the box `[1, *shape]` (n = its number of elements) -> `[2^n, *shape]`."""
    n = lower.numel()
    bits = (
        torch.arange(2**n, device=lower.device)[:, None] >> torch.arange(n, device=lower.device)
    ) & 1
    mask = bits.bool().reshape(-1, *lower.shape[1:])
    return torch.where(mask, upper, lower)


SAMPLE_CHUNK = 256
"""Uniform samples evaluated per forward pass of `best_samples`."""


def best_samples(
    net: nn.Module,
    lower: Tensor,
    upper: Tensor,
    spec: UnsafeSpec,
    config: AttackConfig,
    generator: torch.Generator,
    deadline: float | None = None,
) -> Tensor:
    """The `config.restarts` best of `config.samples` uniform points of the box (by `v`),
    evaluated in chunks of `SAMPLE_CHUNK`; once `deadline` (`time.monotonic()`) would pass
    before the next chunk ends (predicted from the slowest chunk so far), the rest are not
    evaluated (a large network can take seconds per chunk)."""
    points = random_points(lower, upper, max(config.samples, config.restarts), generator)
    values, slowest, peel = [], 0.0, spec.comparisons_only()
    with torch.no_grad():
        for start in range(0, len(points), SAMPLE_CHUNK):
            if values and deadline is not None and time.monotonic() + slowest > deadline:
                break
            tick = time.monotonic()
            y = attack_outputs(net, points[start : start + SAMPLE_CHUNK], peel)
            values.append(violation(y, spec))
            slowest = max(slowest, time.monotonic() - tick)
    found = torch.cat(values)
    return points[: len(found)][found.argsort()[: config.restarts]]


def random_points(lower: Tensor, upper: Tensor, n: int, generator: torch.Generator) -> Tensor:
    """`n` uniform points in the box `[1, *shape]` -> `[n, *shape]`."""
    noise = torch.rand((n, *lower.shape[1:]), generator=generator, dtype=lower.dtype)
    return lower + noise.to(lower.device) * (upper - lower)


def find_counterexample(
    net: nn.Module,
    region: Region,
    *,
    input_shape: tuple[int, ...] | None = None,
    extra_points: Tensor | None = None,
    config: AttackConfig | None = None,
    seed: int = 0,
    deadline: float | None = None,
) -> Tensor | None:
    """A validated counterexample of the region, or None.

    PGD from the box centre (three runs, one per step length), `extra_points` and the
    `config.restarts` best of the uniform samples; the best points of float32 value within
    `UnsafeSpec.value_tolerance` are confirmed by `validate` (a float64 forward pass). On a
    network differentiated through surrogates (`AttackConfig.surrogate_share`), an attack that
    finds nothing is followed by others with the seeds `seed + 1`, `seed + 2`, ... while the
    next one, as long as the longest so far, would end within that share of the time left at
    the start (each paced against the share's end).

    Args:
        net: the network, taking `[batch, *input_shape]`.
        region: a property's `Region`: the box `lower`, `upper` (`[n_inputs]`) and its unsafe
            polytopes.
        input_shape: one input's shape (default: the module's `input_shape`, else
            `(n_inputs,)`).
        extra_points: `[k, *input_shape]` points to try too.
        config: the attack's settings (`AttackConfig`).
        seed: the random seed.
        deadline: `time.monotonic()`: sampling stops after a quarter of the time left, PGD
            early enough to end by then (see `best_samples`, `pgd`); None: one attack.

    Returns:
        `x` `[n_inputs]` (float64, inside the box) whose output is in an unsafe polytope, or
        None; `validate(net, region, x)` gives `(x, y)`.

    Raises:
        ShapeMismatchError: an `input_shape` (given, or the module's) whose size is not the
            region's number of inputs.
    """
    config = config or AttackConfig()
    if not region.unsafe:
        return None
    shape = tuple(input_shape or getattr(net, "input_shape", None) or (len(region.lower),))
    if int(np.prod(shape)) != len(region.lower):
        raise ShapeMismatchError(f"the region has {len(region.lower)} inputs; the network's "
                                 f"input shape {shape} has {int(np.prod(shape))}")  # fmt: skip
    start = time.monotonic()
    found = _attack(net, region, shape, extra_points, config, seed, deadline)
    if found is not None or deadline is None or config.surrogate_share == 0:
        return found
    param = next(net.parameters())
    corner = region_box(region, shape, param.dtype)[0].to(param.device)
    if not uses_surrogates(net, corner):
        return found
    took = time.monotonic() - start
    end = start + config.surrogate_share * max(0.0, deadline - start)
    while found is None and time.monotonic() + took <= end:  # predicted to end by `end`
        seed, tick = seed + 1, time.monotonic()
        found = _attack(net, region, shape, extra_points, config, seed, end)
        took = max(took, time.monotonic() - tick)
    return found


def _attack(
    net: nn.Module, region: Region, shape: tuple[int, ...], extra_points: Tensor | None,
    config: AttackConfig, seed: int, deadline: float | None,
) -> Tensor | None:  # fmt: skip
    """One attack of `find_counterexample` (its docstring), with the random `seed`."""
    param = next(net.parameters())
    lower, upper = (t.to(param.device) for t in region_box(region, shape, param.dtype))
    spec = UnsafeSpec.of(region, param.dtype, param.device)
    generator = torch.Generator().manual_seed(seed)
    # Sampling gets a quarter of the time left: PGD, and the bounds after the attack, need it.
    now = time.monotonic()
    sample_deadline = None if deadline is None else now + max(0.0, deadline - now) / 4
    sampled = best_samples(net, lower, upper, spec, config, generator, sample_deadline)
    starts = [((lower + upper) / 2).repeat(3, *[1] * (lower.dim() - 1)), sampled]  # 3 steps
    if lower.numel() <= config.max_corner_dims:
        starts.append(corners(lower, upper))
    if extra_points is not None:
        extra = extra_points.to(param.device, param.dtype).reshape(-1, *shape)
        starts.append(torch.minimum(torch.maximum(extra, lower), upper))
    starts = torch.cat(starts)
    targeted = len(starts) * spec.n_polytopes <= config.targeted_runs
    fractions = config.step_fraction * torch.tensor([1.0, 3.0, 9.0]).repeat(len(starts))
    points, values = pgd(net, lower, upper, spec, starts, config.steps, fractions[: len(starts)],
                         deadline, targeted)  # fmt: skip
    tolerance = spec.value_tolerance()
    for i in values.argsort()[:4].tolist():
        if values[i] > tolerance:  # sorted: the rest are further away
            break
        found = validate(net, region, points[i : i + 1])
        if found is not None:
            return found[0]
    return None
