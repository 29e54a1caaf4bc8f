"""Session factory (providers verified, threads, IO binding, warm-up), model loading rules and the CLI."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient
from veil.engine import cli
from veil.engine.errors import ModelLoadFailed
from veil.engine.runtime import CPU, CUDA, RuntimeOptions, Session, physical_cores
from veil.engine.server import create_app
from veil.engine.toy import affine_model, affine_weights, write_repository


def test_physical_cores_from_cpuinfo(tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    blocks = [f"processor\t: {i}\nphysical id\t: {i // 4}\ncore id\t\t: {(i // 2) % 2}\n" for i in range(8)]
    info.write_text("\n".join(blocks))  # 2 sockets x 2 cores x 2 SMT threads
    assert physical_cores(str(info)) == 4
    assert physical_cores(str(tmp_path / "missing")) >= 1


@pytest.fixture
def onnx_file(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(affine_model(), path)
    return path


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_cuda_fallback_is_reported_not_hidden(onnx_file, caplog) -> None:
    if CUDA in __import__("onnxruntime").get_available_providers():
        pytest.skip("this onnxruntime build has CUDA: no fallback to observe")
    with caplog.at_level(logging.WARNING, logger="veil.engine"):
        session = Session(onnx_file, RuntimeOptions(providers=[CUDA, CPU], intra_op_threads=1))
    assert session.fell_back and session.provider == CPU and session.requested[0] == CUDA
    assert "CUDAExecutionProvider was requested" in caplog.text


def test_io_binding_path_equals_plain_run(onnx_file) -> None:
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    plain = Session(onnx_file, RuntimeOptions(intra_op_threads=1))
    bound = Session(onnx_file, RuntimeOptions(intra_op_threads=1, io_binding=True))
    assert plain.run.__func__ is Session._run and bound.run.__func__ is Session._run_bound
    w, b = affine_weights()
    np.testing.assert_allclose(bound.run({"x": x})[0], plain.run({"x": x})[0])
    np.testing.assert_allclose(plain.run({"x": x})[0], x @ w + b, rtol=1e-5)


def test_warm_up_failure_is_a_warning(onnx_file, caplog) -> None:
    session = Session(onnx_file, RuntimeOptions(intra_op_threads=1))
    session.input_shapes["x"] = [-1, 5]  # a shape the graph refuses
    with caplog.at_level(logging.WARNING, logger="veil.engine"):
        session.warm_up([1])
    assert "warm-up at batch 1 failed" in caplog.text


def test_hand_written_config_autocompletes_and_thread_override(tmp_path, oip) -> None:
    write_repository(tmp_path, {"m": affine_model()}, max_batch_size=4)
    (tmp_path / "m" / "config.pbtxt").write_text(
        'max_batch_size: 4\nparameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
        "optimization { graph { level: 1 } }\n")
    app = create_app(oip.make_config(tmp_path))
    model = app.state.dataplane.get_model("m")
    assert model.runtime_options().intra_op_threads == 1 and model.runtime_options().graph_level == "extended"
    with TestClient(app) as client:
        meta = client.get("/v2/models/m").json()
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
        r = client.post("/v2/models/m/infer", json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                                                  "data": [1, 2, 3, 4]}]})
        assert r.status_code == 200


@pytest.mark.parametrize("config, message", [
    ('input [ { name: "nope" data_type: TYPE_FP32 dims: [4] } ]', "not in the graph"),
    ('max_batch_size: 0\ndynamic_batching { }', "dynamic_batching needs max_batch_size"),
    ('optimization { graph { level: 7 } }', "optimization.graph.level"),
])
def test_bad_model_stops_startup_with_a_named_error(tmp_path, oip, config: str, message: str) -> None:
    write_repository(tmp_path, {"m": affine_model()})
    (tmp_path / "m" / "config.pbtxt").write_text(config)
    with pytest.raises(ModelLoadFailed, match=message):
        create_app(oip.make_config(tmp_path))


def test_cli_parser_env_token_and_help(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("VEIL_ADMIN_TOKEN", "from-env")
    config = cli.config_from_args(["--repo", str(tmp_path), "--port", "9000", "--max-body-mb", "2"])
    assert (config.admin_token, config.port, config.max_body_mb, config.host) == ("from-env", 9000, 2.0, "127.0.0.1")
    assert cli.config_from_args(["--repo", "r", "--admin-token", "flag"]).admin_token == "flag"
    monkeypatch.delenv("VEIL_ADMIN_TOKEN")
    assert cli.config_from_args(["--repo", "r"]).admin_token is None
    with pytest.raises(ValueError, match="--repo"):
        cli.config_from_args([])
    assert cli.main(["--help"]) == 0
    assert "example:" in capsys.readouterr().out
    assert cli.main(["--no-such-flag"]) == 2


def test_veil_serve_reports_a_missing_repo(capsys, tmp_path) -> None:
    from veil.cli import main

    assert main(["serve", "--repo", str(tmp_path / "missing")]) == 2
    assert "expected a model repository folder" in capsys.readouterr().err


def test_version_policy_all_serves_each_version(tmp_path, oip) -> None:
    write_repository(tmp_path, {"m": affine_model()}, max_batch_size=4, versions=(1, 2))
    config = tmp_path / "m" / "config.pbtxt"
    config.write_text(config.read_text() + "version_policy: { all { } }\n")
    with TestClient(create_app(oip.make_config(tmp_path))) as client:
        assert client.get("/v2/models/m").json()["versions"] == ["1", "2"]
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        for version in ("1", "2"):
            assert client.post(f"/v2/models/m/versions/{version}/infer", json=body).json()["model_version"] == version
        assert client.post("/v2/models/m/infer", json=body).json()["model_version"] == "2"
        assert len(client.get("/v2/models/m/stats").json()["model_stats"]) == 2
