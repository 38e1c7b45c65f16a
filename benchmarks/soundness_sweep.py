"""Soundness sweep: every bound method against at least `--points` evaluated points per real net.

For each net (an ACAS Xu net on a property's input box, mnist_fc 256x2 on a property's eps box,
the OVAL `cifar_base_kw` on an eps = 2/255 ball around the first CIFAR-10 test image) the rows
are every output and every row of the spec (`C = [I; spec]`). Each method's `verify.bounds`
lower and upper bounds on every row are checked against points shared by all methods: uniform
samples of the box, its corners (all of them when few, else random ones), random points on its
faces (a random subset of coordinates at a bound) and every iterate of a projected signed
gradient descent that minimises each row (against its lower bound) and maximises it (against
its upper bound) from several restarts. Values use a float64 forward pass of a float64 copy of
the net (the float32 forward is reported too). A point is outside the bounds when some row has
`value < lower` or `value > upper`: any such point is a soundness bug (the count must be 0).
Min slack = min over points and rows of `value - lower` and `upper - value` (near 0 for the
PGD points means the bounds are tight); mean gap = mean over rows of
`(min seen - lower) + (upper - max seen)`.

`milp` is run row by row with a per-solve time limit and a budget per net; rows it does not
finish keep no bound (reported as `rows k/R`). Every method runs in a child process with a wall
limit (cvxpy's Clarabel fallback has no time limit of its own).

Also `--nets vnncomp2023` (every network of that folder on its first property's box, its first
10 outputs; or `vnncomp2023:<path substring>`) and `--nets traps` (the float-trap zoo of
`tests/model_zoo.py` in float32; or `trap:<name>`).

Usage: python benchmarks/soundness_sweep.py [--points N] [--nets acasxu,mnist_fc,oval]
       [--methods ibp,crown,...] [--quick] [--dtype float32|float64]
Writes benchmarks/results/soundness_sweep.json and .md (or --out-dir).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import multiprocessing
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verify
from benchmarks.common import (
    DATA,
    RESULTS,
    cifar_images,
    cifar_problem,
    resolve,
    vnnlib_problems,
)
from bounds.registry import available_methods
from verify.attack import double_net

NETS = ("acasxu", "mnist_fc", "oval")
BATCH_BYTES = 64 * 2**20  # one batch of float64 inputs (activations are of the same order)


@dataclass(frozen=True)
class Case:
    """A net and its region: the box `lower`/`upper` `[1, *shape]` (the net's dtype), the rows
    `C [1, R, n_out]` and their names; `source` says where the net and the region come from."""

    name: str
    net: nn.Module
    lower: Tensor
    upper: Tensor
    C: Tensor
    rows: list[str]
    source: str


@dataclass
class MethodBounds:
    """One method's bounds on a case: `lower`/`upper` `[R]` float64 (-inf/+inf on rows without
    a bound), seconds inside `verify.bounds`, status ('ok', 'partial', 'timeout', 'error') and a
    note."""

    method: str
    lower: Tensor
    upper: Tensor
    seconds: float
    status: str
    note: str = ""


def row_name(c: Tensor) -> str:
    """`[n_out]` coefficients -> e.g. 'y0', '-y0+y1', '2*y3-y1'."""
    terms = []
    for j, v in enumerate(c.tolist()):
        if v == 0:
            continue
        coef = "" if abs(v) == 1 else f"{abs(v):g}*"
        terms.append(("-" if v < 0 else "+") + f"{coef}y{j}")
    text = "".join(terms) or "0"
    return text[1:] if text.startswith("+") else text


def with_outputs(spec: Tensor) -> Tensor:
    """`[1, S, n_out]` spec rows -> `[1, n_out + S, n_out]`: every output, then the spec rows."""
    n_out = spec.shape[-1]
    return torch.cat([torch.eye(n_out, dtype=spec.dtype)[None], spec], dim=1)


CASES = {  # name: (VNN-COMP 2022 benchmark, network, property; None: a CIFAR-10 eps ball)
    "acasxu": ("acasxu", "ACASXU_run2a_1_1_batch_2000.onnx", "prop_4.vnnlib"),
    "mnist_fc": ("mnist_fc", "mnist-net_256x2.onnx", "prop_0_0.03.vnnlib"),
    "oval": ("oval21", "cifar_base_kw.onnx", None),
}


def known_case(name: str) -> bool:
    """One of NETS, `vnncomp2023:<substring of a network's path>` or `trap:<FLOAT_TRAPS name>`."""
    kind, _, rest = name.partition(":")
    if kind == "vnncomp2023":
        return any(rest in str(p) for p in vnncomp2023_networks())
    if kind == "trap":
        from tests.model_zoo import FLOAT_TRAPS

        return rest in FLOAT_TRAPS
    return name in CASES


def expand_nets(names: str) -> list[str]:
    """`--nets` with `vnncomp2023` (every network of that folder) and `traps` (the float-trap
    zoo) expanded."""
    from tests.model_zoo import FLOAT_TRAPS

    out = []
    for name in names.split(","):
        if name == "vnncomp2023":
            out += [
                f"vnncomp2023:{p.relative_to(DATA / 'vnncomp2023')}" for p in vnncomp2023_networks()
            ]
        elif name == "traps":
            out += [f"trap:{t}" for t in FLOAT_TRAPS]
        else:
            out.append(name)
    return out


def vnncomp2023_networks() -> list[Path]:
    from benchmarks.coverage import networks

    return [p for _, p in networks() if "vnncomp2023" in str(p)]


def _other_case(name: str) -> Case:
    """A `vnncomp2023:` network on its first property's box (`benchmarks.coverage`; an eps
    ball when it has none), its first 10 outputs as the rows; or a float-trap net in float32
    on its box, every output a row."""
    kind, _, rest = name.partition(":")
    if kind == "trap":
        from tests.model_zoo import make_trap

        net, lower, upper = make_trap(rest, torch.float32)
        source = f"float trap {rest} (tests/model_zoo.py), float32"
    else:
        from benchmarks.coverage import first_property, input_box

        path = next(p for p in vnncomp2023_networks() if rest in str(p))
        net = verify.load_onnx(path)
        low64, high64, where = input_box(net, first_property(path))
        dtype = next((t.dtype for t in net.parameters()), torch.float32)
        lower, upper = low64.to(dtype), high64.to(dtype)
        source = f"{path.relative_to(DATA)}, {where}"
    with torch.no_grad():
        n_out = int(net(lower).reshape(1, -1).shape[1])
    k = min(10, n_out)
    C = torch.eye(n_out, dtype=lower.dtype)[:k][None]
    return Case(name, net, lower, upper, C, [row_name(c) for c in C[0]], source)


def load_case(name: str) -> Case:
    """The sweep's case `name` (`known_case`) from the shared data folder or the trap zoo."""
    if ":" in name:
        return _other_case(name)
    if name not in CASES:
        raise ValueError(f"unknown net {name!r}; choose from {', '.join(NETS)}")
    bench, net_name, prop_name = CASES[name]
    folder = DATA / "vnncomp2022" / bench
    net = verify.load_onnx(resolve(folder / "onnx", net_name))
    if prop_name is None:
        images, labels = cifar_images(1)
        lower, upper, spec = cifar_problem(images[0], int(labels[0]), 2 / 255)[:3]
        source = f"{net_name}, CIFAR-10 test image 0 (label {int(labels[0])}), eps 2/255"
    else:
        prop = resolve(folder / "vnnlib", prop_name)
        lower, upper, spec = vnnlib_problems(net, prop)[0][:3]
        source = f"{net_name}, {prop.name}"
    C = with_outputs(spec)
    return Case(name, net, lower, upper, C, [row_name(c) for c in C[0]], source)


