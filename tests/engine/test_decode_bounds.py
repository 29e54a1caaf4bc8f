"""Decoding is bounded before it starts (issue 31 items 3, 4, 18): the declared datatype and element count are
checked before a tensor is decoded, gRPC messages are parsed and decoded off the event loop HTTP shares, and a
message that does not parse is INVALID_ARGUMENT with a message. Work is counted (elements decoded), never timed.
"""

from __future__ import annotations

import itertools
import json
import threading

import grpc
import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from veil.engine import grpc_server, proto, protocol
from veil.engine.errors import BinarySizeMismatch, EngineError
from veil.engine.protocol import Expected


@pytest.fixture
def decoded(monkeypatch) -> list[int]:
    """The BYTES elements each call of the decoders was asked for (binary HTTP, gRPC raw and typed contents)."""
    counts: list[int] = []
    real_bytes, real_contents = protocol.decode_bytes, grpc_server._from_contents

    def spy_bytes(name, raw, count):
        counts.append(count)
        return real_bytes(name, raw, count)

    def spy_contents(name, datatype, count, tensor):
        counts.append(count)
        return real_contents(name, datatype, count, tensor)

    monkeypatch.setattr(protocol, "decode_bytes", spy_bytes)
    monkeypatch.setattr(grpc_server, "_from_contents", spy_contents)
    return counts


def zero_length_bytes_body(name: str, count: int) -> tuple[bytes, dict[str, str]]:
    """An OIP binary body: one BYTES input of ``count`` zero-length elements (4 bytes each)."""
    head = json.dumps({"inputs": [{"name": name, "datatype": "BYTES", "shape": [count],
                                   "parameters": {"binary_data_size": 4 * count}}]}).encode()
    return head + bytes(4 * count), {"Inference-Header-Content-Length": str(len(head)),
                                     "Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def app_client(repo, oip):
    from fastapi.testclient import TestClient
    from veil.engine.server import create_app

    with TestClient(create_app(oip.make_config(repo, max_body_mb=16, max_bytes_elements=100_000))) as c:
        yield c


def test_http_bytes_for_an_fp32_input_are_refused_before_decoding(app_client, decoded) -> None:
    """Issue 31 item 4: 8 MiB of zero-length BYTES elements sent to FP32 'affine' were all decoded (6-9 CPU s per
    64 MiB) before the datatype check; now none is."""
    body, headers = zero_length_bytes_body("x", 2_000_000)
    r = app_client.post("/v2/models/affine/infer", content=body, headers=headers)
    assert r.status_code == 400 and r.json()["error"] == "input 'x': datatype expected FP32, received BYTES"
    assert decoded == []


def test_http_bytes_element_count_is_bounded(app_client, decoded) -> None:
    """Issue 31 item 4: a BYTES input declaring more than --max-bytes-elements is 413 before any is decoded; one
    that fits is decoded (and refused later by its shape)."""
    body, headers = zero_length_bytes_body("text", 100_001)
    r = app_client.post("/v2/models/dtypes/infer", content=body, headers=headers)
    assert r.status_code == 413 and "at most 100000 BYTES elements (--max-bytes-elements), received a shape of " \
                                     "100001" in r.json()["error"]
    assert decoded == []
    r = app_client.post("/v2/models/dtypes/infer", content=zero_length_bytes_body("text", 3)[0],
                        headers=zero_length_bytes_body("text", 3)[1])
    assert r.status_code == 400 and "input 'text': shape expected" in r.json()["error"] and decoded == [3]


def test_http_unknown_input_is_refused_before_decoding(app_client, decoded) -> None:
    body, headers = zero_length_bytes_body("nope", 1000)
    r = app_client.post("/v2/models/affine/infer", content=body, headers=headers)
    assert r.status_code == 400 and r.json()["error"] == "model 'affine' has no input 'nope'; expected ['x']"
    assert decoded == []


def test_bytes_length_prefixes_are_checked_before_reading() -> None:
    """A shape declaring more elements than the data has 4-byte prefixes for is refused before the first one."""
    with pytest.raises(BinarySizeMismatch, match=r"shape expects 1000000000 BYTES elements, which need at least "
                                                 r"4000000000 bytes \(a 4-byte length each\), received 8"):
        protocol.decode_bytes("t", bytes(8), 10**9)


def test_expected_names_field_expected_and_received() -> None:
    expected = Expected("m", {"x": "FP32", "s": "BYTES"}, max_bytes_elements=10)
    expected.check("x", "FP32", 10**9)  # only BYTES are bounded here: fixed-size data is sized by its bytes
    with pytest.raises(EngineError, match=r"input 's': expected at most 10 BYTES elements .* received a shape of 11"):
        expected.check("s", "BYTES", 11)


# -- gRPC -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(repo, oip):
    """(http address, grpc address) of one in-process server with a 1 000-element BYTES bound."""
    config = oip.make_config(repo, grpc_port=0, grpc_max_message_mb=4.0, max_bytes_elements=1000)
    with oip.live_server(config) as (url, server):
        yield url, f"127.0.0.1:{server.config.app.state.grpc_port}"


@pytest.fixture(scope="module")
def raw_call(live):
    """ModelInfer over a raw channel: serialized bytes in, serialized bytes out."""
    channel = grpc.insecure_channel(live[1], options=[("grpc.max_send_message_length", 8 * 2**20)])
    yield channel.unary_unary(f"/{proto.SERVICE}/ModelInfer")
    channel.close()


def bytes_message(model: str, name: str, count: int) -> bytes:
    request = proto.msg.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype="BYTES", shape=[count]).contents.bytes_contents.extend(
        itertools.repeat(b"", count))
    return request.SerializeToString()


