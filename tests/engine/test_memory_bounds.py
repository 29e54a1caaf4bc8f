"""Memory a stranger can take (issue 31): the peak RSS of a ``veil serve`` subprocess stays within a wide bound
while it refuses requests built to make it hold or allocate much more than they send.

Each test sends a bounded number of requests and compares the server's peak resident set (``VmHWM``) before and
after; the bound is several times what one request legitimately needs, and far below what the defect took.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import grpc
import pytest
from veil.engine import proto


@pytest.fixture
def served(repo, oip):
    with oip.server_process(repo, "--grpc-max-message-mb", "64", "--max-bytes-elements", "8000000") as server:
        yield server


def bytes_request(model: str, name: str, count: int) -> bytes:
    """A serialized ModelInferRequest: one BYTES input of ``count`` empty ``contents.bytes_contents`` elements
    (two bytes each on the wire, ~16 bytes each once parsed, 8 more in the decoded object array)."""
    request = proto.msg.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=name, datatype="BYTES", shape=[count])
    tensor.contents.bytes_contents.extend(itertools.repeat(b"", count))
    return request.SerializeToString()


def refused_ten_times(served, body: bytes, code: grpc.StatusCode, message: str) -> float:
    """Send ``body`` to ModelInfer ten times, each refused with ``code`` and ``message``; the MiB the server's peak
    RSS grew meanwhile."""
    channel = grpc.insecure_channel(served.grpc, options=[("grpc.max_send_message_length", 64 * 2**20)])
    call = channel.unary_unary(f"/{proto.SERVICE}/ModelInfer")  # raw bytes in and out
    before = served.memory_mb()
    try:
        for _ in range(10):
            with pytest.raises(grpc.RpcError) as err:
                call(body, timeout=60)
            assert err.value.code() == code and message in err.value.details()
    finally:
        channel.close()
    return served.memory_mb() - before


def test_grpc_failed_requests_are_freed_at_once(served) -> None:
    """Issue 31 item 1: a ModelInfer that fails after its tensors were decoded (here: 8 M BYTES elements for the
    [-1, 3] input 'text') no longer keeps its message and decoded arrays alive in a reference cycle (exception ->
    traceback -> frame -> request) until the cyclic GC runs: ten such 8 MiB messages took the server +1.7 GB,
    they now cost about what one of them does (+0.25 GB)."""
    grown = refused_ten_times(served, bytes_request("dtypes", "text", 4_000_000), grpc.StatusCode.INVALID_ARGUMENT,
                              "input 'text': shape expected")
    assert grown < 700, f"peak RSS grew {grown:.0f} MiB over 10 refused requests"



@pytest.fixture
def codec_served(tmp_path, oip):
    """The shipped codec as model 'codec', with a 256 MiB coding budget (the max_decode_mb parameter)."""
    import shutil

    import veil.codec

    shutil.copytree(Path(veil.codec.__file__).parent / "default" / "codec", tmp_path / "codec")
    config = tmp_path / "codec" / "config.pbtxt"
    config.write_text(config.read_text() + 'parameters { key: "max_decode_mb" value: { string_value: "256" } }\n')
    with oip.server_process(tmp_path) as server:
        yield server


def crafted_stream(side: int) -> bytes:
    """A valid 22-byte k = 1 stream of the shipped codec whose header declares ``side x side`` pixels: the one
    chunk of a 16 x 16 image carries enough bits for the first scale of any size up to ~1000 x 1000."""
    import numpy as np
    import veil.codec
    from veil.codec import bitstream as bs
    from veil.codec.runtime import CodecRuntime

    runtime = CodecRuntime(Path(veil.codec.__file__).parent / "default" / "codec" / "1")
    small = bs.read(runtime.encode(np.full((16, 16, 3), 128, np.uint8), k=1).data)
    return bs.write(bs.Bitstream(bs.Header(small.header.model_hash, side, side, 1), small.chunks))


def test_codec_stream_declaring_a_large_area_is_refused_before_decoding(codec_served, oip) -> None:
    """Issue 31 item 2: a 22-byte stream declaring 768 x 768 took the server +1.6 GB (the prior's attention is
    quadratic in the cells it completes; 1024 x 1024 took 4.8 GB); it is now refused (413) against the model's
    max_decode_mb before any scale is decoded, and the server's peak RSS barely moves."""
    import httpx
    import numpy as np

    stream = crafted_stream(768)
    assert len(stream) == 22
    body, headers = oip.binary_body([("bitstream", "BYTES", np.array([stream], dtype=object))],
                                    [("bitstream", True), ("image", True)])
    before = codec_served.memory_mb()
    r = httpx.post(f"http://{codec_served.url}/v2/models/codec/infer", content=body, headers=headers, timeout=60)
    grown = codec_served.memory_mb() - before
    assert r.status_code == 413, r.text
    assert "768x768 needs about" in r.json()["error"] and "expected at most 256 MiB (the model's max_decode_mb parameter)" in r.json()["error"]
    assert grown < 400, f"peak RSS grew {grown:.0f} MiB for one refused 22-byte stream"
