"""Encrypted inference through `veil serve`: keys, envelopes, both packing modes, every refusal over HTTP."""

from __future__ import annotations

import json
import struct
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest
import tenseal as ts
from veil.export import export_uldnet
from veil.export.he import export_he
from veil.he.client import HeSession, ServerError
from veil.training.uldnet import ModelConfig, TrainConfig, save_uldnet, train_uldnet
from veil.training.uldnet.data import split_stratified


@pytest.fixture(scope="module")
def he_repo(tmp_path_factory):
    """A tiny PolyMLP on a 3-class 6-feature task, exported as ONNX and as latency/throughput HE plans."""
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 40)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    x[np.arange(120), y] += 3.0
    data = split_stratified(x, y, ["a", "b", "c"], "test")
    result = train_uldnet(ModelConfig(arch="mlp", input_shape=[6], num_classes=3, width=8),
                          TrainConfig(epochs=8, warmup_epochs=2, lr=1e-2, batch_size=16), data, progress=False)
    root = tmp_path_factory.mktemp("he")
    save_uldnet(result, root / "ck", data)
    repo = root / "repo"
    export_uldnet(root / "ck", repo, name="plain")
    export_he(root / "ck", repo, "tiny-he", mode="latency")
    export_he(root / "ck", repo, "tiny-he-batch", mode="throughput")
    return repo, data


@pytest.fixture(scope="module")
def live(he_repo, oip):
    repo, _ = he_repo
    with oip.live_server(oip.make_config(repo)) as (url, _server):
        yield f"http://{url}"


def reference(repo, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(repo / "plain" / "1" / "model.onnx")).run(None, {"x": x})[0]


@pytest.mark.parametrize(("model", "batch"), [("tiny-he", 3), ("tiny-he-batch", 24)])
def test_encrypted_inference_matches_plaintext(he_repo, live, tmp_path, model: str, batch: int) -> None:
    repo, data = he_repo
    session = HeSession.create(live, model, tmp_path / "k.keyring")
    x = data.x_test[:batch]
    logits = session.decrypt(session.infer(session.encrypt(x)))
    expected = reference(repo, x)
    assert logits.shape == expected.shape
    assert np.abs(logits - expected).max() < 1e-2
    assert np.array_equal(logits.argmax(1), expected.argmax(1))


def test_metadata_exposes_parameters_and_key_manifest(live) -> None:
    with urllib.request.urlopen(f"{live}/v2/models/tiny-he") as r:
        meta = json.loads(r.read())
    he = meta["parameters"]["he"]
    assert meta["platform"] == "veil_he" and meta["inputs"][0]["datatype"] == "BYTES"
    assert he["mode"] == "latency" and he["galois_steps"] and he["describe"]["security"].startswith("128")
    assert "ops" not in he["plan"] and "values" not in he["plan"]  # layout only, no program or weights


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_context_with_a_secret_key_is_refused(live) -> None:
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, 8192, coeff_mod_bit_sizes=[60, 40, 40, 60])
    status, body = post(f"{live}/v2/he/keys", ctx.serialize(save_secret_key=True))
    assert status == 403 and "secret key" in body["error"]
    status, body = post(f"{live}/v2/he/keys", b"garbage" * 10)
    assert status == 400 and "error" in body


def test_refusals_keep_the_server_serving(live, tmp_path) -> None:
    session = HeSession.create(live, "tiny-he", tmp_path / "k.keyring")
    request = session.encrypt(np.zeros((1, 6), np.float32))
    other = HeSession.create(live, "tiny-he-batch", tmp_path / "o.keyring")
    unknown = HeSession(session.url, session.model, "0" * 64, session.keyring, session.he, session.key_secret)
    with pytest.raises(ServerError, match=r"HTTP 404.*key"):  # a key id nobody registered
        unknown.infer(unknown.encrypt(np.zeros((1, 6), np.float32)))
    with pytest.raises(ServerError, match=r"HTTP 400.*plan_hash"):  # an envelope for another model
        HeSession(session.url, "tiny-he-batch", session.key_id, session.keyring, other.he, session.key_secret).infer(request)
    with pytest.raises(ServerError, match="HTTP 400"):  # corrupted envelope
        session.infer(request[:-10] + b"0123456789")
    header = json.dumps({"inputs": [{"name": "ciphertext", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 8}}]}).encode()
    status, body = post(f"{live}/v2/models/tiny-he/infer", header + struct.pack("<I", 4) + b"abcd",
                        {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "parameters.key_id" in body["error"]
    logits = session.decrypt(session.infer(request))  # still serving
    assert logits.shape == (1, 3)
