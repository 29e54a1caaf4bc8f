"""veil.engine: serves artifacts (ONNX Runtime sessions, OIP v2 HTTP, HE, codec and sampler services).

Filled by the export-and-serve issue; never imports veil.training."""
