"""Embedding lookups (`bounds.ops.embedding`, `bounds.graph.fx_embedding`) and the DLRM of
`examples/dlrm_monitor.py` under `verify.bounds` and `verify.monitor`: the lookup's bounds and
the interaction's are sound by sampling (no tolerance), an index domain that leaves the table is
a typed error naming the node, and the monitor has no false positives, clips clean outputs to
themselves bitwise and catches a corrupted table value."""

from __future__ import annotations

import runpy
from fractions import Fraction
from pathlib import Path

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import build_graph
from bounds.methods.crown import crown_intervals
from bounds.ops.embedding import EmbeddingOp, IndexOutOfTableError
from bounds.types import Interval
from verify import bounds
from verify.monitor import Box, monitor

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dlrm_monitor.py"
DLRM_MODULE = runpy.run_path(str(EXAMPLE), run_name="dlrm_example")
DLRM, DENSE, TABLES, ROWS = (DLRM_MODULE[k] for k in ("DLRM", "DENSE", "TABLES", "ROWS"))


def _net(dtype=torch.float32, seed: int = 0) -> nn.Module:
    """A DLRM with trained-like magnitudes (tables N(0, 0.3)), not trained."""
    torch.manual_seed(seed)
    net = DLRM(hidden=32)
    with torch.no_grad():
        for table in net.tables:
            table.weight.normal_(0, 0.3)
    return net.to(dtype).eval()


def _inputs(n: int, seed: int, dtype=torch.float32, rows: int = ROWS) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(n, DENSE, generator=g, dtype=torch.float64)
    ids = torch.randint(0, rows, (n, TABLES), generator=g).double()
    return torch.cat([dense, ids], 1).to(dtype)


