"""Encrypted inference fanned out over Ray actors (veil.engine.he_fanout, issue 20 §3): a local Ray cluster on
loopback, started and stopped in this module; `veil serve`'s HTTP front with the HE model's ciphertext chunks
evaluated by two worker processes."""

from __future__ import annotations

import os

import httpx
import numpy as np
import onnxruntime as ort
import pytest

ray = pytest.importorskip("ray")

from veil.engine.he_fanout import WorkerPool  # noqa: E402
from veil.he.client import HeSession  # noqa: E402
from veil.he.envelope import open_envelope  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_worker_niceness", "0")  # see test_ray_serve.py
    ray.init(num_cpus=4, object_store_memory=80 * 2**20, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_a_multi_ciphertext_request_is_split_over_two_workers_and_matches_plaintext(tiny_he_repo, cluster, oip,
                                                                                     tmp_path) -> None:
    config = oip.make_config(tiny_he_repo)
    with oip.live_server(config) as (url, server):
        model = server.config.app.state.dataplane.get_model("tiny-he")
        pool = WorkerPool(str(model.path.parent), config.to_dict(), workers=2, cpus=0.5)
        assert pool.wait_ready(120)
        model.fan_out = pool  # what a Ray Serve replica with --he-workers 2 sets
        session = HeSession.create(f"http://{url}", "tiny-he", tmp_path / "k.keyring")
        capacity = session.layout(0).batch_capacity
        x = np.random.default_rng(1).normal(size=(3 * capacity + 1, 6)).astype(np.float32)  # 4 ciphertexts
        result = session.infer(session.encrypt(x))
        logits = session.decrypt(result)
    expected = ort.InferenceSession(str(tiny_he_repo / "plain" / "1" / "model.onnx")).run(None, {"x": x})[0]
    assert np.abs(logits - expected).max() < 1e-2 and np.array_equal(logits.argmax(1), expected.argmax(1))
    assert open_envelope(result, expect_kind="result").meta["ciphertexts"] == 4
    stats = pool.stats()
    assert sorted(s["ciphertexts"] for s in stats) == [2, 2]  # chunks of 2 + 2, one per worker
    assert len({s["pid"] for s in stats} | {os.getpid()}) == 3  # two worker processes besides this one


def test_workers_the_cluster_cannot_place_never_hold_a_request(tiny_he_repo, cluster, oip, tmp_path) -> None:
    """A pool asking for more CPUs than the cluster has stays unready and the server evaluates requests itself
    (before: ray.get waited for the pending actors and the request hung)."""
    config = oip.make_config(tiny_he_repo)
    with oip.live_server(config) as (url, server):
        model = server.config.app.state.dataplane.get_model("tiny-he")
        pool = WorkerPool(str(model.path.parent), config.to_dict(), workers=2, cpus=64)
        model.fan_out = pool
        session = HeSession.create(f"http://{url}", "tiny-he", tmp_path / "k.keyring")
        x = np.random.default_rng(3).normal(size=(2 * session.layout(0).batch_capacity, 6)).astype(np.float32)
        logits = session.decrypt(session.infer(session.encrypt(x)))
    assert not pool.ready and not pool.wait_ready(0.1)
    for worker in pool.workers:
        ray.kill(worker)
    expected = ort.InferenceSession(str(tiny_he_repo / "plain" / "1" / "model.onnx")).run(None, {"x": x})[0]
    assert np.abs(logits - expected).max() < 1e-2


def test_a_worker_checks_the_key_owner_again(tiny_he_repo, cluster, oip, tmp_path) -> None:
    """The replica checked the secret; a worker called directly (any caller of the actor) checks it too."""
    from veil.he.errors import HEError

    config = oip.make_config(tiny_he_repo)
    with oip.live_server(config) as (url, server):
        model = server.config.app.state.dataplane.get_model("tiny-he")
        session = HeSession.create(f"http://{url}", "tiny-he", tmp_path / "k.keyring")
    payload = open_envelope(session.encrypt(np.zeros((1, 6), np.float32)), expect_kind="request").payload
    pool = WorkerPool(str(model.path.parent), config.to_dict(), workers=1, cpus=0.5)
    with pytest.raises(HEError):
        pool(0, session.key_id, "not-the-secret", [payload])
    assert len(pool(0, session.key_id, session.key_secret, [payload])) > 0


def test_veil_serve_ray_with_he_workers_splits_requests(tiny_he_repo, cluster, tmp_path) -> None:
    """The Ray Serve wiring (`veil serve --ray --he-workers 2`): the replica starts its workers and uses them."""
    import socket

    from ray import serve
    from veil.engine import ray_config, ray_serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run_many(ray_serve.app(tiny_he_repo, replicas=1, replica_cpus=0.5, he_workers=2, he_worker_cpus=0.25))
        # keys: the front spools the upload into the shared key folder and a replica registers it from there
        session = HeSession.create(f"http://127.0.0.1:{port}", "tiny-he", tmp_path / "k.keyring")
        key_dir = tiny_he_repo / ".he-keys"
        assert (key_dir / f"{session.key_id}.evk").is_file() and not list(key_dir.glob(".upload-*"))
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:  # declares 1 TiB, sends 64 bytes
            raw.sendall(f"POST /v2/he/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {2**40}\r\n\r\n".encode()
                        + b"\0" * 64)
            chunks = []
            while chunk := raw.recv(65536):  # the server closes the connection after a 413
                chunks.append(chunk)
            answer = b"".join(chunks).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 413") and "key bundle: expected at most" in answer, answer
        garbage = httpx.post(f"http://127.0.0.1:{port}/v2/he/keys", content=b"not keys", timeout=30)
        assert garbage.status_code == 400, garbage.text  # the replica's refusal, passed on with its status
        assert not list(key_dir.glob(".upload-*"))
        x = np.random.default_rng(2).normal(size=(2 * session.layout(0).batch_capacity, 6)).astype(np.float32)
        logits = session.decrypt(session.infer(session.encrypt(x)))
        stats = serve.get_app_handle(ray_config.model_app_name("tiny-he")).he_worker_stats.remote().result()
    finally:
        serve.shutdown()
    expected = ort.InferenceSession(str(tiny_he_repo / "plain" / "1" / "model.onnx")).run(None, {"x": x})[0]
    assert np.abs(logits - expected).max() < 1e-2
    assert [s["ciphertexts"] for s in stats] == [1, 1]
