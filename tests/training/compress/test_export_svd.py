"""A compressed model exports to ONNX with two MatMuls per factorised layer, matches torch under ORT, and the
engine serves it from the repository."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import torch
from veil.export.compressed import export_compressed, factorised_matmul_pairs
from veil.training.compress.log import ModuleLog
from veil.training.compress.lowrank import STAGES, FactorizedLinear


def test_export_two_matmuls_parity_and_serving(micro_lm, micro_calibration, tmp_path) -> None:
    model = copy.deepcopy(micro_lm)
    STAGES["saes_svd"].apply(model, STAGES["saes_svd"].config_cls(ratio=0.4), micro_calibration,
                             ModuleLog(progress=False))
    ranks = {n: m for n, m in model.named_modules() if isinstance(m, FactorizedLinear)}
    manifest = export_compressed(model, tmp_path / "repo", "lm-saes40")
    assert manifest["validation"]["passed"] and manifest["compression"]["factorised_layers"] == 14
    graph = onnx.load(str(tmp_path / "repo" / "lm-saes40" / "1" / "model.onnx"))
    pairs = factorised_matmul_pairs(graph)
    assert len(pairs) == 14  # x -> MatMul (in, r) -> MatMul (r, out), once per factorised layer
    expected = sorted(([m.in_features, m.rank], [m.rank, m.out_features]) for m in ranks.values())
    assert sorted(pairs) == expected

    from fastapi.testclient import TestClient
    from veil.engine.server import ServerConfig, create_app

    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids).logits.numpy()
    config = ServerConfig(repo=str(tmp_path / "repo"), log_level="warning", intra_op_threads=1)
    with TestClient(create_app(config)) as client:
        r = client.post("/v2/models/lm-saes40/infer", json={"inputs": [
            {"name": "input_ids", "shape": [2, 12], "datatype": "INT64", "data": ids.flatten().tolist()}]})
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["shape"] == [2, 12, 256]
    np.testing.assert_allclose(np.asarray(out["data"], dtype=np.float32).reshape(2, 12, 256), ref, atol=1e-3, rtol=1e-3)
