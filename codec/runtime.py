"""Run an exported codec (codec.json + encoder/decoder/prior ONNX) with ONNX Runtime: encode and decode.

Determinism rule: the probabilities that drive the range coder come from the same executor on both sides,
called the same way. The prior session is pinned to one thread, sequential execution and deterministic
compute; for scale ``j`` both sides run it on exactly the same input (the prefix through scale ``j``, built
by :func:`veil.codec.tokens.prior_inputs` from the integer tokens), and the probabilities are quantised to
integers before coding. Encoder and decoder sessions may use more threads: the encoder's output is only
read by the sender, and the decoded pixels are tested identical across thread counts.

Data path::

    pixels -> pad to a multiple of 16 -> encoder.onnx -> z (d, h, w)
    z -> residual sign quantization over K scales (numpy) -> tokens[k] (h_k, w_k, bits_k)
    tokens[:k] -> prior.onnx probabilities -> range coder -> chunks -> bitstream
    bitstream -> chunks -> range decoder (same probabilities) -> tokens[:k]
    tokens[:k] -> prior.onnx predicts scales k+1..K (greedy / seeded sample / mean)
    sum of upsampled codes -> decoder.onnx -> crop -> pixels
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from . import bitstream as bs
from .coder import ONE, cross_entropy_bits, decode_bits, encode_bits, max_coded_bits, quantize_probs
from .errors import BitstreamError, BudgetExceeded, CodecError
from .images import MAX_PIXELS, MAX_WORK_MB, check_size
from .scales import down, latent_size, scale_sizes, up
from .tokens import Geometry, codes, prior_inputs

ARTIFACT_FILES = ("codec.json", "encoder.onnx", "decoder.onnx", "prior.onnx")
# What coding one image costs in memory (issue 31 item 2), measured on the shipped codec with ONNX Runtime 1.x:
# the prior attends over every cell of the scales up to the one it predicts, so its scores, mask and softmax take
# ~70-92 bytes per (query, key) pair: quadratic in the cells, which a 22-byte stream declaring 1024 x 1024 turned
# into 4.8 GB; the decoder (and encoder) graphs take ~760 bytes per padded pixel.
PRIOR_BYTES_PER_PAIR = 96
GRAPH_BYTES_PER_PIXEL = 800


def artifact_hash(folder: str | Path) -> str:
    """SHA-256 over the artifact's files (name and bytes, fixed order): the model's identity in every stream."""
    digest = hashlib.sha256()
    for name in ARTIFACT_FILES:
        digest.update(name.encode() + b"\0" + (Path(folder) / name).read_bytes())
    return digest.hexdigest()


def _session(path: Path, threads: int, deterministic: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    if deterministic:
        options.use_deterministic_compute = True
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@dataclass
class Encoded:
    """An encoded image: the stream and what it cost, with the model's own estimate beside the real bytes."""

    data: bytes
    k: int
    bpp: float  # real bytes x 8 / original pixels, header and CRC included
    cross_entropy_bits: float  # sum -log2 p of the sent bits under the quantised probabilities
    raw_bits: int  # active bits sent, before entropy coding


