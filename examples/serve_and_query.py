"""Start `veil serve` on a model repository, query it with the stock tritonclient, print the result, stop it.

    python examples/serve_and_query.py                          # builds a tiny repository (affine y = xW + b)
    python examples/serve_and_query.py --repo models/ --model digits

The server runs as `python -m veil.cli serve --repo DIR` on 127.0.0.1; the client sends binary tensors
(Triton's binary tensor extension), exactly as it would to NVIDIA Triton.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as triton
from veil.engine.protocol import DATATYPES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(client: triton.InferenceServerClient, server: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("veil serve exited before becoming ready (see its log above)")
        try:
            if client.is_server_ready():
                return
        except Exception:  # connection refused while the server starts
            pass
        time.sleep(0.1)
    raise RuntimeError(f"veil serve was not ready after {timeout} s")


def query(url: str, model: str) -> dict[str, np.ndarray]:
    """Random inputs of the model's declared shapes (-1 -> 1), one binary inference, all outputs."""
    client = triton.InferenceServerClient(url)
    meta = client.get_model_metadata(model)
    rng, inputs = np.random.default_rng(0), []
    for spec in meta["inputs"]:
        shape = [1 if d < 0 else d for d in spec["shape"]]
        data = rng.normal(size=shape).astype(DATATYPES[spec["datatype"]])
        inputs.append(triton.InferInput(spec["name"], shape, spec["datatype"]))
        inputs[-1].set_data_from_numpy(data, binary_data=True)
    outputs = [triton.InferRequestedOutput(o["name"], binary_data=True) for o in meta["outputs"]]
    result = client.infer(model, inputs, outputs=outputs)
    return {o["name"]: result.as_numpy(o["name"]) for o in meta["outputs"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=None, help="model repository (default: build a tiny one)")
    parser.add_argument("--model", default="affine", help="model to query")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        repo = args.repo
        if repo is None:
            from veil.engine.toy import affine_model, write_repository

            repo = write_repository(Path(tmp) / "repo", {"affine": affine_model()}, max_batch_size=8)
        port = args.port or free_port()
        server = subprocess.Popen([sys.executable, "-m", "veil.cli", "serve", "--repo", str(repo),
                                   "--port", str(port), "--log-level", "warning"])
        try:
            url = f"127.0.0.1:{port}"
            wait_ready(triton.InferenceServerClient(url), server)
            for name, value in query(url, args.model).items():
                print(f"{args.model} -> {name} {list(value.shape)}: {np.array2string(value, precision=4)}")
        finally:
            server.terminate()  # SIGTERM: uvicorn finishes in-flight requests, then exits
            server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
