"""veil's repository on Ray Serve: a local Ray cluster on loopback, started and stopped in this module.

One module-scoped cluster (2 CPUs, 80 MiB object store) serves the toy `wide` model with two replicas of half a
CPU each and the adapter model `tiny` with one; stock ``tritonclient.http`` talks to Ray's HTTP proxy unchanged, stock ``tritonclient.grpc`` to the
front's gRPC server.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
th = pytest.importorskip("tritonclient.http")
tg = pytest.importorskip("tritonclient.grpc")
httpx = pytest.importorskip("httpx")

from veil.engine import ray_config, ray_serve  # noqa: E402
from veil.engine.server_config import ServerConfig  # noqa: E402
from veil.engine.toy import digits_model, write_repository  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
# Ray renices its workers to +15 (19 under `nice -n 10`): on a busy shared machine they then starve for minutes;
# 0 keeps the test's own niceness. Serve kills a proxy not ready within 5 s: slow machines need longer.
SLOW_MACHINE = {"RAY_worker_niceness": "0", "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
                "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30"}


ADMIN_TOKEN = "ray-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, write_lora_toy):
    """`wide` with 2 replicas (its config.pbtxt instance_group count) and the adapter model `tiny` with 1."""
    repo = write_repository(tmp_path_factory.mktemp("ray") / "repo", {"wide": digits_model(hidden=256)},
                            max_batch_size=8)
    pbtxt = repo / "wide" / "config.pbtxt"
    pbtxt.write_text(pbtxt.read_text().replace("count: 1", "count: 2"))
    write_lora_toy(repo / "tiny")
    # the local cluster's processes inherit this environment
    saved = {k: os.environ.get(k) for k in SLOW_MACHINE}
    os.environ.update(SLOW_MACHINE)
    for attempt in (1, 2):  # Ray waits a fixed 30 s for its raylet: an overloaded machine can miss that once
        try:
            ray.init(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            break
        except Exception as exc:
            ray.shutdown()
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
    port, grpc_port = _free_port(), _free_port()
    config = ServerConfig(repo=str(repo), host="127.0.0.1", grpc_port=grpc_port, admin_token=ADMIN_TOKEN)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run_many(ray_serve.app(repo, config, replica_cpus=0.5))
        yield f"127.0.0.1:{port}", repo, f"127.0.0.1:{grpc_port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


def _input(x: np.ndarray):
    tensor = th.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    return tensor


def _replicas(url: str, want: int, timeout: float = 60.0, exclude: frozenset = frozenset(),
              successes: int = 0) -> list[dict]:
    """The stats' replica entries once ``want`` replicas (not in ``exclude``) have answered and their reports
    add up to ``successes`` (each replica reports every REPORT_S: the last answers lag; bounded wait)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(f"http://{url}/v2/models/wide/stats", timeout=10).json()["model_stats"][0]
        rows = [r for r in stats["replicas"] if r["replica"] not in exclude and r["inference_count"] > 0]
        if (len(rows) >= want and sum(r["success_count"] for r in rows) >= successes) or time.monotonic() > deadline:
            return rows
        time.sleep(ray_config.REPORT_S)


