"""A real uvicorn server on 127.0.0.1: stock tritonclient (binary and JSON), batching, load, graceful shutdown."""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException
from veil.engine.toy import affine_model, affine_weights, write_repository


@pytest.fixture(scope="module")
def live(repo, oip):
    with oip.live_server(oip.make_config(repo, admin_token=oip.token)) as (url, server):
        yield url, server


def expected_y(x: np.ndarray) -> np.ndarray:
    w, b = affine_weights()
    return x @ w + b


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_roundtrip(live, binary: bool) -> None:
    url, _ = live
    client = triton.InferenceServerClient(url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("affine") and client.is_model_ready("affine", "2")
    assert client.get_server_metadata()["name"] == "veil"
    assert client.get_model_metadata("affine")["inputs"][0]["shape"] == [-1, 4]
    assert client.get_model_config("affine")["max_batch_size"] == 8
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    inp = triton.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    result = client.infer("affine", [inp], outputs=[triton.InferRequestedOutput("y", binary_data=binary)],
                          request_id="r1")
    np.testing.assert_allclose(result.as_numpy("y"), expected_y(x), rtol=1e-5)
    assert result.get_response()["id"] == "r1"
    default = client.infer("affine", [inp])  # no outputs: binary_data_output=True, all outputs
    np.testing.assert_allclose(default.as_numpy("y"), expected_y(x), rtol=1e-5)
    assert client.get_inference_statistics("affine")["model_stats"][0]["inference_count"] >= 6


def test_tritonclient_dtypes_and_errors(live) -> None:
    url, _ = live
    client = triton.InferenceServerClient(url)
    arrays = {"ids": np.array([[1, 2, 3]], np.int64), "mask": np.array([[True, False, False]]),
              "half": np.array([[1, 2, 3]], np.float16), "text": np.array([[b"a", b"xyz", b""]], dtype=object)}
    inputs = []
    for name, datatype in (("ids", "INT64"), ("mask", "BOOL"), ("half", "FP16"), ("text", "BYTES")):
        inputs.append(triton.InferInput(name, [1, 3], datatype))
        inputs[-1].set_data_from_numpy(arrays[name], binary_data=True)
    result = client.infer("dtypes", inputs)
    np.testing.assert_array_equal(result.as_numpy("ids2"), arrays["ids"] * 2)
    np.testing.assert_array_equal(result.as_numpy("not_mask"), ~arrays["mask"])
    np.testing.assert_array_equal(result.as_numpy("half2"), arrays["half"] * 2)
    assert result.as_numpy("text_out").tolist() == arrays["text"].tolist()
    wrong = triton.InferInput("x", [2, 5], "FP32")
    wrong.set_data_from_numpy(np.zeros((2, 5), np.float32))
    with pytest.raises(InferenceServerException, match=r"shape expected \[-1, 4\]"):
        client.infer("affine", [wrong])
    with pytest.raises(InferenceServerException, match="not loaded"):
        client.infer("nope", [wrong])
    assert client.is_server_ready()


def test_tritonclient_repository_api(live, oip) -> None:
    url, _ = live
    client, auth = triton.InferenceServerClient(url), {"Authorization": f"Bearer {oip.token}"}
    assert any(row["name"] == "batched" for row in client.get_model_repository_index(headers=auth))
    client.load_model("affine", headers=auth)
    assert client.is_model_ready("affine")
    with pytest.raises(InferenceServerException, match="Bearer"):
        client.unload_model("affine")


def test_dynamic_batching_batches_and_matches_unbatched(live) -> None:
    url, _ = live
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(1 + i % 3, 4)).astype(np.float32) for i in range(24)]

    def one(x: np.ndarray) -> np.ndarray:
        client = triton.InferenceServerClient(url)
        inp = triton.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("batched", [inp]).as_numpy("y")

    stats = triton.InferenceServerClient(url).get_inference_statistics("batched")["model_stats"][0]
    with ThreadPoolExecutor(12) as pool:
        outs = list(pool.map(one, xs))
    after = triton.InferenceServerClient(url).get_inference_statistics("batched")["model_stats"][0]
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(y, expected_y(x), rtol=1e-5, atol=1e-6)
    inferences = after["inference_count"] - stats["inference_count"]
    executions = after["execution_count"] - stats["execution_count"]
    assert inferences == sum(len(x) for x in xs)
    assert executions < len(xs), f"{executions} executions for {len(xs)} requests: nothing was batched"
    print(f"\nbatched: {inferences} inferences in {executions} executions (avg batch {inferences / executions:.1f})")