def _corners(n: int, seed: int) -> torch.Tensor:
    """Corners of the dense box, with random valid ids (the first and last rows among them)."""
    x = _inputs(n, seed, torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    x[:, :DENSE] = torch.randint(0, 2, (n, DENSE), generator=g).double()
    x[0, DENSE:], x[1, DENSE:] = 0, ROWS - 1
    return x


def _box(rows: int = ROWS) -> Interval:
    lower = torch.cat([torch.zeros(DENSE), torch.zeros(TABLES)]).double()[None]
    upper = torch.cat([torch.ones(DENSE), torch.full((TABLES,), rows - 1.0)]).double()[None]
    return Interval(lower, upper)


# --- the graph op ---------------------------------------------------------------------------


def test_graph_computes_the_module_on_valid_ids():
    net = _net(torch.float64)
    graph = build_graph(net, (DENSE + TABLES,))
    lookups = [n for n in graph.nodes if isinstance(n.op, EmbeddingOp)]
    assert [n.name for n in lookups] == [f"tables_{k}" for k in range(TABLES)]
    x = _inputs(64, 1, torch.float64)
    with torch.no_grad():
        values = graph.forward(x, all_values=True)
        assert torch.allclose(values[graph.output.name], net(x), rtol=0, atol=1e-12)
        for k in range(TABLES):  # the lookups are copies: equal
            assert torch.equal(values[f"tables_{k}"], net.tables[k].weight[x[:, DENSE + k].long()])


class _Lookups(nn.Module):
    """The same two lookups spelled four ways (`table[i]`, `F.embedding`, `index_select`, and
    an `nn.Embedding` of a reshaped index)."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.table = nn.Parameter(torch.randn(7, 3, dtype=torch.float64))
        self.emb = nn.Embedding(7, 3).double()
        self.emb.weight.data.copy_(self.table.data)

    def forward(self, x):
        ids = x[:, 1:].long()
        if self.form == "getitem":
            rows = self.table[ids]
        elif self.form == "embedding":
            rows = F.embedding(ids, self.table)
        elif self.form == "index_select":
            rows = torch.stack([torch.index_select(self.table, 0, ids[:, k]) for k in range(2)], 1)
        else:
            rows = self.emb(ids.reshape(-1, 2, 1))[:, :, 0]
        return rows.flatten(1) * x[:, :1]


@pytest.mark.parametrize("form", ["getitem", "embedding", "index_select", "module"])
def test_lookup_spellings_build_and_agree(form):
    net = _Lookups(form)
    graph = build_graph(net, (3,))
    assert sum(isinstance(n.op, EmbeddingOp) for n in graph.nodes) == (
        2 if form == "index_select" else 1
    )
    x = torch.tensor([[0.5, 0.0, 6.0], [-2.0, 3.0, 3.9]], dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(graph.forward(x), net(x))


class _BadIds(nn.Module):
    def __init__(self, use: str) -> None:
        super().__init__()
        self.use = use
        self.emb = nn.Embedding(5, 2, max_norm=1.0 if use == "max_norm" else None)

    def forward(self, x):
        ids = x.long()
        if self.use == "arith":
            return self.emb(ids + 1).flatten(1)
        return self.emb(ids).flatten(1)


@pytest.mark.parametrize("use", ["arith", "max_norm"])
def test_unsupported_index_uses_name_the_node(use):
    with pytest.raises(UnsupportedOperationError, match=r"add|emb"):
        build_graph(_BadIds(use).eval(), (2,))


def test_lookup_interval_is_the_rows_extremes_and_refuses_leaving_the_table():
    g = torch.Generator().manual_seed(3)
    table = torch.randn(50, 4, generator=g, dtype=torch.float64)
    op = EmbeddingOp(table, (3,), "lookup")
    lower = torch.tensor([[0.0, 10.2, -0.5], [49.0, 0.0, 7.9]], dtype=torch.float64)
    upper = torch.tensor([[49.9, 12.0, 3.0], [49.0, 0.0, 8.5]], dtype=torch.float64)
    iv = op.interval(Interval(lower, upper))
    for b in range(2):
        for p in range(3):
            first, last = int(max(lower[b, p], 0)), int(upper[b, p])
            rows = table[first : last + 1]
            assert torch.equal(iv.lower[b, p], rows.amin(0))
            assert torch.equal(iv.upper[b, p], rows.amax(0))
    for low, high in ((-1.0, 3.0), (0.0, 50.0), (float("nan"), 2.0)):
        bad = Interval(torch.tensor([[low, 0.0, 0.0]]), torch.tensor([[high, 0.0, 0.0]]))
        with pytest.raises(IndexOutOfTableError, match=r"'lookup'.*50 rows"):
            op.interval(bad)


def test_lookup_bias_term_is_the_minimum_over_the_rows():
    """`bias_term - backward_error` is below `A . row` for every row, exactly (Fractions), and
    the box form is never tighter than the finite set."""
    g = torch.Generator().manual_seed(4)
    table = torch.randn(40, 5, generator=g).double()  # float32 values
    op = EmbeddingOp(table, (2,), "lookup")
    A = torch.randn(2, 3, 2, 5, generator=g, dtype=torch.float64)
    bound = op.bias_term(A) - op.backward_error(A, [])
    rows = [[Fraction(float(v)) for v in r] for r in table]
    for b in range(2):
        for s in range(3):
            best = sum(
                min(sum(Fraction(float(a)) * v for a, v in zip(A[b, s, p], r)) for r in rows)
                for p in range(2)
            )
            assert Fraction(float(bound[b, s])) <= best
            assert best - Fraction(float(bound[b, s])) < Fraction(1, 10**9)
    low, high = table.amin(0), table.amax(0)
    box = (A.clamp(min=0) * low + A.clamp(max=0) * high).sum((-2, -1))
    assert bool((box <= op.bias_term(A) + 1e-12).all())


def test_domain_leaving_the_table_is_a_typed_error():
    net = _net()
    box = _box(ROWS + 1)
    with pytest.raises(IndexOutOfTableError, match=r"'tables_0'.*1000 rows"):
        bounds(net, lower=box.lower.float(), upper=box.upper.float(), method="crown")
    with pytest.raises(IndexOutOfTableError, match="'tables_0'"):
        monitor(net, Box(box.lower[0] - 1, _box().upper[0]))


@pytest.mark.parametrize("method", ["ibp", "crown"])
def test_lookup_and_interaction_bounds_are_sound_by_sampling(method):
    """Every node's interval (IBP, or CROWN's) holds at random points and corners of the dense
    box with random ids, evaluated in float64 on the float64 graph: no tolerance."""
    net = _net(torch.float64)
    graph = build_graph(net, (DENSE + TABLES,))
    box = _box()
    with torch.no_grad():
        ivs = graph.interval(box) if method == "ibp" else crown_intervals(graph, box)
        x = torch.cat([_inputs(3000, 5, torch.float64), _corners(500, 6)])
        values = graph.forward(x, all_values=True)
    checked = ["tables_0", "tables_7", "matmul_product", "matmul", "cat", graph.output.name]
    for name in checked:
        v, iv = values[name], ivs[name]
        assert bool((v >= iv.lower).all()) and bool((v <= iv.upper).all()), name
    if method == "crown":  # CROWN's bound of the output is at least as tight as IBP's
        ibp = graph.interval(box)[graph.output.name]
        assert bool((ivs[graph.output.name].lower >= ibp.lower).all())


# --- the monitor ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def watched():
    """A float32 DLRM and its certified monitor over the dense box with every valid row."""
    net = _net()
    return net, monitor(net, DLRM_MODULE["domain"]())


def _pgd(wrapped, x: torch.Tensor, node: str, neuron: int, sign: float, steps: int = 15):
    """Projected sign-gradient ascent of `sign * node[:, neuron]` over the dense features (ids
    fixed), inside [0, 1]."""
    x = x.clone()
    for _ in range(steps):
        dense = x[:, :DENSE].clone().requires_grad_(True)
        wrapped(torch.cat([dense, x[:, DENSE:]], 1))
        value = wrapped.report.values[node].flatten(1)[:, neuron]
        (grad,) = torch.autograd.grad((sign * value).sum(), dense)
        x[:, :DENSE] = (dense.detach() + 0.1 * grad.sign()).clamp(0, 1)
    return x


def test_monitor_has_no_false_positives(watched):
    """10,000 random in-domain inputs, corners of the dense box, and PGD on the dense part
    pushing single neurons of the monitored nodes up and down: nothing is flagged."""
    net, mon = watched
    assert {f"tables_{k}" for k in range(TABLES)} | {"matmul", "cat"} <= set(mon.nodes)
    x = torch.cat([_inputs(10_000, 7), _corners(1000, 8).float()])
    with torch.no_grad():
        report = mon.check(net, x, nodes="all")
    assert not bool(report.flagged.any())
    wrapped = mon.wrap(net, "detect", nodes="all", keep_values=True, checksums=False)
    g = torch.Generator().manual_seed(9)
    for node in ("bottom_0", "bottom_2", "matmul", "top_0", "top_2"):
        size = int(torch.Size(mon.graph[node].shape).numel())
        for sign in (1.0, -1.0):
            neuron = int(torch.randint(size, (1,), generator=g))
            attacked = _pgd(wrapped, _inputs(64, int(neuron) + 10), node, neuron, sign)
            with torch.no_grad():
                assert not bool(mon.check(net, attacked, nodes="all").flagged.any()), node


def test_clipping_leaves_clean_outputs_bitwise_unchanged(watched):
    net, mon = watched
    x = _inputs(10_000, 11)
    with torch.no_grad():
        clean = net(x)
        for action in ("clip", "both"):
            assert torch.equal(mon.wrap(net, action, nodes="all")(x), clean), action


def test_lookup_ranges_are_the_tables_extremes(watched):
    """The certified range of a lookup is its table's per-dimension minimum and maximum
    (stored values: no widening beyond them)."""
    net, mon = watched
    for k in range(TABLES):
        low, high = mon.ranges[f"tables_{k}"]
        weight = net.tables[k].weight.detach()
        assert torch.equal(low[0], weight.amin(0)) and torch.equal(high[0], weight.amax(0))


def test_planted_table_fault_is_detected_and_clipped(watched):
    """A corrupted table value is flagged at its lookup, for exactly the samples that read its
    row; clipping brings the lookup back into the table's range."""
    net, mon = watched
    x = _inputs(256, 12)
    row = int(x[0, DENSE + 3])
    reads = x[:, DENSE + 3] == row
    table = net.tables[3].weight
    saved = table.detach()[row, 5].clone()
    try:
        with torch.no_grad():
            table[row, 5] = 40.0
            report = mon.check(net, x)
            clipping = mon.wrap(net, "both", keep_values=True)
            clipped = clipping(x)
        assert torch.equal(report.flagged, reads)
        assert {report.first_node[i] for i in reads.nonzero().flatten().tolist()} == {"tables_3"}
        assert bool(torch.isfinite(clipped).all())
        assert torch.equal(clipping.report.flagged, reads)
        assert torch.equal(clipped[~reads], net(x)[~reads])  # the others: bitwise unchanged
    finally:
        with torch.no_grad():
            table[row, 5] = saved
    with torch.no_grad():
        assert not bool(mon.check(net, x).flagged.any())


