"""Certify a learned program: a ReLU network trained to compute max(a, b, c, d) on [0, 1]^4,
then proven within delta of the program on the WHOLE input box, not just on samples.

Adaptive neural compilation (Bunel et al., 2016, "Adaptive neural compilation") learns programs
that are fast and right on a target distribution, with no guarantee off the samples. Here the
missing step: the program max(a, b, c, d) is itself a ReLU network (max(a, b) = b + relu(a - b)),
so net - program is one network (`Difference`), and `verify.verify` decides
|net(x) - program(x)| < delta on the box, or returns the worst counterexample branch and bound
finds. At each training checkpoint the smallest certified delta is found by bisection:
the search keeps `witnessed` <= sup |net - program| < `certified`, where `witnessed` is the
error at a point (sampled, or a counterexample) and `certified` a delta proven by `verify`.

Last, a planted bug that sampling misses (a bump near the corner (1, 1, 1, 1), on 3e-7 of the
box's volume): the verifier finds it.

Run: python examples/learned_program.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

import verify
from verify.property import Polytope, Region, VnnlibProperty

N_INPUTS = 4
CHECKPOINTS = (100, 300, 1000, 3000)  # training steps at which the error is certified
TOLERANCE = 0.05  # "accurate" on a sample: |net - program| <= TOLERANCE


class MaxProgram(nn.Module):
    """max(a, b, c, d) exactly, as a ReLU network: max(a, b) = b + relu(a - b)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c, d = x[:, 0:1], x[:, 1:2], x[:, 2:3], x[:, 3:4]
        left = b + torch.relu(a - b)
        right = d + torch.relu(c - d)
        return right + torch.relu(left - right)


class Difference(nn.Module):
    """x -> net(x) - program(x): the error as one network."""

    def __init__(self, net: nn.Module, program: nn.Module) -> None:
        super().__init__()
        self.net, self.program = net, program

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) - self.program(x)


class CornerBump(nn.Module):
    """`net` plus a bug: `height` * relu(1 - (4 - sum x) / width), nonzero only where the L1
    distance to the corner (1, 1, 1, 1) is below `width`."""

    def __init__(self, net: nn.Module, height: float = 0.5, width: float = 0.05) -> None:
        super().__init__()
        self.net, self.height, self.width = net, height, width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        distance = N_INPUTS - x.sum(1, keepdim=True)
        return self.net(x) + self.height * torch.relu(1.0 - distance / self.width)


def new_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(N_INPUTS, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )


def train(net: nn.Module, steps: int, opt: torch.optim.Optimizer, generator) -> None:
    """`steps` Adam steps of the squared error to max on batches uniform in [0, 1]^4."""
    net.train()
    for _ in range(steps):
        x = torch.rand(256, N_INPUTS, generator=generator)
        opt.zero_grad()
        nn.functional.mse_loss(net(x), x.max(1, keepdim=True).values).backward()
        opt.step()
    net.eval()


