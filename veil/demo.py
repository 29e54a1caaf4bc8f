"""`veil demo`: the end-to-end tour, extended as capabilities land.

1. train (or reuse) the digits PolyCNN and its standard-op baseline; reload both checkpoints from disk and
   evaluate them on the held-out test split, with the multiplicative depth;
2. export the PolyCNN to ONNX (validated) into a Triton-layout model repository;
3. train (or reuse) the `digits-he` PolyCNN (8 levels, one leveled 128-bit set) and compile it to a CKKS latency
   plan (power-of-two rotation keys, 8 images per ciphertext), and the HE-sized PolyMLP to a throughput plan;
4. train (or reuse) a PriorGuide sampler on the 2-D Gaussian-linear task and export it (`torch.export`);
5. start `veil serve` on the repository in the background, classify the test split over HTTP (Open
   Inference Protocol v2, binary tensors), run encrypted inference over HTTP in both modes (keys and
   decryption stay in this process), draw posterior samples under a prior chosen at request time and
   compare them with the analytic posterior, print accuracy, time split and bytes, and stop the server.
A checkpoint is reused when its config.json matches the requested configs exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
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
    parser.add_argument("--no-serve", action="store_true", help="skip the export, HTTP serving and encrypted steps")
    parser.add_argument("--he-images", type=int, default=8, help="test images in the latency-mode request (8 fill one ciphertext)")
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


@contextlib.contextmanager
def running_server(repo: Path) -> Iterator[str]:
    """`veil serve` on ``repo`` in a background process; yields its URL, stops it (SIGTERM, graceful) after."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "veil.cli", "serve", "--repo", str(repo), "--port", str(port),
                               "--log-level", "warning"], stdout=subprocess.DEVNULL)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", server)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def classify_plain(url: str, model: str, x: np.ndarray) -> tuple[np.ndarray, float]:
    """Classify ``x`` over OIP v2 with tritonclient (binary tensors), 32 images a request.

    Returns (predicted classes, median request latency in ms).
    """
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
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


def classify_encrypted(url: str, model: str, x: np.ndarray, keyring: Path) -> dict:
    """Keygen, encrypt, infer over HTTP, decrypt; returns logits, the time split and the bytes moved."""
    from veil.he.client import HeSession
    from veil.he.envelope import open_envelope

    start = time.perf_counter()
    session = HeSession.create(url, model, keyring)
    keygen = time.perf_counter() - start
    start = time.perf_counter()
    request = session.encrypt(x)
    encrypt = time.perf_counter() - start
    start = time.perf_counter()
    response = session.infer(request)
    roundtrip = time.perf_counter() - start
    start = time.perf_counter()
    logits = session.decrypt(response)
    decrypt = time.perf_counter() - start
    return {"logits": logits, "keygen_s": keygen, "encrypt_s": encrypt, "roundtrip_s": roundtrip, "decrypt_s": decrypt,
            "server_s": open_envelope(response).meta["server_seconds"], "request_bytes": len(request),
            "response_bytes": len(response), "key_bytes": session.keyring.evaluation_keys().size_bytes,
            "params": session.he["parameters"]}


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
    args = build_parser().parse_args(argv)  # before torch: --help and usage errors stay instant
    from veil.training.uldnet import (
        ModelConfig,
        TrainConfig,
        load_digits_preset,
        load_uldnet,
        multiplicative_depth,
    )
    from veil.training.uldnet.config import DIGITS_PRESETS
    from veil.training.uldnet.trainer import accuracy

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
    he_report = _prepare_encrypted(args, data, repo)
    sampler_status = _prepare_sampler(args, repo)
    x_test = data.x_test.astype(np.float32)
    with running_server(repo) as url:
        served, latency = classify_plain(url, "digits", x_test)
        print(f"served by `veil serve` over OIP v2 (binary tensors, tritonclient): test acc "
              f"{100 * float((served == data.y_test).mean()):.2f}% (local {100 * rows[0][1]:.2f}%), median request of "
              f"32 images {latency:.1f} ms")
        plain = {"latency": classify_plain(url, "digits-cnn-he-plain", x_test)[0],
                 "throughput": classify_plain(url, "digits-mlp", x_test)[0]}
        n_latency = min(args.he_images, len(x_test))
        runs_he = {"latency": classify_encrypted(url, "digits-he", x_test[:n_latency], args.out / "keys" / "latency.keyring"),
                   "throughput": classify_encrypted(url, "digits-he-batch", x_test, args.out / "keys" / "throughput.keyring")}
        draws = sample_posteriors(url, SAMPLER_NAME)
    _print_encrypted(he_report, runs_he, plain, data.y_test, n_latency)
    _print_sampler(draws, sampler_status)
    print("server stopped")
    return 0


