"""Ray Serve scale-out: throughput of 2 replicas against 1 on a compute-bound model, through Ray's HTTP proxy.

The repository holds `wide` (``veil.engine.toy.digits_model`` with a wide hidden layer: compute-bound). A local
Ray cluster (``num_cpus`` = this machine's cores) serves it with ``veil.engine.ray_serve.app``: first 1 replica,
then 2 (each replica reserves 1 CPU and runs ONNX Runtime on 1 thread), and the same thin keep-alive HTTP/1.1
client (binary tensor extension, batch-``--batch`` requests, ``--concurrency`` connections) measures requests
per second through Ray's proxy in the same run. Target (issue 20): 2 replicas >= 1.6x one replica.
The client, Ray's proxy and the replicas share the machine's cores.

Commands:
    python benchmarks/serve_ray.py            # docs/results.md section "serve_ray", docs/results/serve_ray.json
    python benchmarks/serve_ray.py --quick    # a smoke run
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import ray
from ray import serve
from veil.engine import ray_serve
from veil.engine.toy import digits_model, write_repository

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import argument_parser, command_line, environment, requests_per_second, save_results

SECTION = "serve_ray"
WIDE_HIDDEN = 8192  # as benchmarks/serve_http.py: a 32 MB first layer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request_bytes(port: int, batch: int) -> bytes:
    x = np.random.default_rng(1).normal(size=(batch, 1, 8, 8)).astype(np.float32)
    head = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    body = head + x.tobytes()
    return (f"POST /v2/models/wide/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n"
            f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(head)}\r\n\r\n"
            ).encode() + body




def session_ms(path: Path, batch: int, reps: int) -> float:
    """Median single-thread session run of one request's batch (how compute-bound a request is)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).normal(size=(batch, 1, 8, 8)).astype(np.float32)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        session.run(None, {"x": x})
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def markdown(results: dict, command: str) -> str:
    env, rows = results["environment"], results["runs"]
    table = "\n".join(f"| {r['replicas']} | {r['req_s']} | {r['samples_s']} | {r['per_replica']} |" for r in rows)
    return f"""## Ray Serve: 2 replicas against 1 (issue 20 §3)

Command: `{command}` — {env['date']}, {env['machine']}, Ray {env['ray']}, onnxruntime {env['onnxruntime']}.
Model `wide` (`veil.engine.toy.digits_model`, hidden {WIDE_HIDDEN}); batch-{results['batch']} requests, binary tensor
extension, {results['concurrency']} keep-alive connections through Ray's HTTP proxy, {results['requests']} requests per
setting; each replica reserves 1 CPU and runs ONNX Runtime on 1 thread. One request's session run alone:
{results['session_ms']} ms (1 thread). Client, proxy and replicas share the machine's cores (load average
{results['load_before']} before the run: other processes share them too).

| replicas | requests/s | samples/s | requests/s per replica |
|---|---|---|---|
{table}

Speed-up of 2 replicas over 1: **{results['speedup']}x** (target >= 1.6x: {'met' if results['speedup'] >= 1.6 else 'missed'})."""


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few requests")
    parser.add_argument("--batch", type=int, default=8, help="samples per request")
    parser.add_argument("--concurrency", type=int, default=8, help="client connections")
    args = parser.parse_args(argv)
    n = 40 if args.quick else 400
    load = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo", {"wide": digits_model(hidden=WIDE_HIDDEN)}, max_batch_size=64)
        run_ms = session_ms(repo / "wide" / "1" / "model.onnx", args.batch, 10 if args.quick else 50)
        # Ray renices its workers by +15: under `nice -n 10` the replicas (19) would starve beside the client (10)
        os.environ.setdefault("RAY_worker_niceness", "0")
        ray.init(num_cpus=max(os.cpu_count() or 2, 2), include_dashboard=False, log_to_driver=False,
                 object_store_memory=200 * 2**20)
        port = free_port()
        runs = []
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            request = request_bytes(port, args.batch)
            for replicas in (1, 2):
                serve.run_many(ray_serve.app(repo, replicas=replicas, replica_cpus=1))
                rate = asyncio.run(requests_per_second(port, request, n, args.concurrency))
                runs.append({"replicas": replicas, "req_s": round(rate, 1), "samples_s": round(rate * args.batch, 1),
                             "per_replica": round(rate / replicas, 1)})
                print(json.dumps(runs[-1]), file=sys.stderr)
        finally:
            serve.shutdown()
            ray.shutdown()
    results = {"runs": runs, "speedup": round(runs[1]["req_s"] / runs[0]["req_s"], 2), "batch": args.batch,
               "concurrency": args.concurrency, "requests": n, "session_ms": round(run_ms, 3), "load_before": load,
               "environment": environment(ray=ray.__version__, onnxruntime=ort.__version__)}
    save_results(args.out, SECTION, results, markdown(results, command_line(__file__, argv)))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