def test_two_replicas_answer_stock_tritonclient(cluster):
    url, repo, _ = cluster
    import onnxruntime as ort

    client = th.InferenceServerClient(url)
    assert client.is_server_ready() and client.is_model_ready("wide")
    assert client.get_model_metadata("wide")["outputs"][0]["name"] == "logits"
    x = np.random.default_rng(0).normal(size=(3, 1, 8, 8)).astype(np.float32)
    expected = ort.InferenceSession(str(repo / "wide" / "1" / "model.onnx")).run(None, {"x": x})[0]
    for _ in range(24):
        result = client.infer("wide", [_input(x)])
        np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
    rows = _replicas(url, 2, successes=24)
    assert len(rows) == 2, rows  # both replicas answered, and the summed stats say so
    total = httpx.get(f"http://{url}/v2/models/wide/stats", timeout=10).json()["model_stats"][0]
    assert total["inference_stats"]["success"]["count"] == sum(r["success_count"] for r in total["replicas"]) >= 24
    # server-wide routes on the front; a '<model>:<adapter>' name is forwarded to the model's replicas
    assert httpx.get(f"http://{url}/v2/health/ready", timeout=30).json()["ready"] is True
    missing = httpx.post(f"http://{url}/v2/models/nope/infer", json={"inputs": []}, timeout=10)
    assert missing.status_code == 404 and "nope" in missing.json()["error"]
    adapter = httpx.get(f"http://{url}/v2/models/wide:lora1", timeout=30)
    assert adapter.status_code == 404 and "adapter" in adapter.json()["error"]
    assert adapter.headers["veil-replica"] in {r["replica"] for r in rows}


