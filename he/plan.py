"""The compiled HE program: ``plan.json`` (ops, values, levels, packing, key manifest) + ``plan.safetensors``.

A plan is a straight-line program over *values* (in latency mode one ciphertext holds
``batch_capacity`` images, each in its own block of ``period`` slots; in throughput mode one ciphertext
per feature). Its ops, in topological order:

    linear     outputs[k] = sum_i weights[k][i] @ inputs[i] + biases[k]   (1 level, plaintext weights)
    mul        output = inputs[0] * inputs[1]                                (1 level, ct x ct)
    add        output = inputs[0] + inputs[1]                                (0 levels)
    add_const  output = inputs[0] + const                                   (0 levels)
    sumsq      output = sum_j inputs[0][j]^2 (- n inputs[1]^2, n = features), one value for every feature (1 level)

A value has ``features`` (1 = broadcast: the same number for every feature), its ``shape`` and the
``level`` (rescalings consumed) it is produced at. Throughput linear ops hold dense ``weights`` (out, in);
latency linear ops hold masked diagonals instead (per output and input: ``offsets`` and a (n, period) mask
tensor), ``broadcast`` block vectors, the baby-step/giant-step ``split`` and the steps it uses, and latency
values their slot ``positions`` (see :mod:`veil.he.packing`, :mod:`veil.he.layout`). The plan names the
CKKS parameters it was compiled for, so the client derives the same parameters, keys (only
``galois_steps``) and slot layout from the plan alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np

Mode = Literal["latency", "throughput"]
FORMAT = "veil.he.plan/3"  # /3: linear ops may fold outputs (``folds``) and inputs may be im2col patches (``gather``)
# /4: a replicated latency plan (one sample per ciphertext, its block tiled over every slot, rotations taken
# modulo the period); written only for such a plan, so a /3 reader refuses it instead of misreading its keys
REPLICATED_FORMAT = "veil.he.plan/4"
READABLE_FORMATS = ("veil.he.plan/2", FORMAT, REPLICATED_FORMAT)  # a /2 plan has neither and runs unchanged
JSON_NAME, WEIGHTS_NAME = "plan.json", "plan.safetensors"


@dataclasses.dataclass
class Plan:
    """A compiled HE program and its weights.

    Args:
        spec: the JSON part: format, mode, inputs/outputs ({name, value, shape, features, positions}), values,
            ops, levels, period (latency block size), window, batch_capacity, galois_steps, rotation_keys,
            rotations, parameters, precision_bits, onnx_sha256.
        tensors: named float64 arrays the ops refer to (matrices (out, in), bias / constant vectors).
    """

    spec: dict[str, Any]
    tensors: dict[str, np.ndarray]

    @property
    def mode(self) -> Mode:
        return self.spec["mode"]

    @property
    def levels(self) -> int:
        """Rescalings the program consumes (the chain must offer at least this many)."""
        return int(self.spec["levels"])

    @property
    def galois_steps(self) -> list[int]:
        """The key manifest: the only rotation steps the evaluator uses (empty in throughput mode)."""
        return list(self.spec["galois_steps"])

    @property
    def ops(self) -> list[dict[str, Any]]:
        return self.spec["ops"]

    @property
    def slots(self) -> int:
        return int(self.spec["parameters"]["poly_modulus_degree"]) // 2

    @property
    def replicated(self) -> bool:
        """Latency: one sample per ciphertext, its block repeated over every slot (``compile(replicate=True)``)."""
        return bool(self.spec.get("replicated", False))

    @property
    def key_modulus(self) -> int:
        """Rotation steps are equal modulo this: the period of a replicated plan (its ciphertexts repeat every
        period slots, so a rotation by s - period is one by s), else the slots."""
        return int(self.spec["period"]) if self.replicated else self.slots

    @property
    def batch_capacity(self) -> int:
        """Images per ciphertext (latency: slots // period) or per call (throughput: slots)."""
        return int(self.spec["batch_capacity"])

    def ciphertexts_for(self, batch: int) -> int:
        """How many input ciphertexts a batch of ``batch`` samples takes."""
        if self.mode == "latency":
            return -(-batch // self.batch_capacity)
        return int(self.spec["inputs"][0]["features"])

    def parameters(self):  # -> veil.he.params.CkksParameters
        """The CKKS parameters the plan was compiled for."""
        from veil.he.params import CkksParameters

        return CkksParameters.from_dict(self.spec["parameters"])

    def hash(self) -> str:
        """SHA-256 over the canonical JSON and every tensor (name, dtype, shape, bytes), in name order."""
        digest = hashlib.sha256(_canonical(self.spec).encode())
        for name in sorted(self.tensors):
            array = np.ascontiguousarray(self.tensors[name])
            digest.update(f"{name}|{array.dtype.str}|{array.shape}".encode())
            digest.update(array.tobytes())
        return digest.hexdigest()

    def save(self, folder: str | Path) -> Path:
        """Write plan.json and plan.safetensors into ``folder`` (each via a temp file, then rename)."""
        from safetensors.numpy import save_file  # model side only: the client never needs safetensors

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(folder / WEIGHTS_NAME, lambda p: save_file(
            {k: np.ascontiguousarray(v) for k, v in self.tensors.items()}, str(p)))
        spec = {**self.spec, "plan_hash": self.hash()}
        _atomic_write(folder / JSON_NAME, lambda p: Path(p).write_text(json.dumps(spec, indent=1, sort_keys=True)))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> Plan:
        """Read a plan written by :meth:`save`; refuses a wrong format or a hash that does not match."""
        from safetensors.numpy import load_file  # model side only: the client never needs safetensors

        folder = Path(folder)
        spec = json.loads((folder / JSON_NAME).read_text())
        if spec.get("format") not in READABLE_FORMATS:
            raise ValueError(f"{folder / JSON_NAME}: expected format one of {READABLE_FORMATS}, "
                             f"received {spec.get('format')!r}")
        stored = spec.pop("plan_hash", None)
        plan = cls(spec, dict(load_file(str(folder / WEIGHTS_NAME))))
        if stored != plan.hash():
            raise ValueError(f"{folder}: plan_hash expected {plan.hash()} (recomputed), received {stored}")
        return plan

    def encode_inputs(self, x: np.ndarray) -> list[np.ndarray]:
        """Client side: the slot vectors to encrypt for a batch ``x`` of shape (B, *input shape).

        Latency: sample b in block b % capacity of vector b // capacity, feature f at slot
        ``block * period + positions[f]`` (NCHW order, or the im2col patches ``gather`` names), zeros elsewhere;
        a replicated plan repeats sample b's block over every slot of vector b. Throughput: one vector per
        feature, holding that feature of the B samples (B <= slots).
        """
        spec = self.spec["inputs"][0]
        x = np.asarray(x, dtype=np.float64)
        if x.ndim < 1 or tuple(x.shape[1:]) != tuple(spec["shape"]):
            raise ValueError(f"encode_inputs: `x` expected shape (B, {', '.join(map(str, spec['shape']))}), "
                             f"received {tuple(x.shape)}")
        flat = x.reshape(len(x), -1)  # (B, F)
        if "gather" in spec:  # im2col patches of the first conv (compile's input_im2col): index -1 is padding
            index = np.asarray(spec["gather"], dtype=np.int64)
            flat = np.where(index >= 0, flat[:, np.maximum(index, 0)], 0.0)
        if self.mode == "latency":
            slots = self._latency_slots(spec, len(x))  # (B, F)
            vectors = np.zeros((self.ciphertexts_for(len(x)), self.slots))
            vectors.reshape(-1)[slots.reshape(-1)] = flat.reshape(-1)
            if self.replicated:
                period = int(self.spec["period"])
                vectors = np.tile(vectors[:, :period], (1, self.slots // period))
            return list(vectors)  # ceil(B / capacity) x (slots,)
        if len(x) > self.slots:
            raise ValueError(f"encode_inputs: throughput batch expected <= {self.slots} samples, received {len(x)}")
        return list(flat.T.copy())  # F x (B,)

    def decode_outputs(self, vectors: list[np.ndarray], batch: int) -> np.ndarray:
        """Client side: decrypted slot vectors -> outputs (batch, *output shape)."""
        spec = self.spec["outputs"][0]
        features = int(spec["features"])
        if self.mode == "latency":
            if len(vectors) != self.ciphertexts_for(batch):
                raise ValueError(f"decode_outputs: latency mode expects {self.ciphertexts_for(batch)} vectors for "
                                 f"{batch} samples ({self.batch_capacity} per ciphertext), received {len(vectors)}")
            flat = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1)[: self.slots] for v in vectors])
            out = flat[self._latency_slots(spec, batch)]  # (B, F)
        else:
            if len(vectors) != features:
                raise ValueError(f"decode_outputs: throughput mode expects one vector per output feature "
                                 f"({features}), received {len(vectors)}")
            out = np.stack([np.asarray(v)[:batch] for v in vectors], axis=1)  # (B, F)
        return out.reshape(batch, *spec["shape"])


    def _latency_slots(self, end: dict[str, Any], batch: int) -> np.ndarray:
        """(batch, F) slot indices, over the concatenated ciphertexts, of an input's or output's features."""
        period, capacity = int(self.spec["period"]), self.batch_capacity
        b = np.arange(batch)
        base = (b // capacity) * self.slots + (b % capacity) * period  # (B,)
        return base[:, None] + np.asarray(end["positions"], dtype=np.int64)[None, :]


def _canonical(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
