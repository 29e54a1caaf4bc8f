"""Property-based fuzzing of the codec bitstream parser and decoder (issue 19, "Fuzzing in CI").

Random bytes, bit flips under a recomputed CRC, truncations and header field mutations: every input decodes to
an image or is refused with the codec's own error (:class:`~veil.codec.errors.CodecError`), never an
AssertionError or another exception. The runtime's pixel limit is set small so that no input costs more than a
small image's decode; the example counts keep each property to seconds.
"""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from veil.codec import bitstream as bs
from veil.codec.errors import CodecError
from veil.codec.runtime import CodecRuntime

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def reseal(data: bytes | bytearray) -> bytes:
    import zlib

    body = bytes(data[:-4])
    return body + zlib.crc32(body).to_bytes(4, "big")


@pytest.fixture(scope="module")
def small(codec_dir) -> CodecRuntime:
    """The tiny codec with a 16384-pixel limit (the 96 x 136 crop fits, anything 2x larger does not)."""
    return CodecRuntime(codec_dir, max_pixels=16_384)


@pytest.fixture(scope="module")
def streams(small, images) -> dict[str, bytes]:
    return {"greedy": small.encode(images.crop).data,
            "sample": small.encode(images.crop, k=4, mode="sample", seed=7, temperature=0.8).data}


def decodes_or_refuses(runtime: CodecRuntime, data: bytes) -> None:
    """The property: an image of the header's size, or a CodecError; any other exception fails the test."""
    try:
        pixels = runtime.decode(data)
    except CodecError:
        return
    header = bs.read(data).header
    assert pixels.dtype == np.uint8 and pixels.shape == (header.height, header.width, 3)


@FUZZ
@given(data=st.binary(max_size=400), sealed=st.booleans())
def test_random_bytes(small, data: bytes, sealed: bool) -> None:
    data = reseal(b"VC\x01" + data + b"\0\0\0\0") if sealed else data
    decodes_or_refuses(small, data)


@settings(FUZZ, max_examples=150)
@given(which=st.sampled_from(["greedy", "sample"]), draw=st.data())
def test_bit_flips_under_a_recomputed_crc(small, streams, which: str, draw: st.DataObject) -> None:
    """1-3 flipped bits anywhere before the CRC, mostly in the range-coded chunks."""
    data = bytearray(streams[which])
    first = draw.draw(st.sampled_from([0, bs.header_size(bytes(data))]))
    for _ in range(draw.draw(st.integers(1, 3))):
        data[draw.draw(st.integers(first, len(data) - 5))] ^= 1 << draw.draw(st.integers(0, 7))
    decodes_or_refuses(small, reseal(data))


@FUZZ
@given(which=st.sampled_from(["greedy", "sample"]), cut=st.integers(0, 400), sealed=st.booleans())
def test_truncations(small, streams, which: str, cut: int, sealed: bool) -> None:
    data = streams[which][:cut % len(streams[which])]
    decodes_or_refuses(small, reseal(data) if sealed and len(data) >= 4 else data)


@FUZZ
@given(which=st.sampled_from(["greedy", "sample"]), height=st.integers(0, 65535), width=st.integers(0, 65535),
       k=st.integers(0, 255), mode=st.integers(0, 3), version=st.sampled_from([1, 1, 1, 0, 2, 255]))
def test_header_field_mutations(small, streams, which: str, height: int, width: int, k: int, mode: int,
                                version: int) -> None:
    data = bytearray(streams[which])
    magic, _, model_hash, _, _, _, _ = bs._HEAD.unpack_from(data)
    data[:bs._HEAD.size] = bs._HEAD.pack(magic, version, model_hash, height, width, k, mode)
    decodes_or_refuses(small, reseal(data))


@FUZZ
@given(seed=st.integers(0, 2 ** 32 - 1), t100=st.integers(0, 255))
def test_sampling_field_mutations(small, streams, seed: int, t100: int) -> None:
    data = bytearray(streams["sample"])
    data[bs._HEAD.size:bs._HEAD.size + bs._SAMPLE.size] = struct.pack(">IB", seed, t100)
    decodes_or_refuses(small, reseal(data))


@FUZZ
@given(data=st.binary(max_size=200), k=st.integers(-2, 20))
def test_truncate_and_parse_refuse_with_the_codec_error(data: bytes, k: int) -> None:
    for attempt in (lambda: bs.read(reseal(b"VC\x01" + data + b"\0\0\0\0")), lambda: bs.truncate(data, k)):
        with contextlib.suppress(CodecError):
            attempt()


@pytest.fixture(scope="module")
def budgeted(codec_dir) -> CodecRuntime:
    """No pixel limit to speak of, a 16 MiB coding budget: the budget alone bounds what a header can make it do."""
    return CodecRuntime(codec_dir, max_pixels=2 ** 32, max_work_mb=16)


@FUZZ
@given(which=st.sampled_from(["greedy", "sample"]), height=st.integers(0, 65535), width=st.integers(0, 65535),
       k=st.integers(1, 10), mode=st.integers(0, 2))
def test_header_sizes_are_checked_against_the_budget_before_decoding(budgeted, streams, which: str, height: int,
                                                                     width: int, k: int, mode: int) -> None:
    """Issue 31 item 2: whatever size a header declares, a stream whose coding the runtime estimates above its
    budget is refused before the prior runs once; one within it decodes or is refused as corrupt."""
    data = bytearray(streams[which])
    magic, version, model_hash, _, _, sent, _ = bs._HEAD.unpack_from(data)
    data[:bs._HEAD.size] = bs._HEAD.pack(magic, version, model_hash, height, width, min(k, sent), mode)
    calls, real = [], budgeted.probabilities
    budgeted.probabilities = lambda *args: calls.append(1) or real(*args)
    try:
        decodes_or_refuses(budgeted, reseal(data))
    finally:
        del budgeted.probabilities
    if height >= 8 and width >= 8 and budgeted.work_bytes(height, width) > 16 * 2**20:
        assert calls == []