def errors(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """|net(x) - max(x)| in float64 (on a float64 copy of `net`), `[n]`."""
    with torch.no_grad():
        x = x.double()
        return (copy.deepcopy(net).double()(x)[:, 0] - x.max(1).values).abs()


def within_property(delta: float) -> VnnlibProperty:
    """The property |difference| < delta on [0, 1]^4: violated iff difference >= delta or
    difference <= -delta (two unsafe polytopes)."""
    unsafe = (
        Polytope(np.array([[-1.0]]), np.array([-delta])),  # -d <= -delta
        Polytope(np.array([[1.0]]), np.array([-delta])),  # d <= -delta
    )
    region = Region(np.zeros(N_INPUTS), np.ones(N_INPUTS), unsafe)
    return VnnlibProperty("<learned max>", N_INPUTS, 1, (region,))


def grid_delta(net: nn.Module, cells: int = 4) -> float:
    """A sound delta from `verify.bounds` alone: CROWN bounds of the difference on each of the
    cells^4 boxes of a grid that covers [0, 1]^4, the largest |bound| among them."""
    edges = torch.linspace(0.0, 1.0, cells + 1)
    index = torch.cartesian_prod(*[torch.arange(cells)] * N_INPUTS)
    bounds = verify.bounds(Difference(net, MaxProgram()), lower=edges[index],
                           upper=edges[index + 1], method="crown")  # fmt: skip
    return max(-bounds.lower.min().item(), bounds.upper.max().item())


@dataclass(frozen=True)
class Certified:
    """witnessed <= sup_x |net(x) - max(x)| <= certified (< when `verify` proved it; the grid's
    delta otherwise); `worst`: the point of `witnessed`."""

    certified: float
    witnessed: float
    worst: torch.Tensor
    calls: int
    seconds: float


def smallest_delta(net: nn.Module, samples: torch.Tensor, rel_gap: float = 0.01,
                   timeout: float = 10.0) -> Certified:  # fmt: skip
    """The smallest delta `verify.verify` proves, to a relative gap `rel_gap`.

    Starts from the largest sampled error (`witnessed`) and `grid_delta` (sound, from bounds).
    Each step is one `verify.verify` of a guess: "unsat" certifies it, "sat" raises `witnessed`
    to the counterexample's error (at least the guess), "timeout" only narrows the search. The
    guess is `witnessed * (1 + rel_gap)` (one proof ends the search) until a timeout says the
    proof is too hard that close, then bisection between the last failed guess and the grid's.
    """
    start = time.perf_counter()
    diff = Difference(net, MaxProgram())
    sampled = errors(net, samples)
    witnessed, worst = sampled.max().item(), samples[sampled.argmax()].double()
    low, high, certified, calls, close = witnessed, grid_delta(net), float("inf"), 0, True
    while high - low > rel_gap * high:
        delta = low * (1 + rel_gap) if close else (low + high) / 2
        result = verify.verify(diff, within_property(delta), timeout=timeout)
        calls += 1
        if result.status == "unsat":
            high = certified = delta
        elif result.status == "sat":
            x = result.counterexample[0]
            error = errors(net, x[None]).item()
            if error > witnessed:
                witnessed, worst = error, x
            low = max(low, witnessed)
        else:
            low, close = delta, False
    if certified == float("inf"):  # no guess was proven: the grid's delta is, from bounds
        certified = high
    return Certified(certified, witnessed, worst, calls, time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer checkpoints (smoke test)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    checkpoints = CHECKPOINTS[:2] if args.quick else CHECKPOINTS
    generator = torch.Generator().manual_seed(0)
    samples = torch.rand(100_000, N_INPUTS, generator=generator)
    net = new_net()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)

    print("a 4-32-32-1 ReLU net learns max(a, b, c, d) on [0, 1]^4; sampled: 100000 uniform "
          "points\n")  # fmt: skip
    print(f"{'steps':>5} {'sampled |err|<=' + str(TOLERANCE):>20} {'sampled max':>11} "
          f"{'worst found':>11} {'certified delta':>15} {'verify calls':>12} {'seconds':>7}")  # fmt: skip
    done = 0
    for steps in checkpoints:
        train(net, steps - done, opt, generator)
        done = steps
        sampled = errors(net, samples)
        accuracy = (sampled <= TOLERANCE).double().mean().item()
        result = smallest_delta(net, samples)
        print(f"{steps:>5} {accuracy:>20.4f} {sampled.max().item():>11.4f} "
              f"{result.witnessed:>11.4f} {result.certified:>15.4f} {result.calls:>12} "
              f"{result.seconds:>7.2f}")  # fmt: skip
    worst = np.round(result.worst.numpy(), 3).tolist()
    print(f"\nworst point found: x = {worst}, max(x) = {max(worst):.3f}, net(x) error "
          f"{result.witnessed:.4f}")  # fmt: skip

    buggy = CornerBump(net)
    missed = (errors(buggy, samples) >= result.certified).sum().item()
    answer = verify.verify(Difference(buggy, MaxProgram()), within_property(result.certified),
                           timeout=10)  # fmt: skip
    print(f"\nplanted bug (a bump of {buggy.height} within L1 distance {buggy.width} of the corner "
          f"(1, 1, 1, 1)):\n  samples beyond the certified delta {result.certified:.4f}: "
          f"{missed} of {len(samples)}; verify: {answer.status}")  # fmt: skip
    if answer.counterexample is not None:
        x = answer.counterexample[0]
        print(f"  counterexample x = {np.round(x.numpy(), 4).tolist()}, error "
              f"{errors(buggy, x[None]).item():.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
