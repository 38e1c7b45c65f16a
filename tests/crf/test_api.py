"""Public API: shapes, batching, unaries, bad input (clear ValueError subclasses), CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from crf_testlib import smooth_image
from PIL import Image

import crf
from crf.__main__ import main


def _instance(h=12, w=14, m=3, seed=0):
    rng = np.random.default_rng(seed)
    return smooth_image(h, w, seed), crf.unary_from_probs(rng.dirichlet(np.ones(m), size=(h, w)))


@pytest.mark.parametrize("method", ["meanfield", "qp", "dc-neg", "lp"])
def test_map_result_shapes(method):
    img, unary = _instance()
    res = crf.DenseCRF(img, unary).map(method, iterations=3)
    assert res.labels.shape == (12, 14) and res.labels.dtype == np.int64
    assert isinstance(res.energy, float) and res.stats["seconds"] > 0
    assert res.energy == pytest.approx(crf.DenseCRF(img, unary).energy(res.labels), rel=1e-5)


def test_batched_equals_single():
    (i1, u1), (i2, u2) = _instance(seed=0), _instance(seed=1)
    batch = crf.DenseCRF(np.stack([i1, i2]), np.stack([u1, u2]), dtype=torch.float64)
    res = batch.map("dc-neg", iterations=4)
    assert res.labels.shape == (2, 12, 14) and res.energy.shape == (2,)
    for k, (img, un) in enumerate([(i1, u1), (i2, u2)]):
        single = crf.DenseCRF(img, un, dtype=torch.float64).map("dc-neg", iterations=4)
        assert np.array_equal(single.labels, res.labels[k])
        assert single.energy == pytest.approx(res.energy[k], rel=1e-9)


def test_unary_from_labels_matches_pydensecrf_formula():
    labels = np.array([[0, 1], [2, 3]])
    u = crf.unary_from_labels(labels, 3, gt_prob=0.7, zero_unsure=True)
    assert np.allclose(u[0, 0], -np.log(1 / 3))
    assert np.isclose(u[0, 1, 0], -np.log(0.7)) and np.isclose(u[0, 1, 1], -np.log(0.15))
    assert u[1, 1].argmin() == 2
    v = crf.unary_from_labels(labels, 4, zero_unsure=False)
    assert [int(v[i, j].argmin()) for i in range(2) for j in range(2)] == [0, 1, 2, 3]


def test_labels_from_annotation_black_is_unknown():
    ann = np.zeros((2, 3, 3), np.uint8)
    ann[0, 0] = (0, 64, 0)
    ann[1, 2] = (64, 128, 0)
    labels, colours, unknown = crf.labels_from_annotation(ann)
    assert unknown and labels[0, 1] == 0 and labels[0, 0] == 1 and labels[1, 2] == 2
    assert colours.tolist() == [[0, 64, 0], [64, 128, 0]]


def test_read_only_and_converted_inputs():
    img, unary = _instance()
    img.setflags(write=False)
    unary.setflags(write=False)
    grey = img[..., 0].copy()
    ref = crf.DenseCRF(img, unary).map("meanfield")
    assert ref.labels.shape == (12, 14)
    crf.DenseCRF(grey, unary).map("meanfield")  # grey is repeated to RGB
    rgba = np.concatenate([img, np.full((12, 14, 1), 255, np.uint8)], -1)
    assert np.array_equal(crf.DenseCRF(rgba, unary).map("meanfield").labels, ref.labels)
    assert np.array_equal(crf.DenseCRF(img.astype(np.int64), unary).map().labels, ref.labels)


@pytest.mark.parametrize(
    ("make", "exc", "words"),
    [
        (lambda i, u: (i[:-1], u), crf.ShapeMismatchError, "disagrees"),
        (lambda i, u: (i.astype(np.float32) / 255, u), crf.InvalidValueError, "uint8"),
        (lambda i, u: (i, u[..., :0]), crf.ShapeMismatchError, "zero labels"),
        (lambda i, u: (i, np.where(np.arange(3) == 1, np.nan, u)), crf.InvalidValueError, "NaN"),
        (lambda i, u: (i[..., :2], u), crf.ShapeMismatchError, "RGB"),
        (lambda i, u: (i.astype(np.int32) * 2, u), crf.InvalidValueError, "255"),
        (lambda i, u: (i, u[..., 0]), crf.ShapeMismatchError, "(H, W, M)"),
    ],
)
def test_bad_input_errors(make, exc, words):
    img, unary = _instance()
    with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        crf.DenseCRF(*make(img, unary))
    assert isinstance(info.value, ValueError)


def test_bad_options_and_labels():
    img, unary = _instance()
    c = crf.DenseCRF(img, unary)
    with pytest.raises(crf.ConfigError, match="unknown method"):
        c.map("icm")
    with pytest.raises(crf.ConfigError, match="typo"):
        c.map("lp", typo=3)
    with pytest.raises(crf.InvalidValueError, match="labels"):
        c.energy(np.full((12, 14), 3))
    with pytest.raises(crf.ShapeMismatchError):
        c.energy(np.zeros((12, 13), np.int64))
    with pytest.raises(crf.ConfigError):
        crf.DenseCRF(img, unary, normalize="mean")
    with pytest.raises(crf.ConfigError):
        crf.DenseCRF(img, unary, sigma_rgb=0.0)
    with pytest.raises(crf.InvalidValueError, match="NaN"):
        crf.unary_from_probs(np.full((2, 2, 2), np.nan))
    with pytest.raises(crf.InvalidValueError, match="sum"):
        crf.unary_from_probs(np.full((2, 2, 2), 0.2))


def test_budget_stops_early():
    img, unary = _instance(40, 50)
    res = crf.DenseCRF(img, unary).map("qp", iterations=100000, budget=0.3, tol=0.0)
    assert res.stats["seconds"] < 3.0 and res.stats["iterations"] < 100000


def test_cli_refine_writes_labels_and_overlay(tmp_path):
    img = smooth_image(20, 24)
    ann = np.zeros((20, 24, 3), np.uint8)
    ann[:8, :6] = (200, 0, 0)
    ann[12:, 18:] = (0, 0, 200)
    Image.fromarray(img).save(tmp_path / "im.png")
    Image.fromarray(ann).save(tmp_path / "ann.png")
    out = tmp_path / "out.png"
    args = ["refine", str(tmp_path / "im.png"), str(tmp_path / "ann.png"), "--out", str(out)]
    assert main([*args, "--method", "lp", "--iterations", "2"]) == 0
    labels = np.array(Image.open(out))
    assert labels.shape == (20, 24, 3)
    assert {tuple(c) for c in labels.reshape(-1, 3)} <= {(200, 0, 0), (0, 0, 200)}
    assert (tmp_path / "out_overlay.png").exists()
    np.save(tmp_path / "p.npy", np.full((20, 23, 2), 0.5))
    assert (
        main(["refine", str(tmp_path / "im.png"), str(tmp_path / "p.npy"), "--out", str(out)]) == 2
    )


def test_init_from_marginals_and_method_chain():
    img, unary = _instance()
    c = crf.DenseCRF(img, unary)
    mf = c.map("meanfield")
    assert mf.stats["marginals"].shape == (12, 14, 3)
    res = c.map("lp", init=mf.stats["marginals"], iterations=2)
    assert res.stats["init"]["method"] == "given"
    plain = crf.DenseCRF(img, unary, normalize=None)  # model energy == reported energy
    chained = plain.map("lp", iterations=2)  # default pipeline: meanfield -> dc-neg -> lp
    assert chained.stats["init"]["method"] == "dc-neg"
    assert chained.energy <= chained.stats["init"]["energy"] * (1 + 1e-6)
    with pytest.raises(crf.ShapeMismatchError):
        c.map("lp", init=mf.stats["marginals"][..., :2])
