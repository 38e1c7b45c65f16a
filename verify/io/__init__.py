"""Readers: ONNX networks (`onnx_loader` and its translation modules) and VNN-LIB properties
(`vnnlib`: 1.0, our own; `vnnlib2`: 2.0, through the PyPI `vnnlib` package). Each returns the
toolkit's own types: an `nn.Module` and a `verify.property.VnnlibProperty`."""
