"""Dense-CRF benchmark: end-to-end time (build + solve) and energy of every method, beside
pydensecrf2, as a segmentation pipeline calls them (one thread).

Images: im1-3 of ``../shared/data/densecrf`` (unaries from the rough annotations, gt_prob 0.7)
and scikit-image's astronaut, coffee and chelsea photos (21 labels, noisy synthetic unaries:
a k-means colour/position segmentation into 21 regions as the "truth", logits
``3 * onehot + N(0, 1.5^2)`` per pixel and label, softmax, ``phi = -log p``).

Model (the same for every method, pydensecrf2 included): Gaussian sxy=3 compat=3, bilateral
sxy=80 srgb=13 compat=10, **without** per-pixel normalisation, each weight divided by the
kernel's mean row sum ``mean_a (k 1)_a`` (the scalar pydensecrf computes, then ignores, for
NO_NORMALIZATION; pydensecrf2 gets the divided weights as compatibilities), so that every
method minimises exactly the energy that is reported: our one convention (integer labelling,
ordered pairs, un-normalised kernels; lattice filtering).

Timed per image, end to end (``crf.DenseCRF(...)`` + ``map(...)``, or pydensecrf2's
``DenseCRF2D`` + ``setUnaryEnergy`` + ``addPairwise*`` + ``inference`` + argmax), interleaved
in each of ``--repeats`` rounds (minimum kept; the machine may be shared):

- ``meanfield``: 5 iterations (the classic, pixel included), ``energy=False`` (labels only);
- ``qp``: 30 Frank-Wolfe steps from the unaries; ``dc-neg``: its default pipeline (5
  mean-field iterations, then CCCP until its tolerance or 20 steps);
- ``lp``: the default pipeline (mean-field -> dc-neg -> PROX-LP) with a budget that makes its
  end-to-end time 3x mean-field's; ``dc-neg@3x``: DC-neg alone with the same budget and no
  iteration cap (is the PROX-LP stage worth its time?);
- ``pydensecrf2``: 5 mean-field iterations.

Also: the build alone (ours: both lattices and the model) against pydensecrf2's setup; one
mean-field iteration (best of 10) each; and a batch of 8 same-sized images (256 x 256 crops
of the photos) through one batched call, against 8 single calls of ours and of pydensecrf2.

Usage: ``python benchmarks/crf_table.py [--quick] [--repeats 3] [--out benchmarks/results]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

import crf
from crf.io import default_palette, read_image
from crf.solvers.meanfield import softmax_labels
from crf.solvers.meanfield import step as mf_step

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "densecrf"
PARAMS = dict(w_smooth=3.0, sigma_smooth=3.0, w_appearance=10.0, sigma_xy=80.0, sigma_rgb=13.0)
METHODS = ["meanfield", "qp", "dc-neg", "lp", "dc-neg@3x"]
LP_FACTOR = 3.0  # lp's end-to-end budget, in mean-field end-to-end times
PHOTOS = ("astronaut", "coffee", "chelsea")


def kmeans_labels(img: np.ndarray, k: int = 21, iters: int = 10, seed: int = 0) -> np.ndarray:
    """(H, W) "ground truth": k-means on (r, g, b, x/4, y/4) features, deterministic."""
    h, w, _ = img.shape
    yy, xx = np.mgrid[0:h, 0:w]
    f = np.concatenate([img.reshape(-1, 3), xx.reshape(-1, 1) / 4, yy.reshape(-1, 1) / 4], 1)
    f = torch.from_numpy(f.astype(np.float32))
    g = torch.Generator().manual_seed(seed)
    centres = f[torch.randperm(f.shape[0], generator=g)[:k]]
    for _ in range(iters):
        assign = torch.cdist(f, centres).argmin(1)
        for c in range(k):
            sel = f[assign == c]
            if len(sel):
                centres[c] = sel.mean(0)
    return assign.reshape(h, w).numpy()


def noisy_unary(truth: np.ndarray, k: int = 21, seed: int = 0) -> np.ndarray:
    """``-log softmax(3 onehot(truth) + N(0, 1.5^2))``, (H, W, k) float32."""
    rng = np.random.default_rng(seed)
    logits = 3.0 * np.eye(k)[truth] + rng.normal(0.0, 1.5, (*truth.shape, k))
    logits -= logits.max(-1, keepdims=True)
    p = np.exp(logits)
    return crf.unary_from_probs(p / p.sum(-1, keepdims=True))


def photo(name: str, quick: bool) -> np.ndarray:
    from skimage import data as skdata

    img = np.ascontiguousarray(getattr(skdata, name)()[..., :3])
    return np.ascontiguousarray(img[::2, ::2]) if quick else img


def load_images(quick: bool) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(name, image, unary, colours) for the available images."""
    out = []
    if DATA.is_dir():
        for i in (1, 2, 3):
            img = read_image(DATA / f"im{i}.png")
            labels, colours, unk = crf.labels_from_annotation(read_image(DATA / f"anno{i}.png"))
            unary = crf.unary_from_labels(labels, len(colours), gt_prob=0.7, zero_unsure=unk)
            out.append((f"im{i}", img, unary, colours))
    else:
        print(f"data folder absent ({DATA}): skipping im1-3")
    try:
        import skimage  # noqa: F401
    except ImportError:
        print("scikit-image not installed: skipping astronaut, coffee, chelsea")
        return out
    for name in PHOTOS:
        img = photo(name, quick)
        out.append((name, img, noisy_unary(kmeans_labels(img)), default_palette(21)))
    return out