# ----------------------------------------------------------------------------- bounds


def _child(conn, fn: Callable) -> None:
    torch.set_num_threads(1)
    try:
        conn.send(("ok", fn()))
    except Exception as exc:  # reported to the parent, which records it as the method's status
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))
    finally:
        conn.close()


def run_limited(fn: Callable, seconds: float | None) -> tuple[str, object]:
    """`fn()` in a forked child with a wall limit: ('ok', result), ('error', text) or
    ('timeout', None) (the child is then killed). `seconds=None`: in this process, no limit
    (tests: a fork of a process whose HiGHS or OpenMP threads already ran can deadlock)."""
    if seconds is None:
        try:
            return "ok", fn()
        except Exception as exc:
            return "error", f"{type(exc).__name__}: {exc}"
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn), daemon=True)
    proc.start()
    child.close()
    if parent.poll(seconds):
        try:
            out = parent.recv()
        except EOFError:
            out = ("error", f"child exited with code {proc.exitcode} (killed for memory?)")
    else:
        out = ("timeout", None)
        proc.kill()
    proc.join()
    return out


def _bounds_call(case: Case, C: Tensor, method: str, options: dict) -> Callable:
    def call():
        start = time.perf_counter()
        r = verify.bounds(case.net, lower=case.lower, upper=case.upper, C=C, method=method,
                          **options)  # fmt: skip
        seconds = time.perf_counter() - start
        return r.lower[0].double().tolist(), r.upper[0].double().tolist(), seconds

    return call


