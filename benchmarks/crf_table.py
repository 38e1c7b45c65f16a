"""Dense-CRF benchmark: energy and seconds of every method, beside pydensecrf2's mean-field.

Images: im1-3 of ``../shared/data/densecrf`` (unaries from the rough annotations, gt_prob 0.7)
and scikit-image's astronaut, coffee and chelsea photos (21 labels, noisy synthetic unaries:
a k-means colour/position segmentation into 21 regions as the "truth", logits
``3 * onehot + N(0, 1.5^2)`` per pixel and label, softmax, ``phi = -log p``).

Model (the same for every method, pydensecrf2 included): Gaussian sxy=3 compat=3, bilateral
sxy=80 srgb=13 compat=10, **without** per-pixel normalisation, each weight divided by the
kernel's mean row sum ``mean_a (k 1)_a`` (the scalar pydensecrf computes, then ignores, for
NO_NORMALIZATION; pydensecrf2 gets the divided weights as compatibilities), so that every
method minimises exactly the energy that is reported: our one convention (integer labelling,
ordered pairs, un-normalised kernels; lattice filtering). Mean-field is the classic one
(5 iterations, pixel included); ``lp`` runs mean-field, then PROX-LP within a budget of twice
mean-field's time in total, keeping the best labelling seen. Seconds exclude the one-off
lattice build (reported apart; it is shared by all methods). One thread.

Usage: ``python benchmarks/crf_table.py [--quick] [--out benchmarks/results]``.
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
METHODS = ["meanfield", "qp", "dc-neg", "lp"]


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
        from skimage import data as skdata
    except ImportError:
        print("scikit-image not installed: skipping astronaut, coffee, chelsea")
        return out
    for name in ("astronaut", "coffee", "chelsea"):
        img = np.ascontiguousarray(getattr(skdata, name)()[..., :3])
        if quick:
            img = np.ascontiguousarray(img[::2, ::2])
        out.append((name, img, noisy_unary(kmeans_labels(img)), default_palette(21)))
    return out


def mean_scaled_weights(img: np.ndarray, unary: np.ndarray) -> dict:
    """Kernel weights times pydensecrf's NO_NORMALIZATION scalar ``N / sum_a (k 1)_a``."""
    probe = crf.DenseCRF(img, unary[..., :1], **PARAMS, normalize=None)
    kw = dict(PARAMS)
    for term, key in zip(probe.model.terms, ("w_smooth", "w_appearance")):
        ones = torch.ones_like(probe.model.unary)
        kw[key] = PARAMS[key] / float(term.kernel.filter(ones).mean())
    return kw


