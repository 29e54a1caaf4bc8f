"""`veil export forecast`: the collapsed forecaster as ONNX (validated, served by `veil serve`) and as an HE plan
(depth 1, encrypted forecasts within 1e-3 of plaintext at 128-bit security)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from veil.training.forecast import (
    ForecastFitConfig,
    ForecastModelConfig,
    NotAffineError,
    Series,
    load_forecaster,
    save_forecaster,
    train_forecaster,
)

from veil.cli import main

LOOKBACK, HORIZON = 8, 2


def series(channels: int = 1) -> Series:
    t = np.arange(240)
    rng = np.random.default_rng(0)
    values = np.stack([5 + np.sin(t / (4 + k)) + 0.1 * rng.normal(size=240) for k in range(channels)], 1)
    return Series(values, [f"c{k}" for k in range(channels)], [], "toy")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("fc") / "toy-rrr"
    model = ForecastModelConfig(lookback=LOOKBACK, horizon=HORIZON, instance_norm="revin")
    save_forecaster(train_forecaster(series(), model, ForecastFitConfig(fit="rrr")), out)
    return out


def test_export_writes_one_matmul_that_matches_and_is_served(checkpoint, tmp_path, capsys) -> None:
    from fastapi.testclient import TestClient
    from veil.engine.server import ServerConfig, create_app

    repo = tmp_path / "models"
    assert main(["export", "forecast", str(checkpoint), "--repo", str(repo), "--name", "toy"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main(["export", "forecast", str(checkpoint), "--repo", str(repo), "--he", "throughput"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "toy-rrr-he"
    assert summary["collapse"]["max_abs_diff"] < 1e-10 * summary["collapse"]["max_abs_output"]
    graph = onnx.load(str(repo / "toy" / "1" / "model.onnx"))
    assert [n.op_type for n in graph.graph.node] == ["Reshape", "MatMul", "Add", "Reshape"]
    manifest = json.loads((repo / "toy" / "veil.json").read_text())
    assert manifest["kind"] == "forecast" and manifest["source"]["sha256"]
    forecaster, _ = load_forecaster(checkpoint)
    x = 5 + np.random.default_rng(1).normal(size=(3, LOOKBACK, 1))
    config = ServerConfig(repo=str(repo), log_level="warning", intra_op_threads=1)
    with TestClient(create_app(config)) as client:
        body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        reply = client.post("/v2/models/toy/infer", json=body)
        assert reply.status_code == 200, reply.text
        y = np.array(reply.json()["outputs"][0]["data"]).reshape(3, HORIZON, 1)
        np.testing.assert_allclose(y, forecaster.predict_raw(x), atol=1e-4)
        bad = client.post("/v2/models/toy/infer", json={"inputs": [{**body["inputs"][0], "shape": [3, 5, 1],
                                                                    "data": x[:, :5].ravel().tolist()}]})
        assert bad.status_code == 400
        he = client.get("/v2/models/toy-rrr-he").json()  # the same server serves the encrypted forecaster
        assert he["parameters"]["he"]["mode"] == "throughput" and he["parameters"]["he"]["levels"] == 1, he
        assert he["parameters"]["veil"]["task"] == "forecast"


def encrypted_run(model_folder, x: np.ndarray) -> np.ndarray:
    """Client encrypts x, the published plan evaluates, the client decrypts."""
    from veil.he.evaluate import PlanEvaluator
    from veil.he.keys import SecretKeyring
    from veil.he.plan import Plan

    plan = Plan.load(model_folder / "1")
    ring = SecretKeyring.generate(plan.parameters(), plan.galois_steps)
    out = PlanEvaluator(plan, plan.parameters()).run(ring.encrypt(plan.encode_inputs(x)), ring.evaluation_keys())
    return plan.decode_outputs(ring.decrypt(out), len(x))


@pytest.mark.parametrize("mode", ["latency", "throughput"])
def test_encrypted_forecast_matches_plaintext(checkpoint, tmp_path, mode: str) -> None:
    from veil.export.forecast import export_forecast_he

    manifest = export_forecast_he(checkpoint, tmp_path / "models", "toy-he", mode)
    assert manifest["levels"] == 1 and manifest["parameters"]["poly_modulus_degree"] == 8192
    assert (tmp_path / "models" / "toy-he" / "config.pbtxt").read_text().count('backend: "veil_he"') == 1
    forecaster, _ = load_forecaster(checkpoint)
    x = 5 + np.random.default_rng(2).normal(size=(6, LOOKBACK, 1))  # six series in one call
    assert np.abs(encrypted_run(tmp_path / "models" / "toy-he", x) - forecaster.predict_raw(x)).max() < 1e-3


def test_a_forecaster_that_is_not_affine_exports_plaintext_only(tmp_path, capsys) -> None:
    from veil.export.forecast import export_forecast, export_forecast_he

    out = tmp_path / "revin-bias"
    model = ForecastModelConfig(lookback=LOOKBACK, horizon=HORIZON, instance_norm="revin", bias=True,
                                channels="individual")
    save_forecaster(train_forecaster(series(2), model, ForecastFitConfig(fit="ols")), out)
    manifest = export_forecast(out, tmp_path / "models", "plain")  # the normalisation stays in the graph, validated
    assert manifest["collapse"]["affine"] is False and manifest["validation"]["cases"][1]["batch"] == 5
    ops = {n.op_type for n in onnx.load(str(tmp_path / "models" / "plain" / "1" / "model.onnx")).graph.node}
    assert "Sqrt" in ops
    with pytest.raises(NotAffineError, match="normalise on the client"):
        export_forecast_he(out, tmp_path / "models", "enc")
    manifest = export_forecast_he(out, tmp_path / "models", "enc", "throughput", client_normalisation=True)
    assert manifest["input"].startswith("client-normalised")
    forecaster, _ = load_forecaster(out)
    x = 5 + np.random.default_rng(3).normal(size=(3, LOOKBACK, 2))
    z, stats = forecaster.normalise(x)  # the client's side, in the clear on the client only
    assert np.abs(encrypted_run(tmp_path / "models" / "enc", z) - forecaster.core(z)).max() < 1e-3
    np.testing.assert_allclose(forecaster.denormalise(forecaster.core(z), stats), forecaster.predict_raw(x), atol=1e-10)
    assert main(["export", "forecast", str(out), "--repo", str(tmp_path / "m"), "--he", "latency"]) == 2
    assert "is not affine in its input" in capsys.readouterr().err
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())