@pytest.mark.parametrize(("model", "name", "count", "code", "message"), [
    ("affine", "x", 200_000, grpc.StatusCode.INVALID_ARGUMENT, "input 'x': datatype expected FP32, received BYTES"),
    ("dtypes", "text", 1001, grpc.StatusCode.RESOURCE_EXHAUSTED, "expected at most 1000 BYTES elements"),
    ("affine", "y", 10, grpc.StatusCode.INVALID_ARGUMENT, "model 'affine' has no input 'y'; expected ['x']"),
])
def test_grpc_declarations_are_checked_before_decoding(raw_call, decoded, model, name, count, code, message) -> None:
    """Issue 31 item 4 over gRPC: datatype, name and BYTES element count are checked before any element is
    decoded (the typed contents are never turned into Python objects)."""
    with pytest.raises(grpc.RpcError) as err:
        raw_call(bytes_message(model, name, count), timeout=30)
    assert err.value.code() == code and message in err.value.details()
    assert decoded == []


@pytest.mark.parametrize("data", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x12\x02\x0a"])
def test_grpc_undecodable_message_is_invalid_argument(raw_call, data: bytes) -> None:
    """Issue 31 item 18: bytes that are not a ModelInferRequest were gRPC's own UNKNOWN with no message."""
    with pytest.raises(grpc.RpcError) as err:
        raw_call(data, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"request: expected a serialized inference.ModelInferRequest, received "
                                          f"{len(data)} bytes that do not parse")


def test_grpc_large_message_is_decoded_off_the_event_loop(live, raw_call, monkeypatch) -> None:
    """Issue 31 item 3: while a large gRPC message is being decoded, an HTTP health probe is answered (the decode
    waits for an event only the probe's answer sets: decoded on the event loop, the probe could never be answered
    first, and the decode would give up waiting)."""
    entered, answered, waited = threading.Event(), threading.Event(), []
    real = grpc_server.decode_infer

    def blocking_decode(*args, **kwargs):
        entered.set()
        waited.append(answered.wait(timeout=20))
        return real(*args, **kwargs)

    monkeypatch.setattr(grpc_server, "decode_infer", blocking_decode)
    request = proto.msg.ModelInferRequest(model_name="affine")
    request.inputs.add(name="x", datatype="FP32", shape=[8, 4])
    request.raw_input_contents.append(np.zeros((8, 4), np.float32).tobytes())
    request.parameters["pad"].string_param = "x" * (protocol.INLINE_BYTES + 1)
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(raw_call(request.SerializeToString(), timeout=60)))
    worker.start()
    assert entered.wait(timeout=30)
    probe = httpx.get(f"http://{live[0]}/v2/health/ready", timeout=30)
    answered.set()
    worker.join(timeout=60)
    assert probe.status_code == 200 and waited == [True] and len(outcome) == 1


# -- fuzz -----------------------------------------------------------------------------------------------
FUZZ = settings(max_examples=80, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
VALID = proto.msg.ModelInferRequest(model_name="affine", raw_input_contents=[bytes(16)])
VALID.inputs.add(name="x", datatype="FP32", shape=[1, 4])
SEED = VALID.SerializeToString()


@FUZZ
@given(data=st.binary(max_size=200) | st.builds(lambda cut, flips: bytes(
    b ^ flips.get(i, 0) for i, b in enumerate(SEED[:cut])), st.integers(0, len(SEED)),
    st.dictionaries(st.integers(0, len(SEED) - 1), st.integers(1, 255), max_size=4)))
def test_fuzz_grpc_request_decoder(data: bytes) -> None:
    """The gRPC request decoder (parse, then decode against the model's inputs): any bytes give a request or an
    engine error (a client code), never another exception."""
    try:
        request = grpc_server.parse(proto.msg.ModelInferRequest, data)
        grpc_server.decode_infer(request, Expected("affine", {"x": "FP32"}, 1000))
    except EngineError as exc:
        assert exc.status_code < 500, exc


@FUZZ
@given(data=st.binary(max_size=120))
def test_fuzz_grpc_front_answers_any_bytes_with_a_client_code(raw_call, data: bytes) -> None:
    try:
        raw_call(data, timeout=30)
    except grpc.RpcError as err:
        assert err.code() in {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                              grpc.StatusCode.RESOURCE_EXHAUSTED}, (err.code(), err.details())


def test_key_registration_is_not_queued_behind_he_evaluations() -> None:
    """Issue 31 item 7: HE evaluations and key registrations shared the default thread pool, so 8 concurrent HE
    requests delayed another client's registration from 0.09 s to 11 s. With every default-pool thread held by a
    blocked "evaluation", a registration still completes (it has a pool of its own)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from veil.engine import dataplane

    class Store:
        ttl_seconds = 60.0

        def register(self, body, source, key_secret):
            return SimpleNamespace(key_id="k", key_secret="s", size=len(body))

    async def scenario() -> dict:
        loop, release = asyncio.get_running_loop(), threading.Event()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
        held = [asyncio.ensure_future(asyncio.to_thread(release.wait, 30)) for _ in range(2)]
        try:
            return await asyncio.wait_for(dataplane.register_key_bytes(Store(), b"keys", "10.0.0.1", None), 20)
        finally:
            release.set()
            await asyncio.gather(*held)

    assert asyncio.run(scenario())["bytes"] == 4
