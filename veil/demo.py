"""`veil demo`: the end-to-end tour, extended as capabilities land.

1. train (or reuse) the digits PolyCNN and its standard-op baseline; reload both checkpoints from disk and
   evaluate them on the held-out test split, with the multiplicative depth;
2. export the PolyCNN to ONNX (validated) into a Triton-layout model repository;
3. start `veil serve` on that repository in the background, classify the test split over HTTP (Open
   Inference Protocol v2, binary tensors), and stop the server.
A checkpoint is reused when its config.json matches the requested configs exactly.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

EXAMPLE = """example:
  veil demo                      # reuses runs/demo/* when present
  veil demo --retrain --epochs 20
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil demo", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="where the demo's checkpoints live")
    parser.add_argument("--retrain", action="store_true", help="train again even if matching checkpoints exist")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default: the trainer's)")
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    parser.add_argument("--no-baseline", action="store_true", help="skip the standard-op baseline")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--no-serve", action="store_true", help="skip the export and HTTP serving steps")
    return parser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, server: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"veil serve exited with status {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"veil serve was not ready at {url} within {timeout:.0f} s")


def serve_and_classify(repo: Path, model: str, x: np.ndarray) -> tuple[np.ndarray, float]:
    """Serve ``repo`` with `veil serve` in the background and classify ``x`` over HTTP, 32 images a request.

    Returns (predicted classes, median request latency in ms); the server is stopped either way.
    """
    import tritonclient.http as httpclient

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "veil.cli", "serve", "--repo", str(repo), "--port", str(port),
                               "--log-level", "warning"], stdout=subprocess.DEVNULL)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", server)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        predictions, latencies = [], []
        for i in range(0, len(x), 32):
            tensor = httpclient.InferInput("x", list(x[i:i + 32].shape), "FP32")
            tensor.set_data_from_numpy(x[i:i + 32], binary_data=True)
            start = time.perf_counter()
            result = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput("logits", binary_data=True)])
            latencies.append(time.perf_counter() - start)
            predictions.append(result.as_numpy("logits").argmax(axis=1))
        client.close()
        return np.concatenate(predictions), 1e3 * float(np.median(latencies))
    finally:
        server.terminate()  # SIGTERM: graceful shutdown
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def _train_or_reuse(path: Path, model_config, train_config, data, retrain: bool, progress: bool) -> tuple[str, float]:
    """Make sure ``path`` holds a checkpoint of exactly these configs; returns (status, seconds spent)."""
    from veil.training.uldnet import save_uldnet, train_uldnet

    config_file = path / "config.json"
    if not retrain and config_file.is_file():
        saved = json.loads(config_file.read_text())
        if saved.get("model") == model_config.to_dict() and saved.get("train") == train_config.to_dict():
            return "reused", 0.0
    start = time.perf_counter()
    save_uldnet(train_uldnet(model_config, train_config, data, progress=progress), path, data)
    return "trained", time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    from veil.training.uldnet import (
        ModelConfig,
        TrainConfig,
        load_digits_preset,
        load_uldnet,
        multiplicative_depth,
    )
    from veil.training.uldnet.config import DIGITS_PRESETS
    from veil.training.uldnet.trainer import accuracy

    args = build_parser().parse_args(argv)
    data = load_digits_preset()
    preset = DIGITS_PRESETS["cnn"]
    train_config = TrainConfig(seed=args.seed, **{**preset["train"], **({"epochs": args.epochs} if args.epochs else {})})
    polycnn = ModelConfig(arch="cnn", input_shape=data.input_shape, **preset["model"])
    runs = [("PolyCNN (ULD-Net)", args.out / "polycnn", polycnn)]
    if not args.no_baseline:
        runs.append(("CNN baseline (ReLU/BN/MaxPool)", args.out / "cnn-baseline", polycnn.replace(baseline=True)))
    rows = []
    for label, path, model_config in runs:
        status, seconds = _train_or_reuse(path, model_config, train_config, data, args.retrain, not args.no_progress)
        model, _ = load_uldnet(path)
        depth = multiplicative_depth(model)
        rows.append((label, accuracy(model, data.x_test, data.y_test), sum(p.numel() for p in model.parameters()),
                     depth.total, depth.max_op_levels, status, seconds))

    header = f"{'model':<32} {'test acc':>8} {'params':>8} {'depth':>6} {'max/op':>6}  {'checkpoint':<10} {'train s':>7}"
    print(f"\nveil demo: digits ({len(data.y_test)} held-out test images), checkpoints under {args.out}\n")
    print(header)
    print("-" * len(header))
    for label, acc, params, total, per_op, status, seconds in rows:
        fmt = lambda v: "n/a" if v is None else str(v)  # noqa: E731
        print(f"{label:<32} {100 * acc:>7.2f}% {params:>8} {fmt(total):>6} {fmt(per_op):>6}  {status:<10} {seconds:>7.1f}")
    print("\ndepth = CKKS levels consumed end to end (n/a: not polynomial, cannot run encrypted)")
    if args.no_serve:
        return 0

    from veil.export import export_uldnet

    repo = args.out / "models"
    manifest = export_uldnet(runs[0][1], repo, name="digits")
    worst = max(v["max_abs_diff"] for case in manifest["validation"]["cases"] for v in case["outputs"].values())
    print(f"\nexported {repo / 'digits'} (ONNX, veil functions {manifest['export']['veil_functions']}); "
          f"validated against PyTorch at {len(manifest['validation']['cases'])} batch sizes, max |diff| {worst:.1e}")
    served, latency = serve_and_classify(repo, "digits", data.x_test.astype(np.float32))
    local = rows[0][1]
    print(f"served by `veil serve` over OIP v2 (binary tensors, tritonclient): test acc {100 * float((served == data.y_test).mean()):.2f}% "
          f"(local {100 * local:.2f}%), median request of 32 images {latency:.1f} ms; server stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
