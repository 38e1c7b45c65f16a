"""Proof certificates of ReLU splitting (issue 26): the writer (`verify.bab.relu.certify`) and the
checker's ReLU-split trees and split multipliers (`verify.certificate.check`)."""

from __future__ import annotations

import dataclasses
import io
import pathlib
import zipfile

import numpy as np
import pytest
import torch
from torch import nn

import verify
from verify.bab.relu.bounder import ReluBounder
from verify.bab.relu.certify import ReluRecorder
from verify.certificate import check_certificate

MNIST = pathlib.Path("/work/shared/data/vnncomp2022/mnist_fc")
RELU = verify.BabConfig(splitting="relu")


def _net(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                        nn.Linear(16, 2))  # fmt: skip
    return net.to(dtype).eval()


def _bound(method: str) -> float:
    """The upper bound of `y_0` over [-1, 1]^3 by `method` (float64; "milp": exact)."""
    lower, upper = -torch.ones(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64)
    C = torch.tensor([[[-1.0, 0.0]]], dtype=torch.float64)
    bounds = verify.bounds(_net(torch.float64), lower=lower, upper=upper, C=C, method=method)
    return -float(bounds.lower[0, 0])


def _write(tmp_path: pathlib.Path, threshold: float) -> tuple[pathlib.Path, pathlib.Path]:
    """The net as ONNX and the property `y_0 >= threshold or y_0 <= -100` on [-1, 1]^3."""
    onnx_path, spec_path = tmp_path / "net.onnx", tmp_path / "prop.vnnlib"
    torch.onnx.export(_net(), (torch.zeros(1, 3),), str(onnx_path), dynamo=False,
                      opset_version=13)  # fmt: skip
    lines = [f"(declare-const X_{i} Real)" for i in range(3)]
    lines += ["(declare-const Y_0 Real)", "(declare-const Y_1 Real)"]
    lines += [f"(assert (>= X_{i} -1.0))\n(assert (<= X_{i} 1.0))" for i in range(3)]
    lines += [f"(assert (or (and (>= Y_0 {threshold!r})) (and (<= Y_0 -100.0))))"]
    spec_path.write_text("\n".join(lines) + "\n")
    return onnx_path, spec_path


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """A 3-16-16-2 net, unsat a little above its exact maximum of `y_0` (CROWN's root
    bound does not close it: ReLU splits are needed), with its certificate."""
    top, crown = _bound("milp"), _bound("crown")
    assert crown > top + 0.05
    onnx_path, spec_path = _write(tmp_path_factory.mktemp("relu"), top + 0.1 * (crown - top))
    cert = onnx_path.parent / "out.cert"
    result = verify.verify(str(onnx_path), str(spec_path), timeout=60, certificate=cert,
                           config=RELU)  # fmt: skip
    assert result.status == "unsat", result
    return onnx_path, spec_path, cert


def _members(cert: pathlib.Path) -> dict[str, np.ndarray]:
    with np.load(cert) as npz:
        return {n: npz[n] for n in npz.files}


def _rewrite(cert: pathlib.Path, out: pathlib.Path, edit) -> pathlib.Path:
    """A copy of `cert` at `out` with `edit(name, array) -> array | None` (None: unchanged)
    applied to every `.npy` member."""
    with zipfile.ZipFile(cert) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in members.items():
            if name.endswith(".npy"):
                new = edit(name, np.load(io.BytesIO(data)).copy())
                if new is not None:
                    buffer = io.BytesIO()
                    np.save(buffer, new)
                    data = buffer.getvalue()
            zf.writestr(name, data)
    return out


def test_valid_with_relu_splits(solved):
    onnx_path, spec_path, cert = solved
    result = check_certificate(onnx_path, spec_path, cert)
    assert result.valid, result
    members = _members(cert)
    splits = _relu_splits(members)
    assert len(splits) >= 2 and splits.shape[1] == 7
    betas = [a for n, a in members.items() if "leaf_beta" in n]
    assert any((b > 0).any() for b in betas)  # the split multipliers are used
    assert not any(n.endswith("leaf_lower") for n in members)


