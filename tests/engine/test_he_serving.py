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


# -- issue 18 §2: plans deeper than one parameter set, in client-refresh rounds ---------------------------------
@pytest.fixture(scope="module")
def deep_repo(tmp_path_factory):
    """A depth-2 PolyMLP (11 levels) exported with --refresh and N <= 16384: 2 rounds, cut after the first block."""
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 40)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    x[np.arange(120), y] += 3.0
    data = split_stratified(x, y, ["a", "b", "c"], "test")
    result = train_uldnet(ModelConfig(arch="mlp", input_shape=[6], num_classes=3, width=8, depth=2),
                          TrainConfig(epochs=8, warmup_epochs=2, lr=1e-2, batch_size=16), data, progress=False)
    root = tmp_path_factory.mktemp("he-deep")
    save_uldnet(result, root / "ck", data)
    repo = root / "repo"
    export_uldnet(root / "ck", repo, name="plain")
    manifest = export_he(root / "ck", repo, "deep-he", refresh=True, max_poly_modulus_degree=16384)
    return repo, data, manifest


@pytest.fixture(scope="module")
def deep_live(deep_repo, oip):
    repo, _, _ = deep_repo
    with oip.live_server(oip.make_config(repo)) as (url, _server):
        yield f"http://{url}"


def test_deep_model_runs_in_refresh_rounds_and_matches_plaintext(deep_repo, deep_live, tmp_path) -> None:
    repo, data, manifest = deep_repo
    assert manifest["rounds"] == 2 and manifest["segmentation"]["cuts"] == manifest["cuts"] == ["poly_act"]
    assert "segments.json" in (repo / "deep-he" / "config.pbtxt").read_text()
    session = HeSession.create(deep_live, "deep-he", tmp_path / "k.keyring")
    he = session.he
    assert he["rounds"] == 2 and [s["input"] for s in he["segments"]] == ["x", "poly_act"]
    assert all("ops" not in s["plan"] for s in he["segments"])  # layouts only, no program or weights
    x = data.x_test[:3]
    logits = session.run(x)
    expected = reference(repo, x)
    assert np.abs(logits - expected).max() < 1e-2 and np.array_equal(logits.argmax(1), expected.argmax(1))
    assert [r["round"] for r in session.last_rounds] == [0, 1] and session.last_rounds[0]["refresh_seconds"] > 0
    again = HeSession.load(tmp_path / "k.keyring")  # every key set is saved and reloaded
    np.testing.assert_allclose(again.decrypt(again.infer(again.encrypt(x))), logits, atol=1e-2)


def test_deep_model_through_the_cli(deep_repo, deep_live, tmp_path, capsys) -> None:
    from veil.he.cli import main

    repo, data, _ = deep_repo
    keyring = tmp_path / "c.keyring"
    np.save(tmp_path / "x.npy", data.x_test[:2])
    assert main(["keygen", "--server", deep_live, "--model", "deep-he", "--keyring", str(keyring)]) == 0
    assert json.loads(capsys.readouterr().out)["rounds"] == 2
    assert main(["encrypt", "--keyring", str(keyring), "--input", str(tmp_path / "x.npy"),
                 "--out", str(tmp_path / "req.bin")]) == 0
    assert main(["infer", "--keyring", str(keyring), "--request", str(tmp_path / "req.bin"),
                 "--out", str(tmp_path / "res.bin")]) == 0
    assert [r["round"] for r in json.loads(capsys.readouterr().out.splitlines()[-1])["rounds"]] == [0, 1]
    assert main(["decrypt", "--keyring", str(keyring), "--response", str(tmp_path / "res.bin"),
                 "--out", str(tmp_path / "y.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), reference(repo, data.x_test[:2]), atol=1e-2)


def _resealed(envelope: bytes, **meta) -> bytes:
    """The same envelope with meta fields replaced (what a client could send)."""
    from veil.he.envelope import open_envelope, seal_envelope

    e = open_envelope(envelope)
    return seal_envelope(e.payload, kind=e.kind, key_id=e.key_id, params_hash=e.params_hash, plan_hash=e.plan_hash,
                         meta={**e.meta, **meta})


def send(session: HeSession, envelope: bytes, k: int) -> bytes:
    """One round only (``HeSession.infer`` would run all of them), with the key set of round ``k``."""
    return session._post(envelope, *session._ring(k)[:2])


def test_refresh_rounds_replayed_out_of_order_or_foreign_are_refused(deep_repo, deep_live, tmp_path) -> None:
    from veil.he.envelope import open_envelope

    _, data, _ = deep_repo
    a = HeSession.create(deep_live, "deep-he", tmp_path / "a.keyring")
    b = HeSession.create(deep_live, "deep-he", tmp_path / "b.keyring")
    x = data.x_test[:1]
    first = a.encrypt(x)
    with pytest.raises(ServerError, match=r"HTTP 400.*meta.round"):  # a deep model needs the round fields
        send(a, _resealed(first, round="0"), 0)
    mid = send(a, _resealed(first, request_id="client-chosen-1"), 0)
    assert open_envelope(mid).meta["request_id"] == "client-chosen-1" and not open_envelope(mid).meta["final"]
    with pytest.raises(ServerError, match=r"HTTP 409.*already open"):  # round 0 replayed with the same id
        send(a, _resealed(first, request_id="client-chosen-1"), 0)
    second = a._refresh(mid, 0)  # round 1: decrypted, re-encoded and encrypted fresh by the client
    with pytest.raises(ServerError, match=r"HTTP 409.*no open request"):  # a request nobody opened
        send(a, _resealed(second, request_id="f" * 32), 1)
    b_mid = send(b, b.encrypt(x), 0)
    b_second = b._refresh(b_mid, 0)
    with pytest.raises(ServerError, match=r"HTTP 409.*another request or key"):  # b's round 1 into a's request
        send(b, _resealed(b_second, request_id="client-chosen-1"), 1)
    with pytest.raises(ServerError, match=r"HTTP 409.*no open request"):  # a round 1 with round 0's meta
        send(a, _resealed(second, round=1, request_id="never-issued-0"), 1)
    final = send(a, second, 1)
    assert open_envelope(final).meta["final"] and a.decrypt(final).shape == (1, 3)
    with pytest.raises(ServerError, match=r"HTTP 409.*(replayed|no open request)"):  # the last round replayed
        send(a, second, 1)
    assert b.decrypt(send(b, b_second, 1)).shape == (1, 3)  # b's request was untouched: still serving
