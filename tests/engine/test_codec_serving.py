"""The codec service through `veil serve`: encode, decode, the scales parameter, every refusal as a 4xx."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import skimage.data
from veil.codec import bitstream as bs
from veil.codec.images import load_image, png_bytes
from veil.codec.runtime import CodecRuntime


@pytest.fixture(scope="module")
def codec_repo(tmp_path_factory):
    """A tiny codec (2 + 2 training steps) exported as model 'codec' in a fresh repository."""
    from veil.export.codec import export_codec
    from veil.training.codec.config import CodecModelConfig, CodecTrainConfig
    from veil.training.codec.data import skimage_images
    from veil.training.codec.trainer import save_codec, train_codec

    root = tmp_path_factory.mktemp("codec-serving")
    images = skimage_images(("camera",))
    model = CodecModelConfig(d=8, bits=[4, 4, 4, 4, 6, 6, 6, 8, 8, 8], channels=[8, 8, 8, 8], prior_width=16,
                             prior_layers=1, prior_heads=2)
    train = CodecTrainConfig(tokenizer_steps=2, prior_steps=2, crop=64, prior_crop=64, batch_size=2, prior_crops=2)
    save_codec(train_codec(model, train, list(images.values()), progress=False), root / "ck", sorted(images))
    export_codec(root / "ck", root / "repo", "codec")
    (root / "repo" / "codec" / "config.pbtxt").write_text(
        (root / "repo" / "codec" / "config.pbtxt").read_text()
        + 'parameters { key: "max_pixels" value: { string_value: "40000" } }\n')
    return root / "repo"


@pytest.fixture(scope="module")
def live(codec_repo, oip):
    with oip.live_server(oip.make_config(codec_repo)) as (url, _server):
        yield f"http://{url}"


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    return np.ascontiguousarray(skimage.data.astronaut()[100:180, 200:296])  # 80 x 96


def infer(live: str, oip, name: str, payload: bytes, **params) -> tuple[int, dict]:
    body, headers = oip.binary_body([(name, "BYTES", np.array([payload], dtype=object))],
                                    [("bitstream", True), ("image", True)], **params)
    req = urllib.request.Request(f"{live}/v2/models/codec/infer", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, {k: v.reshape(-1)[0] for k, v in oip.decode(_Response(r)).items()}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class _Response:
    """What oip.decode reads from a response: headers and content."""

    def __init__(self, r) -> None:
        self.headers = {k.lower(): v for k, v in r.headers.items()}
        self.content = r.read()


def test_encode_then_decode_over_http(live, oip, codec_repo, photo) -> None:
    status, out = infer(live, oip, "image", png_bytes(photo), scales=6)
    assert status == 200
    stream = bytes(out["bitstream"])
    runtime = CodecRuntime(codec_repo / "codec" / "1")
    assert bs.read(stream).header.k == 6 and stream == runtime.encode(photo, k=6).data  # same bytes as the CLI
    assert np.array_equal(load_image(bytes(out["image"])), runtime.decode(stream))
    status, back = infer(live, oip, "bitstream", stream)
    assert status == 200 and bytes(back["image"]) == bytes(out["image"])


def test_scales_parameter_cuts_a_stream_without_reencoding(live, oip, photo) -> None:
    _, full = infer(live, oip, "image", png_bytes(photo))
    status, cut = infer(live, oip, "bitstream", bytes(full["bitstream"]), scales=3)
    assert status == 200 and bytes(cut["bitstream"]) == bs.truncate(bytes(full["bitstream"]), 3)


def test_metadata_describes_the_codec(live) -> None:
    with urllib.request.urlopen(f"{live}/v2/models/codec") as r:
        meta = json.loads(r.read())
    assert meta["platform"] == "veil_codec" and meta["parameters"]["codec"]["K"] == 10
    assert meta["parameters"]["codec"]["max_pixels"] == 40000


@pytest.mark.parametrize(("name", "payload", "params", "status", "text"), [
    ("bitstream", b"garbage", {}, 400, "bitstream magic"),
    ("bitstream", b"VC\x01" + b"\0" * 20, {}, 400, "bitstream crc"),
    ("image", b"GIF89a" + b"\0" * 40, {}, 400, "image format"),
    ("image", "big", {}, 413, "at most 40000 pixels"),
    ("image", "photo", {"scales": 11}, 400, "parameters.scales"),
    ("image", "photo", {"mode": "wild"}, 400, "parameters.mode"),
])
def test_refusals_are_4xx_and_the_server_keeps_serving(live, oip, photo, name, payload, params, status, text) -> None:
    if payload == "big":
        payload = png_bytes(np.zeros((256, 256, 3), np.uint8))
    elif payload == "photo":
        payload = png_bytes(photo)
    code, body = infer(live, oip, name, payload, **params)
    assert code == status and text in body["error"], body
    assert infer(live, oip, "image", png_bytes(photo), scales=2)[0] == 200


def test_foreign_and_truncated_streams(live, oip, photo) -> None:
    _, out = infer(live, oip, "image", png_bytes(photo), scales=4)
    stream = bs.read(bytes(out["bitstream"]))
    foreign = bs.write(bs.Bitstream(bs.Header(b"abcd", 80, 96, 4), stream.chunks))
    code, body = infer(live, oip, "bitstream", foreign)
    assert code == 400 and "model hash" in body["error"]
    code, body = infer(live, oip, "bitstream", bytes(out["bitstream"])[:-3])
    assert code == 400 and "crc" in body["error"]


def test_two_inputs_at_once_are_refused(live, oip, photo) -> None:
    body, headers = oip.binary_body([("image", "BYTES", np.array([png_bytes(photo)], dtype=object)),
                                     ("bitstream", "BYTES", np.array([b"x"], dtype=object))])
    req = urllib.request.Request(f"{live}/v2/models/codec/infer", data=body, headers=headers, method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req)
    assert info.value.code == 400 and "exactly one of inputs" in json.loads(info.value.read())["error"]


def _resealed(data: bytes | bytearray) -> bytes:
    import zlib

    body = bytes(data[:-4])
    return body + zlib.crc32(body).to_bytes(4, "big")


def test_resealed_corrupt_streams_are_400_not_500(live, oip, codec_repo, photo) -> None:
    """Issue 19, item 15: bit flips under a recomputed CRC reach the range decoder, whose AssertionError was a
    500; a flipped height byte claims a size the stream cannot carry. Both are 400s naming the field."""
    from veil.codec.errors import BitstreamError

    runtime = CodecRuntime(codec_repo / "codec" / "1")
    stream = runtime.encode(photo).data
    refused = None
    for i in range(bs.header_size(stream) + 1, len(stream) - 4):
        for bit in range(8):
            flipped = bytearray(stream)
            flipped[i] ^= 1 << bit
            try:
                runtime.decode(_resealed(flipped))
            except BitstreamError as exc:
                if "decoder refused" in str(exc):
                    refused = _resealed(flipped)
                    break
        if refused:
            break
    assert refused is not None
    code, body = infer(live, oip, "bitstream", refused)
    assert code == 400 and "bitstream scale" in body["error"], body
    tall = bytearray(stream)
    tall[7] ^= 0x80  # height 80 -> 32848
    code, body = infer(live, oip, "bitstream", _resealed(tall))
    assert code == 400 and "bitstream" in body["error"], body
    assert infer(live, oip, "image", png_bytes(photo), scales=2)[0] == 200