def method_bounds(case: Case, method: str, wall: float | None) -> MethodBounds:
    """`verify.bounds` of `method` with its default options on every row at once."""
    status, out = run_limited(_bounds_call(case, case.C, method, {}), wall)
    n = case.C.shape[1]
    if status != "ok":
        inf = torch.full((n,), math.inf, dtype=torch.float64)
        note = f"no bound within the {wall:.0f} s wall limit" if status == "timeout" else out
        return MethodBounds(method, -inf, inf, math.nan, status, note)
    low, up, seconds = out
    return MethodBounds(method, torch.tensor(low), torch.tensor(up), seconds, "ok")


def milp_bounds(
    case: Case, solve_limit: float, budget: float, order: list[int], isolate: bool = True
) -> MethodBounds:
    """The exact MILP row by row (in `order`; intermediate bounds from alpha-CROWN for tighter
    big-M constants), HiGHS `solve_limit` seconds per solve, until `budget` seconds are spent or
    two rows in a row fail. Rows not finished keep no bound; the note says which and why."""
    n = case.C.shape[1]
    lower = torch.full((n,), -math.inf, dtype=torch.float64)
    upper = torch.full((n,), math.inf, dtype=torch.float64)
    seconds, done, failed, streak, start = 0.0, 0, [], 0, time.perf_counter()
    for r in order:
        left = budget - (time.perf_counter() - start)
        if left <= 1 or streak >= 2:
            break
        limit = min(solve_limit, left)
        options = {"time_limit": float(limit), "intermediate": "alpha-crown"}
        call = _bounds_call(case, case.C[:, r : r + 1], "milp", options)
        status, out = run_limited(call, 2 * limit + 120 if isolate else None)
        if status == "ok":
            lower[r], upper[r] = out[0][0], out[1][0]
            seconds, done, streak = seconds + out[2], done + 1, 0
            continue
        timed_out = status == "timeout" or "user_limit" in str(out)
        failed.append(f"{case.rows[r]} ({'time limit' if timed_out else str(out).splitlines()[0]})")
        streak += 1
    status = "ok" if done == n else ("partial" if done else "timeout")
    wall = time.perf_counter() - start
    note = f"rows {done}/{n} at {solve_limit:.0f} s per solve, {wall:.0f} s spent"
    note += f" of a {budget:.0f} s budget"
    if failed:
        note += f"; not solved: {', '.join(failed)}"
    if done + len(failed) < n:
        note += f"; {n - done - len(failed)} rows not tried (budget spent or 2 failures in a row)"
    return MethodBounds("milp", lower, upper, seconds if done else math.nan, status, note)


