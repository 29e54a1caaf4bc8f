"""Write a model into a Triton / KServe model repository.

    <repo>/<name>/config.pbtxt         Triton model configuration (text protobuf)
    <repo>/<name>/<version>/model.onnx the graph (plus any files the model needs, e.g. a tokenizer)
    <repo>/<name>/veil.json            veil's manifest: kind, tensors, source hash, export + validation report

The version folder is assembled under a temporary name and renamed into place; config.pbtxt and
veil.json are written atomically, so a server scanning the repository never sees half a model.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from veil.config import atomic_dir, write_atomic

from .swap import ExportError

# numpy dtype name -> (OIP datatype, Triton config data_type)
DTYPES = {
    "float32": ("FP32", "TYPE_FP32"), "float16": ("FP16", "TYPE_FP16"), "float64": ("FP64", "TYPE_FP64"),
    "int64": ("INT64", "TYPE_INT64"), "int32": ("INT32", "TYPE_INT32"), "int8": ("INT8", "TYPE_INT8"),
    "uint8": ("UINT8", "TYPE_UINT8"), "bool": ("BOOL", "TYPE_BOOL"),
}
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class TensorSpec:
    """One graph input or output: name, numpy dtype name and shape with -1 for variable dims (batch first)."""

    name: str
    dtype: str
    shape: list[int]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": DTYPES[self.dtype][0], "shape": self.shape}


def _tensor_block(spec: TensorSpec, batched: bool) -> str:
    dims = spec.shape[1:] if batched else spec.shape
    return f'  {{\n    name: "{spec.name}"\n    data_type: {DTYPES[spec.dtype][1]}\n    dims: [ {", ".join(map(str, dims))} ]\n  }}'


def config_pbtxt(name: str, inputs: list[TensorSpec], outputs: list[TensorSpec], max_batch_size: int,
                 max_queue_delay_us: int | None, threads: int | None = None) -> str:
    """Triton's config.pbtxt for an ONNX Runtime model; batching on dim 0 when max_batch_size > 0."""
    batched = max_batch_size > 0
    lines = [f'name: "{name}"', 'backend: "onnxruntime"', f"max_batch_size: {max_batch_size}",
             "input [\n" + ",\n".join(_tensor_block(s, batched) for s in inputs) + "\n]",
             "output [\n" + ",\n".join(_tensor_block(s, batched) for s in outputs) + "\n]",
             "instance_group [ { count: 1 kind: KIND_CPU } ]",
             "version_policy: { latest { num_versions: 1 } }"]
    if batched and max_queue_delay_us is not None:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} "
                     "default_queue_policy { max_queue_size: 1024 } }")
    if threads:
        lines.append(f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{threads}" }} }}')
    return "\n".join(lines) + "\n"


def write_model(repo: str | Path, name: str, version: int, model: onnx.ModelProto, inputs: list[TensorSpec],
                outputs: list[TensorSpec], manifest: dict[str, Any], max_batch_size: int = 64,
                max_queue_delay_us: int | None = 500, extra_files: dict[str, Path] | None = None) -> Path:
    """Write (or replace) ``<repo>/<name>/<version>`` and the model's config.pbtxt and veil.json."""
    if not NAME_PATTERN.match(name):
        raise ExportError(f"--name: expected letters, digits, '_', '.', '-' (not starting with a symbol), received {name!r}")
    if version < 1:
        raise ExportError(f"--version: expected an integer >= 1 (Triton version folders), received {version}")
    for spec in inputs + outputs:
        if spec.dtype not in DTYPES:
            raise ExportError(f"tensor {spec.name!r}: dtype {spec.dtype} has no Triton type; expected one of {sorted(DTYPES)}")
    model_dir = Path(repo) / name
    model_dir.mkdir(parents=True, exist_ok=True)
    final = model_dir / str(version)
    with atomic_dir(final) as tmp:
        onnx.save_model(model, str(tmp / "model.onnx"))
        for rel, src in (extra_files or {}).items():
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    full = {"format": 1, "name": name, "version": version, "inputs": [s.to_dict() for s in inputs],
            "outputs": [s.to_dict() for s in outputs], **manifest}
    write_atomic(model_dir / "veil.json", json.dumps(full, indent=2, sort_keys=True, default=str))
    write_atomic(model_dir / "config.pbtxt", config_pbtxt(name, inputs, outputs, max_batch_size, max_queue_delay_us))
    return final
