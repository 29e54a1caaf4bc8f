"""Model kinds: the one table of what ``veil export`` writes and how the engine serves it, and the one ``config.pbtxt``
writer every exporter uses.

    kind (veil.json)     written by                      backend (config.pbtxt)  version folder holds
    uldnet-classifier    veil export onnx                onnxruntime             model.onnx
    sentence-embedding   veil export onnx                onnxruntime             model.onnx (+ tokenizer)
    causal-lm-logits     veil.export.compressed          onnxruntime             model.onnx
    finetuned-merged     veil export finetuned           onnxruntime             model.onnx
    finetuned-unmerged   veil export finetuned           onnxruntime             model.onnx
    lora-merged          veil export adapters            onnxruntime             model.onnx
    lora-adapters        veil export adapters            onnxruntime             model.onnx (+ adapters/)
    forecast             veil export forecast            onnxruntime             model.onnx
    he-plan              veil export he / forecast --he  veil_he                 plan.json (or segments.json)
    codec                veil export codec               veil_codec              codec.json + three graphs
    priorguide-sampler   veil export sampler             veil_sampler            sampler.json + program

The kind strings are on disk (every exported ``veil.json``), so they are never renamed; the backend names are what
``config.pbtxt`` says (Triton's ``onnxruntime``, veil's own ``veil_*``). Shared by export (which writes) and the
engine (which reads, :mod:`veil.engine.repository`): stdlib only.

Example:
    >>> KINDS[Kind.HE_PLAN].backend.value, BACKENDS[Backend.HE].filename
    ('veil_he', 'plan.json')
    >>> print(he_config("digits-he").splitlines()[1])
    backend: "veil_he"
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


class Backend(str, enum.Enum):
    """``config.pbtxt`` ``backend:``: who runs a model (Triton can run ``onnxruntime`` ones too)."""

    ONNXRUNTIME = "onnxruntime"
    HE = "veil_he"  # encrypted inference (CKKS plan)
    CODEC = "veil_codec"  # ARPC image codec
    SAMPLER = "veil_sampler"  # PriorGuide posterior sampler


class Kind(str, enum.Enum):
    """``veil.json`` ``kind``: what an export wrote (the values are on disk: never rename one)."""

    ULDNET_CLASSIFIER = "uldnet-classifier"
    SENTENCE_EMBEDDING = "sentence-embedding"
    CAUSAL_LM_LOGITS = "causal-lm-logits"
    FINETUNED_MERGED = "finetuned-merged"
    FINETUNED_UNMERGED = "finetuned-unmerged"
    LORA_MERGED = "lora-merged"
    LORA_ADAPTERS = "lora-adapters"
    FORECAST = "forecast"
    HE_PLAN = "he-plan"
    CODEC = "codec"
    PRIORGUIDE_SAMPLER = "priorguide-sampler"


@dataclass(frozen=True)
class Tensor:
    """One ``input`` / ``output`` entry: name, Triton data type (``TYPE_FP32``...), dims (no batch dim when batched)."""

    name: str
    data_type: str
    dims: Sequence[int]
    optional: bool = False  # an input a request may leave out (veil_sampler's prior)

    def block(self) -> str:
        dims = ", ".join(str(int(d)) for d in self.dims)
        return (f'{{ name: "{self.name}" data_type: {self.data_type} dims: [ {dims} ]'
                + (" optional: true" if self.optional else "") + " }")


def _tensors(field: str, tensors: Sequence[Tensor]) -> str:
    return f"{field} [\n" + ",\n".join("  " + t.block() for t in tensors) + "\n]"


def batching_body(max_queue_delay_us: int, max_queue_size: int = 1024) -> str:
    """The body of a ``dynamic_batching { }`` block as veil's exporters write it."""
    return f"max_queue_delay_microseconds: {max_queue_delay_us} default_queue_policy {{ max_queue_size: {max_queue_size} }}"


def config_pbtxt(name: str, backend: Backend, inputs: Sequence[Tensor], outputs: Sequence[Tensor], *,
                 max_batch_size: int = 0, filename: str | None = None, latest_versions: int | None = None,
                 batching: str | None = None, parameters: Mapping[str, str] | None = None) -> str:
    """The one ``config.pbtxt`` writer (Triton's text protobuf, the fields :mod:`veil.engine.repository` honours).

    Args:
        backend: who serves it; veil's own backends also get ``default_model_filename`` (``filename`` or the
            backend's own, :data:`BACKENDS`).
        max_batch_size: > 0 batches on dim 0 (``inputs``/``outputs`` dims then leave the batch dim out).
        latest_versions: ``version_policy: { latest { num_versions: N } }`` (None: Triton's default, the latest).
        batching: the body of ``dynamic_batching { }`` (:func:`batching_body`); None: no dynamic batching.
        parameters: ``parameters { key value }`` entries (``intra_op_thread_count``, ``adapter_cache_size``...).
    """
    backend = Backend(backend)
    lines = [f'name: "{name}"', f'backend: "{backend.value}"']
    if filename or backend is not Backend.ONNXRUNTIME:
        lines.append(f'default_model_filename: "{filename or BACKENDS[backend].filename}"')
    lines += [f"max_batch_size: {max_batch_size}", _tensors("input", inputs), _tensors("output", outputs),
              "instance_group [ { count: 1 kind: KIND_CPU } ]"]
    if latest_versions is not None:
        lines.append(f"version_policy: {{ latest {{ num_versions: {latest_versions} }} }}")
    if batching is not None:
        lines.append(f"dynamic_batching {{ {batching} }}")
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in (parameters or {}).items()]
    return "\n".join(lines) + "\n"


