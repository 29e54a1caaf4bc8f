"""Ray Serve scale-out: throughput of 2 replicas against 1 on a compute-bound model, through Ray's HTTP proxy;
and one encrypted request's ciphertexts fanned out over 2 Ray workers against the replica alone.

The repository holds `wide` (``veil.engine.toy.digits_model`` with a wide hidden layer: compute-bound). A local
Ray cluster (``num_cpus`` = this machine's cores) serves it with ``veil.engine.ray_serve.app``: first 1 replica,
then 2 (each replica reserves 1 CPU and runs ONNX Runtime on 1 thread), and the same thin keep-alive HTTP/1.1
client (binary tensor extension, batch-``--batch`` requests, ``--concurrency`` connections) measures requests
per second through Ray's proxy in the same run. Target (issue 20): 2 replicas >= 1.6x one replica.
The client, Ray's proxy and the replicas share the machine's cores.

HE fan-out (``--he-workers``, veil.engine.he_fanout): the digits-he PolyCNN (``DIGITS_HE_PRESETS["cnn"]``, trained
for ``--he-epochs`` only: the cost of an evaluation does not depend on the weights) exported as a latency HE plan
with pow2 rotation keys, served by 1 replica; a ``HeSession`` registers its keys through the proxy and sends
requests of ``--he-ciphertexts`` ciphertexts (8 images each); wall time per request with 0 workers (the replica
evaluates every ciphertext) and with 2 workers (two chunks evaluated at once), interleaved, decrypted results
checked against ONNX Runtime on the same images.

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
from common import (
    argument_parser,
    command_line,
    environment,
    grpc_infer_request,
    grpc_requests_per_second,
    requests_per_second,
    save_results,
)
from ray import serve
from veil.engine import ray_serve
from veil.engine.server_config import ServerConfig
from veil.engine.toy import digits_model, write_repository
from veil.he.envelope import open_envelope

SECTION = "serve_ray"
WIDE_HIDDEN = 8192  # as benchmarks/serve_http.py: a 32 MB first layer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(batch: int) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(batch, 1, 8, 8)).astype(np.float32)


def request_bytes(port: int, batch: int) -> bytes:
    x = samples(batch)
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


def he_repository(root: Path, epochs: int) -> Path:
    """The digits-he PolyCNN (short training, seeded): a repository holding only its latency HE plan (``digits-he``;
    a second served model would take a CPU the workers need) and, beside it, the plain ONNX (``plain/``)."""
    from veil.export import export_uldnet
    from veil.export.he import export_he
    from veil.training.uldnet import ModelConfig, TrainConfig, load_digits_preset, save_uldnet, train_uldnet
    from veil.training.uldnet.config import DIGITS_HE_PRESETS

    data, preset = load_digits_preset(), DIGITS_HE_PRESETS["cnn"]
    recipe = {**preset["train"], "epochs": epochs, "warmup_epochs": min(1, epochs - 1)}
    result = train_uldnet(ModelConfig(input_shape=data.input_shape, **preset["model"]),
                          TrainConfig(**recipe, seed=0, threads=1), data, progress=False)
    save_uldnet(result, root / "ck", data)
    export_uldnet(root / "ck", root / "plain", name="plain")
    export_he(root / "ck", root / "repo", "digits-he", mode="latency", rotation_keys="pow2")
    return root / "repo"


def bench_he_fanout(port: int, repo: Path, keyring: Path, ciphertexts: int, rounds: int) -> dict:
    """Wall seconds per request of ``ciphertexts`` ciphertexts, 0 vs 2 workers (a fresh deployment each time)."""
    from veil.he.client import HeSession
    from veil.training.uldnet import load_digits_preset

    x_all = load_digits_preset().x_test
    plain = ort.InferenceSession(str(repo.parent / "plain" / "plain" / "1" / "model.onnx"))
    times: dict[int, list[float]] = {0: [], 2: []}
    session, errors, agree, server = None, [], [], {0: [], 2: []}
    for r in range(rounds):
        for workers in (0, 2):
            serve.run_many(ray_serve.app(repo, replicas=1, replica_cpus=1, he_workers=workers, he_worker_cpus=1))
            if session is None:  # keys registered once, through the proxy, into the replicas' shared key folder
                session = HeSession.create(f"http://127.0.0.1:{port}", "digits-he", keyring)
                capacity = session.layout(0).batch_capacity
                x = x_all[:ciphertexts * capacity]
                reference = plain.run(None, {"x": x})[0]
            envelope = session.encrypt(x)
            session.infer(session.encrypt(x[:capacity]))  # warm: the workers load the plan and the keys
            start = time.perf_counter()
            result = session.infer(envelope)
            times[workers].append(time.perf_counter() - start)
            server[workers].append(open_envelope(result, expect_kind="result").meta["server_seconds"])
            logits = session.decrypt(result)
            errors.append(float(np.abs(logits - reference).max()))
            agree.append(float((logits.argmax(1) == reference.argmax(1)).mean()))
            print(json.dumps({"round": r, "workers": workers, "seconds": round(times[workers][-1], 2)}), file=sys.stderr)
    median = {w: float(np.median(t)) for w, t in times.items()}
    return {"ciphertexts": ciphertexts, "images": len(x), "rounds": rounds,
            "seconds_per_request": {str(w): round(v, 2) for w, v in median.items()},
            "server_seconds": {str(w): round(float(np.median(v)), 2) for w, v in server.items()},
            "speedup": round(median[0] / median[2], 2), "max_abs_logit_error": max(errors),
            "argmax_agreement": min(agree)}


def markdown(results: dict, command: str) -> str:
    env, rows = results["environment"], results["runs"]
    table = "\n".join(f"| {r['batch']} | {r['session_ms']} | {r['replicas']} | {r['transport']} | {r['req_s']} | "
                      f"{r['samples_s']} | {r['per_replica']} |"
                      for r in sorted(rows, key=lambda r: (r["batch"], r["transport"] != "http", r["replicas"])))
    grpc = ", ".join(f"batch {b}: {v}x" for b, v in results["grpc_speedup"].items())
    grpc_http = ", ".join(f"batch {b}: {v}x" for b, v in results["grpc_over_http"].items())
    speedups = ", ".join(f"batch {b}: **{v}x** ({'met' if v >= 1.6 else 'missed'})" for b, v in results["speedup"].items())
    busy = ", ".join(f"{100 * r['req_s'] * r['session_ms'] / 1e3:.0f} % at batch {r['batch']}" for r in rows
                     if r["replicas"] == 1 and r["transport"] == "http")  # share of its time one replica spends in ONNX Runtime
    return f"""## Ray Serve: 2 replicas against 1 (issue 20 §3)

