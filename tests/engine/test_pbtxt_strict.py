"""config.pbtxt against Triton's model-configuration schema (issue 19 item 10): unknown fields, types, repeats and
oneofs refused naming the field and the file; valid fields veil ignores logged once; veil's own writers clean."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
from veil.engine import pbtxt
from veil.engine.errors import ModelLoadFailed
from veil.engine.pbtxt import PbtxtError, PbtxtSchemaError, parse_model_config
from veil.engine.repository import parse_config, read_model, select_versions
from veil.engine.toy import affine_model, write_repository


def _triton_model_config_pb2():
    """tritonclient's model_config_pb2, loaded from its file (tritonclient.grpc's __init__ needs grpcio)."""
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or spec.origin is None:
        pytest.skip("tritonclient is not installed")
    path = Path(spec.origin).parent / "grpc" / "model_config_pb2.py"
    if not path.is_file():
        pytest.skip("this tritonclient ships no model_config_pb2")
    module_spec = importlib.util.spec_from_file_location("_triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # a protobuf runtime too old or too new for the generated file
        pytest.skip(f"model_config_pb2 does not load here: {exc}")
    return module


def test_schema_matches_tritons_model_config_proto() -> None:
    """The transcription in veil.engine.pbtxt is Triton's proto: every message, field, repetition and enum."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    pb2 = _triton_model_config_pb2()
    scalars = {FD.TYPE_STRING: "string", FD.TYPE_INT32: "int32", FD.TYPE_INT64: "int64", FD.TYPE_UINT32: "uint32",
               FD.TYPE_UINT64: "uint64", FD.TYPE_BOOL: "bool", FD.TYPE_FLOAT: "float", FD.TYPE_DOUBLE: "double"}
    messages, enums, oneofs, todo = {}, {}, {}, [pb2.ModelConfig.DESCRIPTOR]
    while todo:
        d = todo.pop()
        name = d.full_name.removeprefix("inference.")
        if name in messages:
            continue
        fields = {}
        for f in d.fields:
            if f.type == FD.TYPE_MESSAGE:
                todo.append(f.message_type)
                kind = f.message_type.full_name.removeprefix("inference.")
            elif f.type == FD.TYPE_ENUM:
                kind = f.enum_type.full_name.removeprefix("inference.")
                enums[kind] = tuple(v.name for v in f.enum_type.values)
            else:
                kind = scalars[f.type]
            repeated = f.label == FD.LABEL_REPEATED if hasattr(f, "label") else f.is_repeated
            fields[f.name] = ("*" if repeated else "") + kind
        messages[name] = fields
        groups = [tuple(f.name for f in o.fields) for o in d.oneofs if len(o.fields) > 1]
        if groups:
            oneofs[name] = groups
    assert messages == pbtxt.MESSAGES
    assert enums == pbtxt.ENUMS
    assert oneofs == pbtxt.ONEOFS


@pytest.mark.parametrize("text, where", [
    ("max_batch_sise: 8", "max_batch_sise: unknown field of ModelConfig (did you mean 'max_batch_size'?)"),
    ("input { name: 'x' data_type: TYPE_FP32 dim: [1] }", "input[0].dim: unknown field of ModelInput"),
    ("dynamic_batching { max_queue_delay_microsecond: 5 }", "dynamic_batching.max_queue_delay_microsecond"),
    ("max_batch_size: 1 max_batch_size: 2", "max_batch_size: expected one value"),
    ("max_batch_size: 'eight'", "max_batch_size: expected an integer"),
    ("max_batch_size: 4294967296", "int32"),
    ("dynamic_batching { max_queue_delay_microseconds: -1 }", "uint64"),
    ("dynamic_batching { } sequence_batching { }", "oneof"),
    ("version_policy { latest { } all { } }", "oneof"),
    ("instance_group { kind: KIND_TPU }", "instance_group[0].kind: expected one of"),
    ("input { name: 'x' data_type: TYPE_FLOAT }", "input[0].data_type"),
    ("response_cache { enable: 2 }", "expected true or false"),
    ("input: 3", "expected a message"),
])
def test_schema_errors_name_the_field(text: str, where: str) -> None:
    with pytest.raises(PbtxtSchemaError, match=None) as info:
        parse_model_config(text)
    assert where in str(info.value)


def test_unknown_field_stops_the_load_naming_field_and_file(tmp_path) -> None:
    write_repository(tmp_path, {"m": affine_model()}, max_batch_size=4)
    config = tmp_path / "m" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size", "max_batch_sise"))
    with pytest.raises(ModelLoadFailed) as info:
        read_model(tmp_path / "m")
    assert str(config) in str(info.value) and "max_batch_sise" in str(info.value)


