"""Open Inference Protocol v2 tensors, as both fronts hand them to the data plane: datatype tables, the request
and response types, the bounds checked on each input's declaration, raw tensor and BYTES element (de)coding, and
the decode pool. The REST body (JSON and Triton's binary extension) is :mod:`veil.engine.rest_body`; the gRPC
messages are :mod:`veil.engine.grpc_server`'s. Nothing here knows about models: see :mod:`veil.engine.models`.
"""

from __future__ import annotations

import asyncio
import functools
import math
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from .errors import (
    BinarySizeMismatch,
    DatatypeMismatch,
    PayloadTooLarge,
    ShapeMismatch,
    UnknownInput,
)

# OIP datatype -> numpy dtype (little-endian); BYTES are object arrays of `bytes`
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"), "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
# ONNX Runtime type string -> OIP datatype
ONNX_DATATYPES: dict[str, str] = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64", "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32",
    "tensor(int64)": "INT64", "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
_LENGTH = struct.Struct("<I")
MAX_DIMS = 32  # numpy's limit is 64 (32 before numpy 2); ONNX Runtime tensors stay far below either
# the most elements the non-zero dims of a shape may multiply to: numpy refuses a larger shape even when another
# dim is 0 (an empty tensor), so [0, 7920, 17059480, 17066276] must be refused here, not fail inside reshape
MAX_SHAPE_ELEMENTS = 1 << 40
INLINE_BYTES = 64 * 1024  # requests and outputs up to this size are (de)coded on the event loop
DECODE_WORKERS = 4  # larger ones in this pool, shared by both fronts: at most this many decode at once
_DECODE_POOL = ThreadPoolExecutor(max_workers=DECODE_WORKERS, thread_name_prefix="veil-decode")
MAX_BYTES_ELEMENTS = 1 << 20  # default bound on the BYTES elements of one input (decoding each is a Python step)


@dataclass(frozen=True)
class Expected:
    """What the target model accepts, checked on each input's declaration before any of its data is read (issue 31
    item 4: a BYTES tensor sent to an FP32 model is refused before its elements are decoded).

    Attributes:
        model: the model's name (for messages).
        datatypes: input name -> the model's datatype for it.
        max_bytes_elements: the most elements one BYTES input may declare (``--max-bytes-elements``; None: no bound).
    """

    model: str
    datatypes: dict[str, str]
    max_bytes_elements: int | None = MAX_BYTES_ELEMENTS

    def check(self, name: str, datatype: str, count: int) -> None:
        """Refuse an input the model does not have, of another datatype, or with too many BYTES elements.

        Raises:
            UnknownInput, DatatypeMismatch, PayloadTooLarge: naming the input, the expected and the received value.
        """
        if name not in self.datatypes:
            raise UnknownInput(f"model '{self.model}' has no input '{name}'; expected {sorted(self.datatypes)}")
        if datatype != self.datatypes[name]:
            raise DatatypeMismatch(f"input '{name}': datatype expected {self.datatypes[name]}, received {datatype}")
        if datatype == "BYTES" and self.max_bytes_elements is not None and count > self.max_bytes_elements:
            raise PayloadTooLarge(f"input '{name}': expected at most {self.max_bytes_elements} BYTES elements "
                                  f"(--max-bytes-elements), received a shape of {count}")


