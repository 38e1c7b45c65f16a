"""The network graph: `graph` (`Graph`, `Node`, `build_graph`) and the torch.fx translation
that builds it (`fx_handlers` with `fx_common`, `fx_shapes`, `fx_activations`, `fx_nonlinear`)."""
