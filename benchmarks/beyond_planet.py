"""Beyond the Planet barrier: final-layer bounds with identical intermediate bounds.

Part `final` (issue 13): per instance, with the same CROWN intermediate bounds for every method,
the lower bounds of `C y` (9 margin specs) of
- the Planet LP (HiGHS; the optimum of every Planet method: alpha-CROWN, the LD duals, Big-M),
- alpha-crown with 20 and 200 iterations (final-layer slopes only),
- prox (Lagrangian decomposition from alpha-CROWN-20's duals, 400 iterations),
- big-m and active-set (the Anderson dual, `bounds.dual.active_set`) and sp-fw (saddle-point
  Frank-Wolfe, `bounds.dual.sp_fw`, `--sp-fw-iterations` steps after its own Big-M phase) from
  alpha-CROWN-20's slopes (their time includes those 20 iterations),
with bound and seconds. Every method but the LP bounds `C` and `-C` (both halves, as
`verify.bounds` does); the table compares the `C` half. Target: active-set strictly above the
Planet LP (by more than 1e-4 (1 + |LP|)) on >= 80% of the specs, at <= alpha-crown-200's time.

Part `proven` (issue 13): instances proven by bounds alone, alpha-crown vs active-set (both
with alpha-CROWN intermediate bounds) vs active-set with the Anderson relaxation's intermediate
bounds (`intermediate='active-set'`, from alpha-CROWN's), on ACAS Xu, mnist_fc and OVAL
cifar_base around test images (eps 2/255).

Usage: python benchmarks/beyond_planet.py [--part final|proven|both] [--quick] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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
    active_set,
    decompose,
    initial_duals,
    problem_from_intervals,
    proximal,
    sp_fw,
)
from bounds.dual.anderson.problem import anderson_slopes, problem_from_graph
from bounds.lp.lp import LpConfig, planet_lp
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.crown import crown_intervals, output_functional
from bounds.types import Interval

OVAL = DATA / "vnncomp2022" / "oval21" / "onnx"
SP_FW = sp_fw.SpFwConfig()


def final_instances(quick: bool, suites: tuple[str, ...] = ()):
    """(suite, id, net, lower, upper, C): mnist_fc 256x2/x4/x6 (their VNN-COMP properties:
    eps 0.02 / 0.05 around test images) and OVAL base/wide/deep around CIFAR test images."""
    mnist = vnncomp_instances("mnist_fc")
    per = 2 if quick else 4
    for size in ("256x2", "256x4", "256x6"):
        chosen = [(n, p) for n, p in mnist if size in n.name]
        if suites and f"mnist_{size}" not in suites:
            continue
        for net_path, prop in chosen[:: max(1, len(chosen) // per)][:per]:
            net = verify.load_onnx(net_path)
            lo, up, C, *_ = vnnlib_problems(net, prop)[0]
            yield f"mnist_{size}", prop.name, net, lo, up, C
    images, labels = cifar_images(2 if quick else 3)
    names = ("cifar_base_kw",) if quick else ("cifar_base_kw", "cifar_wide_kw", "cifar_deep_kw")
    for name in names:
        if suites and f"oval_{name}" not in suites:
            continue
        net = verify.load_onnx(OVAL / f"{name}.onnx.gz")
        for i in range(images.shape[0]):
            lo, up, C, *_ = cifar_problem(images[i], int(labels[i]), 2 / 255)
            yield f"oval_{name}", f"img{i}", net, lo, up, C


def _clock(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run_final(
    net, lower, upper, C, config: active_set.ActiveSetConfig, lp_limit: float = 600.0,
    sp_fw_config: sp_fw.SpFwConfig = SP_FW,
) -> dict:  # fmt: skip
    graph = verify.network_graph(net, tuple(lower.shape[1:]))
    box = Interval(lower, upper)
    S = C.shape[1]
    intervals = crown_intervals(graph, box)
    row: dict = {}
    if lp_limit > 0:
        (_, _, lp), row["lp_seconds"] = _clock(
            lambda: planet_lp(graph, box, C, intervals, LpConfig(time_limit=lp_limit), upper=False)
        )
        solved = lp["unsolved"] == 0
        row["lp"] = lp["raw"][0, :S].tolist() if solved else None  # None: past the limit
    else:  # no LP (--lp-limit 0): its model alone takes minutes on the wide OVAL nets
        row["lp"], row["lp_seconds"] = None, 0.0
    alpha = {}
    for its in (20, 200):
        cfg = AlphaCrownConfig(iterations=its, optimize_intermediate=False, tolerance=0.0)
        (low, _, _, stats), row[f"alpha{its}_seconds"] = _clock(
            lambda cfg=cfg: alpha_crown(graph, box, C, cfg, intervals=intervals)
        )
        row[f"alpha{its}"] = low[0].tolist()
        alpha[its] = stats
    slopes = alpha[20]["best_slopes"]
    c = output_functional(graph, C)

    def anderson(cfg):
        p = problem_from_graph(graph, box, intervals, c)
        return active_set.solve(p, cfg, active_set.big_m_from_slopes(p, anderson_slopes(p, slopes)))

    t20 = row["alpha20_seconds"]
    for name, cfg in (("big-m", active_set.BigMConfig(iterations=config.iterations)),
                      ("active-set", config)):  # fmt: skip
        result, seconds = _clock(lambda cfg=cfg: anderson(cfg))
        row[name] = result.lower[0, :S].tolist()
        row[name + "_seconds"] = t20 + seconds
        row[name + "_cuts"] = result.stats["cuts"]

    def saddle():
        p = problem_from_graph(graph, box, intervals, c)
        init = active_set.big_m_from_slopes(p, anderson_slopes(p, slopes))
        return sp_fw.solve(p, sp_fw_config, init)

    result, seconds = _clock(saddle)
    row["sp-fw"] = result.lower[0, :S].tolist()
    row["sp-fw_seconds"] = t20 + seconds

    def prox():
        problem = problem_from_intervals(decompose(graph), box, intervals, c)
        init = initial_duals(problem, slopes)
        return proximal.solve(problem, proximal.ProximalConfig(iterations=400), init)

    result, seconds = _clock(prox)
    row["prox"] = result.lower[0, :S].tolist()
    row["prox_seconds"] = t20 + seconds
    return row


METHODS = ("lp", "alpha20", "alpha200", "prox", "big-m", "active-set", "sp-fw")


def _above(values, lp) -> list[bool] | None:
    if lp is None:
        return None
    return [v > q + 1e-4 * (1 + abs(q)) for v, q in zip(values, lp)]


def _mean(values) -> str:
    return "-" if values is None else f"{sum(values) / len(values):10.4f}"


def part_final(
    quick: bool, config, suites=(), lp_limit=600.0, save=None, sp_fw_config=SP_FW,
    lp_from: dict | None = None,
) -> list[dict]:
    """`lp_from`: (suite, id) -> a row of an earlier run whose LP values and seconds are taken
    instead of solving the LP again (same instances and CROWN intervals: the same optimum)."""
    rows = []
    for suite, ident, net, lo, up, C in final_instances(quick, suites):
        earlier = None if lp_from is None else lp_from.get((suite, ident))
        limit = 0.0 if earlier is not None else lp_limit
        row = {"suite": suite, "id": ident,
               **run_final(net, lo, up, C, config, limit, sp_fw_config)}  # fmt: skip
        if earlier is not None:
            row["lp"], row["lp_seconds"] = earlier["lp"], earlier["lp_seconds"]
        row["above_lp"] = _above(row["active-set"], row["lp"])
        row["sp-fw_above_lp"] = _above(row["sp-fw"], row["lp"])
        rows.append(row)
        share = "-" if row["above_lp"] is None else f"{sum(row['above_lp']) / 9:4.0%}"
        print(
            f"{suite:22s} {ident:28s} lp {_mean(row['lp'])} a200 {_mean(row['alpha200'])} "
            f"AS {_mean(row['active-set'])} SP {_mean(row['sp-fw'])} above {share} t: lp "
            f"{row['lp_seconds']:.2f} a200 {row['alpha200_seconds']:.2f} AS "
            f"{row['active-set_seconds']:.2f} SP {row['sp-fw_seconds']:.2f}",
            flush=True,
        )
        if save is not None:
            save(rows)  # after every instance: an interrupted run keeps what it finished
    return rows


def _share(flags: list[bool]) -> str:
    return f"{sum(flags)}/{len(flags)} ({sum(flags) / len(flags):.0%})" if flags else "-"


def final_table(rows: list[dict]) -> str:
    """Per suite: mean bound / mean seconds per method (the LP's over the instances it solved
    within its limit), the share of specs where active-set (and sp-fw) beat the LP, and the
    time ratio."""
    suites = sorted({r["suite"] for r in rows}, key=[r["suite"] for r in rows].index)
    head = "| suite | n | " + " | ".join(f"{m} bound / s" for m in METHODS)
    head += " | active-set > LP | sp-fw > LP | AS time / a200 time |"
    lines = [head, "|" + "---|" * (len(METHODS) + 5)]
    everything: list[bool] = []
    everything_sp: list[bool] = []
    for suite in suites:
        chosen = [r for r in rows if r["suite"] == suite]
        cells = []
        for m in METHODS:
            with_values = [r for r in chosen if r[m] is not None]
            if not with_values:
                cells.append(
                    f"unsolved / {sum(r[m + '_seconds'] for r in chosen) / len(chosen):.0f}"
                )
                continue
            values = [v for r in with_values for v in r[m]]
            secs = sum(r[m + "_seconds"] for r in with_values) / len(with_values)
            cells.append(f"{sum(values) / len(values):.4f} / {secs:.2f}")
        above = [a for r in chosen if r["above_lp"] is not None for a in r["above_lp"]]
        above_sp = [
            a for r in chosen if r["sp-fw_above_lp"] is not None for a in r["sp-fw_above_lp"]
        ]
        everything += above
        everything_sp += above_sp
        ratio = sum(r["active-set_seconds"] for r in chosen) / sum(
            r["alpha200_seconds"] for r in chosen
        )
        lines.append(
            f"| {suite} | {len(chosen)} | " + " | ".join(cells)
            + f" | {_share(above)} | {_share(above_sp)} | {ratio:.2f} |"
        )  # fmt: skip
    ratio = sum(r["active-set_seconds"] for r in rows) / sum(r["alpha200_seconds"] for r in rows)
    lines.append(
        f"| **all** | {len(rows)} |" + " |" * len(METHODS)
        + f" **{_share(everything)}** | **{_share(everything_sp)}** | **{ratio:.2f}** |"
    )  # fmt: skip
    return "\n".join(lines)


def proven_instances(quick: bool, images: int, suites: tuple[str, ...] = ()):
    """(suite, id, net, problems) with `problems` as `vnnlib_problems` gives them."""
    step = 6 if quick else 1
    for bench in ("acasxu", "mnist_fc"):
        if suites and bench not in suites:
            continue
        for net_path, prop in vnncomp_instances(bench)[::step]:
            net = verify.load_onnx(net_path)
            yield bench, f"{net_path.name}:{prop.name}", net, vnnlib_problems(net, prop)
    if suites and "oval_base" not in suites:
        return
    images, labels = cifar_images(min(images, 10) if quick else images)
    net = verify.load_onnx(OVAL / "cifar_base_kw.onnx.gz")
    for i in range(images.shape[0]):
        yield "oval_base", f"img{i}", net, [cifar_problem(images[i], int(labels[i]), 2 / 255)]


def _proven(net, problems, method: str, options: dict) -> tuple[float, float]:
    """The instance's margin by `method` (> 0: proven; the smallest over its regions) and the
    seconds it took, end to end."""
    start = time.perf_counter()
    margins = []
    for lower, upper, C, b, owner, n_poly in problems:
        result = verify.bounds(net, lower=lower, upper=upper, C=C, method=method, **options)
        margins.append(region_margin(result.lower, b, owner, n_poly))
    return min(margins), time.perf_counter() - start


PROVEN_METHODS = ("alpha-crown", "active-set", "active-set-ai")


def part_proven(
    quick: bool, config: active_set.ActiveSetConfig, images: int, suites: tuple[str, ...] = (),
    intermediate_iterations: int = 60, save=None, done: list[dict] | None = None,
) -> list[dict]:  # fmt: skip
    """Per instance, proven by bounds alone (margin > 0) by alpha-crown, by active-set with
    alpha-CROWN's intermediate bounds, and by active-set with the Anderson relaxation's
    intermediate bounds (`intermediate='active-set'`, `intermediate_iterations` per layer,
    from alpha-CROWN's). `save(rows)` after every instance. `done`: the rows of an interrupted
    run with the same settings (`--resume`): kept, and their instances not run again."""
    rows = list(done or [])
    finished = {(r["suite"], r["id"]) for r in rows}
    anderson = {
        "iterations": config.iterations, "big_m_iterations": config.big_m_iterations,
        "cut_frequency": config.cut_frequency, "max_cuts": config.max_cuts,
    }  # fmt: skip
    runs = {
        "alpha-crown": ("alpha-crown", {}),
        "active-set": ("active-set", anderson),
        "active-set-ai": ("active-set", {**anderson, "intermediate": "active-set",
                                         "intermediate_iterations": intermediate_iterations}),
    }  # fmt: skip
    for suite, ident, net, problems in proven_instances(quick, images, suites):
        if (suite, ident) in finished:
            continue
        row = {"suite": suite, "id": ident}
        for label, (method, opts) in runs.items():
            margin, seconds = _proven(net, problems, method, opts)
            row[label], row[label + "_margin"], row[label + "_seconds"] = margin > 0, margin, seconds
        rows.append(row)
        if save is not None:
            save(rows)
        print(f"{suite:10s} {ident:50s} " + " ".join(
            f"{m} {row[m + '_margin']:.4g} ({row[m + '_seconds']:.1f}s)" for m in runs
        ), flush=True)  # fmt: skip
    return rows


def proven_table(rows: list[dict]) -> str:
    lines = ["| suite | instances | alpha-crown proven / s | active-set proven / s "
             "| active-set, Anderson intermediate bounds, proven / s |",
             "|---|---|---|---|---|"]  # fmt: skip
    for suite in sorted({r["suite"] for r in rows}, key=[r["suite"] for r in rows].index):
        chosen = [r for r in rows if r["suite"] == suite]
        cells = [
            f"{sum(r[m] for r in chosen)} / {sum(r[m + '_seconds'] for r in chosen):.1f}"
            for m in PROVEN_METHODS
        ]
        lines.append(f"| {suite} | {len(chosen)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("final", "proven", "both"), default="final")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=active_set.ActiveSetConfig.iterations)
    parser.add_argument("--max-cuts", type=int, default=active_set.ActiveSetConfig.max_cuts)
    parser.add_argument(
        "--sp-fw-iterations", type=int, default=sp_fw.SpFwConfig.iterations, help="SP-FW steps"
    )
    parser.add_argument(
        "--cut-frequency", type=int, default=active_set.ActiveSetConfig.cut_frequency
    )
    parser.add_argument(
        "--restrict", type=int, default=active_set.ActiveSetConfig.restrict, help="0: None"
    )
    parser.add_argument("--tag", default="")
    parser.add_argument("--images", type=int, default=100, help="OVAL test images (proven)")
    parser.add_argument(
        "--suites", nargs="*", default=[],
        help="these suites only (final: mnist_256x2 ... oval_cifar_deep_kw; proven: acasxu, "
        "mnist_fc, oval_base)",
    )  # fmt: skip
    parser.add_argument(
        "--intermediate-iterations", type=int, default=60,
        help="proven part: active-set iterations per layer for the Anderson intermediate bounds",
    )  # fmt: skip
    parser.add_argument(
        "--lp-limit", type=float, default=600.0, help="seconds per LP solve (0: no LP)"
    )
    parser.add_argument(
        "--resume", action="store_true",
        help="proven part: keep the rows of this tag's JSON (an interrupted run with the same "
        "arguments) and run only the instances it lacks",
    )  # fmt: skip
    parser.add_argument(
        "--lp-from", type=Path, default=None,
        help="an earlier run's JSON whose LP values to reuse for the same instances",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = active_set.ActiveSetConfig(
        iterations=args.iterations, max_cuts=args.max_cuts, cut_frequency=args.cut_frequency,
        restrict=args.restrict or None,
    )  # fmt: skip
    suffix = ("_quick" if args.quick else "") + args.tag
    argv = [a for a in sys.argv[1:] if a != "--resume"]  # a resumed run is the same run
    command = "python benchmarks/beyond_planet.py " + " ".join(argv)
    out = [f"# Beyond Planet\n\n`{command}` ({args.threads} thread)\n"]
    payload: dict = {"command": command, "config": {**vars(args), "lp_from": str(args.lp_from)}}
    if args.part in ("final", "both"):

        def save(rows):
            write_json(f"beyond_planet{suffix}.json", {**payload, "final": rows})

        sp_fw_config = sp_fw.SpFwConfig(iterations=args.sp_fw_iterations)
        lp_from = None
        if args.lp_from is not None:
            earlier = json.loads(args.lp_from.read_text())["final"]
            lp_from = {(r["suite"], r["id"]): r for r in earlier if r["lp"] is not None}
        rows = part_final(
            args.quick, config, tuple(args.suites), args.lp_limit, save, sp_fw_config, lp_from
        )  # fmt: skip
        table = final_table(rows)
        print(table)
        out += ["## Final-layer bounds, identical (CROWN) intermediate bounds\n", table, ""]
        payload["final"] = rows
    if args.part in ("proven", "both"):
        def save_proven(rows):
            write_json(f"beyond_planet{suffix}.json", {**payload, "proven": rows})

        done = None
        earlier = RESULTS / f"beyond_planet{suffix}.json"
        if args.resume and earlier.exists():
            before = json.loads(earlier.read_text())
            if before.get("command") != command:
                raise SystemExit(f"--resume: {earlier} was made by another command: "
                                 f"{before.get('command')!r}")  # fmt: skip
            done = before.get("proven", [])
        rows = part_proven(
            args.quick, config, args.images, tuple(args.suites), args.intermediate_iterations,
            save_proven, done,
        )  # fmt: skip
        table = proven_table(rows)
        print(table)
        out += ["## Instances proven by bounds alone\n", table, ""]
        payload["proven"] = rows
    write_json(f"beyond_planet{suffix}.json", payload)
    (RESULTS / f"beyond_planet{suffix}.md").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
