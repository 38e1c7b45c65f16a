"""Fault detection on the small CNN of the production campaign (`digits_cnn` of
`benchmarks/sdc_campaign.py`: a torchvision-style ResNet-18 of width 4 trained here on sklearn
digits 3x16x16, monitor = CROWN ranges over the [0, 1] pixel box and checksums), with the
breakdown of every output-changing fault that escapes: its site (module, kind, element), its
value, the site's proven range at that element, and what checks the site at all.

Run: taskset -c 1 python benchmarks/sdc_detection.py [--trials 2000] [--extra 1000]
[--name sdc_detection] [--out DIR] [--before STEM]
(1 thread; writes DIR/STEM.{json,md}, DIR = benchmarks/results). The campaigns, seeds and
baselines are those of `sdc_campaign.py --production` (the same faults). `--before STEM` puts
the rates of an earlier run (e.g. one of the library before a change, run with that library on
PYTHONPATH and `--out` elsewhere) beside this run's.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import fx, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.sdc_campaign import campaigns, digits_cnn
from verify.cli.faults import (
    Bench,
    Progress,
    false_positives,
    profile_ranges,
    run_campaign,
    summarise,
)
from verify.monitor.check import shared_trace
from verify.monitor.faults import Fault, corrupt

RESULTS = Path(__file__).resolve().parent / "results"


def coverage(bench: Bench) -> dict[str, list[str]]:
    """Per fx node of the traced network: what checks a corruption of its value -- "range"
    (its range, in the default node set), "sum:<node> y" (a checksum reads it as its output,
    or it feeds that output through the layer: a convolution before its BatchNorm), "sum:<node>
    x" (it lies between a checksum's source and its layer: the check recomputes past it)."""
    mon, gm = bench.monitor, shared_trace(bench.net)
    by_name = {n.name: n for n in gm.graph.nodes}
    tags: dict[str, list[str]] = collections.defaultdict(list)
    for name in mon.affine:
        tags[name].append("range")
    for check in mon.sums.values():
        read = by_name[check.node]
        tags[read.name].append(f"sum:{check.monitored} y")
        layer = read
        if read.op == "call_module" and isinstance(gm.get_submodule(read.target),
                                                   nn.modules.batchnorm._BatchNorm):  # fmt: skip
            layer = read.args[0]
            tags[layer.name].append(f"sum:{check.monitored} y")
        node = layer.args[0]
        while isinstance(node, fx.Node) and node.name != check.source:
            tags[node.name].append(f"sum:{check.monitored} x")
            node = node.args[0] if node.args else None
    return dict(tags)


def site_nodes(gm: fx.GraphModule, site: str) -> list[str]:
    """The fx nodes calling the module `site` (a shared ReLU: several)."""
    return [n.name for n in gm.graph.nodes if n.op == "call_module" and n.target == site]


def _element(net: nn.Module, x: torch.Tensor, site: str, index: int, faults) -> list[float]:
    """The value of element `index` of every output of module `site` on `x` (one sample),
    under `faults` (`[]`: clean)."""
    from verify.monitor.faults import inject

    seen: list[float] = []
    module = dict(net.named_modules())[site]
    handle = module.register_forward_hook(
        lambda m, a, out: seen.append(float(out.reshape(-1)[index]))
    )
    try:
        with inject(net, faults), torch.no_grad():
            net(x)
    finally:
        handle.remove()
    return seen


def escape_rows(bench: Bench, rows: list[dict], target: str, cover: dict) -> list[dict]:
    """One row per output-changing fault ours misses (see the module docstring)."""
    net, mon = bench.net, bench.monitor
    gm = shared_trace(net)
    modules = dict(net.named_modules())
    out = []
    for r in rows:
        if not r["changed"] or r["detected_ours"]:
            continue
        site, index = r["layer"], int(r["element"])
        entry = {"site": site, "element": index, "bit": r["bit"], "value": r["value"],
                 "input": r["input"], "clean": r["clean"], "faulty": r["faulty"]}  # fmt: skip
        owner = site.rsplit(".", 1)[0] if target == "weight" else site
        entry["kind"] = type(modules[owner]).__name__
        nodes = site_nodes(gm, owner)
        entry["nodes"] = nodes
        entry["checked_by"] = sorted({t for n in nodes for t in cover.get(n, [])})
        if target == "activation":
            x = bench.inputs[r["input"]][None]
            fault = Fault("activation", site, index, xor=_xor(r["bit"]),
                          value=float(r["value"]) if r["value"] else None, sample=0)  # fmt: skip
            entry["clean_values"] = _element(net, x, site, index, [])
            entry["faulty_values"] = _element(net, x, site, index, [fault])
            entry["ranges"] = {n: [float(t[0].reshape(-1)[index]) for t in mon.ranges[n]]
                               for n in nodes if n in mon.ranges}  # fmt: skip
        else:
            flat = dict(net.named_parameters())[site].detach().reshape(-1)
            entry["clean_values"] = [float(flat[index])]
            bits = _xor(r["bit"])
            new = float(r["value"]) if r["value"] else float(
                corrupt(flat[index : index + 1], Fault("weight", site, 0, xor=bits))[0])  # fmt: skip
            entry["faulty_values"] = [new]
        out.append(entry)
    return out


