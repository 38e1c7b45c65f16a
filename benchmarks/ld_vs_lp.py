"""Lagrangian decomposition vs the exact Planet LP, with identical intermediate (CROWN) bounds.

Part 1 (tightness, `--part lp`): per instance, the share of the LP's improvement over CROWN that
`prox`, `supergradient` and `alpha-crown` (slopes of the final layer only, the same intermediate
bounds) reach against time, next to HiGHS's time; anytime curves to
benchmarks/results/ld_vs_lp.png. Targets: prox >= 99% of the LP's improvement in <= 1/20 of
HiGHS's time; prox matches alpha-CROWN's 20-iteration bound in <= 0.5x its time.

Part 2 (proofs, `--part proven`): VNN-COMP instances proven by bounds alone, per method, with and
without LD intermediate bounds.

Usage: python benchmarks/ld_vs_lp.py [--part lp|proven|both] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verify
from benchmarks.common import (
    DATA,
    RESULTS,
    cifar_images,
    cifar_problem,
    region_margin,
    vnncomp_instances,
    vnnlib_problems,
    write_json,
)
from bounds.dual import (
    decompose,
    evaluate,
    initial_duals,
    problem_from_intervals,
    proximal,
    supergradient,
)
from bounds.lp.lp import planet_lp
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.crown import crown_intervals, output_functional
from bounds.types import Interval

DUAL_ITERATIONS = 400
INIT_ITERATIONS = 20


def lp_instances(quick: bool):
    """(suite, id, net, lower, upper, C) for part 1: a few instances per network."""
    acas = vnncomp_instances("acasxu")[:: 60 if quick else 31]
    mnist = vnncomp_instances("mnist_fc")
    for net_path, prop in acas:
        net = verify.load_onnx(net_path)
        lo, up, C, *_ = vnnlib_problems(net, prop)[0]
        yield "acasxu", f"{net_path.name}:{prop.name}", net, lo, up, C
    for size in ("256x2", "256x4", "256x6"):
        chosen = [(n, p) for n, p in mnist if size in n.name][: 1 if quick else 2]
        for net_path, prop in chosen:
            net = verify.load_onnx(net_path)
            lo, up, C, *_ = vnnlib_problems(net, prop)[0]
            yield f"mnist_{size}", f"{prop.name}", net, lo, up, C
    images, labels = cifar_images(1)
    for name in ("cifar_base_kw",) if quick else ("cifar_base_kw", "cifar_wide_kw"):
        net = verify.load_onnx(DATA / "vnncomp2022/oval21/onnx" / f"{name}.onnx.gz")
        lo, up, C, *_ = cifar_problem(images[0], int(labels[0]), 2 / 255)
        yield f"oval_{name}", "img0", net, lo, up, C


def _share(value, crown, lp):
    """Mean over specs with room (LP - CROWN > 1e-6) of (value - CROWN) / (LP - CROWN)."""
    room = lp - crown
    mask = room > 1e-6 * (1 + lp.abs())
    if not mask.any():
        return 1.0
    return float(((value - crown)[mask] / room[mask]).mean())


def _curve(stats, crown, lp, offset):
    return [(offset + t, _share(v[0], crown, lp)) for t, v in stats["trajectory"]]


def run_lp_instance(net, lower, upper, C):
    """Everything of part 1 for one instance (lower bounds of C y only)."""
    graph = verify.network_graph(net, tuple(lower.shape[1:]))
    box = Interval(lower, upper)
    start = time.perf_counter()
    intervals = crown_intervals(graph, box)
    t_intervals = time.perf_counter() - start
    problem = problem_from_intervals(
        decompose(graph), box, intervals, output_functional(graph, C)[:, : C.shape[1]]
    )
    init = initial_duals(problem)
    crown_value, _ = evaluate(problem, init)
    crown_value = crown_value[0]
    start = time.perf_counter()
    _, _, lp = planet_lp(graph, box, C, intervals, upper=False)
    t_lp = time.perf_counter() - start
    lp_value = lp["raw"][0, : C.shape[1]].to(crown_value.dtype)
    row = {"lp_seconds": t_lp, "intervals_seconds": t_intervals, "curves": {}}
    start = time.perf_counter()
    alpha_cfg = AlphaCrownConfig(iterations=INIT_ITERATIONS, optimize_intermediate=False)
    _, _, _, stats = alpha_crown(graph, box, C, alpha_cfg, intervals=intervals)
    slopes = {act: s[:, : C.shape[1]] for act, s in stats["final_slopes"].items()}
    alpha_init = initial_duals(problem, slopes)
    t_init = time.perf_counter() - start
    solvers = {
        "prox": (proximal.solve, proximal.ProximalConfig, init, 0.0, False),
        "supergradient": (supergradient.solve, supergradient.SupergradientConfig, init, 0.0, False),
        "prox(alpha init)": (proximal.solve, proximal.ProximalConfig, alpha_init, t_init, False),
        "prox(compiled)": (proximal.solve, proximal.ProximalConfig, init, 0.0, True),
        "prox(alpha init, compiled)": (
            proximal.solve, proximal.ProximalConfig, alpha_init, t_init, True
        ),
    }  # fmt: skip
    for name, (solve, config_type, start_duals, offset, compiled) in solvers.items():
        config = config_type(iterations=DUAL_ITERATIONS, check_every=5, compile=compiled)
        if compiled:  # compile outside the timing (reported): the steady state of a process
            start = time.perf_counter()
            solve(problem, replace(config, iterations=config.inner), start_duals)
            row[name + "_compile_seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        result = solve(problem, config, start_duals)
        row[name + "_seconds"] = offset + time.perf_counter() - start
        row[name + "_share"] = _share(result.lower[0], crown_value, lp_value)
        row["curves"][name] = _curve(result.stats, crown_value, lp_value, offset)
    for its in (20, 200):
        start = time.perf_counter()
        low, _, _, stats = alpha_crown(
            graph,
            box,
            C,
            AlphaCrownConfig(
                iterations=its, optimize_intermediate=False, tolerance=0.0, check_every=5
            ),
        )
        row[f"alpha{its}_seconds"] = time.perf_counter() - start
        row[f"alpha{its}_share"] = _share(low[0], crown_value, lp_value)
        row[f"alpha{its}_value"] = low[0].tolist()
    row["curves"]["alpha-crown"] = [(t, None) for t, _ in stats["trajectory"]]
    best = max(("prox", "prox(alpha init)"), key=lambda k: row[k + "_share"])
    row["prox_best_variant"] = best
    row["prox_time_to_99"] = _time_to(row["curves"]["prox"], 0.99)
    row["prox_alpha_time_to_99"] = _time_to(row["curves"]["prox(alpha init)"], 0.99)
    row["prox_time_to_alpha20"] = _time_to(row["curves"]["prox"], row["alpha20_share"])
    compiled = row["curves"]["prox(alpha init, compiled)"]
    row["prox_compiled_alpha_time_to_99"] = _time_to(compiled, 0.99)
    row["prox_compiled_time_to_alpha20"] = _time_to(
        row["curves"]["prox(compiled)"], row["alpha20_share"]
    )
    return row


def _time_to(curve, share):
    for t, s in curve:
        if s is not None and s >= share - 1e-9:
            return t
    return None


def part_lp(quick: bool):
    rows = []
    header = (f"{'suite':<16}{'id':<24}{'LP s':>7}{'prox99 s':>9}{'pA99 s':>8}{'LP/pA99':>8}"
              f"{'prox':>7}{'pA':>7}{'sg':>7}{'a20':>7}{'a200':>7}{'a20 s':>7}{'p->a20 s':>9}"
              f"{'cpA99 s':>8}{'cp->a20':>8}{'comp s':>7}")  # fmt: skip
    legend = ("# shares of the LP's improvement over CROWN after 400 sweeps: prox (CROWN init), pA "
              "(alpha-CROWN-20 init), sg (supergradient), a20/a200 (alpha-CROWN 20/200 it); times "
              "to 99%: prox99, pA99 (eager), cpA99 (compiled, compile time 'comp s' excluded); "
              "p->a20 / cp->a20: prox (eager / compiled) time to alpha-CROWN-20's share")  # fmt: skip
    print(legend)
    print(header)
    table = [legend, header]
    for suite, ident, net, lo, up, C in lp_instances(quick):
        row = run_lp_instance(net, lo, up, C)
        row.update(suite=suite, id=ident)
        rows.append(row)
        t99, ta99 = row["prox_time_to_99"], row["prox_alpha_time_to_99"]
        ratio = f"{row['lp_seconds'] / ta99:.1f}" if ta99 else "-"
        t_a = row["prox_time_to_alpha20"]
        nan = float("nan")
        line = (f"{suite:<16}{ident[:23]:<24}{row['lp_seconds']:>7.2f}{(t99 or nan):>9.3f}"
                f"{(ta99 or nan):>8.3f}{ratio:>8}{row['prox_share']:>7.3f}"
                f"{row['prox(alpha init)_share']:>7.3f}{row['supergradient_share']:>7.3f}"
                f"{row['alpha20_share']:>7.3f}{row['alpha200_share']:>7.3f}"
                f"{row['alpha20_seconds']:>7.2f}{(t_a or nan):>9.3f}"
                f"{(row['prox_compiled_alpha_time_to_99'] or nan):>8.3f}"
                f"{(row['prox_compiled_time_to_alpha20'] or nan):>8.3f}"
                f"{row['prox(compiled)_compile_seconds']:>7.1f}")  # fmt: skip
        print(line, flush=True)
        table.append(line)
    return table, rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = sorted({r["suite"] for r in rows})
    fig, axes = plt.subplots(1, len(suites), figsize=(4 * len(suites), 3.2), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        first = next(r for r in rows if r["suite"] == suite)
        for name in ("prox", "prox(alpha init)", "supergradient"):
            ts = [t for t, _ in first["curves"][name]]
            ss = [s for _, s in first["curves"][name]]
            ax.plot(ts, ss, label=name)
        ax.axvline(first["lp_seconds"], color="k", ls="--", label="HiGHS LP time")
        ax.scatter(
            [first["alpha20_seconds"]],
            [first["alpha20_share"]],
            marker="x",
            color="r",
            label="alpha-CROWN 20 it",
        )
        ax.set_xscale("log")
        ax.set_title(suite)
        ax.set_xlabel("seconds")
        ax.set_ylabel("share of LP improvement over CROWN")
        ax.set_ylim(-0.05, 1.05)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


PROVEN_METHODS = {
    "crown": {"method": "crown"},
    "alpha-crown": {"method": "alpha-crown"},
    "prox": {"method": "prox", "iterations": 100},
    "prox+alpha-crown-intermediate": {
        "method": "prox",
        "iterations": 100,
        "intermediate": "alpha-crown",
    },
    "prox+LD-intermediate": {
        "method": "prox",
        "iterations": 100,
        "intermediate": "prox",
        "intermediate_iterations": 30,
    },
    "supergradient+LD-intermediate": {
        "method": "supergradient",
        "iterations": 100,
        "intermediate": "supergradient",
        "intermediate_iterations": 30,
    },
}


def part_proven(quick: bool):
    header = f"{'suite':<10}{'method':<32}{'proven':>8}{'n':>5}{'s/instance':>12}"
    print(header)
    rows, table = [], [header]
    for suite in ("acasxu", "mnist_fc"):
        instances = vnncomp_instances(suite)
        if quick:
            instances = instances[::10]
        nets = {}
        problems = []
        for net_path, prop in instances:
            nets.setdefault(net_path, verify.load_onnx(net_path))
            problems.append((nets[net_path], vnnlib_problems(nets[net_path], prop)))
        for label, kwargs in PROVEN_METHODS.items():
            proven, seconds = 0, 0.0
            for net, regions in problems:
                margin = float("inf")
                for lo, up, C, b, owner, n_poly in regions:
                    start = time.perf_counter()
                    result = verify.bounds(net, lower=lo, upper=up, C=C, **kwargs)
                    seconds += time.perf_counter() - start
                    margin = min(margin, region_margin(result.lower, b, owner, n_poly))
                proven += margin > 0
            row = {
                "suite": suite,
                "method": label,
                "proven": proven,
                "n": len(problems),
                "seconds_per_instance": seconds / len(problems),
            }
            rows.append(row)
            line = f"{suite:<10}{label:<32}{proven:>8}{len(problems):>5}"
            line += f"{row['seconds_per_instance']:>12.3f}"
            print(line, flush=True)
            table.append(line)
    return table, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["lp", "proven", "both"], default="both")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    suffix = "_quick" if args.quick else ""
    if args.part in ("lp", "both"):
        table, rows = part_lp(args.quick)
        write_json(f"ld_vs_lp{suffix}.json", {"date": stamp, "rows": rows})
        command = f"# python benchmarks/ld_vs_lp.py --part lp{' --quick' if args.quick else ''} ({stamp}, 1 thread)"
        (RESULTS / f"ld_vs_lp{suffix}.txt").write_text("\n".join([command, *table]) + "\n")
        plot(rows, RESULTS / f"ld_vs_lp{suffix}.png")
    if args.part in ("proven", "both"):
        table, rows = part_proven(args.quick)
        write_json(f"ld_proven{suffix}.json", {"date": stamp, "rows": rows})
        command = f"# python benchmarks/ld_vs_lp.py --part proven{' --quick' if args.quick else ''} ({stamp}, 1 thread)"
        (RESULTS / f"ld_proven{suffix}.txt").write_text("\n".join([command, *table]) + "\n")


if __name__ == "__main__":
    main()
