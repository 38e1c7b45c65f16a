"""Proof certificates (issue 26): the writer of input splitting and the independent checker."""

from __future__ import annotations

import ast
import io
import json
import pathlib
import re
import zipfile
from fractions import Fraction

import numpy as np
import pytest
import torch
from torch import nn

import verify
from benchmarks import certificates
from bounds.graph.graph import build_graph
from bounds.methods.crown import crown_intervals
from bounds.types import Interval
from verify.bab.input import certify
from verify.bab.input.certify import (
    Recorder,
    RecordingBounder,
    certificate_config,
    certified_bounds,
)
from verify.certificate import check_certificate
from verify.certificate.arith import affine_interval, mv_lo
from verify.certificate.crown64 import point_interval
from verify.certificate.onnx_plain import read_network
from verify.certificate.vnnlib_plain import read_property
from verify.cli.main import main
from verify.errors import CertificateUnsupportedError
from verify.property import Polytope, Region

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(2, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(),
                         nn.Linear(12, 2)).eval()  # fmt: skip


def _threshold(net: nn.Module) -> float:
    grid = torch.stack(torch.meshgrid(*[torch.linspace(-1, 1, 201)] * 2, indexing="ij"), -1)
    with torch.no_grad():
        y = net(grid.reshape(-1, 2))
    gap = y[:, 0]
    return float(gap.max() + 0.002 * (gap.max() - gap.min()))


@pytest.fixture
def instance(tmp_path):
    net = _net()
    onnx_path, spec_path = tmp_path / "net.onnx", tmp_path / "prop.vnnlib"
    torch.onnx.export(net, (torch.zeros(1, 2),), str(onnx_path), dynamo=False, opset_version=13)
    t = _threshold(net)
    lines = ["(declare-const X_0 Real)", "(declare-const X_1 Real)",
             "(declare-const Y_0 Real)", "(declare-const Y_1 Real)",
             "(assert (>= X_0 -1.0))", "(assert (<= X_0 1.0))",
             "(assert (>= X_1 -1.0))", "(assert (<= X_1 1.0))",
             f"(assert (or (and (>= Y_0 Y_1) (>= Y_0 {t!r}))",
             f"            (and (>= Y_1 {t + 5!r}))))"]  # fmt: skip
    spec_path.write_text("\n".join(lines) + "\n")
    cert = tmp_path / "out.cert"
    result = verify.verify(str(onnx_path), str(spec_path), timeout=60, certificate=cert)
    assert result.status == "unsat"
    return onnx_path, spec_path, cert


def _rewrite(cert, edit) -> None:
    """Apply `edit(name, array) -> array | None` (None: unchanged) to every `.npy` member."""
    with zipfile.ZipFile(cert) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    with zipfile.ZipFile(cert, "w") as zf:
        for name, data in members.items():
            if name.endswith(".npy"):
                array = np.load(io.BytesIO(data))
                new = edit(name, array.copy())
                if new is not None:
                    buffer = io.BytesIO()
                    np.save(buffer, new)
                    data = buffer.getvalue()
            zf.writestr(name, data)


def test_valid_and_format(instance):
    onnx_path, spec_path, cert = instance
    assert check_certificate(onnx_path, spec_path, cert).valid
    with zipfile.ZipFile(cert) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    assert manifest["format"] == "ldverify-certificate" and manifest["version"] == 2
    assert manifest["splitting"] == "input"
    assert manifest["answer"] == "unsat" and manifest["regions"] == 1
    with np.load(cert) as npz:
        assert sum(len(npz[n]) for n in npz.files if n.endswith("split_ints")) > 0


def _first(suffix):
    return lambda name: name.startswith("b") and name.endswith(suffix)


