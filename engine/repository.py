"""The model repository on disk: Triton's layout, ``config.pbtxt`` read into typed configs, version policies.

Layout (the same folder is servable by NVIDIA Triton unchanged)::

    <repo>/<model>/config.pbtxt          Triton model configuration (protobuf text)
    <repo>/<model>/<version>/model.onnx  numeric version folders
    <repo>/<model>/veil.json             optional manifest written by `veil export` (kind, validation report...)

Fields honoured: ``name``, ``platform``/``backend``, ``max_batch_size``, ``input``/``output`` (``name``,
``data_type``, ``dims``), ``dynamic_batching`` (``max_queue_delay_microseconds``,
``default_queue_policy.max_queue_size``), ``instance_group`` (``count``, ``kind``), ``parameters``
(``intra_op_thread_count``, ``inter_op_thread_count``), ``optimization.graph.level``, ``version_policy``
and ``default_model_filename``. Inputs/outputs left out of a hand-written config are filled in from the
ONNX graph when the model loads, as Triton's auto-complete does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ModelLoadFailed
from .pbtxt import PbtxtError, parse
from .protocol import datatype_to_triton, triton_to_datatype


@dataclass(frozen=True)
class CustomBackend:
    """One of veil's own model kinds: where its model class lives and the file a version folder holds.

    The class is imported only when a model of that backend loads, and is constructed as
    ``cls(config, version, path, manifest, plane)`` (``plane``: the :class:`DataPlane`, for shared
    services such as the HE key store); it then offers ``load(metrics)``, ``check_inputs``, ``infer``,
    ``metadata`` and ``unload`` like :class:`veil.engine.models.OnnxModel`.
    """

    module: str
    cls: str
    filename: str


# config.pbtxt `backend:` -> veil model kind; Triton cannot serve these, veil can
CUSTOM_BACKENDS: dict[str, CustomBackend] = {
    "veil_he": CustomBackend("veil.engine.he_model", "HeModel", "plan.json"),  # encrypted inference (CKKS plan)
    "veil_codec": CustomBackend("veil.engine.codec_model", "CodecModel", "codec.json"),  # ARPC image codec
    "veil_sampler": CustomBackend("veil.engine.sampler_model", "SamplerModel", "sampler.json"),  # PriorGuide
}


@dataclass
class TensorConfig:
    """One input or output: OIP datatype and dims (without the batch dim when max_batch_size > 0; -1 = any)."""

    name: str
    datatype: str
    dims: list[int]


@dataclass
class BatchingConfig:
    """Triton's ``dynamic_batching { }`` block."""

    max_queue_delay_us: int = 0
    max_queue_size: int = 0  # 0: unbounded


@dataclass
class ModelConfig:
    """A model's ``config.pbtxt`` in typed form (see the module docstring for the fields honoured)."""

    name: str
    max_batch_size: int = 0
    inputs: list[TensorConfig] = field(default_factory=list)
    outputs: list[TensorConfig] = field(default_factory=list)
    batching: BatchingConfig | None = None
    instance_count: int = 1
    instance_kind: str = "KIND_AUTO"
    parameters: dict[str, str] = field(default_factory=dict)
    graph_level: int | None = None
    version_policy: dict[str, Any] = field(default_factory=lambda: {"latest": {"num_versions": 1}})
    model_filename: str = "model.onnx"
    backend: str = "onnxruntime"  # or one of CUSTOM_BACKENDS (veil's own model kinds)

    def to_triton_json(self) -> dict[str, Any]:
        """The JSON Triton returns from ``GET /v2/models/{m}/config`` (field names as in model_config.proto)."""
        def tensor(t: TensorConfig) -> dict[str, Any]:
            return {"name": t.name, "data_type": datatype_to_triton(t.datatype), "format": "FORMAT_NONE",
                    "dims": t.dims, "is_shape_tensor": False}

        out: dict[str, Any] = {
            "name": self.name, "platform": self.backend if self.backend in CUSTOM_BACKENDS else "onnxruntime_onnx",
            "backend": self.backend,
            "version_policy": self.version_policy, "max_batch_size": self.max_batch_size,
            "input": [tensor(t) for t in self.inputs], "output": [tensor(t) for t in self.outputs],
            "instance_group": [{"name": f"{self.name}_0", "kind": self.instance_kind, "count": self.instance_count,
                                "gpus": []}],
            "default_model_filename": self.model_filename,
            "parameters": {k: {"string_value": v} for k, v in self.parameters.items()},
        }
        if self.batching is not None:
            out["dynamic_batching"] = {
                "preferred_batch_size": [], "max_queue_delay_microseconds": self.batching.max_queue_delay_us,
                "preserve_ordering": False,
                "default_queue_policy": {"max_queue_size": self.batching.max_queue_size, "timeout_action": "REJECT",
                                         "default_timeout_microseconds": 0, "allow_timeout_override": False}}
        if self.graph_level is not None:
            out["optimization"] = {"graph": {"level": self.graph_level}}
        return out


def _repeated(message: dict[str, Any], key: str) -> list[Any]:
    value = message.get(key, [])
    return value if isinstance(value, list) else [value]


def _int(message: dict[str, Any], key: str, default: int, where: str) -> int:
    value = message.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}{key}: expected an integer, received {value!r}")
    return value


