"""Readers: ONNX networks (`onnx_loader` and its translation modules: `onnx_graph` checks the
graph's structure, `onnx_ops`, `onnx_shapes`, `onnx_nonlinear` translate nodes, `onnx_fold` folds
constants) and VNN-LIB properties (`vnnlib_load.load_vnnlib` picks the reader: `vnnlib` for 1.0,
our own; `vnnlib2` for 2.0, through the PyPI `vnnlib` package; both on `vnnlib_common`). Each
returns the toolkit's own types: an `nn.Module` and a `verify.property.VnnlibProperty`."""