def _best_time(fn, repeats: int = 5) -> float:
    """Minimum wall time of ``fn()`` over a few repeats."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run_ours(img: np.ndarray, unary: np.ndarray, kw: dict, mf_its: int = 5) -> dict:
    """Every method on one image; seconds exclude the shared lattice build."""
    start = time.perf_counter()
    model = crf.DenseCRF(img, unary, **kw, normalize=None)
    row = {"build_s": time.perf_counter() - start, "labels": {}}
    row["unary_argmax"] = {"energy": model.energy(unary.argmin(-1)), "seconds": 0.0}
    row["labels"]["unary_argmax"] = unary.argmin(-1)
    mf = model.map("meanfield", iterations=mf_its)
    q = softmax_labels(-model.model.unary)
    row["mf_iter_s"] = _best_time(lambda: mf_step(model.model, q, True), repeats=10)
    t_mf = mf.stats["seconds"]
    runs = {
        "meanfield": mf,
        "qp": model.map("qp", iterations=30, init="unary"),
        "dc-neg": model.map("dc-neg", iterations=20, init="meanfield"),
        "lp": model.map("lp", budget=2 * t_mf),  # mean-field -> dc-neg -> PROX-LP
        "lp_full": model.map("lp", iterations=10),  # same pipeline, no budget: 20 + 10 steps
    }
    for name, res in runs.items():
        row[name] = {
            "energy": float(res.energy),
            "seconds": res.stats["seconds"],
            "iterations": res.stats["iterations"],
        }
        if isinstance(res.stats["init"].get("energy"), float):
            row[name]["init_energy"] = res.stats["init"]["energy"]
        row["labels"][name] = res.labels
    return row


def run_pydensecrf(img: np.ndarray, unary: np.ndarray, kw: dict, mf_its: int = 5) -> dict | None:
    """pydensecrf2's mean-field on the same model: its NO_NORMALIZATION filters without any
    normalisation, so it gets our scaled weights as Potts compatibilities."""
    try:
        import pydensecrf.densecrf as dcrf
    except ImportError:
        return None
    h, w, m = unary.shape
    start = time.perf_counter()
    d = dcrf.DenseCRF2D(w, h, m)
    d.setUnaryEnergy(np.ascontiguousarray(unary.reshape(-1, m).T))
    d.addPairwiseGaussian(
        sxy=kw["sigma_smooth"], compat=kw["w_smooth"], normalization=dcrf.NO_NORMALIZATION
    )
    d.addPairwiseBilateral(
        sxy=kw["sigma_xy"],
        srgb=kw["sigma_rgb"],
        rgbim=np.ascontiguousarray(img),
        compat=kw["w_appearance"],
        normalization=dcrf.NO_NORMALIZATION,
    )
    setup = time.perf_counter() - start
    labels = np.array(d.inference(mf_its)).argmax(0).reshape(h, w)
    t5 = _best_time(lambda: d.inference(mf_its))
    q, tmp1, tmp2 = d.startInference()
    t_step = _best_time(lambda: d.stepInference(q, tmp1, tmp2), repeats=10)
    return {
        "labels": labels,
        "setup_s": setup,
        "seconds": t5,
        "mf_iter_s": t_step,
    }


def bench_image(name, img, unary) -> dict:
    """One table row: our methods, pydensecrf2, energies by our convention."""
    kw = mean_scaled_weights(img, unary)
    row = run_ours(img, unary, kw)
    row.update(name=name, pixels=int(img.shape[0] * img.shape[1]), labels_n=int(unary.shape[-1]))
    peer = run_pydensecrf(img, unary, kw)
    if peer is not None:
        model = crf.DenseCRF(img, unary, **kw, normalize=None)
        row["pydensecrf2"] = {
            "energy": model.energy(peer["labels"]),
            "seconds": peer["seconds"],
            "mf_iter_s": peer["mf_iter_s"],
            "setup_s": peer["setup_s"],
        }
        row["labels"]["pydensecrf2"] = peer["labels"]
        agree = float((peer["labels"] == row["labels"]["meanfield"]).mean())
        row["pydensecrf2"]["agreement_with_ours"] = agree
    return row


COLUMNS = ["unary_argmax", "meanfield", "qp", "dc-neg", "lp", "lp_full", "pydensecrf2"]


def format_table(rows: list[dict]) -> str:
    """Energies (our convention) and seconds, one line per image, plus the targets."""
    head = f"{'image':10s} {'N':>7s} {'M':>3s} " + " ".join(f"{c:>22s}" for c in COLUMNS)
    lines = [
        "energy (our convention) / seconds (1 thread; seconds exclude the shared lattice build;"
        " MF iteration = best of 10 single steps)",
        head,
    ]
    for r in rows:
        cells = []
        for c in COLUMNS:
            if c in r:
                cells.append(f"{r[c]['energy']:>13.6g} / {r[c]['seconds']:5.2f}s")
            else:
                cells.append(f"{'n/a':>22s}")
        lines.append(f"{r['name']:10s} {r['pixels']:7d} {r['labels_n']:3d} " + " ".join(cells))
    lines.append("")
    wins = sum(r["lp"]["energy"] < r["meanfield"]["energy"] for r in rows)
    ratio = [r["lp"]["seconds"] / r["meanfield"]["seconds"] for r in rows]
    lines.append(
        f"lp energy < meanfield energy on {wins}/{len(rows)} images; "
        f"lp time / meanfield time: " + ", ".join(f"{x:.2f}" for x in ratio)
    )
    wins10 = sum(r["lp_full"]["energy"] < r["meanfield"]["energy"] for r in rows)
    lines.append(f"lp_full energy < meanfield energy on {wins10}/{len(rows)} images")
    gain = [r["lp"]["init_energy"] - r["lp"]["energy"] for r in rows]
    gain_full = [r["lp_full"]["init_energy"] - r["lp_full"]["energy"] for r in rows]
    lines.append(
        "lp = mean-field -> dc-neg -> PROX-LP within 2x mean-field's time; energy gained "
        "by the PROX-LP stage over its dc-neg init: " + ", ".join(f"{g:.4g}" for g in gain)
    )
    lines.append(
        "lp_full = the same pipeline without budget (dc-neg 20 steps, PROX-LP 10 steps); gained "
        "by PROX-LP over dc-neg: " + ", ".join(f"{g:.4g}" for g in gain_full)
    )
    for r in rows:
        extra = f"build {r['build_s']:.2f}s, our MF iteration {1e3 * r['mf_iter_s']:.1f} ms"
        if "pydensecrf2" in r:
            p = r["pydensecrf2"]
            extra += (
                f", pydensecrf2 MF iteration {1e3 * p['mf_iter_s']:.1f} ms "
                f"(ratio {r['mf_iter_s'] / p['mf_iter_s']:.2f}), setup {p['setup_s']:.2f}s, "
                f"labels agree with our MF on {100 * p['agreement_with_ours']:.2f}%"
            )
        else:
            extra += ", pydensecrf2 not installed"
        lines.append(f"  {r['name']}: {extra}")
    return "\n".join(lines)


def save_figure(rows, images, path: Path) -> None:
    """Image, unary argmax and each method's labelling side by side (one row per image)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no figure")
        return
    cols = ["image"] + [c for c in COLUMNS if c in rows[0]["labels"]]
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(2.2 * len(cols), 2.0 * len(rows)))
    for i, (r, (_, img, _, colours)) in enumerate(zip(rows, images)):
        for j, c in enumerate(cols):
            ax = axes[i, j] if len(rows) > 1 else axes[j]
            ax.imshow(img if c == "image" else colours[r["labels"][c]])
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(c, fontsize=9)
            if j == 0:
                ax.set_ylabel(r["name"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="half-size scikit-image photos")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    images = load_images(args.quick)
    rows = []
    for name, img, unary, _ in images:
        rows.append(bench_image(name, img, unary))
        print(f"done {name}", flush=True)
    table = format_table(rows)
    print(table)
    (out / "crf_table.txt").write_text(table + "\n")
    meta = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": 1,
        "params": PARAMS,
        "quick": args.quick,
    }
    clean = [{k: v for k, v in r.items() if k != "labels"} for r in rows]
    (out / "crf_table.json").write_text(json.dumps({"meta": meta, "rows": clean}, indent=1))
    save_figure(rows, images, out / "crf_figure.png")


if __name__ == "__main__":
    main()
