"""Property-based fuzzing of what an outsider reaches (issue 19, "Fuzzing in CI"): OIP JSON and binary inference
requests, their headers and encodings, and config.pbtxt text.

Each property: no 5xx and no uncaught exception, the server keeps serving. Inputs are bounded in size (so time
and memory per example are bounded); no deadline is asserted (timing never decides a test on a shared machine).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import zlib

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from veil.engine.pbtxt import PbtxtError, parse_model_config
from veil.engine.protocol import DATATYPES, encode_bytes
from veil.engine.repository import parse_config
from veil.engine.server import create_app

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                database=None)
MODELS = ["affine", "batched", "dtypes", "nope", "affine:x", "%2e%2e", "stats"]
NAMES = ["x", "y", "ids", "mask", "half", "text", "", "x" * 50]

json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | \
    st.text(max_size=8)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
shapes = st.lists(st.integers(-2, 5) | st.sampled_from([2**31, 2**62]) | json_values, max_size=5) | json_values
datatypes = st.sampled_from([*DATATYPES, "FLOAT", "", "fp32"]) | json_values


@st.composite
def tensor_specs(draw, binary: bool) -> dict:
    spec = {"name": draw(st.sampled_from(NAMES) | json_values), "datatype": draw(datatypes), "shape": draw(shapes)}
    if binary and draw(st.booleans()):
        spec["parameters"] = {"binary_data_size": draw(st.integers(-4, 64) | json_values)}
    elif draw(st.integers(0, 9)):
        spec["data"] = draw(st.lists(st.integers(-3, 3) | st.floats(-1e3, 1e3) | st.booleans() | st.text(max_size=3),
                                     max_size=12) | json_values)
    return spec


@st.composite
def requests(draw, binary: bool) -> dict:
    body: dict = {"inputs": draw(st.lists(tensor_specs(binary), max_size=4) | json_values)}
    if draw(st.booleans()):
        body["outputs"] = draw(st.lists(st.fixed_dictionaries(
            {"name": st.sampled_from(["y", "ids2", "half2", "z"]) | json_values},
            optional={"parameters": st.fixed_dictionaries({}, optional={"binary_data": json_values})}),
            max_size=3) | json_values)
    if draw(st.booleans()):
        body["parameters"] = draw(st.fixed_dictionaries({}, optional={
            "binary_data_output": st.booleans() | json_values, "adapter_id": json_values}) | json_values)
    if draw(st.booleans()):
        body["id"] = draw(json_values)
    return body


@pytest.fixture(scope="module")
def fuzz_client(repo, oip):
    with TestClient(create_app(oip.make_config(repo, max_body_mb=0.25, max_json_elements=4096)),
                    raise_server_exceptions=False) as c:
        yield c


def _post(client, model: str, content: bytes, headers: dict) -> None:
    r = client.post(f"/v2/models/{model}/infer", content=content, headers=headers)
    assert r.status_code < 500, (r.status_code, r.text, content[:200], headers)
    # a request may ask for binary outputs (parameters.binary_data_output): then only the header part is JSON
    length = r.headers.get("Inference-Header-Content-Length")
    document = json.loads(r.content[:int(length)] if length is not None else r.content)
    assert set(document) == ({"error"} if r.status_code >= 400 else set(document))


def _still_serving(client) -> None:
    ok = client.post("/v2/models/affine/infer", json={"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    assert ok.status_code == 200


@FUZZ
@given(model=st.sampled_from(MODELS), body=requests(binary=False))
def test_fuzz_json_requests(fuzz_client, model: str, body: dict) -> None:
    _post(fuzz_client, model, json.dumps(body).encode(), {"Content-Type": "application/json"})
    _still_serving(fuzz_client)


@FUZZ
@given(model=st.sampled_from(MODELS), body=requests(binary=True), tail=st.binary(max_size=96),
       header=st.none() | st.integers(-2, 400).map(str) | st.sampled_from(["\u00b2", "1e3", " 7 ", "0x10", "", "-0"]),
       exact=st.booleans(), encoding=st.sampled_from([None, "gzip", "deflate", "identity", "br", "gzip, deflate"]),
       compress=st.booleans())
def test_fuzz_binary_requests(fuzz_client, model, body, tail, header, exact, encoding, compress) -> None:
    head = json.dumps(body).encode()
    content = head + tail
    headers = {}
    length = str(len(head)) if exact else header
    if length is not None:
        headers["Inference-Header-Content-Length"] = length.encode("utf-8")
    if encoding is not None:
        headers["Content-Encoding"] = encoding
        if compress and encoding == "gzip":
            content = gzip.compress(content)
        elif compress and encoding == "deflate":
            content = zlib.compress(content)
    _post(fuzz_client, model, content, headers)
    _still_serving(fuzz_client)


@FUZZ
@given(raw=st.binary(max_size=300), length=st.none() | st.integers(0, 300))
def test_fuzz_raw_bytes(fuzz_client, raw: bytes, length: int | None) -> None:
    headers = {} if length is None else {"Inference-Header-Content-Length": str(length)}
    _post(fuzz_client, "affine", raw, headers)
    _still_serving(fuzz_client)


MODEL_INPUTS = {"affine": [("x", "FP32")], "batched": [("x", "FP32")],
                "dtypes": [("ids", "INT64"), ("mask", "BOOL"), ("half", "FP16"), ("text", "BYTES")]}
ELEMENTS = {"FP32": st.floats(width=32, allow_nan=True) | st.integers(-10, 10), "INT64": st.integers(-2**63, 2**63 - 1),
            "BOOL": st.booleans(), "FP16": st.floats(width=16), "BYTES": st.text(max_size=4)}


@st.composite
def near_valid(draw) -> tuple[str, bytes, dict]:
    """Requests close to valid ones (right names and datatypes, shapes off by a little, binary or JSON data), so
    decoding, input checks, batching and the session run are all reached."""
    model = draw(st.sampled_from(sorted(MODEL_INPUTS)))
    specs, blobs = [], []
    for name, datatype in MODEL_INPUTS[model]:
        shape = draw(st.lists(st.integers(0, 9), min_size=1, max_size=3))
        count = int(np.prod(shape)) + draw(st.sampled_from([0, 0, 0, -1, 1]))
        values = draw(st.lists(ELEMENTS[datatype], min_size=max(count, 0), max_size=max(count, 0)))
        spec = {"name": name, "datatype": draw(st.sampled_from([datatype, datatype, "FP64", "INT32"])), "shape": shape}
        if datatype == "FP16" or draw(st.booleans()):
            if datatype == "BYTES":
                raw = encode_bytes(np.array([v.encode() for v in values], dtype=object))
            else:
                raw = np.array(values, dtype=DATATYPES[datatype]).tobytes()
            raw = raw[:draw(st.integers(0, len(raw)))] if draw(st.integers(0, 5)) == 0 else raw
            spec["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            spec["data"] = values
        specs.append(spec)
    head = json.dumps({"inputs": specs, "parameters": {"binary_data_output": draw(st.booleans())}}).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))} if blobs else {}
    return model, head + b"".join(blobs), headers


@FUZZ
@given(case=near_valid())
@example(case=("affine", json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [6, 4], "data": [0.0] * 24}],
                                     "parameters": {"binary_data_output": True}}).encode(), {}))
def test_fuzz_near_valid_requests(fuzz_client, case: tuple[str, bytes, dict]) -> None:
    model, content, headers = case
    _post(fuzz_client, model, content, headers)
    _still_serving(fuzz_client)


# -- config.pbtxt ---------------------------------------------------------------------------------------------
TOKENS = ["name", "max_batch_size", "input", "output", "dims", "data_type", "TYPE_FP32", "dynamic_batching",
          "instance_group", "kind", "KIND_CPU", "count", "version_policy", "latest", "num_versions", "parameters",
          "key", "value", "string_value", "optimization", "graph", "level", "sequence_batching", "reshape",
          "shape", "{", "}", "[", "]", "<", ">", ":", ",", ";", "#", "\n", "\"x\"", "'y'", "\"\\q\"", "\"\\101\"",
          "1", "-1", "0x1f", "1.5", "inf", "nan", "true", "false", "-", ".", "\\", "\"", "é", "\x00"]


@FUZZ
@given(text=st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join) | st.text(max_size=200))
def test_fuzz_pbtxt_raises_only_its_own_errors(text: str) -> None:
    with contextlib.suppress(PbtxtError):
        parse_model_config(text)
    with contextlib.suppress(ValueError):  # PbtxtError, or a value veil refuses (both name the field)
        parse_config(text, "m")


@pytest.mark.parametrize("binary", [False, True])
def test_an_empty_shape_whose_other_dims_overflow_is_a_400(fuzz_client, binary: bool) -> None:
    # found by the gRPC fuzz test: [0, 7920, 17059480, 17066276] has 0 elements, but numpy refuses to reshape to it
    # (the non-zero dims overflow), which was a 500
    shape = [0, 7920, 17059480, 17066276]
    spec = {"name": "x", "datatype": "FP32", "shape": shape,
            **({"parameters": {"binary_data_size": 0}} if binary else {"data": []})}
    header = json.dumps({"inputs": [spec]}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))} if binary else {"Content-Type": "application/json"}
    r = fuzz_client.post("/v2/models/affine/infer", content=header, headers=headers)
    assert r.status_code == 400 and "2^40" in r.json()["error"], r.text
    _still_serving(fuzz_client)