Command: `{command}` — {env['date']}, {env['machine']}, Ray {env['ray']}, onnxruntime {env['onnxruntime']}.
Model `wide` (`veil.engine.toy.digits_model`, hidden {WIDE_HIDDEN}); requests of each batch size, binary tensor
extension, {results['concurrency']} keep-alive connections through Ray's HTTP proxy (`http`), or {results['concurrency']}
calls in flight on one gRPC channel to the front's gRPC server (`grpc`, engine/ray_plane.py: front -> replica by
deployment handle), {results['requests']} requests per setting; each replica reserves 1 CPU and runs ONNX Runtime on
1 thread. Client, proxy, front and replicas share the machine's cores (load average {results['load_before']} before the
run: other processes share them too).

| batch | session run alone (ms, 1 thread) | replicas | front | requests/s | samples/s | requests/s per replica |
|---|---|---|---|---|---|---|
{table}

Speed-up of 2 replicas over 1 through the HTTP proxy (target >= 1.6x): {speedups}; through the gRPC front: {grpc};
gRPC over HTTP at 2 replicas: {grpc_http}. One replica alone spends {busy} of its time in ONNX Runtime
(requests/s x session run); the rest is Ray's HTTP proxy (or the front) and the replica's own Python, all on the
same two cores as the client: the smaller the request, the less a second replica can add.
{he_markdown(results.get('he_fanout'))}"""


def he_markdown(he: dict | None) -> str:
    if he is None:
        return ""
    t, srv = he["seconds_per_request"], he["server_seconds"]
    return f"""
### Encrypted inference fanned out over Ray workers (`--he-workers`)

The digits-he PolyCNN latency plan (pow2 keys) on 1 replica; one request = {he['ciphertexts']} ciphertexts
({he['images']} test images), {he['rounds']} interleaved rounds per setting, wall time through Ray's proxy (client
encryption excluded, the client's own decryption too).

| workers | seconds per request | server seconds (evaluation) |
|---|---|---|
| 0 (the replica evaluates all) | {t['0']} | {srv['0']} |
| 2 (two chunks at once) | {t['2']} | {srv['2']} |

