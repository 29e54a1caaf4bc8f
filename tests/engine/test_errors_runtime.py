"""The error classes that need a particular server state: QueueFull, ModelNotReady, InferenceFailed, 500."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper, numpy_helper
from veil.engine import errors
from veil.engine.server import create_app
from veil.engine.toy import affine_model, write_repository

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def test_queue_full_is_503_then_serves(tmp_path, oip) -> None:
    write_repository(tmp_path, {"q": affine_model()}, max_batch_size=4,
                     batching={"q": "default_queue_policy { max_queue_size: 1 }"})
    app = create_app(oip.make_config(tmp_path))
    scheduler = app.state.dataplane.get_model("q").scheduler

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            await scheduler._free.acquire()  # the only instance is busy: requests stay queued
            first = asyncio.create_task(client.post("/v2/models/q/infer", json=BODY))  # taken by the loop, waits
            await asyncio.sleep(0.05)
            second = asyncio.create_task(client.post("/v2/models/q/infer", json=BODY))  # fills the queue
            await asyncio.sleep(0.05)
            third = await client.post("/v2/models/q/infer", json=BODY)
            assert "queue is full" in third.json()["error"]
            scheduler._free.release()
            codes = [(await first).status_code, (await second).status_code, third.status_code]
            codes.append((await client.post("/v2/models/q/infer", json=BODY)).status_code)
            await scheduler.drain()
            return codes

    assert asyncio.run(scenario()) == [200, 200, errors.QueueFull.status_code, 200]


def test_model_not_ready_is_503(repo, client) -> None:
    model = client.app.state.dataplane.get_model("affine")
    model.ready = False
    try:
        r = client.post("/v2/models/affine/infer", json=BODY)
        assert r.status_code == errors.ModelNotReady.status_code == 503 and "not ready" in r.json()["error"]
        assert client.get("/v2/models/affine/ready").status_code == 503
        assert client.get("/v2/health/ready").status_code == 503
    finally:
        model.ready = True
    assert client.post("/v2/models/affine/infer", json=BODY).status_code == 200


@pytest.mark.filterwarnings("ignore")
def test_onnxruntime_refusal_is_400(tmp_path, oip) -> None:
    """A graph that reshapes to pairs refuses an odd element count at run time."""
    shape = numpy_helper.from_array(np.array([-1, 2], np.int64), "pairs")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "pairs"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", 2])], [shape])
    (tmp_path / "pairs" / "1").mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "pairs" / "1" / "model.onnx")
    with TestClient(create_app(oip.make_config(tmp_path))) as client:
        r = client.post("/v2/models/pairs/infer", json={"inputs": [{"name": "x", "shape": [3], "datatype": "FP32",
                                                                    "data": [1, 2, 3]}]})
        assert r.status_code == errors.InferenceFailed.status_code == 400 and "ONNX Runtime failed" in r.json()["error"]
        ok = client.post("/v2/models/pairs/infer", json={"inputs": [{"name": "x", "shape": [4], "datatype": "FP32",
                                                                     "data": [1, 2, 3, 4]}]})
        assert ok.json()["outputs"][0]["shape"] == [2, 2]


def test_unexpected_error_is_500_without_details(repo, oip, monkeypatch) -> None:
    app = create_app(oip.make_config(repo))

    async def broken(*args, **kwargs):
        raise RuntimeError("secret payload detail")

    monkeypatch.setattr(app.state.dataplane, "infer", broken)
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.post("/v2/models/affine/infer", json=BODY)
        assert r.status_code == 500 and r.json() == {"error": "internal error: RuntimeError"}
        assert client.get("/v2/health/live").status_code == 200


def test_unexpected_error_is_answered_and_logged_once_not_reraised(repo, oip, monkeypatch, caplog) -> None:
    """Issue 19 items 4/8: Starlette's Exception handler answers 500 and then re-raises, so the server logged a
    second traceback per bug. Now the exception ends at the catch-all: one log record, nothing re-raised."""
    import logging

    app = create_app(oip.make_config(repo))

    async def broken(*args, **kwargs):
        raise RuntimeError("secret payload detail")

    monkeypatch.setattr(app.state.dataplane, "infer", broken)
    caplog.set_level(logging.ERROR)

    async def scenario() -> httpx.Response:
        # raise_app_exceptions=True (the default): an exception that escapes the app fails the call
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.post("/v2/models/affine/infer", json=BODY)

    r = asyncio.run(scenario())
    assert r.status_code == 500 and r.json() == {"error": "internal error: RuntimeError"}
    logged = [rec for rec in caplog.records if rec.exc_info]
    assert len(logged) == 1 and "secret payload detail" not in logged[0].getMessage()


def test_failed_requests_are_counted_whatever_the_error(repo, oip, monkeypatch) -> None:
    """A server fault during inference counts in nv_inference_request_failure, as a client error does."""
    app = create_app(oip.make_config(repo))
    model = app.state.dataplane.get_model("affine")

    def broken(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(model, "check_inputs", broken)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.post("/v2/models/affine/infer", json=BODY).status_code == 500
        assert model.metrics.stats.fail.count == 1
