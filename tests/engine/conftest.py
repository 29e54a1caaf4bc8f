"""Fixtures: a tmp model repository of tiny ONNX models and an in-process app/client over it."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient
from veil.engine.protocol import DATATYPES, decode_bytes, encode_bytes
from veil.engine.server import ServerConfig, build_server, create_app
from veil.engine.toy import affine_model, dtypes_model, write_repository

TOKEN = "test-admin-token"


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """affine (no batching, versions 1 and 2, latest policy), batched (dynamic batching), dtypes (4 types)."""
    root = tmp_path_factory.mktemp("repo")
    write_repository(root, {"affine": affine_model()}, max_batch_size=8, versions=(1, 2))
    write_repository(root, {"batched": affine_model()}, max_batch_size=16,
                     batching={"batched": "max_queue_delay_microseconds: 20000 default_queue_policy { max_queue_size: 64 }"})
    write_repository(root, {"dtypes": dtypes_model()})
    (root / "affine" / "veil.json").write_text('{"kind": "onnx", "source": "toy"}')
    return root


def make_config(repo: Path, **kwargs) -> ServerConfig:
    return ServerConfig(repo=str(repo), log_level="warning", intra_op_threads=1, **kwargs)


@pytest.fixture(scope="module")
def client(repo: Path):
    with TestClient(create_app(make_config(repo, admin_token=TOKEN, max_body_mb=1.0))) as c:
        yield c


@contextlib.contextmanager
def live_server(config: ServerConfig) -> Iterator[tuple[str, uvicorn.Server]]:
    """Run a real uvicorn server on 127.0.0.1 (a free port) in a thread; yields ("127.0.0.1:port", server)."""
    server = build_server(config.replace(host="127.0.0.1", port=0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the live server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def free_port() -> int:
    """A port nothing listens on now (bound to 0 on 127.0.0.1, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A ``veil serve`` subprocess on 127.0.0.1: its HTTP and gRPC addresses and its memory (from /proc)."""

    def __init__(self, process: subprocess.Popen, port: int, grpc_port: int) -> None:
        self.process, self.url, self.grpc = process, f"127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"

    def memory_mb(self, field: str = "VmHWM") -> float:
        """``VmHWM`` (peak resident set) or ``VmRSS`` of the server process, MiB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"/proc/{self.process.pid}/status has no {field}")


@contextlib.contextmanager
def server_process(repo: Path, *flags: str, timeout_s: float = 60) -> Iterator[ServerProcess]:
    """Run ``veil serve --repo repo`` (HTTP and gRPC on free loopback ports, ``flags`` added) in a subprocess
    until it answers ready; stops it (SIGINT, then kill) on exit. Memory tests read its peak RSS."""
    import httpx

    port, grpc_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "veil.engine.cli", "--repo", str(repo), "--host", "127.0.0.1", "--port", str(port),
           "--grpc-port", str(grpc_port), "--log-level", "warning", "--intra-op-threads", "1", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"veil serve exited with {process.returncode}: {process.stderr.read().decode()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("veil serve did not become ready")
            time.sleep(0.2)
        yield ServerProcess(process, port, grpc_port)
    finally:
        process.send_signal(2)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def binary_body(inputs: list[tuple[str, str, np.ndarray]], outputs: list[tuple[str, bool]] | None = None,
                **params) -> tuple[bytes, dict[str, str]]:
    """A JSON + binary inference body (Triton's binary tensor extension) and its headers."""
    blobs, specs = [], []
    for name, datatype, array in inputs:
        raw = encode_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
        blobs.append(raw)
        specs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                      "parameters": {"binary_data_size": len(raw)}})
    head: dict = {"id": "b1", "inputs": specs}
    if outputs is not None:
        head["outputs"] = [{"name": n, "parameters": {"binary_data": b}} for n, b in outputs]
    if params:
        head["parameters"] = params
    text = json.dumps(head).encode()
    return text + b"".join(blobs), {"Inference-Header-Content-Length": str(len(text)),
                                    "Content-Type": "application/octet-stream"}


