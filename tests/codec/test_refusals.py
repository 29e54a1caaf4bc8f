"""Corrupt, truncated and foreign streams, and unsupported or oversize images, are refused naming the field."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image
from veil.codec import bitstream as bs
from veil.codec.errors import BitstreamError, CodecError, ImageError, ImageTooLarge
from veil.codec.images import load_image, png_bytes
from veil.codec.runtime import CodecRuntime


@pytest.fixture(scope="module")
def stream(runtime, images) -> bytes:
    return runtime.encode(images.crop, k=5).data


def refused(runtime: CodecRuntime, data: bytes, field: str) -> str:
    with pytest.raises(BitstreamError) as info:
        runtime.decode(data)
    assert info.value.field == field, str(info.value)
    return str(info.value)


def test_foreign_magic(runtime, stream) -> None:
    assert "expected b'VC'" in refused(runtime, b"\x89PNG\r\n" + stream[6:], "magic")
    refused(runtime, b"", "magic")


def test_other_format_version(runtime, stream) -> None:
    assert "received 9" in refused(runtime, stream[:2] + b"\x09" + stream[3:], "version")


@pytest.mark.parametrize("where", [5, 12, 20, -6, -1])
def test_any_flipped_byte_fails_the_crc(runtime, stream, where: int) -> None:
    data = bytearray(stream)
    data[where] ^= 0x40
    refused(runtime, bytes(data), "crc")


@pytest.mark.parametrize("cut", [1, 3, 10])
def test_truncated_stream(runtime, stream, cut: int) -> None:
    with pytest.raises(BitstreamError) as info:
        runtime.decode(stream[:-cut])
    assert info.value.field in ("crc", "length")


def test_stream_of_another_model(runtime, stream) -> None:
    parsed = bs.read(stream)
    foreign = bs.write(bs.Bitstream(replace(parsed.header, model_hash=b"\0\1\2\3"), parsed.chunks))
    assert "00010203" in refused(runtime, foreign, "model hash")


def test_well_sealed_but_inconsistent_chunks(runtime, stream) -> None:
    parsed = bs.read(stream)
    body = bytearray(bs.write(parsed)[:-4])
    body[bs.header_size(stream)] = 0x7F  # first chunk claims 127 bytes
    import zlib

    refused(runtime, bytes(body) + zlib.crc32(body).to_bytes(4, "big"), "chunk length")


def test_truncate_is_a_byte_operation_with_a_fresh_crc(stream) -> None:
    cut = bs.truncate(stream, 2)
    assert bs.read(cut).header.k == 2 and len(cut) < len(stream)
    with pytest.raises(BitstreamError, match="scales sent"):
        bs.truncate(stream, 6)


def test_unsupported_and_oversize_images() -> None:
    gif = io.BytesIO()
    Image.new("RGB", (32, 32)).save(gif, format="GIF")
    with pytest.raises(ImageError, match="image format"):
        load_image(gif.getvalue())
    with pytest.raises(ImageError, match="image format"):
        load_image(b"not an image at all")
    with pytest.raises(ImageError, match="empty"):
        load_image(b"")
    big = png_bytes(np.zeros((300, 300, 3), np.uint8))
    with pytest.raises(ImageTooLarge, match="at most 40000 pixels"):
        load_image(big, max_pixels=40_000)
    with pytest.raises(ImageError, match=">= 8"):
        load_image(png_bytes(np.zeros((4, 40, 3), np.uint8)))
    assert load_image(big).shape == (300, 300, 3)


def test_encode_refuses_bad_scales(runtime, images) -> None:
    with pytest.raises(ValueError, match=r"expected k in \[1, 10\]"):
        runtime.encode(images.crop, k=11)


# -- issue 19, item 15: streams that pass the CRC (resealed) but are not what they claim -------------------------
def reseal(data: bytes | bytearray) -> bytes:
    """The stream with a CRC recomputed over its (mutated) body, as an attacker would."""
    import zlib

    body = bytes(data[:-4])
    return body + zlib.crc32(body).to_bytes(4, "big")


def test_a_resealed_bit_flip_is_a_bitstream_error_not_an_assertion(runtime, images) -> None:
    """Flipped chunk bits under a fresh CRC: constriction's AssertionError used to escape the decoder."""
    stream = runtime.encode(images.crop).data  # all 10 scales
    start = bs.header_size(stream) + 1
    for i in range(start, len(stream) - 4):
        for bit in range(8):
            flipped = bytearray(stream)
            flipped[i] ^= 1 << bit
            try:
                runtime.decode(reseal(flipped))
            except BitstreamError as exc:
                if "decoder refused" in str(exc):
                    assert exc.field.startswith("scale ")
                    return
    pytest.fail("no flipped stream reached the range decoder's refusal")


def test_a_flipped_height_bit_is_refused_quickly(runtime, stream) -> None:
    """The height's top bit flipped (96 -> 32864 rows, 3.4 MP) under a fresh CRC: the first scale already
    decodes to more information than its bytes carry, so nothing is decoded at the claimed size; since issue 31
    item 2 the coding budget (what completing 32864 x 136 would cost) refuses it even before that."""
    flipped = bytearray(stream)
    flipped[7] ^= 0x80
    with pytest.raises(CodecError, match=r"more than its|needs about .* MiB to code") as info:
        runtime.decode(reseal(flipped))
    assert getattr(info.value, "field", "height/width") in ("scale 1", "height/width")
    assert str(info.value).startswith("bitstream ")


def test_the_stream_length_bounds_the_size_it_can_claim(runtime, images) -> None:
    """A header claiming 20000 x 20000 with all 10 scales in empty chunks: refused by length before any decoding
    (the last scale alone would need 12.5 M bits; 0 bytes carry at most 2.9 M)."""
    parsed = bs.read(runtime.encode(images.crop).data)
    claim = bs.write(bs.Bitstream(replace(parsed.header, height=20_000, width=20_000), [b""] * parsed.header.k))
    big = CodecRuntime(runtime.folder, max_pixels=2 ** 32)
    message = refused(big, claim, "height/width")
    assert "more than its 0 bytes can carry" in message


def test_the_pixel_limit_is_configurable(codec_dir, stream) -> None:
    """96 x 136 = 13056 pixels: decoded under the default limit, refused under a smaller one."""
    small = CodecRuntime(codec_dir, max_pixels=10_000)
    assert "at most 10000 pixels" in refused(small, stream, "height/width")