def test_load_loopback_zero_errors(live, oip) -> None:
    """N requests at concurrency C in binary mode; p50/p99 are printed, never asserted."""
    url, _ = live
    n, concurrency = 200, 8
    x = np.ones((1, 4), np.float32)
    body, headers = oip.binary_body([("x", "FP32", x)], binary_data_output=True)
    latencies: list[float] = []
    errors: list[int] = []

    def worker(count: int) -> None:
        with httpx.Client(base_url=f"http://{url}") as http:
            for _ in range(count):
                start = time.perf_counter()
                r = http.post("/v2/models/affine/infer", content=body, headers=headers)
                latencies.append(time.perf_counter() - start)
                if r.status_code != 200:
                    errors.append(r.status_code)

    threads = [threading.Thread(target=worker, args=(n // concurrency,)) for _ in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    assert errors == [] and len(latencies) == n
    q = statistics.quantiles(latencies, n=100)
    print(f"\nload: {n} requests, concurrency {concurrency}: p50 {q[49] * 1e3:.2f} ms, p99 {q[98] * 1e3:.2f} ms, "
          f"{n / wall:.0f} req/s")


def test_graceful_shutdown_finishes_inflight(tmp_path, oip) -> None:
    """Requests waiting in the batcher's queue (300 ms delay) when shutdown starts still get 200."""
    write_repository(tmp_path, {"slow": affine_model()}, max_batch_size=16,
                     batching={"slow": "max_queue_delay_microseconds: 300000"})
    results: list[int] = []
    with oip.live_server(oip.make_config(tmp_path)) as (url, server):
        scheduler = server.config.app.state.dataplane.get_model("slow").scheduler

        def one() -> None:
            with httpx.Client(base_url=f"http://{url}") as http:
                r = http.post("/v2/models/slow/infer", json={"inputs": [
                    {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
                results.append(r.status_code)

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while scheduler.active < 6 and time.monotonic() < deadline:  # all six are queued in the batcher
            time.sleep(0.001)
        server.should_exit = True
        for t in threads:
            t.join(timeout=30)
    assert results == [200] * 6
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{url}/v2/health/live")


# -- issue 19 ---------------------------------------------------------------------------------------------------
def test_slow_client_gets_408_while_others_are_served(tmp_path, oip) -> None:
    """Item 9: a client that sends its body slowly holds the connection only --body-timeout-s; meanwhile the
    server answers everyone else. (No timing is asserted: the wait is bounded, the outcome is the status.)"""
    import socket

    write_repository(tmp_path, {"m": affine_model()}, max_batch_size=4)
    with oip.live_server(oip.make_config(tmp_path, body_timeout_s=1.0)) as (url, _):
        host, port = url.split(":")
        slow = socket.create_connection((host, int(port)), timeout=30)
        slow.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"inputs\": [")  # ...and nothing more
        with httpx.Client(base_url=f"http://{url}") as other:
            assert other.get("/v2/health/live").status_code == 200
            r = other.post("/v2/models/m/infer", json={"inputs": [
                {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
            assert r.status_code == 200
        answer = b""
        while chunk := slow.recv(65536):  # the server answers 408 and closes the connection
            answer += chunk
        slow.close()
        assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout-s" in answer


def test_tritonclient_request_compression(live) -> None:
    """Item 12: tritonclient's request_compression_algorithm sends gzip/deflate bodies."""
    url, _ = live
    client = triton.InferenceServerClient(url)
    x = np.random.default_rng(2).normal(size=(2, 4)).astype(np.float32)
    for algorithm in ("gzip", "deflate"):
        for binary in (True, False):
            inp = triton.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            result = client.infer("affine", [inp], request_compression_algorithm=algorithm)
            np.testing.assert_allclose(result.as_numpy("y"), expected_y(x), rtol=1e-5)


def test_serve_binds_before_loading_models(tmp_path, monkeypatch, capsys) -> None:
    """Item 13: a busy port used to be found only after every model had loaded and "startup complete" was
    printed; now `veil serve` fails at once with one line, before any model loads."""
    import socket

    from veil.engine import cli
    from veil.engine.dataplane import DataPlane

    write_repository(tmp_path, {"m": affine_model()})
    loads: list[int] = []
    monkeypatch.setattr(DataPlane, "load_all", lambda self: loads.append(1))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        port = busy.getsockname()[1]
        assert cli.main(["--repo", str(tmp_path), "--port", str(port), "--log-level", "warning"]) == 1
    finally:
        busy.close()
    err = capsys.readouterr().err.strip()
    assert loads == [] and len(err.splitlines()) == 1
    assert err.startswith(f"veil serve: cannot bind 127.0.0.1:{port}:") and "in use" in err