# ----------------------------------------------------------------------------- points


def batch_size(shape: tuple[int, ...]) -> int:
    """Points per batch: one batch of float64 inputs takes about BATCH_BYTES, at most 2^16."""
    return max(1, min(2**16, BATCH_BYTES // (8 * math.prod(shape))))


def uniform_points(lower: Tensor, upper: Tensor, n: int, gen: torch.Generator) -> Tensor:
    """`n` uniform points of the box `[1, *shape]` (float64) -> `[n, *shape]`."""
    t = torch.rand((n, *lower.shape[1:]), generator=gen, dtype=torch.float64)
    return torch.minimum(torch.maximum(lower + t * (upper - lower), lower), upper)


def corner_points(lower: Tensor, upper: Tensor, n: int, gen: torch.Generator) -> Tensor:
    """`n` box corners `[n, *shape]`: all `2^d` of them in order, cycled, when `2^d <= n`
    (d = number of inputs), else random ones."""
    d = lower.numel()
    if d <= 24 and 2**d <= n:
        index = torch.arange(n) % 2**d
        bits = (index[:, None] >> torch.arange(d)) & 1
    else:
        bits = torch.randint(0, 2, (n, d), generator=gen)
    mask = bits.bool().reshape(n, *lower.shape[1:])
    return torch.where(mask, upper, lower)


def face_points(lower: Tensor, upper: Tensor, n: int, gen: torch.Generator) -> Tensor:
    """`n` points on the box's faces `[n, *shape]`: per point a share p ~ U(0, 1) of the
    coordinates (at least one) is set to a random bound, the others are uniform."""
    shape = lower.shape[1:]
    points = uniform_points(lower, upper, n, gen)
    share = torch.rand((n, *([1] * len(shape))), generator=gen, dtype=torch.float64)
    fixed = torch.rand((n, *shape), generator=gen, dtype=torch.float64) < share
    first = torch.randint(0, math.prod(shape), (n,), generator=gen)
    fixed.view(n, -1)[torch.arange(n), first] = True
    at = torch.where(torch.rand((n, *shape), generator=gen) < 0.5, lower, upper)
    return torch.where(fixed, at, points)


def row_values(net: nn.Module, x: Tensor, C: Tensor) -> Tensor:
    """`C @ net(x)` per point: `[n, R]` in the dtype of `net` (x is cast to it)."""
    with torch.no_grad():
        y = net(x.to(C.dtype)).reshape(len(x), -1)
    return y @ C.T


@dataclass(frozen=True)
class Nets:
    """The float64 copy of a case's net and the net as loaded, with the rows `C [R, n_out]`
    in each one's dtype."""

    net64: nn.Module
    C64: Tensor
    net32: nn.Module
    C32: Tensor

    @staticmethod
    def of(case: Case) -> Nets:
        net32 = case.net
        if next(net32.parameters()).dtype != torch.float32:
            net32 = copy.deepcopy(net32).float().eval()
        return Nets(double_net(case.net), case.C[0].double(), net32, case.C[0].float())


def sampled_batches(
    nets: Nets, lower: Tensor, upper: Tensor, counts: dict[str, int], gen: torch.Generator
) -> Iterator[tuple[str, Tensor, Tensor]]:
    """(kind, values64 [b, R], values32 [b, R]) batches of the uniform, corner and face points
    (`counts[kind]` of each)."""
    makers = {"uniform": uniform_points, "corner": corner_points, "face": face_points}
    size = batch_size(tuple(lower.shape[1:]))
    for kind, make in makers.items():
        left = counts.get(kind, 0)
        while left > 0:
            x = make(lower, upper, min(size, left), gen)
            yield (
                kind,
                row_values(nets.net64, x, nets.C64),
                row_values(nets.net32, x.float(), nets.C32),
            )
            left -= len(x)


def pgd_batches(
    nets: Nets, lower: Tensor, upper: Tensor, restarts: int, steps: int, gen: torch.Generator,
    step_fraction: float = 0.1,
) -> Iterator[tuple[str, Tensor, Tensor]]:  # fmt: skip
    """('pgd', values64, values32) for every iterate of signed-gradient descent in float64 on
    `sign * C_r . net(x)` for each row r and sign (+1: towards the lower bound, -1: towards the
    upper one) from `restarts` starts each: the box centre, uniform points and random corners,
    projected onto the box; the step (a share of the box width) decays on a cosine schedule."""
    R, shape = nets.C64.shape[0], lower.shape[1:]
    targets = torch.arange(2 * R).repeat_interleave(restarts)
    rows, signs = targets % R, torch.where(targets < R, 1.0, -1.0).double()
    chunk = max(1, batch_size(tuple(shape)) // 4)
    width = upper - lower
    for s in range(0, len(targets), chunk):
        row, sign = rows[s : s + chunk], signs[s : s + chunk]
        n = len(row)
        starts = uniform_points(lower, upper, n, gen)
        half = torch.rand(n, generator=gen) < 0.5
        starts[half] = corner_points(lower, upper, int(half.sum()), gen)
        first = (torch.arange(s, s + n) % restarts) == 0
        starts[first] = (lower + upper) / 2
        x = starts
        for k in range(steps + 1):
            x = x.detach().requires_grad_(True)
            with torch.enable_grad():
                y = nets.net64(x).reshape(n, -1)
                values = y @ nets.C64.T
                objective = (values.gather(1, row[:, None])[:, 0] * sign).sum()
                (grad,) = torch.autograd.grad(objective, x)
            yield "pgd", values.detach(), row_values(nets.net32, x.detach().float(), nets.C32)
            if k == steps:
                break
            scale = step_fraction * 0.5 * (1 + math.cos(math.pi * k / steps)) + 1e-4
            x = x.detach() - scale * width * grad.sign()
            x = torch.minimum(torch.maximum(x, lower), upper)


# ----------------------------------------------------------------------------- tallies


@dataclass
class Tally:
    """One method's bounds against some points: points seen, points outside the bounds in the
    float64 and the float32 forward pass, and the min slack (float64, with its row index and
    side; float32). A negative min slack is the worst amount outside."""

    points: int = 0
    outside64: int = 0
    outside32: int = 0
    min_slack: float = math.inf
    min_row: int = -1
    min_side: str = ""
    min_slack32: float = math.inf

    def update(self, v64: Tensor, v32: Tensor, lower: Tensor, upper: Tensor) -> None:
        """Add a batch of values `[b, R]` against the bounds `[R]` (float64)."""
        below, above = v64 - lower, upper - v64
        self.points += len(v64)
        self.outside64 += int(((below < 0) | (above < 0)).any(dim=1).sum())
        v32 = v32.double()
        slack32 = torch.minimum(v32 - lower, upper - v32)
        self.outside32 += int((slack32 < 0).any(dim=1).sum())
        self.min_slack32 = min(self.min_slack32, float(slack32.min()))
        low, high = below.min(dim=0).values, above.min(dim=0).values
        r = int(torch.minimum(low, high).argmin())
        self.merge(Tally(0, 0, 0, min(float(low[r]), float(high[r])), r,
                         "lower" if float(low[r]) <= float(high[r]) else "upper"))  # fmt: skip

    def merge(self, other: Tally) -> None:
        """Add `other`'s counts; keep the smaller min slacks."""
        self.points += other.points
        self.outside64 += other.outside64
        self.outside32 += other.outside32
        self.min_slack32 = min(self.min_slack32, other.min_slack32)
        if other.min_slack < self.min_slack:
            self.min_slack, self.min_row, self.min_side = (
                other.min_slack, other.min_row, other.min_side)  # fmt: skip

    def as_dict(self, rows: list[str]) -> dict:
        return {"points": self.points, "outside_f64": self.outside64,
                "outside_f32": self.outside32, "min_slack": _finite(self.min_slack),
                "min_slack_row": rows[self.min_row] if self.min_row >= 0 else None,
                "min_slack_side": self.min_side or None,
                "min_slack_f32": _finite(self.min_slack32)}  # fmt: skip


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


@dataclass
class Seen:
    """Min and max value of every row `[R]` over the points seen (float64 forward)."""

    low: Tensor
    high: Tensor

    @staticmethod
    def empty(rows: int) -> Seen:
        inf = torch.full((rows,), math.inf, dtype=torch.float64)
        return Seen(inf, -inf)

    def update(self, v64: Tensor) -> None:
        self.low = torch.minimum(self.low, v64.min(dim=0).values)
        self.high = torch.maximum(self.high, v64.max(dim=0).values)


@dataclass(frozen=True)
class Plan:
    """How many points of each kind; PGD: restarts per (row, side) and steps."""

    counts: dict[str, int]
    restarts: int
    steps: int

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def plan_points(n: int, rows: int, numel: int, steps: int, pgd_share: float = 0.1) -> Plan:
    """At least `n` points: about `pgd_share` of them PGD iterates (at least 4 restarts per
    row and side), then 20% corners (at most 2^numel), 35% face points, the rest uniform."""
    restarts = max(4, math.ceil(pgd_share * n / (2 * rows * (steps + 1))))
    pgd = 2 * rows * restarts * (steps + 1)
    rest = max(0, n - pgd)
    corners = min(int(0.2 * rest), 2**numel if numel <= 24 else rest)
    faces = int(0.35 * rest)
    counts = {"uniform": rest - corners - faces, "corner": corners, "face": faces, "pgd": pgd}
    return Plan(counts, restarts, steps)


def sweep(
    nets: Nets, lower: Tensor, upper: Tensor, plan: Plan, bounds: list[MethodBounds], seed: int,
    progress: Callable[[str], None] = print,
) -> tuple[dict[str, dict[str, Tally]], Seen]:  # fmt: skip
    """Evaluate the planned points once and tally them against every method's bounds:
    `{method: {kind: Tally}}` and the rows' ranges seen."""
    gen = torch.Generator().manual_seed(seed)
    lower, upper = lower.double(), upper.double()
    tallies = {b.method: {k: Tally() for k in plan.counts} for b in bounds}
    seen = Seen.empty(nets.C64.shape[0])
    streams = [
        sampled_batches(nets, lower, upper, plan.counts, gen),
        pgd_batches(nets, lower, upper, plan.restarts, plan.steps, gen),
    ]
    done, tenth, start = 0, plan.total / 10, time.perf_counter()
    for stream in streams:
        for kind, v64, v32 in stream:
            seen.update(v64)
            for b in bounds:
                tallies[b.method][kind].update(v64, v32, b.lower, b.upper)
            if (done + len(v64)) // tenth > done // tenth:
                took = time.perf_counter() - start
                progress(f"    {done + len(v64):>9} / {plan.total} points ({kind}), {took:.0f} s")
            done += len(v64)
    return tallies, seen


# ----------------------------------------------------------------------------- report


def summary(case: Case, b: MethodBounds, tallies: dict[str, Tally], seen: Seen) -> dict:
    """The JSON row of one (net, method)."""
    total = Tally()
    for t in tallies.values():
        total.merge(t)
    bounded = torch.isfinite(b.lower) & torch.isfinite(b.upper)
    gaps = (seen.low - b.lower) + (b.upper - seen.high)
    return {
        "method": b.method, "status": b.status, "note": b.note, "seconds": _finite(b.seconds),
        "rows_bounded": int(bounded.sum()), "rows": len(case.rows),
        **total.as_dict(case.rows),
        "mean_gap": float(gaps[bounded].mean()) if bool(bounded.any()) else None,
        "per_kind": {kind: t.as_dict(case.rows) for kind, t in tallies.items()},
        "lower": [_finite(v) for v in b.lower.tolist()],
        "upper": [_finite(v) for v in b.upper.tolist()],
    }  # fmt: skip


HEADER = ("net", "method", "status", "rows", "bound s", "points", "outside f64", "outside f32",
          "min slack", "min slack PGD", "tightest (row, side)", "mean gap")  # fmt: skip


LEGEND = """\
rows: rows bounded / rows (every output, then the spec rows); bound s: seconds in
`verify.bounds` (default options; milp: row by row, intermediate bounds from alpha-CROWN);
outside: points with some row below its lower or above its upper bound (float64 forward; f32:
the net as loaded); min slack: min over points and rows of value - lower and upper - value (PGD:
over the PGD iterates only), at the row and side named; mean gap: mean over rows of
(min seen - lower) + (upper - max seen).

"""


def _num(v, fmt: str = ".3g") -> str:
    return "-" if v is None else format(v, fmt)


def table_line(net: str, row: dict) -> list[str]:
    """The table cells of one (net, method) summary."""
    pgd = row["per_kind"].get("pgd", {})
    tight = f"{row['min_slack_row']}, {row['min_slack_side']}" if row["min_slack_row"] else "-"
    return [net, row["method"], row["status"], f"{row['rows_bounded']}/{row['rows']}",
            _num(row["seconds"], ".2f"), str(row["points"]), str(row["outside_f64"]),
            str(row["outside_f32"]), _num(row["min_slack"]), _num(pgd.get("min_slack")), tight,
            _num(row["mean_gap"])]  # fmt: skip


def markdown(lines: list[list[str]]) -> str:
    """A markdown table with HEADER."""
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out)


def git_state() -> str:
    """The checkout's commit, with '+dirty' when tracked files changed."""
    root = Path(__file__).resolve().parents[1]

    def git(*words: str) -> str:
        done = subprocess.run(["git", *words], cwd=root, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    try:
        commit, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "-uno")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=None, help="points per net (10^6)")
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--methods", default=",".join(available_methods()))
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2*10^4 points, 20 PGD steps, MILP 20 s per solve and 60 s per net",
    )
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="the net's dtype in verify.bounds (float32: as loaded)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=None, help="PGD steps (100; quick: 20)")
    parser.add_argument("--milp-solve-limit", type=float, help="s per MILP solve (120)")
    parser.add_argument("--milp-budget", type=float, default=None, help="s of MILP per net (600)")
    parser.add_argument("--wall", type=float, default=900.0, help="wall limit s per method")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.points = args.points or (20_000 if args.quick else 1_000_000)
    args.steps = args.steps or (20 if args.quick else 100)
    args.milp_budget = args.milp_budget or (60.0 if args.quick else 600.0)
    args.milp_solve_limit = args.milp_solve_limit or (20.0 if args.quick else 120.0)
    unknown = set(args.methods.split(",")) - set(available_methods())
    args.nets = ",".join(expand_nets(args.nets))
    bad = [n for n in args.nets.split(",") if not known_case(n)]
    if unknown or bad:
        parser.error(f"unknown methods or nets: {sorted(unknown) or bad}")
    return args