def _prepare_encrypted(args: argparse.Namespace, data, repo: Path) -> dict:
    """Train (or reuse) the `digits-he` PolyCNN and PolyMLP; export each as ONNX and as an HE plan.

    The PolyCNN runs in latency mode (pow2 rotation keys: the fewest key bytes to register); the PolyMLP in
    throughput mode (the PolyCNN's throughput plan takes minutes per call on two cores)."""
    from veil.export import export_uldnet
    from veil.export.he import export_he
    from veil.training.uldnet import ModelConfig, TrainConfig
    from veil.training.uldnet.config import DIGITS_HE_PRESETS

    paths = {}
    for arch in ("cnn", "mlp"):
        preset = DIGITS_HE_PRESETS[arch]
        paths[arch] = args.out / f"poly{arch}-he"
        model_config = ModelConfig(input_shape=data.input_shape, **preset["model"])
        train_config = TrainConfig(seed=args.seed, **preset["train"])
        _train_or_reuse(paths[arch], model_config, train_config, data, args.retrain, not args.no_progress)
    export_uldnet(paths["cnn"], repo, name="digits-cnn-he-plain")
    export_uldnet(paths["mlp"], repo, name="digits-mlp")
    latency = export_he(paths["cnn"], repo, "digits-he", mode="latency", rotation_keys="pow2",
                        progress=not args.no_progress)
    export_he(paths["mlp"], repo, "digits-he-batch", mode="throughput", progress=not args.no_progress)
    return latency


SAMPLER_NAME = "gl2"
SAMPLER_X = [0.6, -0.4]  # the observation the demo conditions on
# a prior chosen at request time, much narrower than the training prior N(0, 0.1 I) and off its centre
SAMPLER_PRIOR = {"family": "gaussian", "mean": [0.3, 0.1], "std": [0.12, 0.12]}


def _prepare_sampler(args: argparse.Namespace, repo: Path) -> str:
    """Train (or reuse) a PriorGuide score network on the 2-D Gaussian-linear task; export it to ``repo``."""
    from veil.export.sampler import export_sampler
    from veil.training.priorguide.cli import main as train_sampler

    path = args.out / "sampler-gl2"
    steps = 4000  # ~10 s on one core; the defaults (20,000) are for the benchmarks
    argv = ["--task", "gaussian_linear", "--dim", "2", "--steps", str(steps), "--seed", str(args.seed), "--out", str(path)]
    status = "reused"
    saved = path / "config.json"
    train = json.loads(saved.read_text()).get("train", {}) if saved.is_file() else {}
    if args.retrain or (train.get("steps"), train.get("seed")) != (steps, args.seed):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the trainer prints its metrics JSON
            train_sampler([*argv, *(["--no-progress"] if args.no_progress else [])])
        status = f"trained in {time.perf_counter() - start:.0f} s"
    export_sampler(path, repo, SAMPLER_NAME)
    return status