def test_stock_grpc_client_through_the_front(cluster):
    """The front's gRPC server: model calls answered by the model's replicas (same results and errors as
    `veil serve`), statistics summed over replicas, the repository API behind the admin token."""
    import onnxruntime as ort

    url, repo, grpc_url = cluster
    client = tg.InferenceServerClient(grpc_url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("wide")
    assert "ray_serve" in client.get_server_metadata(as_json=True)["extensions"]
    assert client.get_model_metadata("wide", as_json=True)["outputs"][0]["name"] == "logits"
    assert client.get_model_config("wide", as_json=True)["config"]["max_batch_size"] == 8
    x = np.random.default_rng(1).normal(size=(2, 1, 8, 8)).astype(np.float32)
    expected = ort.InferenceSession(str(repo / "wide" / "1" / "model.onnx")).run(None, {"x": x})[0]
    # the counts include earlier tests on this cluster (each waited for its own reports): wait for these 8 on top
    before = sum(r["success_count"] for r in _replicas(url, 0))
    for _ in range(8):
        tensor = tg.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_allclose(client.infer("wide", [tensor]).as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
    rows = _replicas(url, 1, successes=before + 8)
    stats = client.get_inference_statistics("wide", as_json=True)["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) == sum(r["success_count"] for r in rows) >= before + 8
    # errors keep the replica's message and map to the code `veil serve` gives
    with pytest.raises(tg.InferenceServerException) as bad_shape:
        wrong = tg.InferInput("x", [1, 3], "FP32")
        wrong.set_data_from_numpy(np.ones((1, 3), np.float32))
        client.infer("wide", [wrong])
    assert bad_shape.value.status() == "StatusCode.INVALID_ARGUMENT" and "'x'" in bad_shape.value.message()
    with pytest.raises(tg.InferenceServerException) as missing:
        client.get_model_metadata("nope")
    assert missing.value.status() == "StatusCode.NOT_FOUND" and "nope" in missing.value.message()
    with pytest.raises(tg.InferenceServerException) as adapter:
        client.get_model_metadata("wide:lora1")  # routed to a replica, which has no adapters
    assert adapter.value.status() == "StatusCode.NOT_FOUND" and "adapter" in adapter.value.message()
    # the repository API: refused without the token, Triton's index with it
    with pytest.raises(tg.InferenceServerException) as refused:
        client.get_model_repository_index()
    assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
    index = client.get_model_repository_index(headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, as_json=True)
    assert [(m["name"], m["state"]) for m in index["models"]] == [("tiny", "READY"), ("wide", "READY")]


def test_adapters_are_multiplexed_over_both_fronts(cluster):
    """An adapter request, by Ray's multiplexing header, by `<model>:<adapter>` through the front, and over gRPC,
    gives the base graph plus x A B of the adapter's own arrays; the replica's adapter cache holds it."""
    import onnxruntime as ort
    from veil.engine.toy import affine_weights

    url, repo, grpc_url = cluster
    arrays = {name: value.numpy() for name, value in
              ort.AdapterFormat.read_adapter(str(repo / "tiny" / "adapters" / "t1.onnx_adapter")).get_parameters().items()}
    w, b = affine_weights()
    x = np.random.default_rng(2).normal(size=(2, 4)).astype(np.float32)
    base, expected = x @ w + b, x @ w + b + x @ arrays["lora.A"] @ arrays["lora.B"]
    tensor = th.InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    client = th.InferenceServerClient(url)
    np.testing.assert_allclose(client.infer("tiny", [tensor]).as_numpy("y"), base, rtol=1e-5, atol=1e-5)
    routed = client.infer("tiny", [tensor], headers={ray_config.MULTIPLEX_HEADER: "t1"}).as_numpy("y")
    by_name = client.infer("tiny:t1", [tensor]).as_numpy("y")  # through the front, forwarded with the adapter
    g_tensor = tg.InferInput("x", [2, 4], "FP32")
    g_tensor.set_data_from_numpy(x)
    over_grpc = tg.InferenceServerClient(grpc_url).infer("tiny:t1", [g_tensor]).as_numpy("y")
    for got in (routed, by_name, over_grpc):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert np.abs(expected - base).max() > 1e-3  # the adapter changes the answer
    with pytest.raises(tg.InferenceServerException) as unknown:
        tg.InferenceServerClient(grpc_url).infer("tiny:nope", [g_tensor])
    assert unknown.value.status() == "StatusCode.NOT_FOUND" and "nope" in unknown.value.message()
    deadline = time.monotonic() + 30
    while True:  # replicas report every REPORT_S
        stats = httpx.get(f"http://{url}/v2/models/tiny/stats", timeout=10).json()["model_stats"][0]
        caches = [r.get("adapter_cache", {}) for r in stats["replicas"]]
        if any("t1" in str(c) for c in caches) or time.monotonic() > deadline:
            break
        time.sleep(ray_config.REPORT_S)
    assert any("t1" in str(c) for c in caches), stats


def test_killed_replica_is_replaced_and_only_in_flight_requests_fail(cluster):
    url, _, _ = cluster
    before = _replicas(url, 2)
    assert len(before) == 2
    x = np.ones((1, 1, 8, 8), np.float32)
    lock, state = threading.Lock(), {"in_flight": 0, "ok": 0, "failed": 0}
    in_flight_at_kill: list[int] = []
    requests_per_worker = 60

    def worker() -> None:
        client = th.InferenceServerClient(url, network_timeout=60)
        for _ in range(requests_per_worker):
            with lock:
                state["in_flight"] += 1
            try:
                client.infer("wide", [_input(x)])
                outcome = "ok"
            except Exception:  # the request that was running on the killed replica
                outcome = "failed"
            with lock:
                state["in_flight"] -= 1
                state[outcome] += 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    while state["ok"] < 20:
        time.sleep(0.01)
    with lock:
        in_flight_at_kill.append(state["in_flight"])
        os.kill(before[0]["pid"], signal.SIGKILL)
    for t in threads:
        t.join(timeout=120)
    print(f"killed replica {before[0]['replica']}: {state['failed']} failed of {4 * requests_per_worker}, "
          f"{in_flight_at_kill[0]} in flight at the kill")
    assert state["ok"] + state["failed"] == 4 * requests_per_worker
    assert state["failed"] <= in_flight_at_kill[0], (state, in_flight_at_kill)
    # Ray replaces the replica: a new one answers beside the survivor
    client = th.InferenceServerClient(url)
    deadline = time.monotonic() + 90
    replaced: list[dict] = []
    while not replaced and time.monotonic() < deadline:
        for _ in range(8):
            client.infer("wide", [_input(x)])
        replaced = _replicas(url, 1, timeout=2, exclude=frozenset(r["replica"] for r in before))
    assert replaced and replaced[0]["pid"] != before[0]["pid"]
