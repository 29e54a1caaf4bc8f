"""The PriorGuide sampler through `veil serve` over HTTP: good requests, every refusal a 4xx, still serving."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from veil.engine.server import create_app
from veil.export.sampler import export_sampler
from veil.training.priorguide import SamplerTrainConfig, ScoreNetConfig, get_task, save_sampler, train_score

STRONG = {"family": "gaussian", "mean": [0.2, -0.1], "std": [0.06, 0.06]}


@pytest.fixture(scope="module")
def client(tmp_path_factory, oip):
    task = get_task("gaussian_linear", 2)
    theta, x = task.simulate_pairs(2000, seed=0)
    result = train_score(theta, x, task.prior, ScoreNetConfig(dim=2, x_dim=2, hidden=32),
                         SamplerTrainConfig(simulations=2000, steps=300, batch_size=256), progress=False)
    root = tmp_path_factory.mktemp("sampler")
    save_sampler(result, root / "ck", {"name": task.name, "dim": 2})
    export_sampler(root / "ck", root / "repo", "gl2")
    xi, x = task.simulate_predictive(1000, seed=0)
    joint = train_score(xi, x, task.prior, ScoreNetConfig(dim=4, x_dim=2, hidden=16),
                        SamplerTrainConfig(simulations=1000, steps=50, batch_size=128), progress=False)
    save_sampler(joint, root / "joint", {"name": task.name, "dim": 2, "predictive": True})
    export_sampler(root / "joint", root / "repo", "gl2-pred")
    with TestClient(create_app(oip.make_config(root / "repo"))) as c:
        yield c


def infer(client, inputs, **parameters):
    body = {"inputs": inputs}
    if parameters:
        body["parameters"] = parameters
    return client.post("/v2/models/gl2/infer", json=body)


X = {"name": "x", "datatype": "FP32", "shape": [2], "data": [0.15, -0.05]}
FAST = {"steps": 10, "langevin_steps": 2, "pilot": 100}


def outputs(response) -> dict:
    return {o["name"]: o for o in response.json()["outputs"]}


def test_prior_in_parameters_gives_samples_and_diagnostics(client) -> None:
    r = infer(client, [X], prior=STRONG, num_samples=300, seed=3, **FAST)
    assert r.status_code == 200, r.text
    out = outputs(r)
    samples = np.array(out["samples"]["data"], dtype=np.float32).reshape(out["samples"]["shape"])
    assert samples.shape == (300, 2) and out["samples"]["datatype"] == "FP32"
    diag = json.loads(out["diagnostics"]["data"][0])
    assert diag["seed"] == 3 and diag["nfe"] == 30 and diag["ratio"]["method"] == "closed-form"
    assert {"ood", "sir", "seconds"} <= set(diag)
    again = outputs(infer(client, [X], prior=STRONG, num_samples=300, seed=3, **FAST))
    assert again["samples"]["data"] == out["samples"]["data"]  # seeds reproduce over HTTP


def test_prior_as_bytes_input_and_unguided(client) -> None:
    prior = {"name": "prior", "datatype": "BYTES", "shape": [1], "data": [json.dumps(STRONG)]}
    r = infer(client, [X, prior], num_samples=50, **FAST)
    assert r.status_code == 200, r.text
    r = infer(client, [{**X, "shape": [1, 2]}], num_samples=50, **FAST)
    assert r.status_code == 200 and "ood" not in json.loads(outputs(r)["diagnostics"]["data"][0])


def test_binary_request_and_response(client, oip) -> None:
    body, headers = oip.binary_body([("x", "FP32", np.array([0.1, 0.0], dtype=np.float32))],
                                    [("samples", True), ("diagnostics", False)], prior=STRONG, num_samples=20, **FAST)
    r = client.post("/v2/models/gl2/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert oip.decode(r)["samples"].shape == (20, 2)


def test_predictive_model_returns_x_star_draws(client) -> None:
    r = client.post("/v2/models/gl2-pred/infer", json={"inputs": [X], "parameters": {"prior": STRONG,
                                                                                     "num_samples": 40, **FAST}})
    assert r.status_code == 200, r.text
    out = outputs(r)
    assert out["samples"]["shape"] == [40, 2] and out["predictive"]["shape"] == [40, 2]
    meta = client.get("/v2/models/gl2-pred").json()
    assert meta["parameters"]["sampler"]["theta_dim"] == 2 and meta["parameters"]["sampler"]["dim"] == 4


def test_metadata(client) -> None:
    meta = client.get("/v2/models/gl2").json()
    assert meta["platform"] == "veil_sampler" and meta["parameters"]["sampler"]["dim"] == 2
    assert meta["parameters"]["sampler"]["train_prior"]["family"] == "gaussian"
    assert {i["name"] for i in meta["inputs"]} == {"x", "prior"}


@pytest.mark.parametrize(("inputs", "parameters", "words"), [
    ([X], {"prior": {"family": "beta"}}, ["prior.family", "'beta'"]),
    ([X], {"prior": {"family": "gaussian", "mean": [0, 0, 0], "std": 1}}, ["expected dimension 2", "received 3"]),
    ([X], {"prior": {"family": "gaussian", "mean": [0, 0], "cov": [[1, 2], [2, 1]]}}, ["prior.cov", "positive"]),
    ([X], {"prior": STRONG, "num_samples": 10**7}, ["num_samples", "10000000"]),
    ([X], {"prior": STRONG, "kernel": "magic"}, ["kernel", "'magic'"]),
    ([X], {"prior": STRONG, "steps": 10**6}, ["steps", "[1, 10000]", "1000000"]),
    ([X], {"temperature": 2}, ["unknown parameters", "temperature"]),
    ([{**X, "shape": [3], "data": [0, 0, 0]}], {}, ["input 'x'", "[2]", "[3]"]),
    ([{**X, "datatype": "FP64"}], {}, ["input 'x'", "FP32", "FP64"]),
    ([{"name": "y", "datatype": "FP32", "shape": [2], "data": [0, 0]}], {}, ["no input 'y'"]),
    ([{"name": "prior", "datatype": "BYTES", "shape": [1], "data": ["{}"]}], {}, ["missing inputs", "'x'"]),
    ([X, {"name": "prior", "datatype": "BYTES", "shape": [1], "data": [json.dumps(STRONG)]}], {"prior": STRONG},
     ["prior given twice"]),
    ([X], {"prior": {"family": "uniform", "low": [0, 0], "high": [1, 1]}}, ["support everywhere"]),
])
def test_refusals_are_400_naming_the_field(client, inputs, parameters, words) -> None:
    r = infer(client, inputs, **parameters)
    assert r.status_code == 400, r.text
    assert all(w in r.json()["error"] for w in words), r.json()["error"]
    assert infer(client, [X], num_samples=5, **FAST).status_code == 200  # the server keeps serving
