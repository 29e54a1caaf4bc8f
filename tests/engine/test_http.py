"""OIP v2 REST conformance in-process (JSON and binary), Triton extensions, and every error class over HTTP."""

from __future__ import annotations

import json

import numpy as np
import pytest
from veil.engine import errors
from veil.engine.toy import affine_weights

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def expected_y(x: np.ndarray) -> np.ndarray:
    w, b = affine_weights()
    return x @ w + b


# -- health, metadata, config, stats, metrics --------------------------------------------------------------
def test_server_metadata_and_health(client) -> None:
    meta = client.get("/v2").json()
    assert meta["name"] == "veil" and meta["version"]
    assert {"binary_tensor_data", "model_configuration", "statistics", "model_repository"} <= set(meta["extensions"])
    assert client.get("/v2/health/live").status_code == 200
    ready = client.get("/v2/health/ready")
    assert ready.status_code == 200 and ready.json()["execution_providers"]["affine/2"] == "CPUExecutionProvider"


def test_model_metadata_ready_and_versions(client) -> None:
    meta = client.get("/v2/models/affine").json()
    assert meta["name"] == "affine" and meta["platform"] == "onnxruntime_onnx" and meta["versions"] == ["2"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]
    assert meta["parameters"]["veil"] == {"kind": "onnx", "source": "toy"}
    assert meta["parameters"]["execution_provider"] == "CPUExecutionProvider"
    assert client.get("/v2/models/affine/versions/2").json()["name"] == "affine"
    assert client.get("/v2/models/affine/ready").status_code == 200
    assert client.get("/v2/models/affine/versions/2/ready").json()["ready"] is True


def test_model_config_is_triton_json(client) -> None:
    config = client.get("/v2/models/batched/config").json()
    assert config["name"] == "batched" and config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 16
    assert config["input"][0] == {"name": "x", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [4],
                                  "is_shape_tensor": False}
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 20000
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 64
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert client.get("/v2/models/affine/config").json()["veil"]["kind"] == "onnx"


