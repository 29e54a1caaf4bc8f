"""The spec's B5 invariants on a tiny exported codec: lossless tokens, determinism, rate, coder efficiency."""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import sys

import numpy as np
import pytest
from veil.codec import bitstream as bs
from veil.codec.coder import ONE, cross_entropy_bits, decode_bits, encode_bits, quantize_probs
from veil.codec.runtime import CodecRuntime
from veil.codec.scales import latent_size
from veil.codec.tokens import Geometry, raw_bits


def sha(a: np.ndarray | bytes) -> str:
    return hashlib.sha256(a if isinstance(a, bytes) else a.tobytes()).hexdigest()


def roundtrip(runtime: CodecRuntime, tokens: list[np.ndarray], height: int, width: int) -> list[np.ndarray]:
    h, w = latent_size(height, width, runtime.geo.stride)
    chunks, _ = runtime.encode_tokens(tokens, h, w)
    stream = bs.read(bs.write(bs.Bitstream(bs.Header(runtime.hash4, height, width, len(tokens)), chunks)))
    return runtime.decode_tokens(stream)[0]


def test_token_round_trip_random_adversarial_and_masked(runtime, images) -> None:
    height, width = images.crop.shape[:2]
    h, w = latent_size(height, width, runtime.geo.stride)
    real = runtime.tokenize(runtime.latent(images.crop))
    assert [t.shape[2] for t in real] == list(runtime.geo.bits)  # masked channels are not tokens at all
    assert all(np.array_equal(a, b) for a, b in zip(roundtrip(runtime, real, height, width), real, strict=True))
    rng = np.random.default_rng(1)
    random = [rng.integers(0, 2, t.shape, dtype=np.uint8) for t in real]
    assert all(np.array_equal(a, b) for a, b in zip(roundtrip(runtime, random, height, width), random, strict=True))
    adversarial: list[np.ndarray] = []  # every bit the one the prior finds less likely
    for j in range(runtime.geo.K):
        adversarial.append((runtime.probabilities(adversarial, h, w, j) <= ONE // 2).astype(np.uint8))
    back = roundtrip(runtime, adversarial, height, width)
    assert all(np.array_equal(a, b) for a, b in zip(back, adversarial, strict=True))


def test_extreme_probabilities_stay_lossless_and_bounded() -> None:
    bits = np.array([1, 0] * 200, np.uint8)
    q = quantize_probs(np.array([0.0, 1.0] * 200))  # certain of the wrong bit: clamped to 2^-16
    assert q.min() == 1 and q.max() == ONE - 1
    data = encode_bits(bits, q)
    assert np.array_equal(decode_bits(data, q), bits)
    assert len(data) * 8 <= 16 * bits.size + 64  # a wrong certain bit costs at most 16 bits
    with pytest.raises(ValueError, match="finite"):
        quantize_probs(np.array([np.nan]))


@pytest.mark.parametrize("n", [1, 7, 300, 20_000])
def test_coder_efficiency_bounds(n: int) -> None:
    rng = np.random.default_rng(n)
    p = rng.beta(0.5, 0.5, n)
    bits = (rng.random(n) < p).astype(np.uint8)
    q = quantize_probs(p)
    actual, ce = len(encode_bits(bits, q)) * 8, cross_entropy_bits(bits, q)
    assert ce - 64 <= actual <= ce * 1.01 + 64


def test_model_streams_within_one_percent_of_cross_entropy(runtime, images) -> None:
    enc = runtime.encode(images.crop)
    stream = bs.read(enc.data)
    payload_bits = sum(len(c) for c in stream.chunks) * 8
    assert enc.cross_entropy_bits - 64 <= payload_bits <= enc.cross_entropy_bits * 1.01 + 64 * len(stream.chunks)


def test_encode_is_byte_identical_across_runs_and_processes(runtime, codec_dir, images, tmp_path) -> None:
    first, second = runtime.encode(images.crop).data, CodecRuntime(codec_dir).encode(images.crop).data
    assert first == second
    np.save(tmp_path / "x.npy", images.crop)
    code = ("import hashlib,sys,numpy as np; from veil.codec.runtime import CodecRuntime; "
            "r=CodecRuntime(sys.argv[1]); x=np.load(sys.argv[2]); d=r.encode(x).data; "
            "print(hashlib.sha256(d).hexdigest(), hashlib.sha256(r.decode(d).tobytes()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code, str(codec_dir), str(tmp_path / "x.npy")], check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == [sha(first), sha(runtime.decode(first))]


@pytest.mark.parametrize(("mode", "k"), [("greedy", 3), ("sample", 4), ("mean", 5)])
def test_decode_is_pixel_identical_across_runs_and_threads(codec_dir, images, mode: str, k: int) -> None:
    one, two = CodecRuntime(codec_dir, threads=1), CodecRuntime(codec_dir, threads=2)
    data = one.encode(images.crop, k=k, mode=mode, seed=7).data
    shas = {sha(one.decode(data)), sha(one.decode(data)), sha(two.decode(data))}
    assert len(shas) == 1


def test_seeded_sampling_depends_on_the_seed(runtime, images) -> None:
    a = runtime.decode(runtime.encode(images.crop, k=2, mode="sample", seed=1).data)
    b = runtime.decode(runtime.encode(images.crop, k=2, mode="sample", seed=2).data)
    assert not np.array_equal(a, b)


def test_full_transmission_equals_tokenizer_decode(runtime, images) -> None:
    height, width = images.crop.shape[:2]
    tokens = runtime.tokenize(runtime.latent(images.crop))
    for mode in ("greedy", "sample", "mean"):  # the generator plays no part when k = K
        data = runtime.encode(images.crop, mode=mode, seed=3).data
        assert np.array_equal(runtime.decode(data), runtime.reconstruct_tokens(tokens, height, width))


def test_rate_strictly_increases_and_streams_are_prefixes(runtime, images) -> None:
    streams = [runtime.encode(images.crop, k=k).data for k in range(1, runtime.geo.K + 1)]
    assert all(len(a) < len(b) for a, b in itertools.pairwise(streams))
    head = bs.header_size(streams[0])
    bodies = [s[head:-4] for s in streams]
    assert all(b.startswith(a) for a, b in itertools.pairwise(bodies))
    assert all(bs.truncate(streams[-1], k + 1) == s for k, s in enumerate(streams))  # a cut is the k-scale stream


def test_bpp_counts_every_byte(runtime, images) -> None:
    enc = runtime.encode(images.crop, k=4)
    stream = bs.read(enc.data)
    body = sum(len(bs._varint(len(c))) + len(c) for c in stream.chunks)
    assert len(enc.data) == bs.header_size(enc.data) + body + 4
    assert enc.bpp == len(enc.data) * 8 / (images.crop.shape[0] * images.crop.shape[1])


def test_target_bpp_picks_the_most_scales_within_budget(runtime, images) -> None:
    sizes = [len(runtime.encode(images.crop, k=k).data) for k in range(1, runtime.geo.K + 1)]
    pixels = images.crop.shape[0] * images.crop.shape[1]
    target = (sizes[4] * 8 + 4) / pixels
    assert runtime.encode(images.crop, target_bpp=target).k == 5


def test_raw_budget_matches_the_group_mask_table() -> None:
    # the default model on a 512x512 image: sides 1,2,3,4 x 6 bits, 6,8,12 x 9 bits, 16,24,32 x 12 bits
    geo = Geometry((1, 2, 3, 4, 6, 8, 12, 16, 24, 32), (6,) * 4 + (9,) * 3 + (12,) * 3, 12, (1.0,) * 10, 16, 4, 64.0)
    assert raw_bits(32, 32, geo, 4) == 30 * 6
    assert raw_bits(32, 32, geo, 7) == 30 * 6 + (36 + 64 + 144) * 9
    assert raw_bits(32, 32, geo, 10) == 30 * 6 + 244 * 9 + (256 + 576 + 1024) * 12


def test_digits_round_trip(runtime, images) -> None:
    data = runtime.encode(images.digit, k=6).data
    out = runtime.decode(data)
    assert out.shape == images.digit.shape and out.dtype == np.uint8
