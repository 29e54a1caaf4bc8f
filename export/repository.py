"""Write a model into a Triton / KServe model repository.

    <repo>/<name>/config.pbtxt         Triton model configuration (text protobuf)
    <repo>/<name>/<version>/model.onnx the graph (plus any files the model needs, e.g. a tokenizer)
    <repo>/<name>/veil.json            veil's manifest: kind, tensors, source hash, export + validation report

The whole model folder (config.pbtxt, veil.json, the new version and the versions already there) is assembled
under a temporary name and published in one atomic step (:func:`model_folder`), so a server scanning the
repository sees the old model or the complete new one: never a version without its config.pbtxt, never none.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from veil.pave import ADAPTER_SPEC_DIR, SPEC_FILE

from veil import kinds
from veil.atomic import atomic_dir
from veil.kinds import Backend, Tensor, batching_body

from .errors import ExportError

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


def _tensor(spec: TensorSpec, batched: bool) -> Tensor:
    return Tensor(spec.name, DTYPES[spec.dtype][1], spec.shape[1:] if batched else spec.shape)


def config_pbtxt(name: str, inputs: list[TensorSpec], outputs: list[TensorSpec], max_batch_size: int,
                 max_queue_delay_us: int | None, threads: int | None = None,
                 parameters: dict[str, str] | None = None) -> str:
    """Triton's config.pbtxt for an ONNX Runtime model (:func:`veil.kinds.config_pbtxt`); batching on dim 0 when
    max_batch_size > 0."""
    batched = max_batch_size > 0
    params = {**({"intra_op_thread_count": str(threads)} if threads else {}), **(parameters or {})}
    return kinds.config_pbtxt(name, Backend.ONNXRUNTIME, [_tensor(s, batched) for s in inputs],
                              [_tensor(s, batched) for s in outputs], max_batch_size=max_batch_size, latest_versions=1,
                              batching=batching_body(max_queue_delay_us) if batched and max_queue_delay_us is not None
                              else None, parameters=params)


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link an unchanged file into the new model folder (no copy of big graphs); copy where links fail."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@contextlib.contextmanager
def model_folder(repo: str | Path, name: str, version: int, drop: tuple[str, ...] = ()) -> Iterator[tuple[Path, Path]]:
    """Assemble ``<repo>/<name>`` under a temporary name and publish it whole, in one atomic step.

    Yields ``(folder, version_folder)``: the temporary model folder, pre-filled with everything the published
    one holds except ``<version>`` and the entries named in ``drop`` (what the caller rewrites whole, e.g. an
    ``adapters/`` folder), and its empty ``<version>`` folder. Write the version's files,
    ``config.pbtxt`` and ``veil.json`` into them; on exit the folder replaces the old one
    (:func:`veil.atomic.atomic_dir`), on an error the old one stays. The other versions' files are hard links
    (nothing big is copied; a version folder is never written into once published); the model's own files are
    copies, so writing over one cannot change the published model. PAVE specs (``pave.json``, ``pave/``) are
    never carried over: they describe the model an export wrote, so a re-export without ``--spec`` must not
    leave the old model's spec to be ranked for the new one (``write_spec`` adds the new one after the publish).
    """
    final = Path(repo) / name
    drop = (*drop, SPEC_FILE, ADAPTER_SPEC_DIR)
    with atomic_dir(final) as folder:
        if final.is_dir():
            for entry in final.iterdir():
                if entry.name == str(version) or entry.name.startswith(".") or entry.name in drop:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, folder / entry.name, symlinks=True,
                                    copy_function=_link_or_copy if entry.name.isdigit() else shutil.copy2)
                else:
                    shutil.copy2(entry, folder / entry.name, follow_symlinks=False)
        version_folder = folder / str(version)
        version_folder.mkdir()
        yield folder, version_folder


def write_model(repo: str | Path, name: str, version: int, model: onnx.ModelProto, inputs: list[TensorSpec],
                outputs: list[TensorSpec], manifest: dict[str, Any], max_batch_size: int = 64,
                max_queue_delay_us: int | None = 500, extra_files: dict[str, Path] | None = None,
                model_files: dict[str, Path] | None = None, config_extra: str = "",
                parameters: dict[str, str] | None = None) -> Path:
    """Write (or replace) ``<repo>/<name>/<version>`` and the model's config.pbtxt and veil.json, in one publish.

    Args:
        extra_files: files of the version folder (relative path -> source).
        model_files: files of the model folder beside the versions (e.g. ``adapters/<id>.onnx_adapter``); the
            top-level entries they name replace the published ones whole.
        parameters: config.pbtxt ``parameters`` entries (e.g. ``adapter_cache_size``).
        config_extra: raw lines appended to config.pbtxt.
    """
    if not NAME_PATTERN.match(name):
        raise ExportError(f"--name: expected letters, digits, '_', '.', '-' (not starting with a symbol), received {name!r}")
    if version < 1:
        raise ExportError(f"--version: expected an integer >= 1 (Triton version folders), received {version}")
    for spec in inputs + outputs:
        if spec.dtype not in DTYPES:
            raise ExportError(f"tensor {spec.name!r}: dtype {spec.dtype} has no Triton type; expected one of {sorted(DTYPES)}")
    full = {"format": 1, "name": name, "version": version, "inputs": [s.to_dict() for s in inputs],
            "outputs": [s.to_dict() for s in outputs], **manifest}
    drop = tuple(sorted({Path(rel).parts[0] for rel in model_files or {}}))
    with model_folder(repo, name, version, drop) as (folder, version_folder):
        onnx.save_model(model, str(version_folder / "model.onnx"))
        for root, files in ((version_folder, extra_files), (folder, model_files)):
            for rel, src in (files or {}).items():
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
        (folder / "veil.json").write_text(json.dumps(full, indent=2, sort_keys=True, default=str))
        (folder / "config.pbtxt").write_text(config_pbtxt(name, inputs, outputs, max_batch_size, max_queue_delay_us,
                                                          parameters=parameters) + config_extra)
    return Path(repo) / name / str(version)
