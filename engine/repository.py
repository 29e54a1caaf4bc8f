"""The model repository on disk: Triton's layout, ``config.pbtxt`` read into typed configs, version policies.

Layout (the same folder is servable by NVIDIA Triton unchanged)::

    <repo>/<model>/config.pbtxt          Triton model configuration (protobuf text)
    <repo>/<model>/<version>/model.onnx  numeric version folders
    <repo>/<model>/veil.json             optional manifest written by `veil export` (kind, validation report...)

``config.pbtxt`` is checked against Triton's model-configuration schema (:func:`veil.engine.pbtxt.parse_model_config`):
an unknown field, a wrong type or a non-repeated field given twice stops the load naming the field and the file.
Fields honoured: ``name``, ``platform``/``backend``, ``max_batch_size``, ``input``/``output`` (``name``,
``data_type``, ``dims``), ``dynamic_batching`` (``max_queue_delay_microseconds``,
``default_queue_policy.max_queue_size``), ``instance_group`` (``count``, ``kind``), ``parameters``
(``intra_op_thread_count``, ``inter_op_thread_count``), ``optimization.graph.level``, ``version_policy``
and ``default_model_filename``. Inputs/outputs left out of a hand-written config are filled in from the
ONNX graph when the model loads, as Triton's auto-complete does. Any other valid field set to a non-default
value (``sequence_batching``, ``dynamic_batching.priority_levels``, ``preferred_batch_size``, ``timeout_action``...)
is logged once per model as ignored. Model names are one path component (:func:`check_model_name`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veil.kinds import BACKENDS, Backend

from .errors import InvalidModelName, ModelLoadFailed
from .pbtxt import parse_model_config
from .protocol import datatype_to_triton, triton_to_datatype

logger = logging.getLogger("veil.engine")


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


# config.pbtxt `backend:` -> veil's own backends (veil.kinds.BACKENDS, the one table); Triton cannot serve these
CUSTOM_BACKENDS: dict[str, CustomBackend] = {
    backend.value: CustomBackend(*spec.model.split(":"), spec.filename)
    for backend, spec in BACKENDS.items() if backend is not Backend.ONNXRUNTIME
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
class PbtxtConfig:
    """A model's ``config.pbtxt`` (Triton's ``inference.ModelConfig``) in typed form (see the module docstring
    for the fields honoured)."""

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
    backend: str = Backend.ONNXRUNTIME.value  # or one of CUSTOM_BACKENDS (veil's own model kinds)

    def to_triton_json(self) -> dict[str, Any]:
        """The JSON Triton returns from ``GET /v2/models/{m}/config`` (field names as in model_config.proto)."""
        def tensor(t: TensorConfig) -> dict[str, Any]:
            return {"name": t.name, "data_type": datatype_to_triton(t.datatype), "dims": t.dims, "is_shape_tensor": False}

        out: dict[str, Any] = {
            "name": self.name, "platform": self.backend if self.backend in CUSTOM_BACKENDS else "onnxruntime_onnx",
            "backend": self.backend,
            "version_policy": self.version_policy, "max_batch_size": self.max_batch_size,
            "input": [{**tensor(t), "format": "FORMAT_NONE"} for t in self.inputs],  # ModelOutput has no format
            "output": [tensor(t) for t in self.outputs],
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


def check_model_name(name: str) -> str:
    """``name`` if it is one path component that can be a model folder; refused otherwise.

    Model names reach the file system (``<repo>/<name>``) through load/unload, so ``..``, separators, NUL and
    control characters are refused, and so are ``%`` (a proxy that decodes twice could turn ``%2e%2e`` into
    ``..``) and a leading ``.`` (the repository's own hidden folders: key store, temporary folders of writers).

    Raises:
        InvalidModelName (HTTP 400): naming the rule and the received name.
    """
    if not isinstance(name, str) or not name or name.startswith(".") or _BAD_NAME.search(name):
        raise InvalidModelName(f"model name: expected one path component (no '/', '\\', '%', control characters, "
                               f"not starting with '.'), received {name!r}")
    return name


_BAD_NAME = re.compile(r"[/\\%\x00-\x1f\x7f]")
# the config.pbtxt fields veil reads; any other field set to a non-default value is valid Triton but ignored
# by veil, so it is logged once per model (``input.optional`` is honoured by veil_sampler models only)
HONOURED = frozenset({
    "name", "platform", "backend", "max_batch_size", "default_model_filename",
    "input", "input.name", "input.data_type", "input.dims", "output", "output.name", "output.data_type", "output.dims",
    "dynamic_batching", "dynamic_batching.max_queue_delay_microseconds", "dynamic_batching.default_queue_policy",
    "dynamic_batching.default_queue_policy.max_queue_size",
    "instance_group", "instance_group.name", "instance_group.count", "instance_group.kind",
    "parameters", "parameters.key", "parameters.value", "parameters.value.string_value",
    "optimization", "optimization.graph", "optimization.graph.level",
    "version_policy", "version_policy.latest", "version_policy.latest.num_versions", "version_policy.all",
    "version_policy.specific", "version_policy.specific.versions",
})
_WARNED: set[tuple[str, str]] = set()


def unsupported_fields(raw: dict[str, Any], backend: str, prefix: str = "") -> list[str]:
    """Paths of fields set (to a non-default value) that veil does not implement, in file order."""
    found: list[str] = []
    for key, value in raw.items():
        path = prefix + key
        honoured = path in HONOURED or (path == "input.optional" and backend == "veil_sampler")
        items = value if isinstance(value, list) else [value]
        if not honoured:
            if any(_set(v) for v in items):
                found.append(path)
            continue
        for item in items:
            if isinstance(item, dict):
                found += [p for p in unsupported_fields(item, backend, path + ".") if p not in found]
    return found


def _set(value: Any) -> bool:
    """Whether a field holds something other than its proto3 default (messages count as set, even empty)."""
    return isinstance(value, dict) or value not in (0, 0.0, False, "", "FORMAT_NONE", "REJECT", "PRIORITY_DEFAULT",
                                                    "KIND_AUTO", "TYPE_INVALID")


def _tensor(message: dict[str, Any], where: str) -> TensorConfig:
    if not isinstance(message.get("name"), str) or not message["name"]:
        raise ValueError(f"{where}.name: expected a non-empty string, received {message.get('name')!r}")
    if "reshape" in message:
        raise ValueError(f"{where} '{message['name']}': reshape is not supported by veil")
    dims = message.get("dims", [])
    if not all(d >= -1 for d in dims):
        raise ValueError(f"{where} '{message['name']}': dims expected integers >= -1, received {dims}")
    return TensorConfig(message["name"], triton_to_datatype(message.get("data_type", "")), dims)


def parse_config(text: str, folder_name: str) -> PbtxtConfig:
    """Read ``config.pbtxt`` text into a :class:`PbtxtConfig`, strictly (Triton's schema, see
    :func:`veil.engine.pbtxt.parse_model_config`); valid fields veil does not implement are logged once.

    Raises:
        ValueError: naming the field, the expected and the received value (PbtxtError on syntax and schema errors).
    """
    raw = parse_model_config(text)
    name = raw.get("name", folder_name)
    if name != folder_name:
        raise ValueError(f"name: expected the folder name {folder_name!r}, received {name!r}")
    platform, backend = raw.get("platform"), raw.get("backend")
    if platform not in (None, "onnxruntime_onnx") or backend not in (None, "onnxruntime", *CUSTOM_BACKENDS):
        raise ValueError(f"platform/backend: expected 'onnxruntime_onnx'/'onnxruntime' or a backend in "
                         f"{sorted(CUSTOM_BACKENDS)}, received {platform or backend!r}")
    backend = backend or "onnxruntime"
    if raw.get("max_batch_size", 0) < 0:
        raise ValueError(f"max_batch_size: expected an integer >= 0 (0: no batch dim), received {raw['max_batch_size']}")
    default_file = CUSTOM_BACKENDS[backend].filename if backend in CUSTOM_BACKENDS else "model.onnx"
    config = PbtxtConfig(name=name, max_batch_size=raw.get("max_batch_size", 0),
                         inputs=[_tensor(m, f"input[{i}]") for i, m in enumerate(raw.get("input", []))],
                         outputs=[_tensor(m, f"output[{i}]") for i, m in enumerate(raw.get("output", []))],
                         model_filename=raw.get("default_model_filename") or default_file, backend=backend)
    if "dynamic_batching" in raw:
        block = raw["dynamic_batching"]
        config.batching = BatchingConfig(block.get("max_queue_delay_microseconds", 0),
                                         block.get("default_queue_policy", {}).get("max_queue_size", 0))
    _instance_groups(raw.get("instance_group", []), config)
    for i, p in enumerate(raw.get("parameters", [])):
        if "key" not in p:
            raise ValueError(f"parameters[{i}].key: expected a string, received nothing")
        config.parameters[p["key"]] = p.get("value", {}).get("string_value", "")
    _check_threads(config)
    level = raw.get("optimization", {}).get("graph", {}).get("level")
    config.graph_level = level
    if "version_policy" in raw:
        config.version_policy = _version_policy(raw["version_policy"])
    new = [p for p in unsupported_fields(raw, backend) if (name, p) not in _WARNED]
    if new:
        _WARNED.update((name, p) for p in new)
        logger.warning("model '%s': config.pbtxt sets %s, valid in Triton but not implemented by veil: ignored",
                       name, ", ".join(new))
    return config


def machine_threads() -> int:
    """The most threads (or instances) one model may ask for: 4 per CPU this process may use, at least 4.

    ``intra_op_thread_count "100000"`` or ``instance_group { count: 100000 }`` was accepted: the server never
    became ready and grew ~60 MB/s (issue 31 item 10)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(4, 4 * cpus)


def _check_threads(config: PbtxtConfig) -> None:
    """``instance_group.count`` and the ``intra_op_thread_count`` / ``inter_op_thread_count`` parameters within
    :func:`machine_threads` (the thread counts also 0: ONNX Runtime's default)."""
    limit = machine_threads()
    if config.instance_count > limit:
        raise ValueError(f"instance_group.count: expected at most {limit} instances in all (4 per CPU of this "
                         f"machine), received {config.instance_count}")
    for key in ("intra_op_thread_count", "inter_op_thread_count"):
        value = config.parameters.get(key)
        if value is None:
            continue
        text = value.strip()
        if not (text.isascii() and text.isdigit()) or int(text) > limit:
            raise ValueError(f"parameters {key}: expected an integer in [0, {limit}] (0: ONNX Runtime's default; "
                             f"at most 4 per CPU of this machine), received {value[:40]!r}")


def _instance_groups(groups: list[dict[str, Any]], config: PbtxtConfig) -> None:
    """``count`` summed over the groups (0 means 1, as in Triton); every group must have the same ``kind``."""
    if not groups:
        return
    kinds = sorted({g.get("kind", "KIND_AUTO") for g in groups})
    if len(kinds) > 1:
        raise ValueError(f"instance_group.kind: expected one kind for every group (veil runs all instances of a "
                         f"model on one execution provider), received {kinds}")
    if kinds[0] not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU"):
        raise ValueError(f"instance_group.kind: expected KIND_AUTO, KIND_CPU or KIND_GPU, received {kinds[0]!r}")
    counts = [g.get("count", 0) or 1 for g in groups]
    if min(counts) < 1:
        raise ValueError(f"instance_group.count: expected integers >= 1, received {[g.get('count') for g in groups]}")
    config.instance_count, config.instance_kind = sum(counts), kinds[0]


def _version_policy(policy: dict[str, Any]) -> dict[str, Any]:
    """A version policy with exactly one of latest/all/specific; ``latest.num_versions`` defaults to 1, never 0."""
    if len(policy) != 1:
        raise ValueError(f"version_policy: expected one of latest/all/specific, received {policy!r}")
    kind, body = next(iter(policy.items()))
    if kind == "latest" and body.get("num_versions", 1) < 1:
        raise ValueError(f"version_policy.latest.num_versions: expected an integer >= 1, "
                         f"received {body['num_versions']}")
    if kind == "specific" and not body.get("versions"):
        raise ValueError("version_policy.specific.versions: expected at least one version, received []")
    return policy


def select_versions(available: list[int], policy: dict[str, Any]) -> list[int]:
    """Versions to load under a Triton version policy (``latest {num_versions}``, ``all {}``, ``specific``)."""
    kind, body = next(iter(policy.items()))
    if kind == "all":
        return sorted(available)
    if kind == "specific":
        versions = body.get("versions", [])
        wanted = set(versions if isinstance(versions, list) else [versions])
        return sorted(v for v in available if v in wanted)
    count = body.get("num_versions", 1)
    if count < 1:  # sorted(...)[-0:] would be every version
        raise ValueError(f"version_policy.latest.num_versions: expected an integer >= 1, received {count}")
    return sorted(available)[-count:]


@dataclass
class ModelSource:
    """A model folder on disk: its config, its version folders and the optional veil.json manifest."""

    folder: Path
    config: PbtxtConfig
    versions: dict[int, Path]
    manifest: dict[str, Any] | None


def read_model(folder: Path) -> ModelSource:
    """Read one model folder (config, manifest, version paths) without creating any session.

    Raises:
        ModelLoadFailed: naming the file and the problem.
    """
    check_model_name(folder.name)
    config_path, manifest_path = folder / "config.pbtxt", folder / "veil.json"
    try:
        config = parse_config(config_path.read_text(), folder.name) if config_path.exists() else PbtxtConfig(folder.name)
    except (ValueError, UnicodeDecodeError) as exc:  # PbtxtError is a ValueError
        raise ModelLoadFailed(f"model '{folder.name}': {config_path}: {exc}") from None
    try:
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    except ValueError as exc:
        raise ModelLoadFailed(f"model '{folder.name}': veil.json: {exc}") from None
    available = {int(p.name): p / config.model_filename for p in folder.iterdir()
                 if p.is_dir() and _is_version(p.name) and (p / config.model_filename).is_file()}
    chosen = select_versions(list(available), config.version_policy)
    if not chosen:
        raise ModelLoadFailed(f"model '{folder.name}': no version folder with {config.model_filename} matches "
                              f"version_policy {config.version_policy} (found {sorted(available)})")
    return ModelSource(folder, config, {v: available[v] for v in chosen}, manifest)


def index(repo: Path) -> list[str]:
    """Names of the model folders in a repository (folders that hold a config.pbtxt or a version folder and
    whose name is a valid model name: hidden and temporary folders are not models)."""
    return sorted(p.name for p in repo.iterdir() if p.is_dir() and _valid_name(p.name)
                  and ((p / "config.pbtxt").exists() or any(c.is_dir() and _is_version(c.name) for c in p.iterdir())))


def _is_version(name: str) -> bool:
    """A version folder name: ASCII digits only (``"²".isdigit()`` is True but ``int("²")`` fails)."""
    return name.isascii() and name.isdigit()


def _valid_name(name: str) -> bool:
    try:
        check_model_name(name)
    except InvalidModelName:
        return False
    return True
