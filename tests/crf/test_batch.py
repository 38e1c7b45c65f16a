"""Batched post-processing (issue 15): a batch equals its images one at a time, tensors in give
tensors out, ``probs=`` is ``unary=-log p``, ``energy=False``; the seconds budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from crf_testlib import smooth_image

import crf
from crf.solvers import common

METHODS = ["meanfield", "qp", "dc-neg", "lp"]


def _batch(b: int = 3, h: int = 11, w: int = 13, m: int = 4):
    rng = np.random.default_rng(0)
    images = np.stack([smooth_image(h, w, seed) for seed in range(b)])
    probs = rng.dirichlet(np.ones(m), size=(b, h, w))
    return images, probs


@pytest.mark.parametrize("method", METHODS)
def test_batched_equals_per_image(method):
    """One batched call == each image alone: labels, reported and model energies (float64)."""
    images, probs = _batch()
    unary = crf.unary_from_probs(probs)
    kw = {"dtype": torch.float64, "normalize": None}
    res = crf.DenseCRF(images, unary, **kw).map(method, iterations=4)
    assert res.labels.shape == images.shape[:3] and res.energy.shape == (len(images),)
    for k in range(len(images)):
        single = crf.DenseCRF(images[k], unary[k], **kw).map(method, iterations=4)
        assert np.array_equal(single.labels, res.labels[k]), (method, k)
        assert single.energy == pytest.approx(res.energy[k], rel=1e-9)
        assert single.stats["model_energy"] == pytest.approx(res.stats["model_energy"][k])
        # the reported convention, per image: the energy of the labels returned
        assert crf.DenseCRF(images[k], unary[k], **kw).energy(res.labels[k]) == pytest.approx(
            res.energy[k], rel=1e-9
        )


def test_tensor_inputs_give_tensor_outputs_and_probs_is_minus_log():
    """A segmentation network's softmax as a (B, H, W, M) tensor: results stay tensors, and
    ``probs=p`` is the model of ``unary=-log max(p, 1e-5)``."""
    images, probs = _batch()
    probs_t = torch.from_numpy(probs).float()
    from_probs = crf.DenseCRF(torch.from_numpy(images), probs=probs_t)
    res = from_probs.map("meanfield", energy=False)
    assert isinstance(res.labels, torch.Tensor) and res.labels.shape == images.shape[:3]
    assert isinstance(res.stats["marginals"], torch.Tensor) and res.energy is None
    as_array = crf.DenseCRF(images, crf.unary_from_probs(probs)).map("meanfield")
    assert np.array_equal(res.labels.numpy(), as_array.labels)
    from_array_probs = crf.DenseCRF(images, probs=probs).map("meanfield")
    assert np.array_equal(from_array_probs.labels, as_array.labels)
    torch.testing.assert_close(
        from_probs.model.unary, -torch.log(probs_t.clamp_min(1e-5)).reshape(3, -1, 4)
    )


def test_energy_false_skips_only_the_energies():
    images, probs = _batch(b=1)
    model = crf.DenseCRF(images[0], probs=probs[0])
    with_energy, without = (
        model.map("dc-neg", iterations=3),
        model.map("dc-neg", iterations=3, energy=False),
    )
    assert without.energy is None and "model_energy" not in without.stats
    assert np.array_equal(with_energy.labels, without.labels)
    assert with_energy.energy == pytest.approx(model.energy(with_energy.labels))
    with pytest.raises(crf.ConfigError, match="energy"):
        model.map("meanfield", energy="no")


def test_chained_init_energy_is_reported_and_never_beaten():
    images, probs = _batch(b=2)
    model = crf.DenseCRF(images, probs=probs, normalize=None)
    res = model.map("lp", iterations=2)  # meanfield -> dc-neg -> lp
    assert res.stats["init"]["method"] == "dc-neg"
    assert np.all(res.energy <= np.asarray(res.stats["init"]["energy"]) * (1 + 1e-6))
    assert "labels" not in res.stats["init"] and "labels" not in res.stats["init"]["init"]


class _Clock:
    """A fake ``time.perf_counter``, advanced by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_budget_stops_before_an_iteration_that_would_overrun(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(common.time, "perf_counter", clock)
    budget = common.Budget(iterations=100, seconds=1.0)
    it = 0
    while not budget.exhausted(it):
        clock.now += 0.3  # each iteration takes 0.3 s
        it += 1
    assert it == 3 and clock.now <= 1.0  # a 4th would end at 1.2 s
    first = common.Budget(iterations=100, seconds=1.0, first_step_s=2.0)
    assert first.exhausted(0)  # an a-priori estimate longer than the budget: no iteration
    assert not common.Budget(iterations=100, seconds=None).exhausted(99)
    assert common.Budget(iterations=5, seconds=None).exhausted(5)


@pytest.mark.parametrize("include_self", [True, False])
def test_blocked_meanfield_equals_plain_step(monkeypatch, include_self):
    """The blocked, buffer-reusing mean-field of large CPU inputs (crf.fused.FusedMeanField)
    gives the plain step's iterates; forced here on a small batch with 12 labels."""
    import crf.fused
    import crf.model
    from crf.solvers.meanfield import step

    monkeypatch.setattr(crf.model, "REUSE_BYTES", 0)
    monkeypatch.setattr(crf.fused, "BLOCK_POINTS", 50)  # several blocks per image
    images, probs = _batch(b=2, m=12)
    c = crf.DenseCRF(images, probs=probs, dtype=torch.float64)
    model = c.model
    q0 = torch.softmax(-model.unary, -1)
    assert model.fused_meanfield(q0) is not None
    ref = q0
    for _ in range(4):
        ref = step(model, ref, include_self)
    res = c.map("meanfield", iterations=4, init="unary", include_self=include_self)
    torch.testing.assert_close(torch.as_tensor(res.stats["marginals"]).reshape(ref.shape), ref)