Speed-up with 2 workers: **{he['speedup']}x** on this 2-core machine (client, proxy and workers share the cores;
the two vCPUs of this shared host need not behave as two free cores: two bare SEAL rotation loops at once reached
1.2-1.7x one loop's throughput in separate trials).
decrypted logits vs ONNX Runtime: max error {he['max_abs_logit_error']:.2e}, argmax agreement
{100 * he['argmax_agreement']:.0f} %."""


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few requests")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64],
                        help="samples per request, one scale-out measurement each (8: the proxy's cost dominates; "
                             "64: the model's)")
    parser.add_argument("--concurrency", type=int, default=8, help="client connections")
    parser.add_argument("--he-ciphertexts", type=int, default=8, help="ciphertexts per encrypted request")
    parser.add_argument("--he-rounds", type=int, default=3, help="encrypted requests timed per setting")
    parser.add_argument("--he-epochs", type=int, default=2, help="training epochs of the digits-he PolyCNN")
    parser.add_argument("--skip-he", action="store_true", help="only the replica scale-out part")
    args = parser.parse_args(argv)
    n = 40 if args.quick else 400
    load = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo", {"wide": digits_model(hidden=WIDE_HIDDEN)}, max_batch_size=64)
        run_ms = {b: session_ms(repo / "wide" / "1" / "model.onnx", b, 10 if args.quick else 50) for b in args.batch}
        # Ray renices its workers by +15: under `nice -n 10` the replicas (19) would starve beside the client (10)
        os.environ.setdefault("RAY_worker_niceness", "0")
        # logical CPUs: the HE part reserves 1 replica + 2 workers (the replica waits while they evaluate)
        ray.init(num_cpus=max(os.cpu_count() or 2, 2) + 1, include_dashboard=False, log_to_driver=False,
                 object_store_memory=1024 * 2**20)  # a key upload passes through it (front -> replica)
        port, grpc_port = free_port(), free_port()
        config = ServerConfig(repo=str(repo), host="127.0.0.1", grpc_port=grpc_port)  # + the front's gRPC server
        runs = []
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            for replicas in (1, 2):
                serve.run_many(ray_serve.app(repo, config, replicas=replicas, replica_cpus=1))
                for batch in args.batch:  # both batch sizes, both fronts, on the same deployment
                    for transport in ("http", "grpc"):
                        rate = asyncio.run(
                            requests_per_second(port, request_bytes(port, batch), n, args.concurrency)
                            if transport == "http" else
                            grpc_requests_per_second(grpc_port, grpc_infer_request("wide", {"x": samples(batch)}), n,
                                                     args.concurrency))
                        runs.append({"transport": transport, "batch": batch, "replicas": replicas,
                                     "req_s": round(rate, 1), "samples_s": round(rate * batch, 1),
                                     "per_replica": round(rate / replicas, 1), "session_ms": round(run_ms[batch], 3)})
                        print(json.dumps(runs[-1]), file=sys.stderr)
            for target in ray_serve.app(repo, replicas=1):
                serve.delete(target.name)
            he = None
            if not args.skip_he:
                he_repo = he_repository(Path(tmp) / "he", 1 if args.quick else args.he_epochs)
                he = bench_he_fanout(port, he_repo, Path(tmp) / "he" / "k.keyring",
                                     2 if args.quick else args.he_ciphertexts, 1 if args.quick else args.he_rounds)
        finally:
            serve.shutdown()
            ray.shutdown()
    rate = {(r["transport"], r["batch"], r["replicas"]): r["req_s"] for r in runs}
    results = {"runs": runs, "speedup": {str(b): round(rate["http", b, 2] / rate["http", b, 1], 2) for b in args.batch},
               "grpc_speedup": {str(b): round(rate["grpc", b, 2] / rate["grpc", b, 1], 2) for b in args.batch},
               "grpc_over_http": {str(b): round(rate["grpc", b, 2] / rate["http", b, 2], 2) for b in args.batch},
               "batch": args.batch, "concurrency": args.concurrency, "requests": n, "load_before": load,
               **({"he_fanout": he} if he is not None else {}),
               "environment": environment(ray=ray.__version__, onnxruntime=ort.__version__)}
    save_results(args.out, SECTION, results, markdown(results, command_line(__file__, argv)))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
