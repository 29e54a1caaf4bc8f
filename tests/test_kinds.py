"""The one table of model kinds (veil.kinds, issue 32 item 3): every kind's export verb exists, its backend's engine
class loads, its config.pbtxt writer's output is what the engine reads; the strings already on disk never change."""

from __future__ import annotations

import importlib
import logging

import pytest
from veil.engine.repository import CUSTOM_BACKENDS, parse_config

from veil.cli import GROUPS
from veil.kinds import (
    BACKENDS,
    CHECKPOINT_VERBS,
    KINDS,
    Backend,
    Kind,
    Tensor,
    codec_config,
    config_pbtxt,
    he_config,
    sampler_config,
)

# what exported veil.json files and config.pbtxt files say today: an artifact written before keeps loading
ON_DISK_KINDS = {"uldnet-classifier", "sentence-embedding", "causal-lm-logits", "finetuned-merged", "finetuned-unmerged",
                 "lora-merged", "lora-adapters", "forecast", "he-plan", "codec", "priorguide-sampler"}
ON_DISK_BACKENDS = {"onnxruntime", "veil_he", "veil_codec", "veil_sampler"}
EXPORT_VERBS = {f"veil export {verb}" for verb in GROUPS["export"][1]}

# one sample config per backend, written by the backend's writer
SAMPLES = {
    Backend.ONNXRUNTIME: lambda name: config_pbtxt(name, Backend.ONNXRUNTIME, [Tensor("x", "TYPE_FP32", [4])],
                                                   [Tensor("y", "TYPE_FP32", [3])], max_batch_size=8,
                                                   latest_versions=1, batching="max_queue_delay_microseconds: 500"),
    Backend.HE: he_config,
    Backend.CODEC: codec_config,
    Backend.SAMPLER: lambda name: sampler_config(name, 2, 3, 1),
}


def test_the_strings_on_disk_are_the_tables_values() -> None:
    assert {k.value for k in Kind} == ON_DISK_KINDS and set(KINDS) == set(Kind)
    assert {b.value for b in Backend} == ON_DISK_BACKENDS and set(BACKENDS) == set(Backend)
    assert Kind("he-plan") is Kind.HE_PLAN and Backend("veil_he") is Backend.HE


def test_every_kind_names_an_export_verb_that_exists() -> None:
    verbs = {spec.verb for spec in KINDS.values()} | set(CHECKPOINT_VERBS.values())
    commands = {v for v in verbs if v.startswith("veil ")}
    assert commands <= EXPORT_VERBS, commands - EXPORT_VERBS
    for verb in verbs - commands:  # a Python entry point: module.function
        module, _, function = verb.rpartition(".")
        assert callable(getattr(importlib.import_module(module), function))


@pytest.mark.parametrize("backend", list(Backend))
def test_each_backends_engine_class_loads(backend: Backend) -> None:
    module, cls = BACKENDS[backend].model.split(":")
    assert isinstance(getattr(importlib.import_module(module), cls), type)
    if backend is not Backend.ONNXRUNTIME:
        assert CUSTOM_BACKENDS[backend.value].filename == BACKENDS[backend].filename


@pytest.mark.parametrize("kind", list(Kind))
def test_each_kinds_config_writer_gives_what_the_engine_reads(kind: Kind, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="veil.engine")
    backend = KINDS[kind].backend
    assert KINDS[kind].config is BACKENDS[backend].config
    name = f"m-{kind.value}"
    config = parse_config(SAMPLES[backend](name), name)
    assert config.backend == backend.value and config.model_filename == BACKENDS[backend].filename
    assert not caplog.records  # only fields the engine honours


def test_the_writer_keeps_the_shapes_the_templates_had() -> None:
    """The texts the per-exporter templates wrote (issue 32: six writers, now one), field for field."""
    he = parse_config(he_config("h", "segments.json"), "h")
    assert he.model_filename == "segments.json" and he.max_batch_size == 0
    assert [(t.name, t.datatype, t.dims) for t in he.inputs + he.outputs] == [("ciphertext", "BYTES", [1])] * 2
    codec = parse_config(codec_config("c"), "c")
    assert [t.name for t in codec.inputs] == ["image", "bitstream"] and [t.name for t in codec.outputs] == [
        "bitstream", "image"]
    joint, plain = parse_config(sampler_config("s", 2, 3, 1), "s"), parse_config(sampler_config("s", 2, 3), "s")
    assert [(t.name, t.dims) for t in joint.outputs] == [("samples", [-1, 2]), ("diagnostics", [1]), ("predictive", [-1, 1])]
    assert [t.name for t in plain.outputs] == ["samples", "diagnostics"] and joint.inputs[0].dims == [3]
    onnx = parse_config(SAMPLES[Backend.ONNXRUNTIME]("o"), "o")
    assert onnx.batching is not None and onnx.batching.max_queue_delay_us == 500 and onnx.instance_count == 1
