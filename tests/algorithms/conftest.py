"""Shared by the algorithms tests: 2-D blobs (the spec's test set, at a CI size) and a stand-in OIP embedding
server on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest


def make_blobs(n: int, k: int, seed: int = 0, spread: float = 10.0) -> np.ndarray:
    """n 2-D points around k centres drawn uniformly in [-spread, spread]^2, unit normal noise."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-spread, spread, (k, 2))
    return centres[rng.integers(k, size=n)] + rng.normal(size=(n, 2))


@pytest.fixture(scope="session")
def blobs() -> np.ndarray:
    return make_blobs(300, 3, seed=1)


class _EmbeddingServer(BaseHTTPRequestHandler):
    """A stand-in OIP v2 model: ``/v2/models/emb/infer`` echoes its FP32 input ``x`` as ``embedding``."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v2/models/emb/infer":
            self._reply(404, {"error": f"model {self.path} not found"})
            return
        (tensor,) = body["inputs"]
        self._reply(200, {"model_name": "emb", "outputs": [{"name": "embedding", "datatype": "FP32",
                                                             "shape": tensor["shape"], "data": tensor["data"]}]})

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def server_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmbeddingServer)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
