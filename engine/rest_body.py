"""The OIP v2 REST inference body: JSON, and Triton's binary tensor data extension, decoded and encoded.

Implements the REST inference request/response of the KServe Open Inference Protocol v2 and Triton's
binary tensor data extension: the body is the JSON header followed by raw little-endian, row-major tensors in
the order the JSON lists them; ``Inference-Header-Content-Length`` gives the JSON length. BOOL is one byte,
BYTES elements are a 4-byte little-endian length then the bytes, FP16 travels in binary only. Binary inputs
are read with ``np.frombuffer`` (no copy). The tensor types and bounds are :mod:`veil.engine.protocol`'s.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import orjson

from .errors import (
    BinarySizeMismatch,
    DatatypeMismatch,
    InvalidHeaderLength,
    MalformedRequest,
    PayloadTooLarge,
    ShapeMismatch,
    UnsupportedEncoding,
)
from .protocol import (
    DATATYPES,
    Expected,
    InferRequest,
    InferResponse,
    InputTensor,
    check_shape,
    encode_bytes,
    from_binary,
    valid_shape,
)

# JSON element kinds numpy infers that each datatype accepts (b: bool, i/u: int, f: float, U: str)
_JSON_KINDS = {"BOOL": "b", "FP32": "biuf", "FP64": "biuf", "BYTES": "U"} | {
    name: "biu" for name in ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64")}
_CHUNK = 65536  # top-level JSON list entries converted per numpy call


# -- decode ---------------------------------------------------------------------------------------------
def header_length(value: str | None, body_size: int) -> int | None:
    """Parse ``Inference-Header-Content-Length`` (None when absent); ASCII digits only."""
    if value is None:
        return None
    if not _ascii_int(value) or not 0 < int(value) <= body_size:
        raise InvalidHeaderLength(
            f"Inference-Header-Content-Length: expected an integer in [1, {body_size}] (the body size), received {value!r}")
    return int(value)


def _ascii_int(value: str) -> bool:
    """Whether ``value`` is a non-negative integer in ASCII digits (``str.isdigit`` accepts "²", ``int`` does not)."""
    value = value.strip()
    return value.isascii() and value.isdigit()


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """The body under ``Content-Encoding`` gzip or deflate (zlib or raw), refused beyond ``limit`` bytes decoded.

    tritonclient sends these with ``request_compression_algorithm``; ``Inference-Header-Content-Length`` then
    counts the decompressed JSON. Decompression stops at ``limit + 1`` bytes, so a zip bomb costs at most that.

    Raises:
        UnsupportedEncoding: another encoding (HTTP 415). PayloadTooLarge: more than ``limit`` bytes decoded.
        MalformedRequest: the data is not valid gzip/deflate or is truncated.
    """
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise UnsupportedEncoding(f"Content-Encoding: expected gzip, deflate or identity, received {encoding!r}")
    if encoding == "deflate":  # RFC 9110 says zlib format; some clients send raw deflate
        raw = len(body) < 2 or body[0] & 0x0F != 8 or (body[0] << 8 | body[1]) % 31 != 0
        wbits = -zlib.MAX_WBITS if raw else zlib.MAX_WBITS
    else:
        wbits = 16 + zlib.MAX_WBITS
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(body, limit + 1)
    except zlib.error as exc:
        raise MalformedRequest(f"request body: expected {encoding} data (Content-Encoding), received invalid data: "
                               f"{exc}") from None
    if len(out) > limit:
        raise PayloadTooLarge(f"request body: expected at most {limit} bytes once decompressed (--max-body-mb), "
                              "received more")
    if not decoder.eof or decoder.unused_data:
        raise MalformedRequest(f"request body: expected one complete {encoding} stream (Content-Encoding), received "
                               f"{'trailing data' if decoder.eof else 'a truncated one'}")
    return out


def decode_request(body: bytes, json_length: int | None, max_json_elements: int | None = None,
                   max_json_bytes: int | None = None, expected: Expected | None = None) -> InferRequest:
    """Decode a JSON-only or JSON+binary inference request body.

    Args:
        body: the whole HTTP body.
        json_length: the ``Inference-Header-Content-Length`` value, None when the body is JSON only.
        max_json_elements: the most tensor elements the request may carry as JSON ``data`` (all inputs together),
            checked on the declared shapes before any conversion (None: no limit).
        max_json_bytes: the largest JSON part, checked before parsing: orjson holds the GIL while it parses, so
            this bounds how long one request can keep every other thread, the event loop included, waiting.
        expected: the target model's inputs, checked on each input's declaration before its data is read.

    Raises:
        MalformedRequest, InvalidHeaderLength, BinarySizeMismatch, ShapeMismatch, DatatypeMismatch, UnknownInput,
        PayloadTooLarge (``max_json_elements``, ``max_json_bytes``, ``expected.max_bytes_elements``).
    """
    end = len(body) if json_length is None else json_length
    if max_json_bytes is not None and end > max_json_bytes:
        raise PayloadTooLarge(f"JSON part of the request: expected at most {max_json_bytes} bytes (--max-json-mb; "
                              f"send large tensors with the binary tensor extension), received {end}")
    try:
        head = orjson.loads(body[:end])
    except orjson.JSONDecodeError as exc:
        hint = "" if json_length is not None else " (binary data needs the Inference-Header-Content-Length header)"
        raise MalformedRequest(f"request body: expected a JSON object, received invalid JSON: {exc}{hint}") from None
    if not isinstance(head, dict) or not isinstance(head.get("inputs"), list) or not head["inputs"]:
        raise MalformedRequest("request body: expected a JSON object with a non-empty 'inputs' list")
    _check_json_elements(head["inputs"], max_json_elements)
    inputs, offset, names = [], end, set()
    for i, spec in enumerate(head["inputs"]):
        tensor, offset = _decode_input(spec, i, body, offset, json_length, expected)
        if tensor.name in names:
            raise MalformedRequest(f"inputs[{i}]: expected each input name once, received '{tensor.name}' again")
        names.add(tensor.name)
        inputs.append(tensor)
    if offset != len(body):
        raise BinarySizeMismatch(f"binary data: the inputs' binary_data_size values add up to {offset - end} bytes, "
                                 f"received {len(body) - end} bytes after the JSON header")
    params = _object(head.get("parameters", {}), "parameters")
    outputs = None
    if head.get("outputs") is not None:
        if not isinstance(head["outputs"], list):
            raise MalformedRequest(f"outputs: expected a list, received {type(head['outputs']).__name__}")
        outputs = {}
        for j, out in enumerate(head["outputs"]):
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise MalformedRequest(f"outputs[{j}]: expected an object with a string 'name'")
            if out["name"] in outputs:
                raise MalformedRequest(f"outputs[{j}]: expected each output name once, received '{out['name']}' again")
            binary = _object(out.get("parameters", {}), f"outputs[{j}].parameters").get("binary_data")
            outputs[out["name"]] = bool(params.get("binary_data_output", False) if binary is None else binary)
    request_id = head.get("id")
    return InferRequest(inputs=inputs, outputs=outputs, id=None if request_id is None else str(request_id),
                        binary_output=bool(params.get("binary_data_output", False)), parameters=params)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedRequest(f"{where}: expected a JSON object, received {type(value).__name__}")
    return value


def _check_json_elements(specs: list[Any], limit: int | None) -> None:
    """Refuse JSON ``data`` whose declared shapes hold more than ``limit`` elements, before converting any."""
    if limit is None:
        return
    total = 0
    for spec in specs:
        if isinstance(spec, dict) and "data" in spec and valid_shape(spec.get("shape")):
            total += math.prod(spec["shape"])
    if total > limit:
        raise PayloadTooLarge(f"JSON tensor data: expected at most {limit} elements in all (--max-json-elements; "
                              f"send large tensors with the binary tensor extension), received {total}")


def _decode_input(spec: Any, i: int, body: bytes, offset: int, json_length: int | None,
                  expected: Expected | None = None) -> tuple[InputTensor, int]:
    """One input from its JSON spec (and the binary section at ``offset``); returns it and the new offset."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise MalformedRequest(f"inputs[{i}]: expected an object with a string 'name'")
    name, datatype, shape = spec["name"], spec.get("datatype"), spec.get("shape")
    if not isinstance(datatype, str) or datatype not in DATATYPES:  # {} or [] are unhashable: check the type first
        raise DatatypeMismatch(f"input '{name}': datatype expected one of {list(DATATYPES)}, received {datatype!r}")
    count = check_shape(name, shape)
    if expected is not None:
        expected.check(name, datatype, count)
    size = _object(spec.get("parameters", {}), f"input '{name}' parameters").get("binary_data_size")
    if size is not None:
        if json_length is None:
            raise InvalidHeaderLength(f"input '{name}' has binary_data_size but the request has no "
                                      "Inference-Header-Content-Length header")
        if not isinstance(size, int) or size < 0 or offset + size > len(body):
            raise BinarySizeMismatch(f"input '{name}': binary_data_size {size!r} exceeds the {len(body) - offset} "
                                     "bytes left in the body")
        data = from_binary(name, datatype, count, body, offset, size)
        return InputTensor(name, datatype, shape, data.reshape(shape)), offset + size
    if "data" not in spec:
        raise MalformedRequest(f"input '{name}': expected 'data' or parameters.binary_data_size")
    return InputTensor(name, datatype, shape, _from_json(name, datatype, shape, count, spec["data"])), offset