@pytest.mark.parametrize("text, field", [
    ("max_batch_size: -1", "max_batch_size: expected an integer >= 0"),
    ("version_policy { latest { num_versions: 0 } }", "num_versions: expected an integer >= 1"),
    ("version_policy { specific { } }", "specific.versions"),
    ("instance_group [ { kind: KIND_CPU }, { kind: KIND_GPU } ]", "instance_group.kind: expected one kind"),
    ("instance_group [ { kind: KIND_GPU count: 1 }, { count: 2 } ]", "['KIND_AUTO', 'KIND_GPU']"),
    ("instance_group { count: -2 }", "instance_group.count"),
    ("instance_group { kind: KIND_MODEL }", "KIND_MODEL"),
    ("input { name: 'x' data_type: TYPE_FP32 dims: [1] reshape { shape: [1] } }", "reshape is not supported"),
])
def test_values_triton_refuses_or_veil_cannot_honour(text: str, field: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        parse_config(text, "m")
    assert field in str(info.value)


def test_num_versions_zero_never_loads_every_version() -> None:
    """``sorted(v)[-0:]`` was every version."""
    with pytest.raises(ValueError, match="num_versions"):
        select_versions([1, 2, 3], {"latest": {"num_versions": 0}})
    assert select_versions([1, 2, 3], {"latest": {}}) == [3]


def test_same_kind_instance_groups_add_up() -> None:
    config = parse_config("instance_group [ { kind: KIND_CPU count: 2 }, { kind: KIND_CPU } ]", "m")
    assert (config.instance_count, config.instance_kind) == (3, "KIND_CPU")


UNSUPPORTED = """
max_batch_size: 8
dynamic_batching { preferred_batch_size: [ 4, 8 ] priority_levels: 2
                   default_queue_policy { timeout_action: DELAY max_queue_size: 4 } }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] format: FORMAT_NONE } ]
model_warmup [ { name: "w" batch_size: 1 } ]
"""


def test_valid_but_unsupported_fields_are_warned_once(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="veil.engine")
    config = parse_config(UNSUPPORTED, "warned_once")
    assert config.batching is not None and config.batching.max_queue_size == 4
    parse_config(UNSUPPORTED, "warned_once")
    warnings = [r.getMessage() for r in caplog.records if "warned_once" in r.getMessage()]
    assert len(warnings) == 1
    for field in ("dynamic_batching.preferred_batch_size", "dynamic_batching.priority_levels",
                  "dynamic_batching.default_queue_policy.timeout_action", "model_warmup"):
        assert field in warnings[0]
    assert "format" not in warnings[0] and "max_queue_size" not in warnings[0]  # defaults and honoured fields
    caplog.clear()
    parse_config("sequence_batching { }", "seq_model")
    assert "sequence_batching" in caplog.records[0].getMessage()


def test_veils_own_configs_parse_without_warnings(caplog, tmp_path) -> None:
    """Every config.pbtxt veil writes (the one writer, veil.kinds, for each backend) fits the schema and uses only
    honoured fields."""
    from veil.export.repository import TensorSpec, config_pbtxt

    from veil.kinds import codec_config, he_config, sampler_config

    caplog.set_level(logging.WARNING, logger="veil.engine")
    texts = {"onnx_m": config_pbtxt("onnx_m", [TensorSpec("x", "float32", [-1, 4])],
                                    [TensorSpec("y", "float32", [-1, 3])], 8, 500, threads=2),
             "he_m": he_config("he_m"), "codec_m": codec_config("codec_m")}
    for name, text in texts.items():
        parse_config(text, name)
    assert parse_config(sampler_config("sampler_m", 2, 2), "sampler_m").inputs[1].name == "prior"
    assert not caplog.records


@pytest.mark.parametrize("text", ['a: "\\q"', "a {" * 5000, 'a: "\\U00110000"', "a: 1 }", "a 1", '"x"'])
def test_parser_refuses_with_its_own_error_only(text: str) -> None:
    """Bad escapes and deep nesting were SyntaxError / RecursionError; now every refusal is a PbtxtError."""
    with pytest.raises(PbtxtError):
        parse_model_config(text)


@pytest.mark.parametrize(("text", "needle"), [
    ('parameters { key: "intra_op_thread_count" value: { string_value: "100000" } }',
     "parameters intra_op_thread_count: expected an integer in [0, {limit}]"),
    ('parameters { key: "inter_op_thread_count" value: { string_value: "-1" } }',
     "parameters inter_op_thread_count: expected an integer in [0, {limit}]"),
    ('parameters { key: "intra_op_thread_count" value: { string_value: "x" } }', "received 'x'"),
    ("instance_group [ { count: 100000 kind: KIND_CPU } ]", "instance_group.count: expected at most {limit} instances"),
    ("instance_group [ { count: {half} }, { count: {half} } ]", "received {total}"),
])
def test_thread_and_instance_counts_are_bounded_by_the_machine(text: str, needle: str) -> None:
    """Issue 31 item 10: intra_op_thread_count "100000" or instance_group count 100000 was accepted and the server
    never became ready (growing ~60 MB/s); now parsing the config refuses it, before any session exists."""
    from veil.engine.repository import machine_threads

    limit = machine_threads()
    half = limit // 2 + 1
    text = text.replace("{half}", str(half))
    with pytest.raises(ValueError) as info:
        parse_config(text, "m")
    assert needle.format(limit=limit, total=2 * half) in str(info.value)
    assert parse_config(f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{limit}" }} }}',
                        "m").parameters["intra_op_thread_count"] == str(limit)


def test_a_model_asking_for_too_many_threads_fails_to_load_naming_the_field(tmp_path) -> None:
    from veil.engine.dataplane import DataPlane
    from veil.engine.metrics import Metrics
    from veil.engine.runtime import RuntimeOptions

    write_repository(tmp_path, {"m": affine_model()})
    config = tmp_path / "m" / "config.pbtxt"
    config.write_text(config.read_text() + 'parameters { key: "intra_op_thread_count" value: { string_value: "100000" } }\n')
    with pytest.raises(ModelLoadFailed, match=r"model 'm': .*parameters intra_op_thread_count: expected an integer"):
        DataPlane(tmp_path, RuntimeOptions(), Metrics()).load_all()
