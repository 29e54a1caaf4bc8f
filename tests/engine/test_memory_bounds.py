"""Memory a stranger can take (issue 31): the peak RSS of a ``veil serve`` subprocess stays within a wide bound
while it refuses requests built to make it hold or allocate much more than they send.

Each test sends a bounded number of requests and compares the server's peak resident set (``VmHWM``) before and
after; the bound is several times what one request legitimately needs, and far below what the defect took.
"""

from __future__ import annotations

import itertools

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