def in_dtype(case: Case, dtype: str) -> Case:
    """`case` with its net, box and rows in `dtype` (float64: a float64 copy of the net)."""
    if dtype == "float32":
        return case
    return Case(case.name, double_net(case.net), case.lower.double(), case.upper.double(),
                case.C.double(), case.rows, case.source)  # fmt: skip


def run_case(name: str, args: argparse.Namespace) -> tuple[dict, list[list[str]]]:
    """Bounds of every method, the sweep, and the JSON entry and table lines of one net."""
    print(f"== {name}", flush=True)
    loaded = load_case(name)
    case = in_dtype(loaded, args.dtype)
    print(f"   {case.source}; {len(case.rows)} rows; bounds in {args.dtype}", flush=True)
    results = []
    for method in args.methods.split(","):
        if method == "milp":
            n_out = case.C.shape[2]
            spec_first = list(range(n_out, len(case.rows))) + list(range(n_out))
            b = milp_bounds(case, args.milp_solve_limit, args.milp_budget, spec_first)
        else:
            b = method_bounds(case, method, args.wall)
        note = b.note.splitlines()[0] if b.note else ""
        print(f"   {method:<14}{b.status:<8}{b.seconds:8.2f} s  {note}", flush=True)
        results.append(b)
    numel = case.lower.numel()
    plan = plan_points(args.points, len(case.rows), numel, args.steps)
    pgd = f"{plan.restarts} restarts x {plan.steps} steps per row and side"
    print(f"   points: {plan.counts} (PGD: {pgd})", flush=True)
    start = time.perf_counter()
    tallies, seen = sweep(Nets.of(loaded), loaded.lower, loaded.upper, plan, results, args.seed,
                          progress=lambda s: print(s, flush=True))  # fmt: skip
    seconds = time.perf_counter() - start
    rows = [summary(case, b, tallies[b.method], seen) for b in results]
    entry = {
        "source": case.source,
        "rows": case.rows,
        "points": plan.counts,
        "pgd": {"restarts_per_row_and_side": plan.restarts, "steps": plan.steps},
        "sweep_seconds": seconds,
        "seen_min": seen.low.tolist(),
        "seen_max": seen.high.tolist(),
        "methods": rows,
    }
    return entry, [table_line(name, r) for r in rows]


