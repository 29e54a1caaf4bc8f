"""The checksummed container every veil HE file uses, and ciphertexts in and out of it.

SEAL objects become bytes in memory in :mod:`veil.he.sealbytes` (never through a named file); its
:func:`seal_to_bytes` and :func:`seal_from_bytes` are importable from here too.

Container layout (all integers big-endian)::

    magic (8 bytes) | version (uint16) | header length (uint32) | SHA-256 of header+payload (32 bytes)
    | header (UTF-8 JSON object) | payload
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Sequence
from typing import Any

import tenseal.sealapi as sa
from veil.he.errors import HEError, MalformedCiphertext, TooManyCiphertexts
from veil.he.params import CkksParameters
from veil.he.sealbytes import Savable, seal_from_bytes, seal_to_bytes  # seal_*: importable from here too

Buffer = bytes | bytearray | memoryview  # what a container is read from or written as

_PREFIX = struct.Struct(">8sHI32s")
CIPHERTEXTS_MAGIC = b"VEILCTS\x00"
CIPHERTEXTS_VERSION = 1


def pack(magic: bytes, version: int, header: dict[str, Any], payload: bytes = b"") -> bytes:
    """Build a container: prefix, canonical JSON header, payload."""
    return b"".join(pack_parts(magic, version, header, [payload]))


def pack_parts(magic: bytes, version: int, header: dict[str, Any], payload: Sequence[Buffer]) -> list[Buffer]:
    """:func:`pack`'s container as its pieces (prefix and header, then the payload's parts, none copied): what
    a large container (a key set of hundreds of MiB) is hashed and written from without ever being joined."""
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(head)
    for part in payload:
        digest.update(part)
    return [_PREFIX.pack(magic, version, len(head), digest.digest()) + head, *payload]


def unpack(data: Buffer, magic: bytes, versions: Sequence[int], error: type[HEError],
           what: str, *, as_view: bool = False) -> tuple[int, dict[str, Any], Buffer]:
    """Parse and verify a container; return ``(version, header, payload)``.

    With ``as_view``, the payload is a memoryview into ``data`` (no copy: a key set's sections stay in the upload).

    Raises:
        error: naming the field (magic, version, length, checksum, header) that is wrong.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise error(f"{what}: expected bytes, received {type(data).__name__}")
    view = memoryview(data).cast("B")  # no copy of a large payload until the one returned
    if len(view) < _PREFIX.size:
        raise error(f"{what}: expected at least {_PREFIX.size} bytes, received {len(view)}")
    got_magic, version, head_len, digest = _PREFIX.unpack_from(view)
    if got_magic != magic:
        raise error(f"{what}.magic: expected {magic!r}, received {got_magic!r}")
    if version not in versions:
        raise error(f"{what}.version: expected one of {list(versions)}, received {version}")
    body = view[_PREFIX.size:]
    if head_len > len(body):
        raise error(f"{what}.header_length: expected <= {len(body)}, received {head_len}")
    actual = hashlib.sha256(body).digest()
    if actual != digest:
        raise error(f"{what}.sha256: expected {digest.hex()}, received {actual.hex()} (corrupted or truncated)")
    try:
        header = json.loads(bytes(body[:head_len]))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, too many digits, nesting too deep
        raise error(f"{what}.header: expected a JSON object, received unparsable bytes "
                    f"({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(header, dict):
        raise error(f"{what}.header: expected a JSON object, received {type(header).__name__}")
    return version, header, body[head_len:] if as_view else bytes(body[head_len:])


def check_fields(header: dict[str, Any], allowed: Sequence[str], error: type[HEError], what: str) -> None:
    """Refuse header fields that are missing or unknown: a container carries only what its reader parses."""
    unknown, missing = sorted(set(header) - set(allowed)), sorted(set(allowed) - set(header))
    if unknown or missing:
        raise error(f"{what}.header: expected exactly the fields {sorted(allowed)}, received unknown fields "
                    f"{[str(k)[:40] for k in unknown[:8]]} and missing fields {missing}")


def split_sections(payload: Buffer, lengths: Any, error: type[HEError], what: str) -> list[Buffer]:
    """Cut ``payload`` into consecutive sections of the given lengths (which must cover it exactly; views of a
    memoryview, copies of bytes)."""
    if not isinstance(lengths, list) or not all(isinstance(n, int) and n >= 0 for n in lengths):
        raise error(f"{what}.lengths: expected a list of non-negative ints, received {lengths!r}")
    if sum(lengths) != len(payload):
        raise error(f"{what}.lengths: expected a total of {len(payload)} bytes, received {sum(lengths)}")
    out, start = [], 0
    for n in lengths:
        out.append(payload[start:start + n])
        start += n
    return out


def ciphertexts_to_bytes(cts: Sequence[Savable]) -> bytes:
    """Serialize ciphertexts (plain ``sa.Ciphertext`` or seeded ``Serializable`` ones) into one container."""
    return blobs_to_bytes([seal_to_bytes(ct) for ct in cts])


def blobs_to_bytes(blobs: Sequence[bytes]) -> bytes:
    """The container of ciphertexts already serialized by SEAL (e.g. :func:`ciphertext_blobs` of other containers):
    framing only, no SEAL object is built (a server forwarding chunks of a request to its workers, issue 32)."""
    return pack(CIPHERTEXTS_MAGIC, CIPHERTEXTS_VERSION, {"count": len(blobs), "lengths": [len(b) for b in blobs]},
                b"".join(blobs))


def ciphertexts_from_bytes(params: CkksParameters, data: bytes, *, max_count: int | None = None,
                           fresh: bool = False) -> list[sa.Ciphertext]:
    """Parse :func:`ciphertexts_to_bytes` output and check every ciphertext fully before anyone evaluates it.

    Every ciphertext must be valid for the parameters' context (``sa.is_valid_for``), in NTT form, not
    transparent (an all-zero mask, which SEAL refuses mid-evaluation), of size 2, and at a finite positive
    scale; with ``fresh`` also at the first level and at exactly ``params.scale`` (what the client's
    encryptor produces; any other scale fails SEAL's scale checks mid-evaluation).

    Args:
        params: the parameters the ciphertexts must belong to.
        data: the container bytes.
        max_count: the most ciphertexts accepted; more are refused from the header, before any is parsed.
        fresh: require fresh ciphertexts (server side, before evaluation).

    Raises:
        TooManyCiphertexts: more than ``max_count`` ciphertexts (HTTP 413).
        MalformedCiphertext: garbage, a bad checksum, or a ciphertext failing any check above.
    """
    return ciphertexts_from_blobs(params, ciphertext_blobs(data, max_count=max_count), fresh=fresh)


def ciphertext_blobs(data: bytes, *, max_count: int | None = None) -> list[bytes]:
    """The SEAL bytes of each ciphertext of a :func:`ciphertexts_to_bytes` container, unparsed.

    Checks the container (magic, version, checksum, header fields, lengths, count) and ``max_count`` from the
    header; the ciphertexts themselves are checked by :func:`ciphertexts_from_blobs`.

    Raises:
        TooManyCiphertexts: more than ``max_count`` ciphertexts (HTTP 413).
        MalformedCiphertext: garbage, a bad checksum, or inconsistent lengths or count.
    """
    _, header, payload = unpack(data, CIPHERTEXTS_MAGIC, (CIPHERTEXTS_VERSION,), MalformedCiphertext, "ciphertexts")
    check_fields(header, ("count", "lengths"), MalformedCiphertext, "ciphertexts")
    lengths = header["lengths"]
    if max_count is not None and isinstance(lengths, list) and len(lengths) > max_count:
        raise TooManyCiphertexts(f"ciphertexts.count: expected at most {max_count} ciphertexts, "
                                 f"received {len(lengths)}")
    blobs = split_sections(payload, lengths, MalformedCiphertext, "ciphertexts")
    if header["count"] != len(blobs):
        raise MalformedCiphertext(f"ciphertexts.count: expected {len(blobs)}, received {header['count']!r}")
    return blobs


def ciphertexts_from_blobs(params: CkksParameters, blobs: Sequence[bytes], *, fresh: bool = False
                           ) -> list[sa.Ciphertext]:
    """Parse the :func:`ciphertext_blobs` of a container and check each ciphertext as :func:`ciphertexts_from_bytes`.

    Raises:
        MalformedCiphertext: a blob that is not a ciphertext for ``params`` or fails a check (named by its index).
    """
    context, out = params.seal_context(), []
    for i, blob in enumerate(blobs):
        try:
            ct = seal_from_bytes(sa.Ciphertext(), context, blob)
        except Exception as exc:  # SEAL raises RuntimeError/ValueError/IOError subclasses for bad input
            raise MalformedCiphertext(f"ciphertexts[{i}]: not a ciphertext for parameters {params.hash()[:12]} "
                                      f"(N={params.poly_modulus_degree}, chain={list(params.coeff_mod_bit_sizes)}): "
                                      f"{type(exc).__name__}: {str(exc)[:200]}") from None
        check_ciphertext(ct, params, f"ciphertexts[{i}]", fresh=fresh)
        out.append(ct)
    return out


def check_ciphertext(ct: sa.Ciphertext, params: CkksParameters, what: str, *, fresh: bool = False) -> None:
    """Refuse a loaded ciphertext SEAL would fail on mid-evaluation (see :func:`ciphertexts_from_bytes`).

    Raises:
        MalformedCiphertext: naming the property, the expected and the received value.
    """
    context = params.seal_context()
    if not sa.is_valid_for(ct, context):
        raise MalformedCiphertext(f"{what}: expected a ciphertext valid for parameters {params.hash()[:12]}, "
                                  "received one SEAL finds invalid")
    if ct.size() != 2:
        raise MalformedCiphertext(f"{what}.size: expected 2 polynomials (relinearized), received {ct.size()}")
    if not ct.is_ntt_form():
        raise MalformedCiphertext(f"{what}.is_ntt_form: expected True (CKKS ciphertexts are in NTT form), "
                                  "received False")
    if ct.is_transparent():
        raise MalformedCiphertext(f"{what}: expected a ciphertext with a non-zero mask, received a transparent one "
                                  "(it would reveal its plaintext)")
    scale = ct.scale
    if fresh:
        if ct.parms_id() != context.first_parms_id():
            raise MalformedCiphertext(f"{what}.level: expected a fresh ciphertext at the first level, received one "
                                      f"at chain index {context.get_context_data(ct.parms_id()).chain_index()}")
        if scale != params.scale:
            raise MalformedCiphertext(f"{what}.scale: expected exactly 2^{params.scale_bits} = {params.scale!r}, "
                                      f"received {scale!r}")
    elif not (math.isfinite(scale) and scale >= 1.0):
        raise MalformedCiphertext(f"{what}.scale: expected a finite scale >= 1, received {scale!r}")