def _from_json(name: str, datatype: str, shape: list[int], count: int, data: Any) -> np.ndarray:
    if datatype == "FP16":
        raise DatatypeMismatch(f"input '{name}': FP16 cannot travel as JSON; send it with the binary tensor "
                               "extension (parameters.binary_data_size)")
    if isinstance(data, list) and len(data) not in (count, shape[0] if shape else 1):
        raise ShapeMismatch(f"input '{name}': shape {shape} needs {count} elements, data has {len(data)} "
                            "top-level entries")
    try:
        array = _as_array(data)
    except ValueError:
        raise ShapeMismatch(f"input '{name}': data is a ragged nested list; expected shape {shape}") from None
    except TypeError:  # numpy 2 cannot promote e.g. strings with numbers across chunks
        raise DatatypeMismatch(f"input '{name}': data mixes element types; expected {datatype} elements") from None
    if array.size != count:
        raise ShapeMismatch(f"input '{name}': shape {shape} needs {count} elements, data has {array.size}")
    if array.size and array.dtype.kind not in _JSON_KINDS[datatype]:
        raise DatatypeMismatch(f"input '{name}': datatype {datatype} expects JSON "
                               f"{'strings' if datatype == 'BYTES' else 'numbers' if datatype != 'BOOL' else 'booleans'}"
                               f", received elements of numpy kind {array.dtype.kind!r}")
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        out[:] = [s.encode() for s in array.ravel().tolist()]
        return out.reshape(shape)
    return array.astype(DATATYPES[datatype], copy=False).reshape(shape)


