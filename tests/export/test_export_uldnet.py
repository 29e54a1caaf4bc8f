"""ULD-Net export: veil-domain ONNX functions, ORT parity per family, loud validation, repository layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from veil.export import ExportError, ExportValidationError, export_graph, export_uldnet, validate_export
from veil.export.validate import cpu_session
from veil.training.uldnet import (
    ModelConfig,
    PolyActConfig,
    PolyNormConfig,
    TrainConfig,
    build_model,
    load_digits_preset,
    save_uldnet,
    train_uldnet,
)
from veil.training.uldnet.polynorm import set_warmup

DYNAMIC = {"x": {0: "batch"}}


def calibrated(config: ModelConfig) -> torch.nn.Module:
    """A model whose PolyNorm running variances come from one training-mode batch."""
    torch.manual_seed(0)
    model = build_model(config)
    model.train()
    with torch.no_grad():
        model(torch.randn(32, *config.input_shape))
    return model.eval()


def export(model: torch.nn.Module, shape: list[int]) -> onnx.ModelProto:
    return export_graph(model, (torch.randn(4, *shape),), ["x"], ["logits"], DYNAMIC).model


CONFIGS = {
    "mlp": ModelConfig(arch="mlp", input_shape=[1, 8, 8], width=16, depth=2),
    "cnn": ModelConfig(arch="cnn", width=8, depth=1),
    "vit": ModelConfig(arch="vit", width=16, heads=2, depth=1),
    "vit-sample-stats": ModelConfig(arch="vit", width=16, heads=2, depth=1, norm=PolyNormConfig(token_stats="sample")),
    "cnn-deg3-shared-noaffine": ModelConfig(arch="cnn", width=8, depth=0, norm=PolyNormConfig(affine=False),
                                            act=PolyActConfig(degree=3, per_channel=False)),
    "mlp-deg1": ModelConfig(arch="mlp", input_shape=[1, 8, 8], width=8, act=PolyActConfig(degree=1)),
}


@pytest.mark.parametrize("key", list(CONFIGS))
def test_onnx_runtime_matches_pytorch_for_every_family(key: str) -> None:
    config = CONFIGS[key]
    model = calibrated(config)
    proto = export(model, config.input_shape)
    session = cpu_session(proto)
    for batch in (1, 5, 33):
        x = torch.randn(batch, *config.input_shape)
        with torch.no_grad():
            expected = model(x).numpy()
        np.testing.assert_allclose(session.run(["logits"], {"x": x.numpy()})[0], expected, rtol=1e-4, atol=2e-5)


def test_veil_layers_are_functions_of_standard_ops() -> None:
    proto = export(calibrated(CONFIGS["vit"]), [1, 8, 8])
    veil_nodes = [n for n in proto.graph.node if n.domain == "veil"]
    assert {n.op_type for n in veil_nodes} == {"PolyNorm", "PolyAct", "LinearAttention"}
    assert {f.name for f in proto.functions if f.domain == "veil"} == {"PolyNorm", "PolyAct", "LinearAttention"}
    for function in proto.functions:
        assert all(node.domain == "" for node in function.node), function.name
    assert any(o.domain == "veil" and o.version == 1 for o in proto.opset_import)
    norm = next(n for n in veil_nodes if n.op_type == "PolyNorm")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in norm.attribute}
    assert attrs["axes"] == [-1] and attrs["b"] == pytest.approx(8.0) and attrs["mu"] == pytest.approx(2.0)
    assert attrs["running_var"] > 0


def test_batch_dimension_stays_symbolic() -> None:
    proto = export(calibrated(CONFIGS["cnn"]), [1, 8, 8])
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and [d.dim_value for d in dims[1:]] == [1, 8, 8]


def test_example_of_size_one_on_a_dynamic_axis_is_refused() -> None:
    with pytest.raises(ExportError, match=r"dynamic axis 0 \(batch\) needs size >= 2 .* received 1"):
        export_graph(calibrated(CONFIGS["mlp"]), (torch.randn(1, 1, 8, 8),), ["x"], ["logits"], DYNAMIC)


def test_polynorm_in_warmup_is_refused_by_name() -> None:
    model = calibrated(CONFIGS["mlp"])
    set_warmup(model, True)
    with pytest.raises(ExportError, match=r"net\.2: PolyNorm is still in its LayerNorm warm-up"):
        export(model, [1, 8, 8])


def test_validation_fails_loudly_and_names_the_first_diverging_node() -> None:
    model = calibrated(CONFIGS["cnn"])
    proto = export(model, [1, 8, 8])
    second_norm = [n for n in proto.graph.node if n.op_type == "PolyNorm"][1]
    for attr in second_norm.attribute:
        if attr.name == "running_var":
            attr.f *= 3.0  # a wrong constant in the graph
    make = lambda batch: {"x": torch.randn(batch, 1, 8, 8)}  # noqa: E731
    with pytest.raises(ExportValidationError, match=r"output 'logits' .* first diverging node: .*PolyNorm #1"):
        validate_export(model, proto, make, [{"batch": 2}, {"batch": 3}], DYNAMIC, ["logits"])
    with pytest.raises(ExportValidationError, match=">= 2 input shapes"):
        validate_export(model, export(model, [1, 8, 8]), make, [{"batch": 2}], DYNAMIC, ["logits"])


@pytest.fixture(scope="module")
def digits_checkpoint(tmp_path_factory):
    data = load_digits_preset()
    result = train_uldnet(ModelConfig(arch="cnn", width=16, input_shape=data.input_shape),
                          TrainConfig(epochs=6, warmup_epochs=1, lr=3e-3), data, progress=False)
    path = tmp_path_factory.mktemp("ck") / "polycnn"
    save_uldnet(result, path, data)
    return path, result.metrics["test_accuracy"]


def test_checkpoint_export_writes_a_triton_repository(digits_checkpoint, tmp_path) -> None:
    checkpoint, _ = digits_checkpoint
    manifest = export_uldnet(checkpoint, tmp_path, name="digits")
    model_dir = tmp_path / "digits"
    assert sorted(p.name for p in model_dir.iterdir()) == ["1", "config.pbtxt", "veil.json"]
    assert (model_dir / "1" / "model.onnx").is_file()
    config = (model_dir / "config.pbtxt").read_text()
    for line in ('name: "digits"', 'backend: "onnxruntime"', "max_batch_size: 64", "data_type: TYPE_FP32",
                 "dims: [ 1, 8, 8 ]", "dims: [ 10 ]", "dynamic_batching"):
        assert line in config
    saved = json.loads((model_dir / "veil.json").read_text())
    assert saved["kind"] == "uldnet-classifier" and saved["validation"]["passed"]
    # validated on the data it was trained for: a trained PolyCNN/PolyViT overflows to NaN on N(0, 1) inputs
    assert saved["validation"]["samples"] == "rows of the digits preset's validation split"
    assert len(saved["validation"]["cases"]) >= 2 and saved["export"]["exporter"] == "torch.onnx.export(dynamo=True)"
    assert {"torch", "onnx", "onnxscript", "onnxruntime"} <= set(saved["export"]["versions"])
    assert saved["source"]["sha256"] == manifest["source"]["sha256"] and saved["depth"]["max_op_levels"] <= 3
    assert saved["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    export_uldnet(checkpoint, tmp_path, name="digits")  # re-export replaces version 1 whole
    assert sorted(p.name for p in model_dir.iterdir()) == ["1", "config.pbtxt", "veil.json"]


def test_int8_static_quantization_reports_its_accuracy(digits_checkpoint, tmp_path) -> None:
    checkpoint, _ = digits_checkpoint
    manifest = export_uldnet(checkpoint, tmp_path, name="digits-int8", quantize="int8")
    quant = manifest["quantization"]
    assert manifest["precision"] == "int8" and quant["calibration_samples"] == 360
    assert abs(quant["accuracy_delta"]) <= 0.02 and quant["int8_accuracy"] > 0.8
    graph = onnx.load(str(tmp_path / "digits-int8" / "1" / "model.onnx"))
    assert any(n.op_type == "QuantizeLinear" for n in graph.graph.node)


def test_bad_names_and_versions_are_refused(digits_checkpoint, tmp_path) -> None:
    checkpoint, _ = digits_checkpoint
    with pytest.raises(ExportError, match=r"--name: expected letters"):
        export_uldnet(checkpoint, tmp_path, name="../evil")
    with pytest.raises(ExportError, match=r"--version: expected an integer >= 1"):
        export_uldnet(checkpoint, tmp_path, name="ok", version=0)


def test_cli_exports_a_checkpoint(digits_checkpoint, tmp_path, capsys) -> None:
    from veil.cli import main

    checkpoint, _ = digits_checkpoint
    assert main(["export", "onnx", str(checkpoint), "--repo", str(tmp_path), "--name", "d"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["name"] == "d" and out["veil_functions"] == ["PolyAct", "PolyNorm"]
    assert main(["export", "onnx", str(tmp_path / "missing"), "--repo", str(tmp_path)]) == 2
    assert "missing': not found" in capsys.readouterr().err  # issue 24: not a transformers error


def test_validation_inputs_are_rows_of_the_validation_split() -> None:
    from veil.export.uldnet import _validation_inputs

    x_val = load_digits_preset().x_val.reshape(360, -1)
    make, _ = _validation_inputs({"data": {"source": "preset:digits"}}, [1, 8, 8])
    batch = make(batch=5)["x"].numpy().reshape(5, -1)
    assert all(np.any(np.all(x_val == row, axis=1)) for row in batch)
    make_normal, samples = _validation_inputs({"data": {"source": "npz:/data/mine.npz"}}, [1, 8, 8])
    assert samples == "standard normal" and make_normal(batch=2)["x"].shape == (2, 1, 8, 8)


def test_export_records_no_local_source_paths() -> None:
    """The exporter's stack traces name files on this machine: an export must be the same bytes from any checkout
    (the codec's model id hashes them) and publish no local paths, so they are dropped, other node metadata kept."""
    import veil

    proto = export(calibrated(CONFIGS["cnn"]), [1, 8, 8])
    keys = {p.key for n in proto.graph.node for p in n.metadata_props}
    assert "pkg.torch.onnx.stack_trace" not in keys and "namespace" in keys
    text = proto.SerializeToString()
    for path in {str(Path(veil.__file__).resolve().parent.parent), str(Path(torch.__file__).resolve().parent)}:
        assert path.encode() not in text


def test_export_carries_the_input_contract_to_clients(digits_checkpoint, tmp_path) -> None:
    """Issue 30 §5: a client reads the input's dtype, shape, scale and normalisation from veil.json (the OIP model
    metadata's parameters.veil) and from the ONNX file, so raw 0-16 pixels are not sent to a model expecting 0-1."""
    checkpoint, _ = digits_checkpoint
    manifest = export_uldnet(checkpoint, tmp_path, name="digits")
    contract = json.loads((tmp_path / "digits" / "veil.json").read_text())["input"]
    assert contract == manifest["input"]
    assert contract["name"] == "x" and contract["dtype"] == "float32" and contract["shape"] == [1, 8, 8]
    assert "pixel / 16" in contract["scale"] and contract["normalization"] == "none"
    props = {p.key: p.value for p in onnx.load(str(tmp_path / "digits" / "1" / "model.onnx")).metadata_props}
    assert json.loads(props["veil.input"]) == contract