def sample_posteriors(url: str, model: str) -> dict[str, dict]:
    """1,000 draws over OIP v2 JSON, without a prior (the training posterior) and under ``SAMPLER_PRIOR``."""
    out = {}
    for label, prior in (("training prior (unguided)", None), ("new prior (PriorGuide)", SAMPLER_PRIOR)):
        parameters = {"num_samples": 1000, "seed": 0, **({"prior": prior} if prior else {})}
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": SAMPLER_X}], "parameters": parameters}
        request = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=120) as response:
            result = json.loads(response.read())
        seconds = time.perf_counter() - start
        outputs = {o["name"]: o for o in result["outputs"]}
        samples = np.asarray(outputs["samples"]["data"], dtype=np.float64).reshape(outputs["samples"]["shape"])
        out[label] = {"samples": samples, "prior": prior, "seconds": seconds,
                      "diagnostics": json.loads(outputs["diagnostics"]["data"][0])}
    return out


def _print_sampler(draws: dict[str, dict], status: str) -> None:
    """Sample mean and std against the analytic Gaussian-linear posterior under each prior."""
    import torch

    from veil.posterior.priors import prior_from_spec
    from veil.training.priorguide.simulators import get_task

    task = get_task("gaussian_linear", 2)
    x = torch.tensor(SAMPLER_X, dtype=torch.float64)
    print(f"\nPriorGuide posterior sampling (2-D Gaussian linear, x = {SAMPLER_X}; score network {status}; served as a "
          f"torch.export program): 1,000 draws per request over HTTP")
    header = f"{'prior':<27} {'sample mean':>17} {'analytic mean':>17} {'sample std':>15} {'analytic std':>15} {'NFE':>5} {'s':>5}"
    print(header)
    print("-" * len(header))
    for label, run in draws.items():
        exact = task.posterior(x, prior_from_spec(run["prior"]) if run["prior"] else None)
        mean, std = run["samples"].mean(0), run["samples"].std(0)
        fmt = lambda v: "[" + ", ".join(f"{a:+.3f}" for a in v) + "]"  # noqa: E731
        print(f"{label:<27} {fmt(mean):>17} {fmt(exact.loc.tolist()):>17} {fmt(std):>15} "
              f"{fmt(exact.cov.diagonal().sqrt().tolist()):>15} {run['diagnostics'].get('nfe', '?'):>5} {run['seconds']:>5.2f}")
    print(f"(new prior {SAMPLER_PRIOR}: no retraining; the network only ever saw the training prior N(0, 0.1 I))")


def _print_encrypted(manifest: dict, runs_he: dict, plain: dict[str, np.ndarray], labels: np.ndarray,
                     n_latency: int) -> None:
    params = manifest["parameters"]
    print(f"\nencrypted inference (CKKS, 128-bit): latency = the digits-he PolyCNN, N={params['poly_modulus_degree']}, "
          f"chain {params['coeff_mod_bit_sizes']}, {manifest['levels']} levels "
          f"({manifest['parameter_choice']['batch_capacity']} images per ciphertext); throughput = the digits-he PolyMLP")
    header = f"{'mode':<11} {'images':>6} {'plain acc':>9} {'enc acc':>8} {'agree':>6} {'keygen s':>8} {'encrypt s':>9} " \
             f"{'server s':>8} {'decrypt s':>9} {'keys MB':>7} {'req MB':>7} {'resp MB':>7}"
    print(header)
    print("-" * len(header))
    for mode, run in runs_he.items():
        n = len(run["logits"])
        pred = run["logits"].argmax(1)
        ref = plain[mode][:n]
        print(f"{mode:<11} {n:>6} {100 * float((ref == labels[:n]).mean()):>8.2f}% "
              f"{100 * float((pred == labels[:n]).mean()):>7.2f}% {100 * float((pred == ref).mean()):>5.1f}% "
              f"{run['keygen_s']:>8.2f} {run['encrypt_s']:>9.2f} {run['server_s']:>8.2f} {run['decrypt_s']:>9.2f} "
              f"{run['key_bytes'] / 2**20:>7.1f} {run['request_bytes'] / 2**20:>7.1f} {run['response_bytes'] / 2**20:>7.1f}")
    print(f"(latency mode: the first {n_latency} test images side by side in the slots of one request; throughput "
          "mode: the whole test split in one call; the server never holds the secret key)")


if __name__ == "__main__":
    sys.exit(main())
