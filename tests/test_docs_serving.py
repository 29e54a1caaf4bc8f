"""The serving guide's first request runs as written (issue 33.2): valid JSON, digits scaled as the model
expects, 200 with finite logits from an exported digits model; non-finite outputs are flagged, not silent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST = re.compile(r"<!-- docs-test: first-request -->\s*```bash\n(.*?)^```", re.S | re.M)


def first_request() -> tuple[str, dict]:
    """The model path and the JSON body of docs/serving.md's first curl (the block under its marker)."""
    block = FIRST.search((ROOT / "docs" / "serving.md").read_text()).group(1)
    path = re.search(r"localhost:8000(/v2/\S+)", block).group(1)
    body = re.search(r"-d '(.*?)'", block, re.S).group(1)
    return path, json.loads(body)


def test_the_first_curl_is_valid_json_and_scaled_as_the_contract_says() -> None:
    from sklearn.datasets import load_digits

    path, body = first_request()
    assert path == "/v2/models/digits/infer"
    x = np.asarray(body["inputs"][0]["data"], np.float32).reshape(body["inputs"][0]["shape"])
    np.testing.assert_array_equal(x[0, 0], load_digits().images[0] / 16)  # in [0, 1], not raw 0..16


def test_the_first_curl_answers_finite_logits_from_an_exported_digits_model(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient
    from veil.engine.server import ServerConfig, create_app

    from veil.cli import main

    ck, repo = tmp_path / "ck", tmp_path / "models"
    assert main(["train", "uldnet", "--arch", "mlp", "--width", "32", "--epochs", "6", "--warmup-epochs", "1",
                 "--act-degree", "3", "--out", str(ck), "--no-progress"]) == 0
    assert main(["export", "onnx", str(ck), "--repo", str(repo), "--name", "digits"]) == 0
    path, body = first_request()
    with TestClient(create_app(ServerConfig(repo=str(repo)))) as client:
        meta = client.get("/v2/models/digits").json()
        answer = client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    out = answer.json()
    logits = out["outputs"][0]
    assert logits["shape"] == [1, 10] and all(v is not None and np.isfinite(v) for v in logits["data"])
    assert "parameters" not in out  # nothing flagged
    assert "/ 16" in json.dumps(meta["parameters"])  # the metadata states the scale too


def test_non_finite_json_outputs_are_flagged_and_clients_still_parse() -> None:
    import tritonclient.http as httpclient
    from veil.engine.protocol import InferResponse
    from veil.engine.rest_body import encode_response

    y = np.array([[1.0, np.nan, np.inf, -np.inf]], np.float32)
    body, header = encode_response(InferResponse("m", "1", {"y": y, "z": np.ones(2, np.float32)},
                                                 {"y": "FP32", "z": "FP32"}, {"y": False, "z": False}))
    assert header is None
    out = json.loads(body)
    assert out["parameters"]["non_finite_outputs"] == "y"
    assert out["outputs"][0]["data"] == [1.0, None, None, None]
    assert out["outputs"][0]["parameters"] == {"non_finite_count": 3} and "parameters" not in out["outputs"][1]
    assert all(isinstance(v, (str, int, float, bool)) for v in out["parameters"].values())  # OIP scalar parameters
    result = httpclient.InferResult.from_response_body(body)
    assert result.get_response()["parameters"]["non_finite_outputs"] == "y"
    np.testing.assert_array_equal(result.as_numpy("z"), np.ones(2, np.float32))


if __name__ == "__main__":
    pytest.main([__file__])
