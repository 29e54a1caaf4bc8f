"""The veil codec bitstream: header, length-prefixed per-scale chunks, CRC (big-endian ``struct``).

=========  =======  ====================================================================
bytes      type     field
=========  =======  ====================================================================
2          bytes    magic ``b"VC"``
1          uint8    format version (1)
4          bytes    model hash: the first 4 bytes of the SHA-256 of the exported artifact
2 + 2      uint16   original height, width (pixels)
1          uint8    scales sent k (1..K)
1          uint8    decode mode of the scales not sent: 0 greedy, 1 sampled, 2 mean
(4 + 1)    uint32,  seed and temperature x 100 (only when the mode is sampled)
           uint8
k x        varint   per scale: LEB128 byte length, then that many range-coded bytes
+ bytes
4          uint32   CRC-32 (zlib) of everything before it
=========  =======  ====================================================================

Chunks are independent range-coder streams, one per scale, so a stream is cut at any scale boundary by
dropping trailing chunks and re-sealing the header (:func:`truncate`): no re-encoding, and the body of a
k-scale stream is a byte prefix of the body of the (k+1)-scale stream of the same image.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field, replace

from .errors import BitstreamError

MAGIC = b"VC"
VERSION = 1
MODES = {"greedy": 0, "sample": 1, "mean": 2}
_HEAD = struct.Struct(">2sB4sHHBB")  # magic, version, model hash, H, W, k, mode
_SAMPLE = struct.Struct(">IB")  # seed, temperature x 100
_CRC = struct.Struct(">I")


@dataclass(frozen=True)
class Header:
    """Everything the decoder needs besides the model and the chunks."""

    model_hash: bytes  # 4 bytes
    height: int
    width: int
    k: int
    mode: str = "greedy"
    seed: int = 0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if len(self.model_hash) != 4:
            raise ValueError(f"model_hash: expected 4 bytes, received {len(self.model_hash)}")
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {list(MODES)}, received {self.mode!r}")
        if not (0 <= self.seed < 2 ** 32 and 0.01 <= self.temperature <= 2.55):
            raise ValueError(f"seed/temperature: expected seed in [0, 2^32) and temperature in [0.01, 2.55], "
                             f"received {self.seed}, {self.temperature}")


@dataclass(frozen=True)
class Bitstream:
    """A parsed stream: its header and one byte string per scale sent."""

    header: Header
    chunks: list[bytes] = field(default_factory=list)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 28:
            raise BitstreamError("chunk length", f"expected a LEB128 length at byte {pos}, the stream ends or the "
                                                 "length is malformed (truncated or corrupt)")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def write(stream: Bitstream) -> bytes:
    """Serialize a header and its chunks, sealed with a CRC-32."""
    h = stream.header
    if len(stream.chunks) != h.k:
        raise ValueError(f"chunks: expected k={h.k} chunks, received {len(stream.chunks)}")
    out = bytearray(_HEAD.pack(MAGIC, VERSION, h.model_hash, h.height, h.width, h.k, MODES[h.mode]))
    if h.mode == "sample":
        out += _SAMPLE.pack(h.seed, round(h.temperature * 100))
    for chunk in stream.chunks:
        out += _varint(len(chunk)) + chunk
    return bytes(out + _CRC.pack(zlib.crc32(out)))


def read(data: bytes) -> Bitstream:
    """Parse and check a stream; refusals name the field (magic, version, crc, chunk length, ...)."""
    data = bytes(data)
    if len(data) < len(MAGIC) or data[:len(MAGIC)] != MAGIC:
        raise BitstreamError("magic", f"expected {MAGIC!r} (a veil codec stream), received {data[:len(MAGIC)]!r}")
    if len(data) < _HEAD.size + _CRC.size:
        raise BitstreamError("length", f"expected at least {_HEAD.size + _CRC.size} bytes, received {len(data)} "
                                       "(truncated)")
    _magic, version, model_hash, height, width, k, mode = _HEAD.unpack_from(data)
    if version != VERSION:
        raise BitstreamError("version", f"expected format version {VERSION}, received {version}")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    actual = zlib.crc32(data[:-_CRC.size])
    if crc != actual:
        raise BitstreamError("crc", f"expected {actual:#010x} over the first {len(data) - 4} bytes, the stream "
                                    f"carries {crc:#010x} (corrupt or truncated)")
    modes = {v: n for n, v in MODES.items()}
    if mode not in modes:
        raise BitstreamError("decode mode", f"expected one of {sorted(modes)}, received {mode}")
    pos, end, seed, temperature = _HEAD.size, len(data) - _CRC.size, 0, 1.0
    if modes[mode] == "sample":
        if end - pos < _SAMPLE.size:
            raise BitstreamError("seed", "expected a seed and a temperature after the header, the stream ends")
        seed, t100 = _SAMPLE.unpack_from(data, pos)
        pos, temperature = pos + _SAMPLE.size, t100 / 100
    if k < 1:
        raise BitstreamError("scales sent", f"expected k >= 1, received {k}")
    chunks = []
    for i in range(k):
        size, pos = _read_varint(data, pos, end)
        if pos + size > end:
            raise BitstreamError("chunk length", f"scale {i + 1} claims {size} bytes, only {end - pos} remain")
        chunks.append(data[pos:pos + size])
        pos += size
    if pos != end:
        raise BitstreamError("length", f"expected the stream to end after {k} chunks, {end - pos} bytes remain")
    try:
        header = Header(model_hash, height, width, k, modes[mode], seed, max(temperature, 0.01))
    except ValueError as exc:
        raise BitstreamError("header", str(exc)) from None
    return Bitstream(header, chunks)


def truncate(data: bytes, k: int) -> bytes:
    """The same stream cut to its first ``k`` scales: drop chunks, rewrite k, fresh CRC (no re-encoding)."""
    stream = read(data)
    if not 1 <= k <= stream.header.k:
        raise BitstreamError("scales sent", f"can cut to k in [1, {stream.header.k}], received {k}")
    return write(Bitstream(replace(stream.header, k=k), stream.chunks[:k]))


def header_size(data: bytes) -> int:
    """Bytes before the first chunk's length (what a proxy rewrites when it truncates)."""
    stream = read(data)
    return _HEAD.size + (_SAMPLE.size if stream.header.mode == "sample" else 0)
