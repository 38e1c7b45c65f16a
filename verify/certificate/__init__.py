"""Proof certificates (issue 26), format v2, and their independent checker.

File: one zip archive (members deflated) that `numpy.load` opens; every member but
`manifest.json` is a `.npy` array named `b{batch}_{name}.npy`. Batches are appended (zip
append mode) while the search closes domains, so the records are never all in memory. `manifest.json` (read with `zipfile`,
written last):
`{"format": "ldverify-certificate", "version": 2, "network_sha256", "property_sha256",
"answer": "unsat" | "sat", "regions": n, "batches": k, "splitting": "input" | "relu"}`; the hashes are of the files' bytes as
stored (a `.onnx.gz` is hashed compressed).

Members of a batch (K splits, L leaves):
- `split_ints [K, 5]` int64 `(region, parent_id, dim, left_id, right_id)` and `split_point
  [K]` float64: the parent box is halved along `dim` at `point` (left: `x_dim <= point`);
  node 0 of each region is the region's box from the VNN-LIB file.
- `leaf_ints [L, 3]` int64 `(region, node_id, polytope)`; `leaf_lambda [L, r]` float64 over
  the polytope's rows (padded with zeros to the widest polytope), `>= 0`; `leaf_claim [L]` the
  claimed lower bound of `sum_i lambda_i (C_i y - b_i)` over the node's box (> 0 excludes the
  unsafe polytope `{y : C y <= b}`); `leaf_lower`, `leaf_upper [L, n_in]` a box containing the
  node's box (a redundancy check of the tree); `leaf_alpha{j} [L, n_j]` the lower slopes in
  [0, 1] of the j-th ReLU layer (in network order) in the backward pass of that objective.
  One leaf excludes one polytope; a node is closed when each polytope of its region has a leaf.
- with `"splitting": "relu"` (ReLU splitting, `relu_check`), instead of `split_*`:
  `relu_split_ints [K, 7]` int64 `(region, polytope, parent_id, relu_layer j, neuron,
  inactive_id, active_id)`: one tree per (region, polytope), node 0 its root (no split); the
  children add `v_neuron <= 0` (inactive) or `>= 0` (active) of the j-th ReLU layer's input.
  Leaves have no `leaf_lower`/`leaf_upper` but `leaf_beta{j} [L, n_j]` `>= 0` (0 at neurons not
  split on the node's path): the split multipliers; alpha and beta may be stored as float32.
- `sat_x [n_in]` float64 and `sat_region` int64 (answer "sat"): the counterexample.

The checker (`check.check_certificate`) re-derives each leaf's bound with its own float64,
outward-rounded IBP and CROWN (`crown64`, `arith`): intermediate bounds of every layer by IBP
intersected with CROWN at the adaptive slopes (1 where u >= -l, else 0), then the objective's
backward pass at the leaf's slopes; every rounding is bounded (gamma_n terms, `nextafter`). It
reads the network with its own ONNX reader (`onnx_plain`) and the property with its own VNN-LIB
reader (`vnnlib_plain`); it imports no module of this project outside `verify.certificate`
(`onnx` and numpy only)."""

from verify.certificate import relu_check  # noqa: F401  (registers the ReLU-split checker)
from verify.certificate.check import CheckResult, check_certificate

__all__ = ["CheckResult", "check_certificate"]
