"""config.pbtxt parsing (Triton-style examples), version policies, and repository loading errors."""

from __future__ import annotations

import math

import pytest
from veil.engine.errors import ModelLoadFailed
from veil.engine.pbtxt import PbtxtError, parse
from veil.engine.repository import parse_config, read_model, select_versions
from veil.engine.toy import affine_model, write_repository

TRITON_EXAMPLE = """
# the digits model, as veil export writes it
name: "digits"
backend: "onnxruntime"
max_batch_size: 64
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1, 8, 8 ] } ]
output [
  {
    name: "logits"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }
]
dynamic_batching { max_queue_delay_microseconds: 500 default_queue_policy { max_queue_size: 256 } }
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
version_policy: { latest { num_versions: 1 } }
"""


def test_parse_triton_example() -> None:
    raw = parse(TRITON_EXAMPLE)
    assert raw["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [1, 8, 8]}]
    assert raw["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 256
    config = parse_config(TRITON_EXAMPLE, "digits")
    assert config.max_batch_size == 64 and config.inputs[0].datatype == "FP32" and config.outputs[0].dims == [10]
    assert config.batching is not None and config.batching.max_queue_delay_us == 500
    assert config.instance_kind == "KIND_CPU" and config.parameters == {"intra_op_thread_count": "2"}


def test_parse_syntax_variants() -> None:
    text = """
    input { name: 'a' data_type: TYPE_INT64 dims: -1 }   input: { name: "b" dims: [2] data_type: TYPE_STRING }
    optimization < graph { level: -1 } >;  f: 1.5e3, g: 0x10 h: -inf i: true j: "x\\"y" "z" k: [] l: 2.5f
    parameters [ { key: "k1" value { string_value: "1" } }, { key: "k2" value: { string_value: "2" } } ]
    """
    raw = parse(text)
    assert raw["input"][0] == {"name": "a", "data_type": "TYPE_INT64", "dims": -1} and raw["input"][1]["name"] == "b"
    assert raw["optimization"] == {"graph": {"level": -1}}
    assert (raw["f"], raw["g"], math.isinf(raw["h"]), raw["i"], raw["j"], raw["k"], raw["l"]) == \
        (1500.0, 16, True, True, 'x"yz', [], 2.5)
    assert [p["key"] for p in raw["parameters"]] == ["k1", "k2"]
    config = parse_config("name: 'm'\n" + text.replace("f: 1.5e3, g: 0x10 h: -inf i: true j: \"x\\\"y\" \"z\" k: [] l: 2.5f", ""), "m")
    assert [t.datatype for t in config.inputs] == ["INT64", "BYTES"] and config.graph_level == -1


@pytest.mark.parametrize("text, where", [("a: {", "missing"), ("a: 1 }", "line 1"), ("a 1", "expected ':'"),
                                         ("a: [1, 2", "expected ]"), ('a: "x\nb: 2', "unexpected"), ("a: @", "column 4")])
def test_parse_errors_name_the_place(text: str, where: str) -> None:
    with pytest.raises(PbtxtError, match=where):
        parse(text)


@pytest.mark.parametrize("text, field", [('name: "other"', "name"), ('platform: "tensorrt_plan"', "platform"),
                                         ("input { name: 'x' data_type: TYPE_FLOAT dims: [1] }", "data_type"),
                                         ("instance_group { kind: KIND_TPU }", "kind"),
                                         ("max_batch_size: 1.5", "max_batch_size"),
                                         ("version_policy { newest { } }", "version_policy")])
def test_config_errors_name_the_field(text: str, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_config(text, "m")


def test_version_policies() -> None:
    assert select_versions([1, 3, 2], {"latest": {"num_versions": 1}}) == [3]
    assert select_versions([1, 3, 2], {"latest": {"num_versions": 2}}) == [2, 3]
    assert select_versions([1, 3, 2], {"all": {}}) == [1, 2, 3]
    assert select_versions([1, 3, 2], {"specific": {"versions": [1, 3]}}) == [1, 3]
    assert select_versions([1, 3, 2], {"specific": {"versions": 2}}) == [2]


def test_read_model_and_errors(tmp_path) -> None:
    write_repository(tmp_path, {"m": affine_model()}, max_batch_size=4, versions=(1, 2, 3))
    assert list(read_model(tmp_path / "m").versions) == [3]
    config = tmp_path / "m" / "config.pbtxt"
    config.write_text(config.read_text() + "version_policy: { specific { versions: [7] } }")
    with pytest.raises(ModelLoadFailed, match="no version folder"):
        read_model(tmp_path / "m")
    config.write_text("max_batch_size: {")
    with pytest.raises(ModelLoadFailed, match=r"config\.pbtxt"):
        read_model(tmp_path / "m")
    config.unlink()  # plain Triton auto-complete: no config at all
    assert read_model(tmp_path / "m").config.max_batch_size == 0
    (tmp_path / "m" / "veil.json").write_text("{")
    with pytest.raises(ModelLoadFailed, match=r"veil\.json"):
        read_model(tmp_path / "m")


def test_server_start_sweeps_what_killed_exporters_left(tmp_path) -> None:
    # issue 19 item 14: temporaries of killed writers were never cleaned up; now also swept at load
    import subprocess
    import sys

    from veil.engine.dataplane import DataPlane
    from veil.engine.metrics import Metrics
    from veil.engine.runtime import RuntimeOptions

    from veil.atomic import HOST

    write_repository(tmp_path, {"affine": affine_model()})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale_model = tmp_path / f".affine.tmp-{HOST}-{dead}-0123abcd"
    stale_file = tmp_path / "affine" / f".veil.json.tmp-{HOST}-{dead}-89abcdef"
    stale_model.mkdir()
    (stale_model / "config.pbtxt").write_text("half")
    stale_file.write_text("half")
    plane = DataPlane(tmp_path, RuntimeOptions(intra_op_threads=1), Metrics())
    plane.load_all()
    assert not stale_model.exists() and not stale_file.exists()
    assert "affine" in plane.models