def _relu_splits(members: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([a for n, a in members.items() if n.endswith("relu_split_ints")])


def _split_neuron(members: dict[str, np.ndarray]) -> tuple[int, int]:
    """A (relu layer, neuron) never split: beta there is not allowed."""
    splits = _relu_splits(members)
    used = {(int(j), int(i)) for j, i in splits[:, 3:5]}
    return next((0, i) for i in range(16) if (0, i) not in used)


MUTATIONS = {
    "remove a leaf": (
        "leaf_ints",
        lambda a, m: np.concatenate([a[:-1], [[0, 99999, 0]]]),
        "no such node",
    ),
    "flip a split": (
        "relu_split_ints",
        lambda a, m: a[:, [0, 1, 2, 3, 4, 6, 5]],
        "exceeds the re-derived",
    ),
    "negative beta": ("leaf_beta", lambda a, m: -a - (a == 0), "beta"),
    "beta off the splits": ("leaf_beta0", lambda a, m: _set(a, _split_neuron(m)[1]), "not split"),
    "same neuron twice": ("relu_split_ints", lambda a, m: _same_neuron(a), "or split"),
    "slope outside": ("leaf_alpha0", lambda a, m: a + 2.0, "outside [0, 1]"),
    "claim up": ("leaf_claim", lambda a, m: a * 1e3 + 1.0, "exceeds the re-derived"),
    "lambda up": ("leaf_lambda", lambda a, m: -a, "lambda"),
}


def _same_neuron(a: np.ndarray) -> np.ndarray:
    a[:, 3:5] = a[0, 3:5]  # every split on the first split's neuron
    return a


def _set(a: np.ndarray, i: int) -> np.ndarray:
    a[:, i] = 0.5
    return a


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutations_rejected(solved, tmp_path, mutation):
    onnx_path, spec_path, cert = solved
    key, change, words = MUTATIONS[mutation]
    members = _members(cert)

    def edit(name: str, a: np.ndarray) -> np.ndarray | None:
        return change(a, members) if name.split("_", 1)[1].startswith(key) else None

    bad = _rewrite(cert, tmp_path / "bad.cert", edit)
    result = check_certificate(onnx_path, spec_path, bad)
    assert not result.valid and words in result.reason, result.reason
    if mutation not in ("remove a leaf", "same neuron twice"):
        assert "leaf (region" in result.reason, result.reason


def test_removed_leaf_breaks_coverage(solved, tmp_path):
    onnx_path, spec_path, cert = solved
    bad = _rewrite(cert, tmp_path / "bad.cert", lambda n, a: a[1:] if "_leaf_" in n else None)
    result = check_certificate(onnx_path, spec_path, bad)
    assert not result.valid and "coverage" in result.reason, result.reason


def test_unconfirmed_claims_reopen(tmp_path, monkeypatch):
    """A closed domain whose claim the writer's own check does not confirm is reopened and
    split further (never an uncheckable leaf): here every first claim of a run fails."""
    onnx_path, spec_path = _write(
        tmp_path, _bound("milp") + 0.5 * (_bound("crown") - _bound("milp"))
    )
    claims, calls = ReluRecorder.claims, []

    def first_fails(self, *args, **kwargs):
        values, parts = claims(self, *args, **kwargs)
        calls.append(len(values))
        return (values - np.inf if len(calls) == 1 else values), parts

    monkeypatch.setattr(ReluRecorder, "claims", first_fails)
    cert = tmp_path / "c.cert"
    result = verify.verify(str(onnx_path), str(spec_path), timeout=60, certificate=cert,
                           config=RELU)  # fmt: skip
    assert result.status == "unsat" and result.stats["regions"][0]["certificate_reopened"] >= 1
    assert check_certificate(onnx_path, spec_path, cert).valid


def test_unsound_bounder_rejected(tmp_path, monkeypatch):
    """A planted unsound bounder (every bound 1.0 too high, its float64 confirmation and the
    writer's own check skipped) closes at once the root of a property that needs ReLU splits
    (its proof is wrong): its certificate is rejected."""
    top = _bound("milp")
    onnx_path, spec_path = _write(tmp_path, top + 0.01)
    optimise, claims = ReluBounder.optimise, ReluRecorder.claims

    def unsound(self, *args, **kwargs):
        result = optimise(self, *args, **kwargs)
        return dataclasses.replace(result, lower=result.lower + 1.0)

    def unsound_claims(self, *args, **kwargs):
        values, parts = claims(self, *args, **kwargs)
        return values + 1.0, parts

    monkeypatch.setattr(ReluBounder, "optimise", unsound)
    monkeypatch.setattr(ReluBounder, "confirmed", lambda self, d, alpha, beta: d)
    monkeypatch.setattr(ReluRecorder, "claims", unsound_claims)
    config = RELU
    cert = tmp_path / "bad.cert"
    answer = verify.verify(str(onnx_path), str(spec_path), timeout=30, certificate=cert,
                           config=config)  # fmt: skip
    assert answer.status == "unsat" and answer.stats["regions"][0]["max_depth"] == 0
    result = check_certificate(onnx_path, spec_path, cert)
    assert not result.valid and "exceeds the re-derived" in result.reason, result


@pytest.mark.skipif(not MNIST.exists(), reason="VNN-COMP 2022 mnist_fc data absent")
@pytest.mark.parametrize("prop", ["prop_8_0.03", "prop_9_0.05"])
def test_mnist_fc_relu_certificates(tmp_path, prop):
    """mnist_fc 256x2 (784 inputs: ReLU splitting), unsat beyond the root: valid."""
    onnx_path = MNIST / "onnx" / "mnist-net_256x2.onnx.gz"
    spec_path = MNIST / "vnnlib" / f"{prop}.vnnlib.gz"
    cert = tmp_path / "mnist.cert"
    assert verify.verify(onnx_path, spec_path, timeout=60, certificate=cert).status == "unsat"
    assert len(_relu_splits(_members(cert))) > 0  # beyond the root
    result = check_certificate(onnx_path, spec_path, cert)
    assert result.valid, result