MUTATIONS = {
    "remove a leaf": (
        "leaf_ints.npy",
        lambda a: np.concatenate([a[:-1], a[:1] * 0 + [0, 99999, 0]]),
        "no such node",
    ),
    "move a split point": ("split_point.npy", lambda a: a + 0.3, "box"),
    "flip a child": ("split_ints.npy", lambda a: a[:, [0, 1, 2, 4, 3]], "box"),
    "scale lambda": ("leaf_lambda.npy", lambda a: a * 1e3, "exceeds the re-derived"),
    "alpha outside": ("leaf_alpha0.npy", lambda a: a + 2.0, "outside [0, 1]"),
    "lambda negative": ("leaf_lambda.npy", lambda a: -a, "lambda"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutations_rejected(instance, mutation):
    onnx_path, spec_path, cert = instance
    suffix, change, words = MUTATIONS[mutation]
    if mutation == "scale lambda":  # the claim scales too little: raise the claim itself
        suffix, change = "leaf_claim.npy", lambda a: a * 1e3
    _rewrite(cert, lambda name, a: change(a) if name.endswith(suffix) else None)
    result = check_certificate(onnx_path, spec_path, cert)
    assert not result.valid and words in result.reason, result.reason


def test_removed_leaf_breaks_coverage(instance):
    onnx_path, spec_path, cert = instance

    def drop(name, a):
        return a[1:] if "_leaf_" in name else None

    _rewrite(cert, drop)
    result = check_certificate(onnx_path, spec_path, cert)
    assert not result.valid and "coverage" in result.reason, result.reason


def test_hashes(instance):
    onnx_path, spec_path, cert = instance
    text = spec_path.read_text()
    raised = re.sub(r"\(>= Y_0 ([-0-9.e]+)\)", lambda m: f"(>= Y_0 {float(m[1]) + 0.1!r})", text)
    assert raised != text
    spec_path.write_text(raised)  # the property's threshold changed
    assert "property_sha256" in check_certificate(onnx_path, spec_path, cert).reason
    spec_path.write_text(text)
    data = bytearray(onnx_path.read_bytes())
    data[-40] ^= 1
    onnx_path.write_bytes(bytes(data))
    assert "network_sha256" in check_certificate(onnx_path, spec_path, cert).reason


def test_unsound_bounder_rejected(tmp_path, monkeypatch):
    net = _net()
    onnx_path, spec_path = tmp_path / "net.onnx", tmp_path / "prop.vnnlib"
    torch.onnx.export(net, (torch.zeros(1, 2),), str(onnx_path), dynamo=False, opset_version=13)
    t = _threshold(net) + 0.0
    spec_path.write_text("\n".join([
        "(declare-const X_0 Real)", "(declare-const X_1 Real)", "(declare-const Y_0 Real)",
        "(declare-const Y_1 Real)", "(assert (>= X_0 -1.0))", "(assert (<= X_0 1.0))",
        "(assert (>= X_1 -1.0))", "(assert (<= X_1 1.0))",
        f"(assert (>= Y_0 {t!r}))"]) + "\n")  # fmt: skip
    search, certify = RecordingBounder._call_bounds, RecordingBounder.certify_rows

    def unsound_search(self, *args, **kwargs):  # every bound of the search, 1.0 too high
        return search(self, *args, **kwargs) + 1.0

    def unsound_certify(self, *args, **kwargs):  # and its float64 recheck, the leaves' bounds
        rows, best, alphas = certify(self, *args, **kwargs)
        return rows + 1.0, best, alphas

    monkeypatch.setattr(RecordingBounder, "_call_bounds", unsound_search)
    monkeypatch.setattr(RecordingBounder, "certify_rows", unsound_certify)
    cert = tmp_path / "bad.cert"
    answer = verify.verify(str(onnx_path), str(spec_path), timeout=30, certificate=cert)
    assert answer.status == "unsat"  # the planted bounder closes the root at once
    result = check_certificate(onnx_path, spec_path, cert)
    assert not result.valid and "exceeds the re-derived" in result.reason, result


def test_checker_imports_no_engine():
    for path in (ROOT / "verify" / "certificate").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:  # only itself, onnx, numpy and the standard library
                ours = name.startswith(("bounds", "relaxations", "verify", "crf", "kernels"))
                assert not ours or name.startswith("verify.certificate"), (path, name)


def _write_spec(path, threshold: float) -> None:
    path.write_text("\n".join([
        "(declare-const X_0 Real)", "(declare-const X_1 Real)", "(declare-const Y_0 Real)",
        "(declare-const Y_1 Real)", "(assert (>= X_0 -1.0))", "(assert (<= X_0 1.0))",
        "(assert (>= X_1 -1.0))", "(assert (<= X_1 1.0))",
        f"(assert (>= Y_0 {threshold!r}))"]) + "\n")  # fmt: skip


def test_sat_certificate_and_cli(tmp_path, capsys):
    net = _net()
    onnx_path, spec_path, cert = tmp_path / "net.onnx", tmp_path / "prop.vnnlib", tmp_path / "c"
    torch.onnx.export(net, (torch.zeros(1, 2),), str(onnx_path), dynamo=False, opset_version=13)
    _write_spec(spec_path, _threshold(net) - 0.5)
    code = main(["run", str(onnx_path), str(spec_path), "--timeout", "30", "--certificate",
                 str(cert)])  # fmt: skip
    assert code == 0 and capsys.readouterr().out.strip() == "sat"
    assert main(["check", str(onnx_path), str(spec_path), str(cert)]) == 0
    assert capsys.readouterr().out.strip() == "valid"
    _write_spec(spec_path, _threshold(net) + 0.5)
    assert main(["check", str(onnx_path), str(spec_path), str(cert)]) == 1
    assert "property_sha256" in capsys.readouterr().out


def test_refusals(instance):
    onnx_path, spec_path, cert = instance
    for kwargs in ({"method": "alpha-crown"}, {"workers": 2}):
        with pytest.raises(CertificateUnsupportedError):
            verify.verify(str(onnx_path), str(spec_path), timeout=5, certificate=cert, **kwargs)


ACAS = pathlib.Path("/work/shared/data/vnncomp2022/acasxu")


@pytest.mark.skipif(not ACAS.exists(), reason="VNN-COMP 2022 ACAS Xu data absent")
@pytest.mark.parametrize("net, prop", [("1_1", 1), ("2_1", 3), ("1_2", 3), ("3_3", 4)])
def test_acasxu_certificates(tmp_path, net, prop):
    onnx_path = ACAS / "onnx" / f"ACASXU_run2a_{net}_batch_2000.onnx.gz"
    spec_path = ACAS / "vnnlib" / f"prop_{prop}.vnnlib.gz"
    cert = tmp_path / "acas.cert"
    answer = verify.verify(str(onnx_path), str(spec_path), timeout=60, certificate=cert)
    assert answer.status == "unsat"
    result = check_certificate(onnx_path, spec_path, cert)
    assert result.valid, result


def test_readers(tmp_path):
    """The checker's ONNX reader computes the network (sound point intervals around torch's
    float64 output); its VNN-LIB reader gives the regions and rows of `verify.io`."""
    net = _net()
    onnx_path = tmp_path / "net.onnx"
    torch.onnx.export(net, (torch.zeros(1, 2),), str(onnx_path), dynamo=False, opset_version=13)
    layers, n_in = read_network(onnx_path.read_bytes())
    x = np.random.default_rng(0).uniform(-1, 1, (20, n_in))
    with torch.no_grad():
        y = verify.load_onnx(onnx_path).double()(torch.tensor(x)).numpy()
    for point, out in zip(x, y):
        low, high = point_interval(layers, point)
        assert (low <= out + 1e-12).all() and (out - 1e-12 <= high).all()
        assert (high - low).max() < 1e-12
    for path in sorted(ACAS.glob("vnnlib/*.vnnlib.gz"))[:4]:
        mine, ref = read_property(path.read_bytes()), verify.load_vnnlib(path).regions
        assert len(mine) == len(ref)
        for a, b in zip(mine, ref):  # the same, within one outward rounding
            assert (a.lower <= b.lower).all() and (a.upper >= b.upper).all()
            assert np.allclose(a.lower, b.lower, rtol=1e-15) and np.allclose(
                a.upper, b.upper, rtol=1e-15
            )
            for p, q in zip(a.unsafe, b.unsafe, strict=True):
                assert np.array_equal(p.A, q.A) and (p.b >= q.b).all()
                assert np.allclose(p.b, q.b, rtol=1e-15)


def test_arith_bounds_exact_values():
    """`mv_lo` and `affine_interval` bound the exact rational results (T1, T2)."""
    rng = np.random.default_rng(1)
    a, x = rng.normal(size=(5, 40)) * 1e3, rng.normal(size=40)
    exact = [sum(Fraction(float(p)) * Fraction(float(q)) for p, q in zip(row, x)) for row in a]
    low = mv_lo(a, x)
    assert all(Fraction(float(lo)) <= e for lo, e in zip(low, exact))
    c = rng.normal(size=5)
    lo, hi = affine_interval(a, c, x, x)
    for k in range(5):
        value = exact[k] + Fraction(float(c[k]))
        assert Fraction(float(lo[k])) <= value <= Fraction(float(hi[k]))


MNIST = pathlib.Path("/work/shared/data/vnncomp2022/mnist_fc")


@pytest.mark.skipif(not MNIST.exists(), reason="VNN-COMP 2022 mnist_fc data absent")
@pytest.mark.parametrize("prop, answer", [("prop_0_0.03", "unsat"), ("prop_1_0.03", "sat")])
def test_mnist_fc_certificates(tmp_path, prop, answer):
    """784 inputs: the root closed by CROWN (unsat), a counterexample re-run (sat)."""
    onnx_path = MNIST / "onnx" / "mnist-net_256x2.onnx.gz"
    spec_path = MNIST / "vnnlib" / f"{prop}.vnnlib.gz"
    cert = tmp_path / "mnist.cert"
    assert verify.verify(onnx_path, spec_path, timeout=60, certificate=cert).status == answer
    result = check_certificate(onnx_path, spec_path, cert)
    assert result.valid, result


def _alpha_instance(tmp_path):
    """The tiny instance certified with alpha-CROWN for every domain (strong_depth 0)."""
    net = _net()
    onnx_path, spec_path = tmp_path / "net.onnx", tmp_path / "prop.vnnlib"
    torch.onnx.export(net, (torch.zeros(1, 2),), str(onnx_path), dynamo=False, opset_version=13)
    _write_spec(spec_path, _threshold(net))
    cert = tmp_path / "alpha.cert"
    config = verify.BabConfig(strong_depth=0)
    answer = verify.verify(str(onnx_path), str(spec_path), timeout=60, certificate=cert,
                           config=config)  # fmt: skip
    assert answer.status == "unsat" and answer.stats["regions"][0]["strong_domains"] > 0
    return onnx_path, spec_path, cert


def _fractional(cert) -> list[tuple[str, int, int]]:
    """(member, leaf, neuron) of every slope strictly inside (0, 1)."""
    with np.load(cert) as npz:
        return [(n, int(i), int(j)) for n in npz.files if "leaf_alpha" in n
                for i, j in zip(*np.nonzero((npz[n] > 0) & (npz[n] < 1)))]  # fmt: skip


def test_alpha_crown_leaves_valid(tmp_path):
    """alpha-CROWN's optimised slopes (not only CROWN's 0/1) are the leaves' and check valid."""
    onnx_path, spec_path, cert = _alpha_instance(tmp_path)
    assert _fractional(cert), "no leaf carries an optimised slope"
    result = check_certificate(onnx_path, spec_path, cert)
    assert result.valid, result


def test_alpha_crown_leaf_slope_outside_rejected(tmp_path):
    onnx_path, spec_path, cert = _alpha_instance(tmp_path)
    member, leaf, neuron = _fractional(cert)[0]

    def edit(name, a):
        if name != member + ".npy":
            return None
        a[leaf, neuron] = 1.5
        return a

    _rewrite(cert, edit)
    result = check_certificate(onnx_path, spec_path, cert)
    assert not result.valid and "outside [0, 1]" in result.reason, result.reason


def test_certificate_config():
    """The default configuration is certified as it is (alpha-CROWN from strong_depth on);
    alpha-CROWN optimising intermediate slopes, or another method, is refused."""
    config = certificate_config(verify.BabConfig())
    assert (config.strong_method, config.strong_depth) == ("alpha-crown", 30)
    assert config.float64_recheck and config.splitting == "input"
    assert certificate_config(verify.BabConfig(float64_recheck=False)).float64_recheck
    for bad in ({"strong_options": {"optimize_intermediate": True}}, {"strong_method": "ibp"},
                {"method": "alpha-crown"}, {"splitting": "relu"}):  # fmt: skip
        with pytest.raises(CertificateUnsupportedError):
            certificate_config(verify.BabConfig(**bad))


def _recorder(rows: int) -> Recorder:
    poly = Polytope(np.eye(rows, 2), np.zeros(rows))
    region = Region(np.zeros(2), np.ones(2), (poly,))
    return Recorder(None, 0, region, combine=True)


def test_rows_checked_caps_combination_rows_at_the_checkers_interval_bound():
    """A combination row whose bound came from the output's interval is claimed at most the
    mean of its single rows' interval bounds (the checker's); a backward-pass row as it is."""
    recorder = _recorder(2)  # rows 0, 1 and their midpoint, row 2
    intervals = torch.tensor([[1.0, -3.0, 0.5]], dtype=torch.float64)
    from_interval = torch.tensor([[1.0, -3.0, 0.5]], dtype=torch.float64)
    assert recorder.rows_checked(from_interval, intervals).tolist() == [[1.0, -3.0, -1.0]]
    backward = torch.tensor([[2.0, -1.0, 0.7]], dtype=torch.float64)
    assert recorder.rows_checked(backward, intervals).tolist() == [[2.0, -1.0, 0.7]]


def test_certified_bounds_slopes_of_stable_neurons_are_adaptive():
    """At a neuron the engine finds stable the recorded slope is CROWN's adaptive one (the
    checker's relaxation then agrees should it find the neuron barely unstable), elsewhere the
    alpha-CROWN slope given."""
    net = _net().double()
    graph = build_graph(net, (2,))
    box = Interval(torch.full((1, 2), -1.0, dtype=torch.float64), torch.ones(1, 2).double())
    C = torch.tensor([[[1.0, -1.0]]], dtype=torch.float64)
    slopes = {a.name: torch.full((1, 2, *a.shape), 0.5, dtype=torch.float64)
              for a in graph.activations()}  # fmt: skip
    _, alphas, _ = certified_bounds(graph, box, C, slopes)
    intervals = crown_intervals(graph, box, every_neuron=True)
    for act, alpha in zip(graph.activations(), alphas):
        iv = intervals[act.inputs[0]]
        stable = ((iv.lower >= 0) | (iv.upper <= 0))[0]
        assert stable.any() and (~stable).any()
        assert (alpha[0, 0, ~stable] == 0.5).all()
        assert (alpha[0, 0, stable] == (iv.upper > -iv.lower)[0, stable].double()).all()


def test_benchmark_core_on_a_tiny_instance(instance, tmp_path):
    """`benchmarks/certificates.py`'s core: both runs, the check valid, every mutation
    invalid, and the suite's figures from that row."""
    onnx_path, spec_path, _ = instance
    row = certificates.run_instance(onnx_path, spec_path, 30.0, True, tmp_path)
    assert row["plain"]["status"] == row["certified"]["status"] == "unsat"
    assert row["check"]["valid"] and row["leaves"] > 0 and row["size_mb"] > 0
    applicable = set(certificates.MUTATIONS) - {"ReLU split sides swapped"}  # input splitting
    assert set(row["mutations"]) == {*applicable, "property constant changed"}
    assert not any(m["valid"] for m in row["mutations"].values()), row["mutations"]
    s = certificates.summarize([row])
    assert (s["solved_plain"], s["solved_certified"], s["unsat_valid"], s["unsat"]) == (1, 1, 1, 1)
    assert s["mutations_invalid"] == s["mutations"] == 4 and s["time_ratio"] > 0
    assert "| 1 | 1 / 1 |" in certificates.markdown({"tiny": s}, "cmd", "now")


def _agreement(onnx_path, spec_path, k: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """The engine's float64 CROWN (every neuron) and the checker's re-derived bound of every
    row of the first polytope on `k` random sub-boxes of the first region."""
    from bounds.graph.graph import build_graph
    from bounds.methods.crown import crown
    from bounds.types import Interval
    from verify.certificate.check import Checker
    from verify.certificate.onnx_plain import read_bytes
    from verify.io.onnx_loader import load_onnx

    layers, _ = read_network(read_bytes(onnx_path))
    regions = read_property(read_bytes(spec_path))
    net = load_onnx(onnx_path).double()
    shape = tuple(getattr(net, "input_shape", None) or (len(regions[0].lower),))
    graph = build_graph(net, shape)
    rng, r = np.random.default_rng(0), regions[0]
    a, b = (rng.uniform(r.lower, r.upper, size=(k, len(r.lower))) for _ in range(2))
    lower = np.minimum(a, b)
    upper = np.minimum(
        np.maximum(a, b), lower + rng.uniform(1e-3, 0.3, (k, 1)) * (r.upper - r.lower)
    )
    poly = r.unsafe[0]
    box = Interval(*(torch.tensor(t).reshape(k, *shape) for t in (lower, upper)))
    engine = crown(graph, box, torch.tensor(poly.A).expand(k, *poly.A.shape), None, True)[0]
    ints = np.zeros((k, 3), np.int64)
    ints[:, 1] = np.arange(k)  # distinct nodes: each box its own intervals
    checker = Checker(layers, regions)
    rows = [checker.derive(ints, np.broadcast_to(np.eye(len(poly.b))[i], (k, len(poly.b))).copy(),
                           (lower, upper), {}) for i in range(len(poly.b))]  # fmt: skip
    return engine.numpy() - poly.b, np.stack(rows, 1)


def test_checker_agrees_with_the_engine_on_1000_leaves(instance):
    """The checker's bounds (adaptive slopes) are the engine's float64 CROWN bounds, less at
    most the rounding terms (1e-9 relative here; measured 1e-11 on ACAS Xu), on 99% of the
    leaves; on the others the checker is tighter (its fallback: the rows' intervals from the
    output's CROWN intervals)."""
    onnx_path, spec_path, _ = instance
    engine, checker = _agreement(onnx_path, spec_path)
    slack = 1e-9 * (1 + np.abs(engine))
    assert (checker >= engine - slack).all()
    assert (np.abs(engine - checker) <= slack).mean() >= 0.99


@pytest.mark.skipif(not ACAS.exists(), reason="VNN-COMP 2022 ACAS Xu data absent")
def test_checker_agrees_with_the_engine_on_acasxu():
    onnx_path = ACAS / "onnx" / "ACASXU_run2a_1_1_batch_2000.onnx.gz"
    engine, checker = _agreement(onnx_path, ACAS / "vnnlib" / "prop_3.vnnlib.gz")
    assert (np.abs(engine - checker) <= 1e-9 * (1 + np.abs(engine))).all()


def test_bias_and_product_slack_bound_the_exact_values():
    """`bias_lo` is below the exact `a c`; `product_slack` bounds the exact rounding error of
    `fl(a w)` summed against `h` (rational arithmetic, huge and tiny magnitudes)."""
    from verify.certificate.arith import bias_lo, l1_up, product_slack

    rng = np.random.default_rng(2)
    a = rng.normal(size=(2, 3, 7)) * 10.0 ** rng.integers(-8, 9, size=(2, 3, 7))
    c = rng.normal(size=7) * 1e6
    w = rng.normal(size=(7, 4)) * 10.0 ** rng.integers(-6, 7, size=(7, 4))
    h = np.abs(rng.normal(size=(2, 4))) * 1e3
    norm = l1_up(a)
    low = bias_lo(a, norm, c)
    value, slack = product_slack(a, w, h, norm)
    for k in range(2):
        for m in range(3):
            exact = sum(Fraction(float(p)) * Fraction(float(q)) for p, q in zip(a[k, m], c))
            assert Fraction(float(low[k, m])) <= exact
            err = sum(
                abs(Fraction(float(value[k, m, j]))
                    - sum(Fraction(float(a[k, m, i])) * Fraction(float(w[i, j])) for i in range(7)))
                * Fraction(float(h[k, j]))
                for j in range(4)
            )  # fmt: skip
            assert err <= Fraction(float(slack[k, m]))


def test_small_batches_valid(tmp_path, monkeypatch):
    """Records appended in many small batches (splits and leaves of one node in different
    batches) make the same valid certificate."""
    monkeypatch.setattr(certify, "FLUSH", 5)
    net = _net()
    onnx_path, spec_path, cert = tmp_path / "net.onnx", tmp_path / "prop.vnnlib", tmp_path / "c"
    torch.onnx.export(net, (torch.zeros(1, 2),), str(onnx_path), dynamo=False, opset_version=13)
    _write_spec(spec_path, _threshold(net))
    answer = verify.verify(str(onnx_path), str(spec_path), timeout=60, certificate=cert)
    assert answer.status == "unsat"
    with zipfile.ZipFile(cert) as zf:
        assert json.loads(zf.read("manifest.json"))["batches"] > 3
    result = check_certificate(onnx_path, spec_path, cert)
    assert result.valid, result
