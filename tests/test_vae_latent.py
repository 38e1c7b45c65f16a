"""examples/vae_latent.py: its pixel bounds and class proofs re-checked on sampled latent codes
(decoded in float64, no tolerance), and a latent box across a class boundary gives a genuine
counterexample."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.example_modules import load_example
from tests.soundness import box_samples

vae_latent = load_example("vae_latent")
DIGIT, OTHER = 3, 8
D = torch.float64


@pytest.fixture(scope="module")
def trained():
    vae, x, y, accuracy = vae_latent.train_vae(steps=400)
    assert accuracy > 0.8
    return vae, x, y


def codes_in(lower: torch.Tensor, upper: torch.Tensor, n: int = 4000) -> torch.Tensor:
    """`[n + 64, dims]` float64 codes in the box: uniform, and corners."""
    lo, up = lower.to(D)[None], upper.to(D)[None]
    points = box_samples(lo, up, n)[0]
    return torch.minimum(torch.maximum(points, lo), up)


def float64(net: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(net).double()


@pytest.mark.parametrize("radius", [0.5, 3.0])
def test_pixel_bounds_hold_on_sampled_codes(trained, radius):
    vae, x, y = trained
    lower, upper = vae_latent.latent_box(vae, x, y, DIGIT, radius)
    pixels, _ = vae_latent.certify_box(vae, lower, upper, DIGIT)
    with torch.no_grad():
        images = float64(vae_latent.decoded_image(vae))(codes_in(lower, upper))
    assert (pixels.lower <= images).all() and (images <= pixels.upper).all()
    assert (pixels.upper - pixels.lower).min() >= 0


def test_proven_box_decodes_to_the_digit_everywhere(trained):
    vae, x, y = trained
    lower, upper = vae_latent.latent_box(vae, x, y, DIGIT, 0.5)
    _, result = vae_latent.certify_box(vae, lower, upper, DIGIT)
    assert result.status == "unsat"
    with torch.no_grad():
        logits = float64(vae_latent.decode_then_classify(vae))(codes_in(lower, upper))
    others = torch.cat([logits[:, :DIGIT], logits[:, DIGIT + 1 :]], dim=1)
    assert (logits[:, DIGIT] > others.max(1).values).all()


@pytest.mark.parametrize("radius", [1.0, 2.0, 3.0])
def test_every_answer_is_right_on_samples(trained, radius):
    """Whatever `verify` answers on a z box: a proof holds on samples, a counterexample is one."""
    vae, x, y = trained
    lower, upper = vae_latent.latent_box(vae, x, y, DIGIT, radius)
    _, result = vae_latent.certify_box(vae, lower, upper, DIGIT)
    assert result.status in ("unsat", "sat")
    net = float64(vae_latent.decode_then_classify(vae))
    with torch.no_grad():
        if result.status == "unsat":
            assert (net(codes_in(lower, upper)).argmax(1) == DIGIT).all()
        else:
            assert_counterexample(net, result.counterexample[0], lower, upper)


def assert_counterexample(net, code, lower, upper):
    """`code` lies in the box and some logit_j >= logit_digit there (float64)."""
    assert code.dtype == D
    assert (lower.to(D) <= code).all() and (code <= upper.to(D)).all()
    with torch.no_grad():
        logits = net(code[None])[0]
    assert any(logits[j] >= logits[DIGIT] for j in range(10) if j != DIGIT)


def test_box_across_a_class_boundary_gives_a_counterexample(trained):
    vae, x, y = trained
    lower, upper = vae_latent.crossing_box(vae, x, y, DIGIT, OTHER, 0.5)
    assert lower[DIGIT] == 0 and upper[OTHER] == 1 and lower[OTHER] == 0
    _, result = vae_latent.certify_box(vae, lower, upper, DIGIT)
    assert result.status == "sat"
    net = float64(vae_latent.decode_then_classify(vae))
    assert_counterexample(net, result.counterexample[0], lower, upper)
    assert vae_latent.said(vae, result.counterexample[0]) != DIGIT


def test_class_property_excludes_exactly_the_other_classes():
    lower, upper = torch.zeros(14), torch.ones(14)
    (region,) = vae_latent.class_property(lower, upper, DIGIT).regions
    assert len(region.unsafe) == 9
    logits = torch.zeros(10, dtype=D)
    logits[DIGIT] = 1.0
    assert not any(p.contains(logits.numpy()) for p in region.unsafe)
    logits[OTHER] = 1.0  # a tie is a violation
    assert any(p.contains(logits.numpy()) for p in region.unsafe)


def test_png_is_a_valid_greyscale_image(tmp_path):
    image = vae_latent.panel_grid([[torch.linspace(0, 1, 64).numpy()] * 3] * 2)
    path = tmp_path / "grid.png"
    vae_latent.write_png(path, image)
    PIL = pytest.importorskip("PIL.Image")
    with PIL.open(path) as png:
        assert png.mode == "L" and png.size == (image.shape[1], image.shape[0])
        assert png.getpixel((4, 4)) == 0 and png.getpixel((0, 0)) == 128