def main(argv: list[str] | None = None) -> dict:
    """Run the sweep, print the table, write `soundness_sweep.json` / `.md`; returns the JSON."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    nets, lines = {}, []
    for name in args.nets.split(","):
        nets[name], new = run_case(name, args)
        lines += new
    table = markdown(lines)
    print(table)
    outside = sum(r["outside_f64"] for e in nets.values() for r in e["methods"])
    stamp = time.strftime("%Y-%m-%d %H:%M")
    meta = {"date": stamp, "torch": torch.__version__, "threads": 1, "git": git_state(),
            "argv": sys.argv[1:] if argv is None else argv, "points": args.points,
            "dtype": args.dtype, "seconds": time.perf_counter() - start,
            "outside_f64_total": outside}  # fmt: skip
    payload = {"meta": meta, "nets": nets}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "soundness_sweep.json").write_text(json.dumps(payload, indent=2))
    command = "python benchmarks/soundness_sweep.py " + " ".join(meta["argv"])
    text = (f"# Soundness sweep\n\n`{command.strip()}` ({stamp}, {meta['git']}, 1 thread, "
            f"{meta['seconds'] / 60:.1f} min; bounds in {args.dtype}, points in float64)\n\n"
            + "".join(f"- {n}: {e['source']}; points {e['points']}\n" for n, e in nets.items())
            + f"\n{table}\n\n" + LEGEND + "".join(
                f"- {n} {r['method']}: {r['note'].splitlines()[0]}\n"
                for n, e in nets.items() for r in e["methods"] if r["note"])
            + f"\nPoints outside the bounds (float64 forward), all nets and methods: "
            f"**{outside}**.\n")  # fmt: skip
    (args.out_dir / "soundness_sweep.md").write_text(text)
    print(f"outside the bounds (float64): {outside}; {meta['seconds']:.0f} s", flush=True)
    return payload


if __name__ == "__main__":
    main()