def batch_images(side: int = 256, count: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """``count`` (side x side) crops of the photos (corners and centres) with their unaries."""
    crops, unaries = [], []
    for i in range(count):
        img = photo(PHOTOS[i % len(PHOTOS)], quick=False)
        h, w, _ = img.shape
        y0 = [0, h - side, (h - side) // 2][(i // len(PHOTOS)) % 3]
        x0 = [0, w - side, (w - side) // 2][(i // len(PHOTOS)) % 3]
        crop = np.ascontiguousarray(img[y0 : y0 + side, x0 : x0 + side])
        crops.append(crop)
        unaries.append(noisy_unary(kmeans_labels(crop), seed=i))
    return np.stack(crops), np.stack(unaries)


def mean_scaled_weights(img: np.ndarray, unary: np.ndarray) -> dict:
    """Kernel weights times pydensecrf's NO_NORMALIZATION scalar ``N / sum_a (k 1)_a`` for
    one (H, W, 3) image and its (H, W, M) unaries."""
    probe = crf.DenseCRF(img, unary[..., :1], **PARAMS, normalize=None)
    kw = dict(PARAMS)
    for term, key in zip(probe.model.terms, ("w_smooth", "w_appearance")):
        ones = torch.ones_like(probe.model.unary)
        kw[key] = PARAMS[key] / float(term.kernel.filter(ones).mean())
    return kw


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _ours(img, unary, kw: dict, method: str, **options) -> dict:
    """Build + solve, end to end: seconds (total, build, solve) and the labels. The solve time
    is ``map``'s own (init and solver, not the reporting of energies after them); mean-field
    runs with ``energy=False``, as a post-processing pipeline calls it."""
    t_build, model = _timed(lambda: crf.DenseCRF(img, unary, **kw, normalize=None))
    res = model.map(method, energy=method != "meanfield", **options)
    t_solve = res.stats["seconds"]
    init = res.stats["init"].get("energy")
    return {"e2e_s": t_build + t_solve, "build_s": t_build, "solve_s": t_solve,
            "labels": res.labels, "iterations": res.stats["iterations"],
            "init_energy": init if isinstance(init, float) else None}  # fmt: skip


def _peer(img: np.ndarray, unary: np.ndarray, kw: dict, its: int = 5) -> dict | None:
    """pydensecrf2's mean-field on the same model, end to end (None if not installed)."""
    try:
        import pydensecrf.densecrf as dcrf
    except ImportError:
        return None
    h, w, m = unary.shape
    start = time.perf_counter()
    d = dcrf.DenseCRF2D(w, h, m)
    d.setUnaryEnergy(np.ascontiguousarray(unary.reshape(-1, m).T))
    nn = dcrf.NO_NORMALIZATION
    d.addPairwiseGaussian(sxy=kw["sigma_smooth"], compat=kw["w_smooth"], normalization=nn)
    d.addPairwiseBilateral(sxy=kw["sigma_xy"], srgb=kw["sigma_rgb"], rgbim=img,
                           compat=kw["w_appearance"], normalization=nn)  # fmt: skip
    setup = time.perf_counter() - start
    labels = np.array(d.inference(its)).argmax(0).reshape(h, w)
    total = time.perf_counter() - start
    q, tmp1, tmp2 = d.startInference()
    step = min(_timed(lambda: d.stepInference(q, tmp1, tmp2))[0] for _ in range(10))
    return {"e2e_s": total, "setup_s": setup, "labels": labels, "iter_s": step}


def _keep_min(best: dict, key: str, run: dict) -> None:
    """Keep, per key, the run with the smallest end-to-end time (its labels too)."""
    if key not in best or run["e2e_s"] < best[key]["e2e_s"]:
        best[key] = run


def bench_image(name: str, img: np.ndarray, unary: np.ndarray, repeats: int) -> dict:
    """One row: every method and pydensecrf2, end to end, best of ``repeats`` rounds."""
    kw = mean_scaled_weights(img, unary)
    best: dict = {}
    for _ in range(repeats):
        _keep_min(best, "meanfield", _ours(img, unary, kw, "meanfield", iterations=5))
        peer = _peer(img, unary, kw)
        if peer is not None:
            _keep_min(best, "pydensecrf2", peer)
        _keep_min(best, "qp", _ours(img, unary, kw, "qp", iterations=30, init="unary"))
        _keep_min(best, "dc-neg", _ours(img, unary, kw, "dc-neg"))
    mf = best["meanfield"]
    budget = max(LP_FACTOR * mf["e2e_s"] - mf["build_s"], 1e-3)  # solve budget, seconds
    for _ in range(repeats):
        _keep_min(best, "lp", _ours(img, unary, kw, "lp", budget=budget))
        dc_long = _ours(img, unary, kw, "dc-neg", budget=budget, iterations=10**6, tol=0.0)
        _keep_min(best, "dc-neg@3x", dc_long)
    model = crf.DenseCRF(img, unary, **kw, normalize=None)
    q = softmax_labels(-model.model.unary)
    mf_step(model.model, q, True)
    our_iter = min(_timed(lambda: mf_step(model.model, q, True))[0] for _ in range(10))
    row = {"name": name, "pixels": int(img.shape[0] * img.shape[1]),
           "labels_n": int(unary.shape[-1]), "mf_iter_s": our_iter, "lp_budget_s": budget,
           "unary_argmax": {"energy": model.energy(unary.argmin(-1)), "e2e_s": 0.0}}  # fmt: skip
    for key, run in best.items():
        row[key] = {k: v for k, v in run.items() if k != "labels"}
        row[key]["energy"] = model.energy(run["labels"])
    if "pydensecrf2" in best:
        agree = (best["pydensecrf2"]["labels"] == best["meanfield"]["labels"]).mean()
        row["pydensecrf2"]["agreement_with_ours"] = float(agree)
    row["labels"] = {k: v["labels"] for k, v in best.items()}
    return row


def bench_batch(repeats: int) -> dict:
    """8 same-sized images: one batched call against 8 single calls (ours, pydensecrf2)."""
    images, unaries = batch_images()
    kw = mean_scaled_weights(images[0], unaries[0])
    best = {"batched": np.inf, "single": np.inf, "pydensecrf2": np.inf}
    for _ in range(repeats):
        batched = _ours(images, unaries, kw, "meanfield", iterations=5)
        single = [_ours(i, u, kw, "meanfield", iterations=5) for i, u in zip(images, unaries)]
        peers = [_peer(i, u, kw) for i, u in zip(images, unaries)]
        best["batched"] = min(best["batched"], batched["e2e_s"])
        best["single"] = min(best["single"], sum(s["e2e_s"] for s in single))
        if peers[0] is not None:
            best["pydensecrf2"] = min(best["pydensecrf2"], sum(p["e2e_s"] for p in peers))
    same = float(np.mean([np.mean(batched["labels"][i] == s["labels"])
                          for i, s in enumerate(single)]))  # fmt: skip
    out = {"images": len(images), "shape": list(images.shape[1:3]),
           "labels_n": int(unaries.shape[-1]), "batched_agrees_with_single": same}  # fmt: skip
    out.update({f"{k}_s": (None if not np.isfinite(v) else float(v)) for k, v in best.items()})
    return out


COLUMNS = ["unary_argmax", "meanfield", "qp", "dc-neg", "lp", "dc-neg@3x", "pydensecrf2"]


def format_table(rows: list[dict], batch: dict | None) -> str:
    """Energies (our convention) and end-to-end seconds per image, then the targets."""
    head = f"{'image':10s} {'N':>7s} {'M':>3s} " + " ".join(f"{c:>22s}" for c in COLUMNS)
    lines = [
        "energy (our convention) / end-to-end seconds (build + solve; 1 thread; best of the "
        "rounds, interleaved with pydensecrf2)",
        head,
    ]
    for r in rows:
        cells = [
            f"{r[c]['energy']:>13.6g} / {r[c]['e2e_s']:5.2f}s" if c in r else f"{'n/a':>22s}"
            for c in COLUMNS
        ]
        lines.append(f"{r['name']:10s} {r['pixels']:7d} {r['labels_n']:3d} " + " ".join(cells))
    lines += ["", "build vs setup, one mean-field iteration, end to end (mean-field, 5 its):"]
    for r in rows:
        m = r["meanfield"]
        text = f"  {r['name']:10s} build {m['build_s']:.3f}s, MF iteration {1e3 * r['mf_iter_s']:.1f} ms"
        if "pydensecrf2" in r:
            p = r["pydensecrf2"]
            text += (
                f" | pydensecrf2 setup {p['setup_s']:.3f}s, iteration {1e3 * p['iter_s']:.1f} ms"
                f" | end to end {m['e2e_s']:.3f}s vs {p['e2e_s']:.3f}s = "
                f"{m['e2e_s'] / p['e2e_s']:.2f}x; labels agree on "
                f"{100 * p['agreement_with_ours']:.2f}%"
            )
        lines.append(text)
    lines.append("")
    lines += _targets(rows)
    if batch is not None:
        lines.append("")
        lines.append(_batch_line(batch))
    return "\n".join(lines)


def _targets(rows: list[dict]) -> list[str]:
    photos = [r for r in rows if r["name"] in PHOTOS and "pydensecrf2" in r]
    ratios = [r["meanfield"]["e2e_s"] / r["pydensecrf2"]["e2e_s"] for r in photos]
    met = all(x <= 1.0 for x in ratios) and len(ratios) == len(PHOTOS)
    lines = [
        "target: CPU end to end (build + 5 MF) <= 1.0x pydensecrf2 on the 21-label photos: "
        + ", ".join(f"{r['name']} {x:.2f}x" for r, x in zip(photos, ratios))
        + (" -- met" if met else " -- NOT met")
    ]
    wins = sum(r["lp"]["energy"] < r["meanfield"]["energy"] for r in rows)
    factor = [r["lp"]["e2e_s"] / r["meanfield"]["e2e_s"] for r in rows]
    ok = wins == len(rows) and all(f <= LP_FACTOR * 1.05 for f in factor)
    lines.append(
        f"target: lp energy < meanfield on {wins}/{len(rows)} images at "
        + ", ".join(f"{f:.2f}" for f in factor)
        + f"x mean-field's end-to-end time (budget {LP_FACTOR:g}x)"
        + (" -- met" if ok else " -- NOT met")
    )
    beats = sum(r["lp"]["energy"] < r["dc-neg@3x"]["energy"] for r in rows)
    ties = sum(r["lp"]["energy"] == r["dc-neg@3x"]["energy"] for r in rows)
    lines.append(
        f"lp vs dc-neg alone at the same budget: lp lower on {beats}/{len(rows)}, equal on "
        f"{ties}, dc-neg lower on {len(rows) - beats - ties}"
    )
    gain = [r["lp"]["init_energy"] - r["lp"]["energy"] for r in rows if r["lp"]["init_energy"]]
    lines.append(
        "  energy gained by lp's PROX-LP stage over its dc-neg init: "
        + ", ".join(f"{g:.4g}" for g in gain)
    )
    return lines


def _batch_line(b: dict) -> str:
    per = {k: b[f"{k}_s"] / b["images"] for k in ("batched", "single") if b[f"{k}_s"]}
    text = (
        f"batch of {b['images']} images {b['shape'][0]}x{b['shape'][1]}, {b['labels_n']} "
        f"labels, build + 5 MF: one batched call {b['batched_s']:.3f}s "
        f"({per['batched']:.3f}s/image), 8 single calls {b['single_s']:.3f}s"
    )
    if b.get("pydensecrf2_s"):
        text += f", pydensecrf2 8 calls {b['pydensecrf2_s']:.3f}s"
        text += f" (batched / pydensecrf2 = {b['batched_s'] / b['pydensecrf2_s']:.2f}x)"
    return (
        text + f"; batched labels agree with single on {100 * b['batched_agrees_with_single']:.2f}%"
    )


def save_figure(rows, images, path: Path) -> None:
    """Image, unary argmax and each method's labelling side by side (one row per image)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no figure")
        return
    cols = ["image"] + [c for c in COLUMNS if c in rows[0]["labels"] or c == "unary_argmax"]
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(2.2 * len(cols), 2.0 * len(rows)))
    for i, (r, (_, img, unary, colours)) in enumerate(zip(rows, images)):
        labels = dict(r["labels"], unary_argmax=unary.argmin(-1))
        for j, c in enumerate(cols):
            ax = axes[i, j] if len(rows) > 1 else axes[j]
            ax.imshow(img if c == "image" else colours[labels[c]])
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(c, fontsize=9)
            if j == 0:
                ax.set_ylabel(r["name"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="half-size photos, no batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    images = load_images(args.quick)
    rows = []
    for name, img, unary, _ in images:
        rows.append(bench_image(name, img, unary, args.repeats))
        print(f"done {name}", flush=True)
    batch = None if args.quick else bench_batch(args.repeats)
    table = format_table(rows, batch)
    print(table)
    suffix = "_quick" if args.quick else ""
    (out / f"crf_table{suffix}.txt").write_text(table + "\n")
    meta = {"torch": torch.__version__, "python": platform.python_version(), "threads": 1,
            "params": PARAMS, "quick": args.quick, "repeats": args.repeats}  # fmt: skip
    clean = [{k: v for k, v in r.items() if k != "labels"} for r in rows]
    payload = {"meta": meta, "rows": clean, "batch": batch}
    (out / f"crf_table{suffix}.json").write_text(json.dumps(payload, indent=1))
    save_figure(rows, images, out / f"crf_figure{suffix}.png")


if __name__ == "__main__":
    main()