def he_config(name: str, filename: str = "plan.json") -> str:
    """A ``veil_he`` model: one BYTES ciphertext envelope in, one out (``segments.json`` for client-refresh rounds)."""
    cipher = [Tensor("ciphertext", "TYPE_STRING", [1])]
    return config_pbtxt(name, Backend.HE, cipher, cipher, filename=filename)


def codec_config(name: str) -> str:
    """A ``veil_codec`` model: a BYTES image or bitstream in, the other out."""
    image, stream = Tensor("image", "TYPE_STRING", [1]), Tensor("bitstream", "TYPE_STRING", [1])
    return config_pbtxt(name, Backend.CODEC, [image, stream], [stream, image])


def sampler_config(name: str, theta_dim: int, x_dim: int, predictive_dim: int = 0) -> str:
    """A ``veil_sampler`` model: FP32 x and an optional BYTES prior in; samples, diagnostics (and x* draws of a
    joint model, ``predictive_dim`` > 0) out."""
    outputs = [Tensor("samples", "TYPE_FP32", [-1, theta_dim]), Tensor("diagnostics", "TYPE_STRING", [1])]
    if predictive_dim > 0:
        outputs.append(Tensor("predictive", "TYPE_FP32", [-1, predictive_dim]))
    inputs = [Tensor("x", "TYPE_FP32", [x_dim]), Tensor("prior", "TYPE_STRING", [1], optional=True)]
    return config_pbtxt(name, Backend.SAMPLER, inputs, outputs)


@dataclass(frozen=True)
class BackendSpec:
    """What a backend's version folder holds, the engine class that serves it, and its config writer."""

    filename: str  # default_model_filename
    model: str  # "module:Class", imported only when a model of this backend loads
    config: Callable[..., str]


BACKENDS: dict[Backend, BackendSpec] = {
    Backend.ONNXRUNTIME: BackendSpec("model.onnx", "veil.engine.models:OnnxModel", config_pbtxt),
    Backend.HE: BackendSpec("plan.json", "veil.engine.he_model:HeModel", he_config),
    Backend.CODEC: BackendSpec("codec.json", "veil.engine.codec_model:CodecModel", codec_config),
    Backend.SAMPLER: BackendSpec("sampler.json", "veil.engine.sampler_model:SamplerModel", sampler_config),
}


@dataclass(frozen=True)
class KindSpec:
    """One model kind: the export command that writes it and the backend that serves it."""

    verb: str
    backend: Backend

    @property
    def config(self) -> Callable[..., str]:
        """This kind's ``config.pbtxt`` writer (its backend's)."""
        return BACKENDS[self.backend].config


KINDS: dict[Kind, KindSpec] = {
    Kind.ULDNET_CLASSIFIER: KindSpec("veil export onnx", Backend.ONNXRUNTIME),
    Kind.SENTENCE_EMBEDDING: KindSpec("veil export onnx", Backend.ONNXRUNTIME),
    Kind.CAUSAL_LM_LOGITS: KindSpec("veil.export.compressed.export_compressed", Backend.ONNXRUNTIME),
    Kind.FINETUNED_MERGED: KindSpec("veil export finetuned", Backend.ONNXRUNTIME),
    Kind.FINETUNED_UNMERGED: KindSpec("veil export finetuned", Backend.ONNXRUNTIME),
    Kind.LORA_MERGED: KindSpec("veil export adapters", Backend.ONNXRUNTIME),
    Kind.LORA_ADAPTERS: KindSpec("veil export adapters", Backend.ONNXRUNTIME),
    Kind.FORECAST: KindSpec("veil export forecast", Backend.ONNXRUNTIME),
    Kind.HE_PLAN: KindSpec("veil export he", Backend.HE),
    Kind.CODEC: KindSpec("veil export codec", Backend.CODEC),
    Kind.PRIORGUIDE_SAMPLER: KindSpec("veil export sampler", Backend.SAMPLER),
}

# checkpoint kind (a training folder's config.json "kind", or what export/cli.py reads off the folder) -> the
# export command that takes it; `veil export onnx` refuses the others naming theirs
CHECKPOINT_VERBS: dict[str, str] = {
    "uldnet": "veil export onnx", "huggingface-encoder": "veil export onnx", "codec": "veil export codec",
    "priorguide-sampler": "veil export sampler", "forecast": "veil export forecast",
    "finetune": "veil export finetuned",
}