def _xor(bits: str) -> int:
    return sum(1 << int(b) for b in bits.split(";")) if bits else 0


def domain_points(bench: Bench, count: int) -> torch.Tensor:
    """Uniform points and random corners of the [0, 1] box (fault-free, in the domain)."""
    gen = torch.Generator().manual_seed(21)
    shape = bench.inputs.shape[1:]
    uniform = torch.rand(count, *shape, generator=gen)
    corners = torch.randint(0, 2, (count, *shape), generator=gen).float()
    return torch.cat([uniform, corners, torch.zeros(1, *shape), torch.ones(1, *shape)])


def run(trials: int, extra: int) -> dict:
    start = time.perf_counter()
    bench, prof, held = digits_cnn()
    build = time.perf_counter() - start
    with torch.no_grad():
        accuracy = float(
            (bench.net(bench.inputs[held]).argmax(1) == bench.labels[held]).float().mean()
        )
    profiled = profile_ranges(bench, bench.inputs[prof])
    cover = coverage(bench)
    gm = shared_trace(bench.net)
    sites = sorted({m for n in gm.graph.nodes if n.op == "call_module" for m in [n.target]})
    wrapped = bench.monitor.wrap(bench.net, "detect")
    points = domain_points(bench, 1000)
    with torch.no_grad():
        y, report = wrapped.run(points)
        domain = {"count": len(points), "flagged": int(report.flagged.sum()),
                  "outputs_equal": bool(torch.equal(y, bench.net(points)))}  # fmt: skip
    result = {"build_s": build, "clean_accuracy": accuracy, "nodes": list(bench.monitor.affine),
              "checksums": sorted(bench.monitor.sums),
              "false_positives": false_positives(bench, profiled, bench.inputs[held], None),
              "domain_points": domain,
              "unchecked_modules": [s for s in sites
                                    if not any(cover.get(n) for n in site_nodes(gm, s))],
              "campaigns": {}}  # fmt: skip
    for label, campaign in campaigns(trials, extra):
        rows = run_campaign(bench, held, profiled, campaign, Progress(f"digits_cnn {label:>24}"))
        summary = summarise(rows)
        summary["sdc_by_kind"] = _by_kind(bench, rows, campaign.target)
        summary["escapes"] = escape_rows(bench, rows, campaign.target, cover)
        result["campaigns"][label] = summary
        print(f"{label}: SDC {summary['sdc']}, detected {summary['methods']['ours']['detected_sdc']:.3f}, "
              f"escapes {len(summary['escapes'])}", flush=True)  # fmt: skip
    return result


def _by_kind(bench: Bench, rows: list[dict], target: str) -> dict[str, list[int]]:
    """`{module kind: [SDCs, escaped]}` (the kind of the module the fault hits)."""
    modules = dict(bench.net.named_modules())
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        if r["changed"]:
            owner = r["layer"].rsplit(".", 1)[0] if target == "weight" else r["layer"]
            kind = type(modules[owner]).__name__
            out[kind][0] += 1
            out[kind][1] += int(not r["detected_ours"])
    return dict(out)