def _as_array(data: Any) -> np.ndarray:
    """``np.asarray`` in slices of the top-level list: each call holds the GIL only that long, so the event loop
    keeps answering while a large JSON tensor is converted in a worker thread."""
    if not isinstance(data, list) or len(data) <= _CHUNK:
        return np.asarray(data)
    return np.concatenate([np.asarray(data[i:i + _CHUNK]) for i in range(0, len(data), _CHUNK)])


# -- encode ---------------------------------------------------------------------------------------------
def _json_text(name: str, item: str | bytes) -> str:
    """A BYTES element as a JSON string; bytes that are not UTF-8 (a bitstream, a ciphertext) cannot be one
    without loss, so they are refused rather than silently replaced."""
    if isinstance(item, str):
        return item
    try:
        return bytes(item).decode("utf-8")
    except UnicodeDecodeError:
        raise DatatypeMismatch(f"output '{name}': BYTES element is not UTF-8 (expected text for JSON output, received "
                               f"{len(item)} binary bytes); request it with parameters.binary_data: true") from None


def encode_response(response: InferResponse) -> tuple[bytes, int | None]:
    """Encode a response; returns the body and the JSON header length (None when the body is JSON only)."""
    outputs, blobs, flagged = [], [], []
    for name, array in response.outputs.items():
        datatype = response.datatypes[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if response.binary[name]:
            raw = encode_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif datatype == "FP16":
            raise DatatypeMismatch(f"output '{name}': FP16 cannot travel as JSON; request it with "
                                   "parameters.binary_data: true")
        elif datatype == "BYTES":
            entry["data"] = [_json_text(name, b) for b in array.ravel().tolist()]
        else:
            entry["data"] = np.ascontiguousarray(array).ravel()
            if array.dtype.kind == "f" and not np.isfinite(array).all():  # JSON has no NaN/inf: they become null
                entry["parameters"] = {"non_finite_count": int(np.size(array) - np.isfinite(array).sum())}
                flagged.append(name)
        outputs.append(entry)
    head: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id is not None:
        head["id"] = response.id
    if flagged:  # scalar parameters only, so OIP v2 clients (tritonclient, KServe's pydantic models) still parse it
        head["parameters"] = {"non_finite_outputs": ",".join(flagged),
                              "non_finite_note": "NaN/inf output elements are null in JSON; check the input's scale "
                                                 "(the model metadata's input contract) or request binary_data"}
    head["outputs"] = outputs
    text = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return text, None
    return b"".join([text, *blobs]), len(text)