def decode_binary_response(response) -> dict[str, np.ndarray]:
    """name -> array from a (possibly binary) inference response."""
    length = response.headers.get("inference-header-content-length")
    body = response.content
    head = json.loads(body[:int(length)] if length else body)
    out, offset = {}, int(length or 0)
    for o in head["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is None:
            data = o["data"]
            out[o["name"]] = np.array(data, dtype=object if o["datatype"] == "BYTES" else DATATYPES[o["datatype"]])
        elif o["datatype"] == "BYTES":
            out[o["name"]] = decode_bytes(o["name"], body[offset:offset + size], int(np.prod(o["shape"])))
        else:
            out[o["name"]] = np.frombuffer(body[offset:offset + size], DATATYPES[o["datatype"]])
        out[o["name"]] = out[o["name"]].reshape(o["shape"])
        offset += size or 0
    return out


@pytest.fixture(scope="session")
def oip():
    """The helpers above as one fixture (tests run in importlib mode and cannot import conftest)."""
    return types.SimpleNamespace(binary_body=binary_body, decode=decode_binary_response, live_server=live_server,
                                 make_config=make_config, token=TOKEN, server_process=server_process)


def _write_lora_toy(folder: Path) -> None:
    """An adapter-as-input model as `veil export adapters` writes one (``lora.A``/``lora.B`` graph inputs whose
    initializers are zeros) and one adapter ``t1``, built directly (exporting a transformer costs ~9 s of CPU)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from veil.engine.toy import affine_weights

    w, b = affine_weights()
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["base"]),
             helper.make_node("MatMul", ["x", "lora.A"], ["xa"]), helper.make_node("MatMul", ["xa", "lora.B"], ["d"]),
             helper.make_node("Add", ["base", "d"], ["y"])]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "lora_toy",
        [value("x", TensorProto.FLOAT, ["batch", 4]), value("lora.A", TensorProto.FLOAT, [4, 2]),
         value("lora.B", TensorProto.FLOAT, [2, 3])], [value("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b"),
                     numpy_helper.from_array(np.zeros((4, 2), np.float32), "lora.A"),
                     numpy_helper.from_array(np.zeros((2, 3), np.float32), "lora.B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True)
    (folder / "adapters").mkdir()
    onnx.save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(
        'name: "tiny"\nbackend: "onnxruntime"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'dynamic_batching { max_queue_delay_microseconds: 500 }\n')
    rng = np.random.default_rng(0)
    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    adapter.set_parameters({n: ort.OrtValue.ortvalue_from_numpy(rng.normal(size=shape).astype(np.float32))
                            for n, shape in (("lora.A", (4, 2)), ("lora.B", (2, 3)))})
    adapter.export_adapter(str(folder / "adapters" / "t1.onnx_adapter"))


@pytest.fixture(scope="session")
def write_lora_toy() -> Callable[[Path], None]:
    """``write_lora_toy(folder)`` writes the adapter model ``tiny`` (an affine graph, ORT LoRA inputs ``lora.A`` /
    ``lora.B``, one adapter ``t1``) into ``folder`` (the gRPC kinds and Ray tests serve it)."""
    return _write_lora_toy


@pytest.fixture(scope="module")
def tiny_he_repo(tmp_path_factory: pytest.TempPathFactory, tiny_polymlp) -> Path:
    """The tiny PolyMLP (tests/conftest.py) as plain ONNX ("plain") and as a latency HE plan ("tiny-he"); one
    repository per test module (servers write their key store into it)."""
    from veil.export import export_uldnet
    from veil.export.he import export_he

    checkpoint, _ = tiny_polymlp
    repo = tmp_path_factory.mktemp("tiny-he") / "repo"
    export_uldnet(checkpoint, repo, name="plain")
    export_he(checkpoint, repo, "tiny-he", mode="latency")
    return repo
