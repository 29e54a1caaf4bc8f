"""An image codec model version: an exported ARPC codec served as an OIP v2 model (encode and decode).

Request inputs (each BYTES, shape [1]; send one of them):
    ``image``      PNG/JPEG/... file bytes -> encode; the response holds the stream and its reconstruction.
    ``bitstream``  a veil codec stream -> decode; the response holds the (possibly cut) stream and the PNG.
Parameters: ``scales`` (send / keep the first K scales: for a stream this is a pure byte cut, re-sealed with
a fresh CRC), ``target_bpp`` (encode: the most scales within it), ``mode`` (greedy|sample|mean) and ``seed``.
Outputs: ``bitstream`` (BYTES) and ``image`` (BYTES, PNG of what a receiver decodes).

Every refusal is a 4xx: foreign, corrupt or truncated streams name the field (magic, version, crc, model
hash, ...); unsupported formats are 400 and oversize images 413. The coding itself runs in
:class:`veil.codec.runtime.CodecRuntime` on ONNX Runtime, the prior pinned to one thread (bit-exact decoding).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from veil.codec import bitstream as bs
from veil.codec.errors import CodecError, ImageTooLarge
from veil.codec.images import MAX_PIXELS, load_image, png_bytes
from veil.codec.runtime import MAX_WORK_MB, CodecRuntime

from .errors import (
    DatatypeMismatch,
    InvalidCodecInput,
    MissingInput,
    ModelLoadFailed,
    PayloadTooLarge,
    ShapeMismatch,
    UnknownInput,
)
from .metrics import Metrics, ModelMetrics
from .protocol import InputTensor
from .repository import PbtxtConfig, TensorConfig

if TYPE_CHECKING:
    from .dataplane import DataPlane

logger = logging.getLogger("veil.engine")
IMAGE, BITSTREAM = "image", "bitstream"


def _refusal(exc: CodecError) -> Exception:
    return PayloadTooLarge(str(exc)) if isinstance(exc, ImageTooLarge) else InvalidCodecInput(str(exc))


class CodecModel:
    """A ``backend: "veil_codec"`` model: one exported codec version folder (codec.json + three ONNX graphs).

    Args:
        config: the model's config.pbtxt; ``parameters { key: "max_pixels" ... }``, ``max_decode_mb`` (the
            memory one request's coding may need, estimated before any is done) and ``intra_op_thread_count``
            are honoured.
        version: the version folder number.
        path: the version's ``codec.json``.
        manifest: veil.json (kind "codec").
        plane: the data plane (unused; the signature every custom backend shares).
    """

    def __init__(self, config: PbtxtConfig, version: int, path: Path, manifest: dict[str, Any] | None,
                 plane: DataPlane) -> None:
        self.config, self.name, self.version, self.path = config, config.name, str(version), path
        self.manifest = manifest
        self.ready, self.session, self.scheduler = False, None, None  # no ORT session of its own, no batcher
        self.metrics: ModelMetrics | None = None
        self.inputs = {n: TensorConfig(n, "BYTES", [1]) for n in (IMAGE, BITSTREAM)}
        self.outputs = {n: TensorConfig(n, "BYTES", [1]) for n in (BITSTREAM, IMAGE)}

    def load(self, metrics: Metrics) -> None:
        """Open the three ONNX sessions and check the artifact; then ready."""
        try:
            self.max_pixels = int(self.config.parameters.get("max_pixels", MAX_PIXELS))
            self.max_decode_mb = float(self.config.parameters.get("max_decode_mb", MAX_WORK_MB))
            if not self.max_decode_mb > 0:
                raise ValueError(f"parameters max_decode_mb: expected a number of MiB > 0, received {self.max_decode_mb}")
            threads = int(self.config.parameters.get("intra_op_thread_count", 1))
            self.runtime = CodecRuntime(self.path.parent, threads=threads, max_pixels=self.max_pixels,
                                        max_work_mb=self.max_decode_mb)
        except (OSError, ValueError) as exc:
            raise ModelLoadFailed(f"model '{self.name}' version {self.version}: {self.path.parent}: {exc}") from None
        self.metrics = metrics.for_model(self.name, self.version, "veil_codec", "veil_codec")
        self.ready = True
        logger.info("codec model '%s' version %s ready (K=%d scales, hash %s)", self.name, self.version,
                    self.runtime.geo.K, self.runtime.hash[:8])

    def _parameters(self, parameters: dict[str, Any] | None) -> dict[str, Any]:
        p = parameters or {}
        K = self.runtime.geo.K
        scales, target, mode, seed = p.get("scales"), p.get("target_bpp"), p.get("mode", "greedy"), p.get("seed", 0)
        if scales is not None and (isinstance(scales, bool) or not isinstance(scales, int) or not 1 <= scales <= K):
            raise InvalidCodecInput(f"parameters.scales: expected an integer in [1, {K}], received {scales!r}")
        if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float)) or target <= 0):
            raise InvalidCodecInput(f"parameters.target_bpp: expected a number > 0, received {target!r}")
        if scales is not None and target is not None:
            raise InvalidCodecInput("parameters: expected at most one of scales and target_bpp, received both")
        if mode not in bs.MODES:
            raise InvalidCodecInput(f"parameters.mode: expected one of {sorted(bs.MODES)}, received {mode!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
            raise InvalidCodecInput(f"parameters.seed: expected an integer in [0, 2^32), received {seed!r}")
        return {"scales": scales, "target_bpp": None if target is None else float(target), "mode": mode, "seed": seed}

    def check_inputs(self, inputs: list[InputTensor], parameters: dict[str, Any] | None = None
                     ) -> tuple[dict[str, Any], int]:
        """Exactly one BYTES input of shape [1] (``image`` or ``bitstream``) and valid parameters."""
        feeds: dict[str, Any] = {}
        for tensor in inputs:
            if tensor.name not in self.inputs:
                raise UnknownInput(f"model '{self.name}' has no input '{tensor.name}'; expected one of "
                                   f"{sorted(self.inputs)}")
            if tensor.datatype != "BYTES":
                raise DatatypeMismatch(f"input '{tensor.name}': datatype expected BYTES, received {tensor.datatype}")
            if list(tensor.shape) != [1]:
                raise ShapeMismatch(f"input '{tensor.name}': shape expected [1] (one file), received {tensor.shape}")
            feeds[tensor.name] = bytes(tensor.data.reshape(-1)[0])
        if len(feeds) != 1:
            raise MissingInput(f"model '{self.name}': expected exactly one of inputs ['{IMAGE}', '{BITSTREAM}'], "
                               f"received {sorted(feeds)}")
        options = self._parameters(parameters)
        if IMAGE in feeds:
            try:
                feeds[IMAGE] = load_image(feeds[IMAGE], self.max_pixels)  # (H, W, 3) uint8, refused early
            except CodecError as exc:
                raise _refusal(exc) from None
        return {**feeds, **options}, 1

    async def infer(self, feeds: dict[str, Any], batch: int) -> tuple[dict[str, np.ndarray], int]:
        """Encode or decode in a worker thread (ONNX Runtime and the range coder release the GIL)."""
        stream, png = await asyncio.to_thread(self._run, feeds)
        return {BITSTREAM: np.array([stream], dtype=object), IMAGE: np.array([png], dtype=object)}, 0

    def _run(self, feeds: dict[str, Any]) -> tuple[bytes, bytes]:
        try:
            if IMAGE in feeds:
                data = self.runtime.encode(feeds[IMAGE], k=feeds["scales"], target_bpp=feeds["target_bpp"],
                                           mode=feeds["mode"], seed=feeds["seed"]).data
            else:
                data = feeds[BITSTREAM]
                if feeds["scales"] is not None:
                    data = bs.truncate(data, min(feeds["scales"], bs.read(data).header.k))
            return data, png_bytes(self.runtime.decode(data))
        except CodecError as exc:
            raise _refusal(exc) from None

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """OIP metadata plus what a client needs: scales, active bits, model hash, modes and limits."""
        geo = self.runtime.geo
        return {"name": self.name, "versions": versions, "platform": "veil_codec",
                "inputs": [{"name": n, "datatype": "BYTES", "shape": [1]} for n in (IMAGE, BITSTREAM)],
                "outputs": [{"name": n, "datatype": "BYTES", "shape": [1]} for n in (BITSTREAM, IMAGE)],
                "parameters": {"codec": {"scales": list(geo.scales), "bits": list(geo.bits), "K": geo.K,
                                         "model_hash": self.runtime.hash, "stream_model_hash": self.runtime.hash4.hex(),
                                         "modes": sorted(bs.MODES), "max_pixels": self.max_pixels,
                                         "max_decode_mb": self.max_decode_mb,
                                         "format_version": bs.VERSION},
                               "veil": self.manifest}}

    async def unload(self) -> None:
        self.ready = False