def markdown(res: dict, before: dict | None, command: str) -> str:
    fp = res["false_positives"]["rate"]
    dom = res["domain_points"]
    lines = [
        "# SDC detection on the digits CNN", "", f"Command: `{command}`", "", NOTES,
        f"Clean accuracy {res['clean_accuracy']:.3f} on the 597 held-out digits; false positives "
        f"ours / profiled / fix6 / fix100: "
        f"{' / '.join(f'{fp[k]:.3f}' for k in ('ours', 'profiled', 'fixed6', 'fixed100'))} of "
        f"{res['false_positives']['count']}; in-domain points (uniform, corners of [0, 1]): "
        f"{dom['flagged']} of {dom['count']} flagged, outputs equal to the network's: "
        f"{dom['outputs_equal']}. {len(res['nodes'])} range-checked nodes, "
        f"{len(res['checksums'])} checksums; modules with no check of their own: "
        f"{', '.join(res['unchecked_modules']) or 'none'}.", "",
        "| faults | trials | SDC rate | detected SDC ours (before) | ours (this run) | profiled "
        "| fix6 | fix100 | escaped SDCs by module kind (this run) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for label, s in res["campaigns"].items():
        m = s["methods"]
        old = (
            ""
            if before is None
            else f"{before['campaigns'][label]['methods']['ours']['detected_sdc']:.3f}"
        )
        kinds = ", ".join(f"{k} {e}/{n}" for k, (n, e) in sorted(s["sdc_by_kind"].items()) if e)
        lines.append(f"| {label} | {s['trials']} | {s['sdc_rate']:.4f} | {old} | "
                     f"{m['ours']['detected_sdc']:.3f} | {m['profiled']['detected_sdc']:.3f} | "
                     f"{m['fixed6']['detected_sdc']:.3f} | {m['fixed100']['detected_sdc']:.3f} | "
                     f"{kinds or 'none'} |")  # fmt: skip
    for title, run in (("before", before), ("this run", res)):
        if run is not None:
            lines += ["", *escape_summary(run, title), "", *escape_table(run, title)]
    return "\n".join(lines) + "\n"


def escape_summary(res: dict, title: str) -> list[str]:
    """The escaped SDCs of a run grouped by fault model, site kind, what checks the site and
    whether the faulty value lies inside the site's proven range."""
    groups: dict[tuple, int] = collections.Counter()
    for label, s in res["campaigns"].items():
        for e in s.get("escapes", []):
            ranges = list(e.get("ranges", {}).values())
            if label.startswith("weight"):
                inside = "a parameter"
            elif not ranges:
                inside = "no range of its own"
            else:
                inside = "inside" if all(lo <= v <= hi for v in e["faulty_values"]
                                         for lo, hi in ranges) else "outside"  # fmt: skip
            checked = ", ".join(e["checked_by"]) or "nothing"
            groups[(label, e["kind"], checked, inside)] += 1
    total = sum(groups.values())
    lines = [f"Escaped SDCs ({title}): {total}.{_looseness(res)}", ""]
    if total:
        lines += ["| faults | site kind | checked by | faulty value vs proven range | escaped |",
                  "|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {n} |" for k, n in sorted(groups.items())]
    return lines


def _looseness(res: dict) -> str:
    """How wide the proven ranges are where activation faults escaped, against the values."""
    widths, values = [], []
    for s in res["campaigns"].values():
        for e in s.get("escapes", []):
            for lo, hi in e.get("ranges", {}).values():
                widths.append(hi - lo)
            values += [abs(v) for v in e["clean_values"]] if e.get("ranges") else []
    if not widths:
        return ""
    return (f" Where activation faults escaped, the proven ranges are {statistics.median(widths):.3g} "
            f"wide (median; {min(widths):.3g} to {max(widths):.3g}) against fault-free values of "
            f"median magnitude {statistics.median(values):.3g}.")  # fmt: skip


def escape_table(res: dict, title: str, limit: int = 30) -> list[str]:
    """The first `limit` escaped SDCs of a run, one row each (all of them in the JSON)."""
    rows = [(label, e) for label, s in res["campaigns"].items() for e in s.get("escapes", [])]
    if not rows:
        return []
    lines = [f"The first {min(limit, len(rows))} of them ({title}; all in the JSON):", "",
             "| faults | site (kind) | element | fault | clean -> faulty value | proven range "
             "| checked by | top-1 clean -> faulty |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, e in rows[:limit]:
        fault = f"bits {e['bit']}" if e["bit"] else f"value {e['value']}"
        values = "; ".join(
            f"{a:.4g} -> {b:.4g}" for a, b in zip(e["clean_values"], e["faulty_values"])
        )
        ranges = "; ".join(
            f"{n} [{lo:.4g}, {hi:.4g}]" for n, (lo, hi) in e.get("ranges", {}).items()
        )
        lines.append(f"| {label} | {e['site']} ({e['kind']}) | {e['element']} | {fault} | "
                     f"{values} | {ranges or 'no node of its own'} | "
                     f"{', '.join(e['checked_by']) or 'nothing'} | {e['clean']} -> {e['faulty']} |")  # fmt: skip
    return lines


NOTES = """\
Faults and baselines as in `sdc_campaign.py --production` (the same seeds: the same faults):
SDC = the top-1 class changed; "ours" = `wrap(net, "detect")` (CROWN ranges over the [0, 1]
box and the checksums); profiled = per-layer min/max over 1,200 training digits (Ranger-like);
fix6 / fix100 = an activation outside +-6 / +-100. Activation faults hit the output of one
module for one input (a shared ReLU module: each of its calls). "checked by": range = the
site's own range; sum:N y = the checksum flagged at N reads the site's value as its output (or
the site feeds it through the layer); sum:N x = the site lies between that checksum's source
and its layer (the check recomputes past it); for a shared module (one ReLU called twice in a
block) the union over its calls. Proven range: the site's certified range at the element (per
call of a shared module)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=2000, help="single-bit trials per target")
    parser.add_argument("--extra", type=int, default=1000, help="trials of the other models")
    parser.add_argument("--name", default="sdc_detection", help="results file stem")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--before", default="", help="stem of an earlier run in --out")
    parser.add_argument("--markdown-only", action="store_true",
                        help="rewrite STEM.md from STEM.json (no campaign)")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.markdown_only:
        result = json.loads((args.out / f"{args.name}.json").read_text())
    else:
        result = {"trials": args.trials, "extra": args.extra, **run(args.trials, args.extra)}
    before = None
    if args.before:
        before = json.loads((args.out / f"{args.before}.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    trials, extra = result.get("trials", args.trials), result.get("extra", args.extra)
    command = (f"taskset -c 1 python benchmarks/sdc_detection.py --trials {trials} "
               f"--extra {extra} --name {args.name}"
               + (f" --before {args.before}" if args.before else ""))  # fmt: skip
    text = markdown(result, before, command)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
