"""veil.engine: serves artifacts (ONNX Runtime sessions, OIP v2 HTTP, HE, codec and sampler services).

Filled by the export-and-serve issue; never imports veil.training.

Plaintext serving (`veil serve --repo DIR`, docs/serving.md), one module per job:
    runtime     ONNX Runtime session factory: providers verified, threads, warm-up, IO binding
    models      one served model version: load, ready, check inputs, infer
    batcher     Triton-style dynamic batching (one asyncio loop per model)
    plane       the data-plane protocol both fronts serve; dataplane: its in-process implementation (the
                model registry and protocol-agnostic inference)
    protocol    OIP v2 tensors as the fronts hand them to the plane; rest_body: the REST body (JSON and
                Triton's binary extension)
    http        the HTTP front's route functions; grpc_server: the gRPC front; server: wiring and uvicorn;
                server_config: its settings (torch/ORT-free); cli: the `veil serve` verb
    repository  Triton model repository and config.pbtxt (pbtxt: the text-format parser)
    metrics     Prometheus /metrics and Triton /stats; errors: exception classes and HTTP handlers
    toy         tiny ONNX models and repositories for tests, examples and benchmarks
    ray_serve   the same repository as Ray Serve applications (`veil serve --ray`; optional: veil[ray]):
                ray_plane (the front's data plane), ray_replica (a model's replicas), ray_config (settings)
"""
