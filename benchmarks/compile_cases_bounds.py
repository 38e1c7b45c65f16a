"""Bound-solver steps for `benchmarks/compile_bench.py`: the proximal sweep and anchor move,
the supergradient (Adam) step, the alpha-CROWN step (final-layer slopes) and the fused ReLU
oracle pass alone (elementwise), on random ReLU MLPs of the shapes of ACAS Xu (5-50x6-5) and
mnist_fc (784-256x4-10), float32, one input region each (no shared data needed)."""

from __future__ import annotations

import itertools

import torch
from torch import nn

import verify
from benchmarks.compile_case import Case
from bounds.dual import decompose, initial_duals, problem_from_intervals, proximal, supergradient
from bounds.methods import alpha_crown as ac
from bounds.methods.crown import crown_intervals, output_functional
from bounds.types import Interval
from kernels.prox_relu_reference import prox_relu_oracle_reference

SHAPES = {"acas": (5, [50] * 6, 5, 0.3), "mnist": (784, [256] * 4, 10, 0.02)}


def _net(n_in: int, hidden: list[int], n_out: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    sizes, layers = [n_in, *hidden], []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-1], n_out)).eval()


def _setup(kind: str, specs: int = 9):
    n_in, hidden, n_out, eps = SHAPES[kind]
    net = _net(n_in, hidden, n_out, seed=0)
    graph = verify.network_graph(net, (n_in,))
    x = torch.rand(1, n_in)
    box = Interval(x - eps, x + eps)
    C = torch.randn(1, specs, n_out)
    intervals = crown_intervals(graph, box)
    c = output_functional(graph, C)
    return graph, box, C, problem_from_intervals(decompose(graph), box, intervals, c)


def _prox_cases(kind: str, iterations: int) -> list[Case]:
    _, _, _, problem = _setup(kind)
    state, scale = proximal.initial_state(problem, initial_duals(problem))
    factor = torch.tensor(1.0)
    sweep = Case(
        f"prox sweep ({kind})",
        lambda s: proximal.sweep_step(problem, s, factor, scale),
        state, iterations, cpu_default=False, default_iterations=100,
    )  # fmt: skip
    anchor = Case(
        f"prox anchor ({kind})",
        lambda s: proximal.anchor_step(problem, s, factor, scale, 0.3),
        state, iterations, cpu_default=False, default_iterations=20,
    )  # fmt: skip
    return [sweep, anchor]


def _supergradient_case(kind: str, iterations: int) -> Case:
    _, _, _, problem = _setup(kind)
    state = supergradient.initial_state(problem, initial_duals(problem))
    step = torch.tensor(1e-3)
    return Case(
        f"supergradient ({kind})",
        lambda s: supergradient.ascent_step(problem, s, step),
        state, iterations, cpu_default=False, default_iterations=100,
    )  # fmt: skip


def _alpha_case(kind: str, iterations: int) -> Case:
    """alpha-CROWN's step with final-layer slopes (the form branch and bound uses)."""
    graph, box, C, _ = _setup(kind)
    base = crown_intervals(graph, box)
    problem = ac._Problem(graph, box, C, base, {}, (), {})
    alphas = ac._init_alphas(problem)
    problem = ac._Problem(graph, box, C, base, {}, tuple(alphas), {})
    lr = torch.tensor(0.1)
    return Case(
        f"alpha-crown final ({kind})",
        lambda s: ac.alpha_step(problem, s, lr),
        ac._initial_state(problem, alphas), iterations, cpu_default=False,
        default_iterations=20,
    )  # fmt: skip


def _oracle_case(iterations: int) -> Case:
    """The ReLU oracle pass of a proximal block step alone (elementwise + per-problem sums):
    a batch of 256 domains x 1 spec x 8192 neurons (a conv layer of a CIFAR net)."""
    gen = torch.Generator().manual_seed(0)
    shape = (256, 1, 8192)

    def rand(*s):
        return torch.randn(*s, generator=gen)

    lower = -rand(256, 8192).abs()
    upper = rand(256, 8192).abs()
    eta = torch.rand(256, 1, generator=gen) + 0.5
    anchor, xhA, g = rand(*shape), rand(*shape), rand(*shape)

    def step(xhB):
        xhB_cg, _, num_b, den_b = prox_relu_oracle_reference(anchor, xhB, xhA, eta, g, lower, upper)
        return xhB + 1e-3 * (num_b / (1 + den_b)).unsqueeze(-1) * (xhB_cg - xhB)

    return Case("relu oracle pass (elementwise)", step, rand(*shape), iterations, cpu_default=None)


def cases(quick: bool) -> list[Case]:
    """The bound-solver cases (fewer iterations with `quick`)."""
    n = 5 if quick else 20
    out = _prox_cases("acas", n) + _prox_cases("mnist", n)
    out += [_supergradient_case("mnist", n), _alpha_case("acas", n), _alpha_case("mnist", n)]
    return [*out, _oracle_case(n)]