def triton_to_datatype(triton_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32`` (``TYPE_STRING`` -> ``BYTES``), as Triton's config.pbtxt spells types."""
    name = triton_type.removeprefix("TYPE_")
    name = "BYTES" if name == "STRING" else name
    if name not in DATATYPES:
        raise ValueError(f"data_type: expected one of {['TYPE_' + t for t in DATATYPES]}, received {triton_type!r}")
    return name


def datatype_to_triton(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


@dataclass
class InputTensor:
    """One decoded request input: ``data`` already has ``shape`` and the numpy dtype of ``datatype``."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray


@dataclass
class InferRequest:
    """A decoded inference request; ``outputs`` maps requested names to "binary?" (None: all outputs)."""

    inputs: list[InputTensor]
    outputs: dict[str, bool] | None = None
    id: str | None = None
    binary_output: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferResponse:
    """Outputs to encode: name -> array, and which of them go in binary."""

    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    binary: dict[str, bool]
    id: str | None = None


_T = TypeVar("_T")


async def off_loop(size: int, fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` inline when ``size`` (bytes to parse or encode) is at most ``INLINE_BYTES``, else in the decode
    pool: the event loop both fronts share keeps answering health probes and small requests meanwhile, and a flood
    of large requests decodes ``DECODE_WORKERS`` at a time."""
    if size <= INLINE_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(_DECODE_POOL, functools.partial(fn, *args))


def output_size(response: InferResponse) -> int:
    """About how many bytes encoding ``response`` writes (BYTES elements counted at 64 bytes each)."""
    return sum(a.nbytes if a.dtype != object else a.size * 64 for a in response.outputs.values())


# -- decode ---------------------------------------------------------------------------------------------
def valid_shape(shape: Any) -> bool:
    """Whether ``shape`` is a list of at most ``MAX_DIMS`` non-negative ints (bools refused)."""
    return isinstance(shape, list) and len(shape) <= MAX_DIMS and \
        all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)


def check_shape(name: str, shape: Any) -> int:
    """The element count of an input's declared shape, or ShapeMismatch naming the input (HTTP and gRPC)."""
    if not valid_shape(shape):
        raise ShapeMismatch(f"input '{name}': shape expected a list of at most {MAX_DIMS} non-negative integers, "
                            f"received {shape!r}")
    if math.prod(d for d in shape if d) > MAX_SHAPE_ELEMENTS:
        raise ShapeMismatch(f"input '{name}': shape {shape} expected its non-zero dims to multiply to at most "
                            f"2^40 elements, received {math.prod(d for d in shape if d)}")
    return math.prod(shape)


def from_binary(name: str, datatype: str, count: int, body: bytes, offset: int, size: int) -> np.ndarray:
    """``count`` elements of ``datatype`` from ``body[offset:offset + size]`` (raw tensors read without a copy).

    Raises:
        BinarySizeMismatch: ``size`` is not what ``count`` elements take (BYTES: as :func:`decode_bytes` says).
    """
    if datatype == "BYTES":
        return decode_bytes(name, body[offset:offset + size], count)
    dtype = DATATYPES[datatype]
    if size != count * dtype.itemsize:
        raise BinarySizeMismatch(f"input '{name}': binary_data_size expected {count * dtype.itemsize} "
                                 f"({count} x {datatype}), received {size}")
    data = np.frombuffer(body, dtype=dtype, count=count, offset=offset)  # zero copy, read-only
    return data if data.flags.aligned else data.copy()


def decode_bytes(name: str, raw: bytes, count: int) -> np.ndarray:
    """Length-prefixed BYTES elements -> object array of ``bytes``; ``count`` elements need at least ``4 * count``
    bytes of length prefixes, checked before any element is read."""
    if 4 * count > len(raw):
        raise BinarySizeMismatch(f"input '{name}': shape expects {count} BYTES elements, which need at least "
                                 f"{4 * count} bytes (a 4-byte length each), received {len(raw)}")
    items, pos = [], 0
    while pos < len(raw):
        if len(items) == count:  # more elements than the shape holds: stop here, not at the end of the body
            raise ShapeMismatch(f"input '{name}': shape expects {count} BYTES elements, received more")
        if pos + 4 > len(raw):
            raise BinarySizeMismatch(f"input '{name}': truncated BYTES length prefix at byte {pos}")
        (n,) = _LENGTH.unpack_from(raw, pos)
        if pos + 4 + n > len(raw):
            raise BinarySizeMismatch(f"input '{name}': BYTES element {len(items)} declares {n} bytes, "
                                     f"{len(raw) - pos - 4} left")
        items.append(raw[pos + 4:pos + 4 + n])
        pos += 4 + n
    if len(items) != count:
        raise ShapeMismatch(f"input '{name}': shape expects {count} BYTES elements, received {len(items)}")
    out = np.empty(count, dtype=object)
    out[:] = items
    return out


# -- encode ---------------------------------------------------------------------------------------------
def encode_bytes(array: np.ndarray) -> bytes:
    """Object/str/bytes array -> length-prefixed BYTES elements."""
    parts = []
    for item in array.ravel().tolist():
        raw = item.encode() if isinstance(item, str) else bytes(item)
        parts += [_LENGTH.pack(len(raw)), raw]
    return b"".join(parts)