def test_stats_and_metrics_count_inferences(client) -> None:
    before = client.get("/v2/models/affine/stats").json()["model_stats"][0]
    client.post("/v2/models/affine/infer", json={"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                                                             "data": X.tolist()}]})
    after = client.get("/v2/models/affine/versions/2/stats").json()["model_stats"][0]
    assert after["name"] == "affine" and after["version"] == "2"
    assert after["inference_count"] == before["inference_count"] + 2
    assert after["execution_count"] == before["execution_count"] + 1
    stats = after["inference_stats"]
    assert stats["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert set(stats) >= {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output"}
    assert {s["name"] for s in client.get("/v2/models/stats").json()["model_stats"]} == {"affine", "batched", "dtypes"}
    text = client.get("/metrics").text
    for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count",
                 "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_infer_duration_us", "veil_batch_size_bucket"):
        assert name in text
    assert 'veil_execution_provider{model="affine",provider="CPUExecutionProvider"' in text.replace(',version="2"', "")


# -- inference: JSON ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("nested", [True, False])
def test_infer_json_flat_or_nested(client, nested: bool) -> None:
    data = X.tolist() if nested else X.ravel().tolist()
    r = client.post("/v2/models/affine/infer", json={"id": "42", "inputs": [
        {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": data}]})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["id"] == "42" and body["model_name"] == "affine" and body["model_version"] == "2"
    out = body["outputs"][0]
    assert out["name"] == "y" and out["datatype"] == "FP32" and out["shape"] == [2, 3]
    np.testing.assert_allclose(np.array(out["data"]).reshape(2, 3), expected_y(X), rtol=1e-5)


def test_infer_json_dtypes_and_versions(client) -> None:
    r = client.post("/v2/models/dtypes/versions/1/infer", json={"inputs": [
        {"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]},
        {"name": "mask", "shape": [1, 3], "datatype": "BOOL", "data": [True, False, True]},
        {"name": "text", "shape": [1, 3], "datatype": "BYTES", "data": ["a", "bé", ""]},
        {"name": "half", "shape": [1, 3], "datatype": "FP16", "parameters": {"binary_data_size": 6}}]},
    )
    assert r.status_code == 400  # FP16 needs binary: the body above has binary_data_size but no header
    body, headers = _dtypes_binary_half_only()
    r = client.post("/v2/models/dtypes/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    outs = {o["name"]: o for o in json.loads(r.content[:int(r.headers["inference-header-content-length"])])["outputs"]}
    assert outs["ids2"]["data"] == [2, 4, 6] and outs["not_mask"]["data"] == [False, True, False]
    assert outs["text_out"]["data"] == ["a", "bé", ""] and outs["half2"]["parameters"]["binary_data_size"] == 6


def _dtypes_binary_half_only() -> tuple[bytes, dict[str, str]]:
    """JSON ids/mask/text, binary FP16 half; outputs JSON except FP16 (binary)."""
    head = {"inputs": [
        {"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]},
        {"name": "mask", "shape": [1, 3], "datatype": "BOOL", "data": [True, False, True]},
        {"name": "text", "shape": [1, 3], "datatype": "BYTES", "data": ["a", "bé", ""]},
        {"name": "half", "shape": [1, 3], "datatype": "FP16", "parameters": {"binary_data_size": 6}}],
        "outputs": [{"name": n, "parameters": {"binary_data": n == "half2"}}
                    for n in ("ids2", "not_mask", "half2", "text_out")]}
    text = json.dumps(head).encode()
    return text + np.array([1, 2, 3], np.float16).tobytes(), {"Inference-Header-Content-Length": str(len(text))}


# -- inference: binary ----------------------------------------------------------------------------------------
def test_infer_binary_all_dtypes_roundtrip(client, oip) -> None:
    ids, mask = np.array([[1, -2, 3], [4, 5, 6]], np.int64), np.array([[True, False, True], [False] * 3])
    half = np.array([[0.5, 1.5, -2], [3, 4, 5]], np.float16)
    text = np.array([[b"x", b"", b"\x00\xff".decode("latin-1").encode()], [b"a", b"bb", b"ccc"]], dtype=object)
    body, headers = oip.binary_body([("ids", "INT64", ids), ("mask", "BOOL", mask), ("half", "FP16", half),
                                     ("text", "BYTES", text)], binary_data_output=True)
    r = client.post("/v2/models/dtypes/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream" and "inference-header-content-length" in r.headers
    out = oip.decode(r)
    np.testing.assert_array_equal(out["ids2"], ids * 2)
    np.testing.assert_array_equal(out["not_mask"], ~mask)
    np.testing.assert_array_equal(out["half2"], half + half)
    assert out["text_out"].tolist() == text.tolist()


def test_non_utf8_bytes_output_as_json_is_refused_not_mangled() -> None:
    """A bitstream or ciphertext output asked for as JSON: a clear error, never U+FFFD replacements."""
    from veil.engine.errors import DatatypeMismatch
    from veil.engine.protocol import InferResponse
    from veil.engine.rest_body import encode_response

    out = np.array([b"\x89PNG\xff\x00"], dtype=object)
    as_json = InferResponse("codec", "1", {"bitstream": out}, {"bitstream": "BYTES"}, {"bitstream": False})
    with pytest.raises(DatatypeMismatch, match=r"output 'bitstream'.*binary_data"):
        encode_response(as_json)
    text, n = encode_response(InferResponse("codec", "1", {"bitstream": out}, {"bitstream": "BYTES"},
                                            {"bitstream": True}))
    assert n is not None and text[n + 4:] == out[0]  # 4-byte length prefix, then the raw bytes
    utf8 = InferResponse("m", "1", {"t": np.array([b"caf\xc3\xa9"], dtype=object)}, {"t": "BYTES"}, {"t": False})
    assert json.loads(encode_response(utf8)[0])["outputs"][0]["data"] == ["café"]


def test_infer_binary_mixed_outputs_and_selection(client, oip) -> None:
    body, headers = oip.binary_body([("x", "FP32", X)], outputs=[("y", True)])
    r = client.post("/v2/models/affine/infer", content=body, headers=headers)
    np.testing.assert_allclose(oip.decode(r)["y"], expected_y(X), rtol=1e-5)
    body, headers = oip.binary_body([("x", "FP32", X)], outputs=[("y", False)])
    r = client.post("/v2/models/affine/infer", content=body, headers=headers)
    assert r.headers["content-type"] == "application/json" and r.json()["id"] == "b1"
    body, headers = oip.binary_body([("ids", "INT64", np.ones((1, 3), np.int64)), ("mask", "BOOL", np.ones((1, 3), bool)),
                                     ("half", "FP16", np.ones((1, 3), np.float16)),
                                     ("text", "BYTES", np.array([[b"a", b"b", b"c"]], dtype=object))],
                                    outputs=[("not_mask", True)])
    r = client.post("/v2/models/dtypes/infer", content=body, headers=headers)
    assert list(oip.decode(r)) == ["not_mask"]


# -- errors: every class over HTTP, and the server keeps serving -------------------------------------------------
def _x(shape=(2, 4), datatype="FP32", name="x", data=None) -> dict:
    return {"name": name, "shape": list(shape), "datatype": datatype,
            "data": data if data is not None else [0.0] * int(np.prod(shape))}


BAD_REQUESTS = {
    "malformed_json": (400, errors.MalformedRequest, dict(content=b"{not json")),
    "no_inputs": (400, errors.MalformedRequest, dict(json={"inputs": []})),
    "unknown_input": (400, errors.UnknownInput, dict(json={"inputs": [_x(name="nope")]})),
    "missing_input": (400, errors.MissingInput, dict(json={"inputs": [_x((1, 3), "INT64", "ids")]})),
    "wrong_dtype": (400, errors.DatatypeMismatch, dict(json={"inputs": [_x(datatype="INT32", data=[0] * 8)]})),
    "wrong_json_element": (400, errors.DatatypeMismatch, dict(json={"inputs": [_x(data=["a"] * 8)]})),
    "wrong_shape": (400, errors.ShapeMismatch, dict(json={"inputs": [_x((2, 5))]})),
    "count_mismatch": (400, errors.ShapeMismatch, dict(json={"inputs": [_x((2, 4), data=[0.0] * 7)]})),
    "batch_too_big": (400, errors.ShapeMismatch, dict(json={"inputs": [_x((9, 4))]})),
    "unknown_output": (400, errors.UnknownOutput, dict(json={"inputs": [_x()], "outputs": [{"name": "z"}]})),
    "binary_without_header": (400, errors.InvalidHeaderLength, dict(
        json={"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": 32}}]})),
    "bad_header_value": (400, errors.InvalidHeaderLength, dict(content=b"{}", headers={"Inference-Header-Content-Length": "x"})),
    "header_too_long": (400, errors.InvalidHeaderLength, dict(content=b"{}", headers={"Inference-Header-Content-Length": "99"})),
    "unknown_model": (404, errors.ModelNotFound, dict(url="/v2/models/nope/infer", json={"inputs": [_x()]})),
    "unknown_version": (404, errors.ModelNotFound, dict(url="/v2/models/affine/versions/1/infer", json={"inputs": [_x()]})),
    "too_large": (413, errors.PayloadTooLarge, dict(json={"inputs": [_x((8, 4), data=[1e-9] * 32)], "pad": "x" * 2**20})),
    # issue 19 item 8: these were 500s
    "datatype_object": (400, errors.DatatypeMismatch, dict(json={"inputs": [{**_x(), "datatype": {}}]})),
    "datatype_list": (400, errors.DatatypeMismatch, dict(json={"inputs": [{**_x(), "datatype": []}]})),
    "too_many_dims_json": (400, errors.ShapeMismatch, dict(json={"inputs": [_x((1,) * 65, data=[0.0])]})),
    # issue 19 item 11: the last duplicate used to win
    "duplicate_input": (400, errors.MalformedRequest, dict(json={"inputs": [_x(), _x()]})),
    "duplicate_output": (400, errors.MalformedRequest, dict(json={"inputs": [_x()],
                                                                  "outputs": [{"name": "y"}, {"name": "y"}]})),
    # issue 19 item 12: compressed bodies
    "unknown_encoding": (415, errors.UnsupportedEncoding, dict(content=b"{}", headers={"Content-Encoding": "br"})),
    "broken_gzip": (400, errors.MalformedRequest, dict(content=b"\x1f\x8bnot gzip",
                                                       headers={"Content-Encoding": "gzip"})),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_gets_4xx_and_server_keeps_serving(client, case: str) -> None:
    status, error_class, kwargs = BAD_REQUESTS[case]
    assert error_class.status_code == status
    url = kwargs.get("url", "/v2/models/affine/infer")
    r = client.post(url, **{k: v for k, v in kwargs.items() if k != "url"})
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and r.json()["error"]
    ok = client.post("/v2/models/affine/infer", json={"inputs": [_x()]})
    assert ok.status_code == 200


def test_binary_size_errors(client, oip) -> None:
    body, headers = oip.binary_body([("x", "FP32", X)])
    for broken in (body[:-4], body + b"\0\0\0\0"):
        r = client.post("/v2/models/affine/infer", content=broken, headers=headers)
        assert r.status_code == errors.BinarySizeMismatch.status_code == 400 and "binary" in r.json()["error"]
    wrong = body.replace(b'"binary_data_size": 32', b'"binary_data_size": 28')
    r = client.post("/v2/models/affine/infer", content=wrong, headers=headers)
    assert r.status_code == 400 and "expected 32" in r.json()["error"]


def test_error_messages_name_field_expected_received(client) -> None:
    r = client.post("/v2/models/affine/infer", json={"inputs": [_x((2, 5))]})
    assert r.json()["error"] == "input 'x': shape expected [-1, 4] (-1: any), received [2, 5]"
    r = client.post("/v2/models/affine/infer", json={"inputs": [_x(datatype="INT32", data=[0] * 8)]})
    assert "datatype expected FP32, received INT32" in r.json()["error"]


def test_unknown_route_and_method_get_oip_error_body(client) -> None:
    r = client.get("/v2/nothing/here")
    assert r.status_code == 404 and "error" in r.json()
    assert client.get("/v2/models/nope").status_code == 404
    assert client.get("/v2/models/nope/ready").status_code == 404


# -- repository API (admin token) ----------------------------------------------------------------------------
def test_admin_token_rules(client, repo, oip) -> None:
    from fastapi.testclient import TestClient
    from veil.engine.server import create_app

    assert client.post("/v2/repository/index").status_code == errors.Unauthorized.status_code == 401
    assert client.post("/v2/repository/index", headers={"Authorization": "Bearer wrong"}).status_code == 401
    auth = {"Authorization": f"Bearer {oip.token}"}
    rows = client.post("/v2/repository/index", headers=auth).json()
    assert {"name": "affine", "version": "2", "state": "READY"} in rows
    assert client.post("/v2/repository/models/dtypes/unload", headers=auth).status_code == 200
    assert client.get("/v2/models/dtypes/ready").status_code == 404
    assert {"name": "dtypes", "state": "UNAVAILABLE", "reason": "unloaded"} in client.post(
        "/v2/repository/index", headers=auth).json()
    assert client.post("/v2/repository/models/dtypes/unload", headers=auth).status_code == 404
    assert client.post("/v2/repository/models/dtypes/load", headers=auth).status_code == 200
    assert client.get("/v2/models/dtypes/ready").status_code == 200
    assert client.post("/v2/repository/models/nope/load", headers=auth).status_code == 404
    with TestClient(create_app(oip.make_config(repo))) as plain:  # no token: the repository API is off
        assert "model_repository" not in plain.get("/v2").json()["extensions"]
        r = plain.post("/v2/repository/index", headers=auth)
        assert r.status_code == errors.RepositoryApiDisabled.status_code == 403 and "admin-token" in r.json()["error"]


def test_load_failure_is_400_and_keeps_old_versions(client, repo, oip, tmp_path) -> None:
    auth = {"Authorization": f"Bearer {oip.token}"}
    config = repo / "batched" / "config.pbtxt"
    original = config.read_text()
    try:
        config.write_text(original.replace("TYPE_FP32", "TYPE_INT8", 1))
        r = client.post("/v2/repository/models/batched/load", headers=auth)
        assert r.status_code == errors.ModelLoadFailed.status_code == 400 and "data_type" in r.json()["error"]
        assert client.get("/v2/models/batched/ready").status_code == 200  # the loaded version keeps serving
    finally:
        config.write_text(original)


# -- issue 19: hardening ------------------------------------------------------------------------------------------
def test_unicode_digit_in_header_length_is_400(repo, oip) -> None:
    """Item 8: "²".isdigit() is True but int("²") fails: a 500. (httpx's ASGI transport passes the header byte
    0xB2 as a real server does; the TestClient would re-encode it as UTF-8.)"""
    import asyncio

    import httpx
    from veil.engine.server import create_app

    app = create_app(oip.make_config(repo))

    async def post(value: bytes) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post("/v2/models/affine/infer", content=b'{"inputs": []}',
                                headers={"Inference-Header-Content-Length": value, "Content-Length": value})

    for value in ("\u00b2".encode("latin-1"), "\u0663".encode("utf-8")):  # superscript two, Arabic-Indic three
        r = asyncio.run(post(value))
        assert r.status_code == 400 and "Inference-Header-Content-Length" in r.json()["error"]


def test_binary_input_with_65_dims_is_400(client, oip) -> None:
    """Item 8: numpy refuses > 64 dims with a ValueError, which was a 500."""
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1] * 65,
                                   "parameters": {"binary_data_size": 4}}]}).encode()
    r = client.post("/v2/models/affine/infer", content=head + b"\0" * 4,
                    headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 400 and "at most 32" in r.json()["error"]


def test_json_tensors_bounded_by_element_count(repo, oip) -> None:
    """Item 9: JSON data beyond --max-json-elements is refused (413) before any conversion; binary is not counted."""
    from fastapi.testclient import TestClient
    from veil.engine.server import create_app

    with TestClient(create_app(oip.make_config(repo, max_json_elements=4))) as small:
        r = small.post("/v2/models/affine/infer", json={"inputs": [_x((2, 4))]})
        assert r.status_code == 413 and "--max-json-elements" in r.json()["error"] and "8" in r.json()["error"]
        assert small.post("/v2/models/affine/infer", json={"inputs": [_x((1, 4))]}).status_code == 200
        body, headers = oip.binary_body([("x", "FP32", X)])
        assert small.post("/v2/models/affine/infer", content=body, headers=headers).status_code == 200


def test_json_part_bounded_before_parsing(repo, oip) -> None:
    """Item 9: orjson holds the GIL while it parses, so a JSON part above --max-json-mb is refused unparsed."""
    from fastapi.testclient import TestClient
    from veil.engine.server import create_app

    with TestClient(create_app(oip.make_config(repo, max_json_mb=0.001))) as small:  # 1048 bytes
        r = small.post("/v2/models/affine/infer", json={"inputs": [_x()], "pad": "x" * 2000})
        assert r.status_code == 413 and "--max-json-mb" in r.json()["error"]
        assert small.post("/v2/models/affine/infer", json={"inputs": [_x()]}).status_code == 200


def test_large_json_tensor_converted_in_slices() -> None:
    """The conversion runs in 65536-entry slices (the GIL is released between them); values and checks hold."""
    from veil.engine.rest_body import decode_request

    n = 3 * 65536 + 5
    values = [float(i % 97) for i in range(n)]
    body = json.dumps({"inputs": [{"name": "v", "datatype": "FP32", "shape": [n], "data": values}]}).encode()
    np.testing.assert_array_equal(decode_request(body, None).inputs[0].data, np.array(values, np.float32))
    mixed = [*values[:-1], "a"]
    body = json.dumps({"inputs": [{"name": "v", "datatype": "FP32", "shape": [n], "data": mixed}]}).encode()
    with pytest.raises(errors.DatatypeMismatch, match="'v'"):
        decode_request(body, None)
    body = json.dumps({"inputs": [{"name": "v", "datatype": "FP32", "shape": [n], "data": [*values, 1.0]}]}).encode()
    with pytest.raises(errors.ShapeMismatch, match="top-level"):
        decode_request(body, None)


def test_large_body_is_decoded_off_the_event_loop(repo, oip) -> None:
    """Item 9: while one large JSON body is being decoded, a health probe is answered (decode blocked on an
    event that only the probe's answer sets: on the event loop, the probe could never be answered first)."""
    import asyncio
    import threading

    import httpx
    from veil.engine import http
    from veil.engine.server import create_app

    app = create_app(oip.make_config(repo))
    entered, release, released = threading.Event(), threading.Event(), []
    real = http.decode_request

    def slow_decode(*args, **kwargs):
        entered.set()
        released.append(release.wait(timeout=10))
        return real(*args, **kwargs)

    async def scenario() -> tuple[int, int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            body = {"inputs": [_x((8, 4))], "pad": "x" * (http.INLINE_BYTES + 1)}
            big = asyncio.create_task(client.post("/v2/models/affine/infer", json=body))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            probe = await client.get("/v2/health/live")
            release.set()
            return probe.status_code, (await big).status_code

    http.decode_request = slow_decode
    try:
        assert asyncio.run(scenario()) == (200, 200)
    finally:
        http.decode_request = real
    assert released == [True]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
def test_compressed_request_bodies(client, oip, encoding: str) -> None:
    """Item 12: tritonclient's request_compression_algorithm (gzip/deflate); the header length counts the
    decompressed JSON."""
    import zlib

    body, headers = oip.binary_body([("x", "FP32", X)], binary_data_output=True)
    wbits = {"gzip": 31, "deflate": 15, "raw-deflate": -15}[encoding]
    packer = zlib.compressobj(wbits=wbits)
    packed = packer.compress(body) + packer.flush()
    r = client.post("/v2/models/affine/infer", content=packed,
                    headers={**headers, "Content-Encoding": encoding.removeprefix("raw-")})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(oip.decode(r)["y"], expected_y(X), rtol=1e-5)


def test_decompression_is_bounded(client) -> None:
    """Item 12: a small gzip body that inflates past --max-body-mb (1 MiB here) stops at the limit: 413."""
    import gzip

    bomb = gzip.compress(b'{"inputs": [], "pad": "' + b"x" * (4 * 2**20) + b'"}')
    assert len(bomb) < 2**20
    r = client.post("/v2/models/affine/infer", content=bomb, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 413 and "decompressed" in r.json()["error"]
    truncated = gzip.compress(json.dumps({"inputs": [_x()]}).encode())[:-8]
    r = client.post("/v2/models/affine/infer", content=truncated, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "truncated" in r.json()["error"]


def test_metrics_use_triton_counter_names(client) -> None:
    """Item 12: Triton's exact names (no _total, no _created), typed counter."""
    client.post("/v2/models/affine/infer", json={"inputs": [_x()]})
    text = client.get("/metrics").text
    for name in ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                 "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us"):
        assert f"# TYPE {name} counter\n" in text
        assert f'{name}{{model="affine",version="2"}} ' in text
    triton = [line for line in text.splitlines() if line.startswith("nv_")]
    assert triton and not [line for line in triton if "_total" in line or "_created" in line]


def test_config_outputs_have_no_format_field(client) -> None:
    """Item 12: Triton's ModelOutput has no 'format' (ModelInput has)."""
    config = client.get("/v2/models/affine/config").json()
    assert "format" in config["input"][0] and all("format" not in o for o in config["output"])


@pytest.mark.parametrize("path", ["/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/affine",
                                  "/v2/models/affine/ready", "/v2/models/affine/config", "/v2/models/stats",
                                  "/metrics"])
def test_head_is_answered_where_get_is(client, path: str) -> None:
    """Item 11: HEAD was 405."""
    r = client.head(path)
    assert r.status_code == 200 and r.content == b""


def test_model_named_stats_is_reachable(tmp_path, oip) -> None:
    """Item 11: /v2/models/stats was always the all-models statistics; a model named "stats" wins it."""
    from fastapi.testclient import TestClient
    from veil.engine.server import create_app
    from veil.engine.toy import affine_model, write_repository

    write_repository(tmp_path, {"stats": affine_model(), "other": affine_model()}, max_batch_size=4)
    with TestClient(create_app(oip.make_config(tmp_path))) as c:
        meta = c.get("/v2/models/stats")
        assert meta.status_code == 200 and meta.json()["name"] == "stats" and meta.json()["inputs"]
        assert c.get("/v2/models/stats/versions/1").json()["name"] == "stats"
        assert c.get("/v2/models/stats/ready").status_code == 200
        assert c.post("/v2/models/stats/infer", json={"inputs": [_x((1, 4))]}).status_code == 200
        assert c.get("/v2/models/stats/stats").json()["model_stats"][0]["name"] == "stats"
        assert c.get("/v2/models/other/stats").json()["model_stats"][0]["name"] == "other"


@pytest.mark.parametrize("name", ["%2e%2e", "%2E%2E", "%2e", ".he-keys", "a%5Cb", "a%00b", "%252e%252e"])
def test_path_traversal_in_model_names_is_refused(tmp_path, oip, name: str) -> None:
    """Item 7: with the admin token, POST /v2/repository/models/../load served a model from the repository's
    parent folder; every route that takes a model name refuses what is not one path component."""
    from fastapi.testclient import TestClient
    from veil.engine.server import create_app
    from veil.engine.toy import affine_model, write_repository

    repo = tmp_path / "repo"
    write_repository(repo, {"inside": affine_model()})
    (tmp_path / "1").mkdir()  # the repository's parent is itself a servable model folder
    write_repository(tmp_path / "outside", {"x": affine_model()})
    (tmp_path / "x" / "1").mkdir(parents=True, exist_ok=True)
    (tmp_path / "1" / "model.onnx").write_bytes((tmp_path / "outside" / "x" / "1" / "model.onnx").read_bytes())
    (repo / ".he-keys" / "1").mkdir(parents=True)
    (repo / ".he-keys" / "1" / "model.onnx").write_bytes((tmp_path / "1" / "model.onnx").read_bytes())
    auth = {"Authorization": f"Bearer {oip.token}"}
    with TestClient(create_app(oip.make_config(repo, admin_token=oip.token))) as c:
        r = c.post(f"/v2/repository/models/{name}/load", headers=auth)
        assert r.status_code in (400, 404), r.text
        assert r.status_code == 404 or "one path component" in r.json()["error"]
        assert list(c.app.state.dataplane.models) == ["inside"]
        assert c.post(f"/v2/repository/models/{name}/unload", headers=auth).status_code in (400, 404)
        for path in (f"/v2/models/{name}", f"/v2/models/{name}/ready", f"/v2/models/{name}/config"):
            assert c.get(path).status_code in (400, 404)
        assert c.post(f"/v2/models/{name}/infer", json={"inputs": [_x()]}).status_code in (400, 404)
        assert all(row["name"] == "inside" for row in c.post("/v2/repository/index", headers=auth).json())