def _tensor(message: Any, where: str) -> TensorConfig:
    if not isinstance(message, dict) or not isinstance(message.get("name"), str):
        raise ValueError(f"{where}: expected a message with a string name, received {message!r}")
    dims = _repeated(message, "dims")
    if "reshape" in message:
        raise ValueError(f"{where} '{message['name']}': reshape is not supported by veil")
    if not all(isinstance(d, int) and d >= -1 for d in dims):
        raise ValueError(f"{where} '{message['name']}': dims expected integers >= -1, received {dims}")
    return TensorConfig(message["name"], triton_to_datatype(str(message.get("data_type", ""))), dims)


def parse_config(text: str, folder_name: str) -> ModelConfig:
    """Read ``config.pbtxt`` text into a :class:`ModelConfig`.

    Raises:
        ValueError: naming the field, the expected and the received value (PbtxtError on syntax errors).
    """
    raw = parse(text)
    name = raw.get("name", folder_name)
    if name != folder_name:
        raise ValueError(f"name: expected the folder name {folder_name!r}, received {name!r}")
    platform, backend = raw.get("platform"), raw.get("backend")
    if platform not in (None, "onnxruntime_onnx") or backend not in (None, "onnxruntime", *CUSTOM_BACKENDS):
        raise ValueError(f"platform/backend: expected 'onnxruntime_onnx'/'onnxruntime' or a backend in "
                         f"{sorted(CUSTOM_BACKENDS)}, received {platform or backend!r}")
    default_file = CUSTOM_BACKENDS[backend].filename if backend in CUSTOM_BACKENDS else "model.onnx"
    config = ModelConfig(name=name, max_batch_size=_int(raw, "max_batch_size", 0, ""),
                         inputs=[_tensor(m, "input") for m in _repeated(raw, "input")],
                         outputs=[_tensor(m, "output") for m in _repeated(raw, "output")],
                         model_filename=str(raw.get("default_model_filename", default_file)),
                         backend=str(backend or "onnxruntime"))
    if "dynamic_batching" in raw:
        block = raw["dynamic_batching"]
        policy = block.get("default_queue_policy", {})
        config.batching = BatchingConfig(_int(block, "max_queue_delay_microseconds", 0, "dynamic_batching."),
                                         _int(policy, "max_queue_size", 0, "dynamic_batching.default_queue_policy."))
    groups = _repeated(raw, "instance_group")
    if groups:
        config.instance_count = sum(_int(g, "count", 1, "instance_group.") for g in groups)
        config.instance_kind = str(groups[0].get("kind", "KIND_AUTO"))
        if config.instance_kind not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU"):
            raise ValueError(f"instance_group.kind: expected KIND_AUTO, KIND_CPU or KIND_GPU, received {config.instance_kind!r}")
    for p in _repeated(raw, "parameters"):
        value = p.get("value", {})
        config.parameters[str(p.get("key"))] = str(value.get("string_value", "") if isinstance(value, dict) else value)
    level = raw.get("optimization", {}).get("graph", {}).get("level")
    config.graph_level = None if level is None else int(level)
    if "version_policy" in raw:
        config.version_policy = raw["version_policy"]
        if not isinstance(config.version_policy, dict) or len(config.version_policy) != 1 or \
                next(iter(config.version_policy)) not in ("latest", "all", "specific"):
            raise ValueError(f"version_policy: expected one of latest/all/specific, received {raw['version_policy']!r}")
    return config


def select_versions(available: list[int], policy: dict[str, Any]) -> list[int]:
    """Versions to load under a Triton version policy (``latest {num_versions}``, ``all {}``, ``specific``)."""
    kind, body = next(iter(policy.items()))
    if kind == "all":
        return sorted(available)
    if kind == "specific":
        wanted = {int(v) for v in _repeated(body or {}, "versions")}
        return sorted(v for v in available if v in wanted)
    return sorted(available)[-int((body or {}).get("num_versions", 1)):]


@dataclass
class ModelSource:
    """A model folder on disk: its config, its version folders and the optional veil.json manifest."""

    folder: Path
    config: ModelConfig
    versions: dict[int, Path]
    manifest: dict[str, Any] | None


def read_model(folder: Path) -> ModelSource:
    """Read one model folder (config, manifest, version paths) without creating any session.

    Raises:
        ModelLoadFailed: naming the file and the problem.
    """
    config_path, manifest_path = folder / "config.pbtxt", folder / "veil.json"
    try:
        config = parse_config(config_path.read_text(), folder.name) if config_path.exists() else ModelConfig(folder.name)
    except (ValueError, PbtxtError) as exc:
        raise ModelLoadFailed(f"model '{folder.name}': config.pbtxt: {exc}") from None
    try:
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    except ValueError as exc:
        raise ModelLoadFailed(f"model '{folder.name}': veil.json: {exc}") from None
    available = {int(p.name): p / config.model_filename for p in folder.iterdir()
                 if p.is_dir() and p.name.isdigit() and (p / config.model_filename).is_file()}
    chosen = select_versions(list(available), config.version_policy)
    if not chosen:
        raise ModelLoadFailed(f"model '{folder.name}': no version folder with {config.model_filename} matches "
                              f"version_policy {config.version_policy} (found {sorted(available)})")
    return ModelSource(folder, config, {v: available[v] for v in chosen}, manifest)


def index(repo: Path) -> list[str]:
    """Names of the model folders in a repository (folders that hold a config.pbtxt or a version folder)."""
    return sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith(".")
                  and ((p / "config.pbtxt").exists() or any(c.is_dir() and c.name.isdigit() for c in p.iterdir())))