def test_monitor_bounds_of_the_interaction_hold_in_float32(watched):
    """The float32 module's values of the lookups, the products' sums and the top MLP lie in
    the monitor's float64 bounds (before padding and rounding outward): no tolerance."""
    net, mon = watched
    wrapped = mon.wrap(net, "detect", nodes="all", keep_values=True)
    x = torch.cat([_inputs(4000, 13), _corners(500, 14).float()])
    with torch.no_grad():
        wrapped(x)
    for name in ("tables_0", "matmul", "cat", "top_2"):
        value = wrapped.report.values[name].double()
        iv = mon.bounds[name]
        assert bool((value >= iv.lower).all()) and bool((value <= iv.upper).all()), name


def test_example_runs(capsys):
    """The example end to end, on less data and few faults: it trains, certifies, and prints
    the campaign's table with no false clips for the certified ranges."""
    out = DLRM_MODULE["main"](["--quick", "--trials", "3"])
    text = capsys.readouterr().out
    assert "certified monitor of" in text and "| certified |" in text
    assert out["false_clips"]["certified"] == 0.0
    assert out["campaign"]["clean_auc"]["certified"] == out["campaign"]["clean_auc"]["none"]
    assert out["campaign"]["clean_auc"]["none"] > 0.7


# --- ONNX -------------------------------------------------------------------------------------


