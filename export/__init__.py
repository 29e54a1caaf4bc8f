"""veil.export: trained checkpoint -> deployable artifact (ONNX in a Triton-layout model repository).

Filled by the export-and-serve issue; nothing is exported yet."""