class CodecRuntime:
    """An exported codec folder, ready to encode and decode.

    Args:
        folder: a version folder holding codec.json, encoder.onnx, decoder.onnx and prior.onnx.
        threads: ONNX Runtime threads of the encoder and decoder sessions (the prior always uses one).
        max_pixels: images larger than this are refused.
        max_work_mb: images and streams whose coding :meth:`work_bytes` estimates above this many MiB are refused
            before any of it is done (the served model's ``max_decode_mb`` parameter).
    """

    def __init__(self, folder: str | Path, threads: int = 1, max_pixels: int = MAX_PIXELS,
                 max_work_mb: float = MAX_WORK_MB) -> None:
        self.folder = Path(folder)
        missing = [n for n in ARTIFACT_FILES if not (self.folder / n).is_file()]
        if missing:
            raise CodecError(f"codec model {str(self.folder)!r}: expected files {list(ARTIFACT_FILES)}, missing {missing}")
        self.spec: dict[str, Any] = json.loads((self.folder / "codec.json").read_text())
        s = self.spec
        self.geo = Geometry(tuple(s["scales"]), tuple(s["bits"]), s["d"], tuple(s["alphas"]), s["stride"],
                            s["n_freq"], s["quant"])
        self.hash = artifact_hash(self.folder)
        self.hash4 = bytes.fromhex(self.hash[:8])
        self.max_pixels, self.max_work_mb = max_pixels, max_work_mb
        self.encoder = _session(self.folder / "encoder.onnx", threads, deterministic=False)
        self.decoder = _session(self.folder / "decoder.onnx", threads, deterministic=False)
        self.prior = _session(self.folder / "prior.onnx", 1, deterministic=True)

    # -- budget ---------------------------------------------------------------------------------------
    def work_bytes(self, height: int, width: int) -> int:
        """About the peak memory of coding a ``height x width`` image (encode, or decode with every scale the
        prior completes): the larger of the prior's attention over the cells of all K scales and the graphs'
        per-pixel cost (they run one after the other)."""
        h, w = latent_size(height, width, self.geo.stride)
        cells = sum(hk * wk for hk, wk in scale_sizes(h, w, self.geo.scales))
        return max(PRIOR_BYTES_PER_PAIR * cells ** 2, GRAPH_BYTES_PER_PIXEL * h * w * self.geo.stride ** 2)

    def check_budget(self, height: int, width: int, field: str = "image size") -> None:
        """Refuse, before any work, an image whose coding :meth:`work_bytes` puts above ``max_work_mb``.

        Raises:
            BudgetExceeded: naming ``field``, the size, the estimate and the budget (an ImageTooLarge: 413 when
            served).
        """
        need = self.work_bytes(height, width)
        if need > self.max_work_mb * 2**20:
            raise BudgetExceeded(f"{field}: {height}x{width} needs about {need / 2**20:.0f} MiB to code (the prior "
                                 f"attends over every latent cell), expected at most {self.max_work_mb:g} MiB (the "
                                 "model's max_decode_mb parameter)")

    # -- tokens ---------------------------------------------------------------------------------------
    def latent(self, pixels: np.ndarray) -> np.ndarray:
        """(H, W, 3) uint8 -> (d, h, w) float32 encoder output (the image edge-padded to a multiple of 16)."""
        H, W = pixels.shape[:2]
        h, w = latent_size(H, W, self.geo.stride)
        padded = np.pad(pixels, ((0, h * self.geo.stride - H), (0, w * self.geo.stride - W), (0, 0)), mode="edge")
        x = (padded.astype(np.float32) / 255.0 - 0.5).transpose(2, 0, 1)[None]  # (1, 3, Hp, Wp)
        return self.encoder.run(None, {"image": x})[0][0]

    def tokenize(self, z: np.ndarray) -> list[np.ndarray]:
        """Residual sign quantization of z (d, h, w): bits of every scale as (h_k, w_k, bits_k) uint8."""
        _, h, w = z.shape
        acc, tokens = np.zeros_like(z), []
        for k, size in enumerate(scale_sizes(h, w, self.geo.scales)):
            r = down(z - acc, size)  # (d, h_k, w_k)
            bits = (r[:self.geo.bits[k]] > 0).astype(np.uint8).transpose(1, 2, 0)  # (h_k, w_k, m_k)
            tokens.append(np.ascontiguousarray(bits))
            acc = acc + up(codes(bits, k, self.geo), (h, w))
        return tokens

    def probabilities(self, tokens: list[np.ndarray], h: int, w: int, j: int) -> np.ndarray:
        """Quantised p(bit = 1) of scale ``j`` given scales < j: (h_j, w_j, bits_j) int64 numerators over 2^16."""
        feats, pos, sid = prior_inputs(tokens, h, w, self.geo, j)
        logits = self.prior.run(None, {"feats": feats, "pos": pos, "sid": sid})[0][0]  # (L, d)
        hj, wj = scale_sizes(h, w, self.geo.scales)[j]
        block = logits[logits.shape[0] - hj * wj:, :self.geo.bits[j]].astype(np.float64)  # (h_j*w_j, m_j)
        return quantize_probs(1.0 / (1.0 + np.exp(-block))).reshape(hj, wj, -1)

    # -- encode ---------------------------------------------------------------------------------------
    def encode(self, pixels: np.ndarray, k: int | None = None, target_bpp: float | None = None,
               mode: str = "greedy", seed: int = 0, temperature: float = 1.0) -> Encoded:
        """Encode (H, W, 3) uint8 sending ``k`` scales (default all), or the most scales within ``target_bpp``
        (at least one)."""
        H, W = pixels.shape[:2]
        check_size(H, W, self.max_pixels)
        self.check_budget(H, W)
        K = self.geo.K
        if k is not None and not 1 <= k <= K:
            raise CodecError(f"scales: expected k in [1, {K}], received {k}")
        z = self.latent(pixels)
        _, h, w = z.shape
        tokens = self.tokenize(z)
        upto = K if k is None else k
        chunks, ce = self.encode_tokens(tokens[:upto], h, w)
        raw = [t.size for t in tokens[:upto]]
        header = bs.Header(self.hash4, H, W, upto, mode, seed, temperature)
        data = bs.write(bs.Bitstream(header, chunks))
        if target_bpp is not None:
            chosen = 1
            for n in range(1, upto + 1):
                if len(bs.truncate(data, n)) * 8 / (H * W) <= target_bpp:
                    chosen = n
            data, upto = bs.truncate(data, chosen), chosen
        return Encoded(data, upto, len(data) * 8 / (H * W), float(sum(ce[:upto])), int(sum(raw[:upto])))

    def encode_tokens(self, tokens: list[np.ndarray], h: int, w: int) -> tuple[list[bytes], list[float]]:
        """Range-code the given scales, one stream each: (chunks, model cross-entropy of each in bits)."""
        chunks, ce = [], []
        for j, bits in enumerate(tokens):
            q = self.probabilities(tokens, h, w, j)
            chunks.append(encode_bits(bits, q))
            ce.append(cross_entropy_bits(bits, q))
        return chunks, ce

    # -- decode ---------------------------------------------------------------------------------------
    def read(self, data: bytes) -> bs.Bitstream:
        """Parse a stream and check that this model made it and can decode it."""
        stream = bs.read(data)
        h = stream.header
        if h.model_hash != self.hash4:
            raise BitstreamError("model hash", f"expected {self.hash4.hex()} (this model), received "
                                               f"{h.model_hash.hex()} (a stream made by another model)")
        if h.k > self.geo.K:
            raise BitstreamError("scales sent", f"expected k <= {self.geo.K}, received {h.k}")
        try:
            check_size(h.height, h.width, self.max_pixels)
        except CodecError as exc:
            raise BitstreamError("height/width", str(exc)) from None
        lh, lw = latent_size(h.height, h.width, self.geo.stride)
        sizes = scale_sizes(lh, lw, self.geo.scales)[:h.k]
        for j, ((hj, wj), chunk) in enumerate(zip(sizes, stream.chunks, strict=True)):
            claimed = hj * wj * self.geo.bits[j]
            if claimed > max_coded_bits(len(chunk)):
                raise BitstreamError("height/width", f"{h.height}x{h.width} needs {claimed} bits at scale {j + 1}, "
                                                     f"more than its {len(chunk)} bytes can carry (at most "
                                                     f"{max_coded_bits(len(chunk))}): corrupt header")
        self.check_budget(h.height, h.width, "bitstream height/width")  # a valid header: what completing the scales not sent will cost
        return stream

    def decode_tokens(self, stream: bs.Bitstream) -> tuple[list[np.ndarray], int, int]:
        """Range-decode the sent scales: (tokens[:k], h, w)."""
        hdr = stream.header
        h, w = latent_size(hdr.height, hdr.width, self.geo.stride)
        tokens: list[np.ndarray] = []
        for j, chunk in enumerate(stream.chunks):
            tokens.append(decode_bits(chunk, self.probabilities(tokens, h, w, j), field=f"scale {j + 1}"))
        return tokens, h, w

    def complete(self, tokens: list[np.ndarray], h: int, w: int, mode: str, seed: int = 0,
                 temperature: float = 1.0) -> np.ndarray:
        """The quantized latent (d, h, w): sent scales as coded, the rest predicted by the prior.

        greedy: the likelier bit; sample: bits drawn with a generator seeded from the header (temperature on
        the logits); mean: the expected code alpha (2p - 1) (the bits fed forward are the greedy ones).
        """
        rng = np.random.default_rng(seed)
        tokens = list(tokens)
        acc = np.zeros((self.geo.d, h, w), np.float32)
        for j in range(self.geo.K):
            if j < len(tokens):
                acc = acc + up(codes(tokens[j], j, self.geo), (h, w))
                continue
            q = self.probabilities(tokens, h, w, j) if mode != "sample" or temperature == 1.0 else \
                self._tempered(tokens, h, w, j, temperature)
            if mode == "sample":
                bits = (rng.integers(0, ONE, size=q.shape) < q).astype(np.uint8)
            else:
                bits = (q > ONE // 2).astype(np.uint8)
            tokens.append(bits)
            if mode == "mean":
                soft = np.zeros((self.geo.d, *q.shape[:2]), np.float32)
                soft[:q.shape[2]] = (np.float32(self.geo.alphas[j]) * (2.0 * q / ONE - 1.0)).astype(np.float32
                                                                                                  ).transpose(2, 0, 1)
                acc = acc + up(soft, (h, w))
            else:
                acc = acc + up(codes(bits, j, self.geo), (h, w))
        return acc

    def _tempered(self, tokens: list[np.ndarray], h: int, w: int, j: int, temperature: float) -> np.ndarray:
        q = self.probabilities(tokens, h, w, j).astype(np.float64) / ONE
        logits = np.log(q) - np.log1p(-q)
        return quantize_probs(1.0 / (1.0 + np.exp(-logits / temperature)))

    def pixels(self, latent: np.ndarray, height: int, width: int) -> np.ndarray:
        """(d, h, w) quantized latent -> (height, width, 3) uint8 through decoder.onnx."""
        y = self.decoder.run(None, {"latent": latent[None]})[0][0]  # (3, 16h, 16w)
        y = y[:, :height, :width].transpose(1, 2, 0)
        return np.clip(np.rint((y + 0.5) * 255.0), 0, 255).astype(np.uint8)

    def decode(self, data: bytes) -> np.ndarray:
        """Bitstream -> (H, W, 3) uint8 (refuses foreign, corrupt and truncated streams, naming the field)."""
        stream = self.read(data)
        hdr = stream.header
        tokens, h, w = self.decode_tokens(stream)
        latent = self.complete(tokens, h, w, hdr.mode, hdr.seed, hdr.temperature)
        return self.pixels(latent, hdr.height, hdr.width)

    def reconstruct_tokens(self, tokens: list[np.ndarray], height: int, width: int) -> np.ndarray:
        """Tokenizer decode of all K scales (no prior involved): the k = K reconstruction."""
        h, w = latent_size(height, width, self.geo.stride)
        acc = np.zeros((self.geo.d, h, w), np.float32)
        for j, bits in enumerate(tokens):
            acc = acc + up(codes(bits, j, self.geo), (h, w))
        return self.pixels(acc, height, width)