def test_onnx_export_loads_bounds_and_monitors(tmp_path, watched):
    """The DLRM exported by torch (Slice, Cast to INT64, Gather of each table) loads, computes
    what the module computes, is monitored without false positives, and a domain whose ids can
    leave a table is refused naming the Gather node."""
    from verify.io.onnx_loader import load_onnx

    net, _ = watched
    path = tmp_path / "dlrm.onnx"
    torch.onnx.export(net, (torch.zeros(1, DENSE + TABLES),), str(path), dynamo=False,
                      opset_version=13, input_names=["x"], output_names=["click"],
                      dynamic_axes={"x": {0: "batch"}})  # fmt: skip
    loaded = load_onnx(path)
    assert loaded.input_shape == (DENSE + TABLES,)
    x = _inputs(2000, 15)
    with torch.no_grad():
        assert torch.equal(loaded(x), net(x))
    graph = build_graph(loaded, (DENSE + TABLES,))
    assert sum(isinstance(n.op, EmbeddingOp) for n in graph.nodes) == TABLES
    mon = monitor(loaded, DLRM_MODULE["domain"]())
    with torch.no_grad():
        assert not bool(mon.check(loaded, x, nodes="all").flagged.any())
    box = _box()
    box.upper[0, DENSE + 2] = ROWS  # the third table's id may reach row 1000
    with pytest.raises(IndexOutOfTableError, match=r"'tables_2_gather'.*\[0, 999\]"):
        monitor(loaded, Box(box.lower[0], box.upper[0]))


def test_onnx_gather_of_a_table_on_another_axis_is_refused(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    from verify.io.onnx_loader import load_onnx

    table = numpy_helper.from_array(torch.randn(4, 5).numpy(), "table")
    nodes = [
        helper.make_node("Cast", ["x"], ["ids"], to=TensorProto.INT64),
        helper.make_node("Gather", ["table", "ids"], ["y"], axis=1, name="lookup"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1, 2])], [table],
    )  # fmt: skip
    path = tmp_path / "gather.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    with pytest.raises(UnsupportedOperationError, match=r"lookup.*axis 1"):
        load_onnx(path)
