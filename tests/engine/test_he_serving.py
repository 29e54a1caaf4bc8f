"""Encrypted inference through `veil serve`: keys, envelopes, both packing modes, every refusal over HTTP."""

from __future__ import annotations

import json
import logging
import shutil
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
def he_repo(tmp_path_factory, tiny_polymlp):
    """The tiny PolyMLP (conftest) exported as ONNX and as latency/throughput HE plans."""
    checkpoint, data = tiny_polymlp
    repo = tmp_path_factory.mktemp("he") / "repo"
    export_uldnet(checkpoint, repo, name="plain")
    export_he(checkpoint, repo, "tiny-he", mode="latency")
    export_he(checkpoint, repo, "tiny-he-batch", mode="throughput")
    export_he(checkpoint, repo, "tiny-he-one", mode="latency", rotation_keys="binary", replicate=True)
    shutil.copytree(repo / "tiny-he", repo / "tiny-he-two")  # the operator's bound: 2 ciphertexts per request
    config = (repo / "tiny-he" / "config.pbtxt").read_text().replace('"tiny-he"', '"tiny-he-two"')
    (repo / "tiny-he-two" / "config.pbtxt").write_text(
        config + 'parameters { key: "he_max_ciphertexts" value { string_value: "2" } }\n')
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
    # the input contract travels (issue 30 §5): what x must be before it is encrypted
    contract = meta["parameters"]["veil"]["input"]
    assert contract == {"name": "x", "dtype": "float32", "shape": [6], "scale": "as given", "normalization": "none"}


def test_a_replicated_model_tells_its_clients_to_tile_one_image_per_ciphertext(live) -> None:
    metas = {}
    for model in ("tiny-he", "tiny-he-one"):
        with urllib.request.urlopen(f"{live}/v2/models/{model}") as r:
            metas[model] = json.loads(r.read())["parameters"]["he"]
    batched, one = metas["tiny-he"]["plan"], metas["tiny-he-one"]["plan"]
    assert one["replicated"] and one["batch_capacity"] == 1 and one["format"] == "veil.he.plan/4"
    assert "replicated" not in batched and batched["batch_capacity"] > 1
    assert all(0 < s < one["period"] for s in metas["tiny-he-one"]["galois_steps"])  # keys modulo the block


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


def test_seeded_ciphertexts_are_evaluated_and_broken_ones_refused_with_400(he_repo, oip, tmp_path) -> None:
    """Issue 35.4: the client encrypts symmetrically and ships SEAL's seeded ciphertexts (about half the bytes);
    the server expands and evaluates them to the plaintext result, and a truncated or malformed seeded ciphertext
    inside a well-formed envelope is a 400 that leaves the server serving (a server of its own: the module's
    shared one holds this source's key-set quota)."""
    repo, data = he_repo
    with oip.live_server(oip.make_config(repo, he_key_dir=str(tmp_path / "keys"))) as (url, _server):
        _seeded_round_trip(f"http://{url}", repo, data, tmp_path)


def _seeded_round_trip(live: str, repo, data, tmp_path) -> None:
    from veil.he.envelope import open_envelope, seal_envelope
    from veil.he.serialize import CIPHERTEXTS_MAGIC, CIPHERTEXTS_VERSION, pack, unpack

    session = HeSession.create(live, "tiny-he", tmp_path / "k.keyring")
    x = data.x_test[:1]
    request = session.encrypt(x)
    env = open_envelope(request)
    _, header, body = unpack(env.payload, CIPHERTEXTS_MAGIC, (CIPHERTEXTS_VERSION,), ValueError, "cts")
    blob = body  # one ciphertext: the whole body
    params = session.keyring.params
    unseeded = 2 * params.poly_modulus_degree * len(params.coeff_mod_bit_sizes[:-1]) * 8
    assert header["count"] == 1 and len(blob) < 0.6 * unseeded  # seeded: one polynomial and a seed, not two
    logits = session.decrypt(session.infer(request))
    assert np.array_equal(logits.argmax(1), reference(repo, x).argmax(1))

    def resealed(payload_blob: bytes) -> bytes:
        payload = pack(CIPHERTEXTS_MAGIC, CIPHERTEXTS_VERSION, {"count": 1, "lengths": [len(payload_blob)]},
                       payload_blob)
        return seal_envelope(payload, kind="request", key_id=env.key_id, params_hash=env.params_hash,
                             plan_hash=env.plan_hash, meta=env.meta)

    # (a flipped byte inside the polynomial is a valid ciphertext of something else: the envelope's SHA-256 is
    # what catches that in transit, and it was recomputed here)
    for what, broken in (("half", blob[: len(blob) // 2]), ("one byte short", blob[:-1]),
                         ("zeroed", blob[:16] + b"\x00" * (len(blob) - 16))):
        try:
            session.infer(resealed(broken))
        except ServerError as exc:
            assert "HTTP 400" in str(exc), what
        else:
            raise AssertionError(f"{what}: accepted")
    assert np.array_equal(session.decrypt(session.infer(request)), logits)  # still serving, same result


# -- issue 19: a hostile client and a clumsy operator ------------------------------------------------------
@pytest.fixture(scope="module")
def app_client(he_repo, oip, tmp_path_factory):
    """The HE repository in-process, with an admin token and 2 key sets per source."""
    from fastapi.testclient import TestClient
    from veil.engine.server import create_app

    repo, _ = he_repo
    config = oip.make_config(repo, admin_token=oip.token, he_keys_per_source=2,
                             he_key_dir=str(tmp_path_factory.mktemp("he-keys")))
    with TestClient(create_app(config)) as c:
        yield c


def _he(client, model: str) -> dict:
    return client.get(f"/v2/models/{model}").json()["parameters"]["he"]


def _register(client, model: str, headers: dict | None = None, steps: list[int] | None = None):
    """Keys for ``model`` (or only ``steps``) registered through ``client``: (keyring, he metadata, response JSON)."""
    from veil.he.keys import SecretKeyring
    from veil.he.params import CkksParameters

    he = _he(client, model)
    ring = SecretKeyring.generate(CkksParameters.from_dict(he["parameters"]), he["galois_steps"] if steps is None
                                  else steps)
    r = client.post("/v2/he/keys", content=ring.evaluation_keys().to_bytes(), headers=headers or {})
    assert r.status_code == 200, r.text
    return ring, he, r.json()


@pytest.fixture(scope="module")
def tiny_key(app_client):
    """One key set for the latency plans (tiny-he, tiny-he-two share its parameters and manifest)."""
    return _register(app_client, "tiny-he")


@pytest.fixture(scope="module")
def batch_key(app_client):
    return _register(app_client, "tiny-he-batch")


def _infer(client, model: str, he: dict, key: dict, payload: bytes, secret: str | None = None):
    """POST one request envelope holding ``payload`` (a ciphertext container) as a binary BYTES tensor."""
    from veil.he.envelope import seal_envelope

    envelope = seal_envelope(payload, kind="request", key_id=key["key_id"], params_hash=he["params_hash"],
                             plan_hash=he["plan_hash"], meta={"batch": 1})
    header = json.dumps({"inputs": [{"name": "ciphertext", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 4 + len(envelope)}}],
                         "parameters": {"key_id": key["key_id"], "binary_data_output": True,
                                        "key_secret": key["key_secret"] if secret is None else secret}}).encode()
    return client.post(f"/v2/models/{model}/infer", content=header + struct.pack("<I", len(envelope)) + envelope,
                       headers={"Inference-Header-Content-Length": str(len(header))})


def _vector(he: dict) -> np.ndarray:
    """One slot vector of the model's layout (latency: a zero sample tiled over the slots)."""
    from veil.he.plan import Plan

    return Plan(he["plan"], {}).encode_inputs(np.zeros((1, 6)))[0]


def test_key_upload_is_capped_by_the_plans_key_manifest_before_reading(app_client, live) -> None:
    # 19.1: the route ignored every body limit but the 2 GiB quota and read the whole body before checking it
    import socket

    from veil.he.galois import max_bundle_bytes
    from veil.he.params import CkksParameters

    metas = [_he(app_client, m) for m in ("tiny-he", "tiny-he-batch")]
    for meta in metas:
        assert meta["key_bundle_limit_bytes"] == max_bundle_bytes(CkksParameters.from_dict(meta["parameters"]),
                                                                  meta["galois_steps"])
    limit = max(meta["key_bundle_limit_bytes"] for meta in metas)
    assert limit < 2048 * 2**20 // 16  # what this plan's manifest needs, not the 2 GiB quota
    host, port = live.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:  # declares 1 GB, sends nothing
        sock.sendall(b"POST /v2/he/keys HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        answer = sock.recv(65536).decode()
    assert answer.startswith("HTTP/1.1 413") and "key bundle" in answer and "--max-body-mb" not in answer  # 19.6
    assert f"at most {limit} bytes" in answer

    def chunks():  # no Content-Length: refused once the stream passes the cap
        for _ in range(limit // 2**20 + 2):
            yield b"\x00" * 2**20

    r = app_client.post("/v2/he/keys", content=chunks())
    assert r.status_code == 413 and "largest served HE plan" in r.json()["error"]
    assert app_client.get("/v2/health/live").status_code == 200


def test_keys_have_owners_and_sources_are_bounded(app_client, oip) -> None:
    # 19.2: anyone could use or flood key sets; now the key secret is needed, and a source holds 2 at most
    from fastapi.testclient import TestClient

    owner, flooder = (TestClient(app_client.app, client=(host, 1)) for host in ("10.0.0.5", "10.0.0.66"))
    ring, he, key = _register(owner, "tiny-he")
    payload = ring.encrypt_to_bytes([_vector(he)])
    assert _infer(app_client, "tiny-he", he, key, payload).status_code == 200
    r = _infer(app_client, "tiny-he", he, key, payload, secret="not-the-secret")
    assert r.status_code == 403 and "key_secret" in r.json()["error"]
    r = _infer(app_client, "tiny-he", he, key, payload, secret="")
    assert r.status_code == 400 and "parameters.key_secret" in r.json()["error"]
    assert app_client.delete(f"/v2/he/keys/{key['key_id']}", headers={"Authorization": "Bearer nope"}).status_code == 403
    assert app_client.delete(f"/v2/he/keys/{key['key_id']}",
                             headers={"Authorization": f"bearer {key['key_secret']}"}).status_code == 200
    assert _infer(app_client, "tiny-he", he, key, payload).status_code == 404
    keys = [_register(flooder, "tiny-he", steps=[])[2] for _ in range(2)]
    from veil.he.keys import SecretKeyring
    from veil.he.params import CkksParameters

    third = SecretKeyring.generate(CkksParameters.from_dict(_he(app_client, "tiny-he")["parameters"]), [])
    r = flooder.post("/v2/he/keys", content=third.evaluation_keys().to_bytes())  # refused, nothing evicted (31.5)
    assert r.status_code == 413 and "--he-keys-per-source" in r.json()["error"]
    for k in keys:  # the operator may delete any key set, with a lower-case scheme too (19.6)
        assert app_client.delete(f"/v2/he/keys/{k['key_id']}",
                                 headers={"authorization": f"BEARER {oip.token}"}).status_code == 200


def test_forwarded_for_is_believed_only_from_a_trusted_proxy(he_repo, oip, tmp_path) -> None:
    """Issue 31 item 5: uvicorn believed X-Forwarded-For from 127.0.0.1 (the default bind), so local uploads with
    forged headers counted as many sources and evicted an idle client's keys. Now the header is ignored unless
    --trusted-proxy names the peer: three uploads from 127.0.0.1 with three forged sources are one source, whose
    bound (2) refuses the third."""
    import httpx
    from veil.engine.server import build_server
    from veil.he.keys import SecretKeyring
    from veil.he.params import CkksParameters

    repo, _ = he_repo
    config = oip.make_config(repo, he_keys_per_source=2, he_key_dir=str(tmp_path / "keys"))
    with oip.live_server(config) as (url, _server):
        params = CkksParameters.from_dict(httpx.get(f"http://{url}/v2/models/tiny-he").json()["parameters"]["he"]
                                          ["parameters"])
        statuses = [httpx.post(f"http://{url}/v2/he/keys", content=SecretKeyring.generate(params, []).evaluation_keys()
                               .to_bytes(), headers={"X-Forwarded-For": f"203.0.113.{i}"}, timeout=60).status_code
                    for i in range(3)]
    assert statuses == [200, 200, 413]
    trusting = build_server(config.replace(trusted_proxy="127.0.0.1, 10.0.0.0/8")).config
    assert trusting.proxy_headers and trusting.forwarded_allow_ips == ["127.0.0.1", "10.0.0.0/8"]
    assert not build_server(config).config.proxy_headers


def test_bearer_scheme_is_case_insensitive(app_client, oip) -> None:
    # 19.6: RFC 6750's scheme name is case-insensitive; "bearer TOKEN" was refused
    for scheme in ("Bearer", "bearer", "BEARER"):
        r = app_client.post("/v2/repository/index", headers={"Authorization": f"{scheme} {oip.token}"})
        assert r.status_code == 200, (scheme, r.text)
    assert app_client.post("/v2/repository/index", headers={"Authorization": f"Basic {oip.token}"}).status_code == 401


@pytest.mark.parametrize(("model", "count", "status"), [("tiny-he", 9, 413), ("tiny-he-two", 3, 413),
                                                         ("tiny-he-batch", 7, 413), ("tiny-he-batch", 5, 400)])
def test_ciphertexts_per_request_are_bounded_by_the_layout(app_client, tiny_key, batch_key, model: str, count: int,
                                                           status: int) -> None:
    # 19.3: any number of ciphertexts was evaluated (8 took 25 s of CPU); latency takes he_max_ciphertexts (8),
    # throughput exactly one per input feature (6)
    ring, _, key = batch_key if model == "tiny-he-batch" else tiny_key
    he = _he(app_client, model)
    assert he["max_ciphertexts"] == {"tiny-he": 8, "tiny-he-two": 2, "tiny-he-batch": 6}[model]
    r = _infer(app_client, model, he, key, ring.encrypt_to_bytes([_vector(he)] * count))
    assert r.status_code == status, r.text
    assert ("at most" if status == 413 else "one ciphertext per input feature") in r.json()["error"]


def _crafted(ring, he: dict, kind: str) -> bytes:
    """A ciphertext container SEAL loads and finds valid, but that would fail mid-evaluation."""
    import tenseal.sealapi as sa
    from veil.he.serialize import ciphertexts_to_bytes

    params = ring.params
    if kind == "zero-non-ntt":
        ct = sa.Ciphertext(params.seal_context())
        ct.resize(params.seal_context(), 2)
        return ciphertexts_to_bytes([ct])
    [ct] = ring.encrypt([_vector(he)])
    ct.scale = {"nan": float("nan"), "off-1e-10": params.scale * (1 + 1e-10), "inf": float("inf")}[kind]
    return ciphertexts_to_bytes([ct])


@pytest.mark.parametrize(("kind", "match"), [("nan", "scale: expected exactly"), ("off-1e-10", "scale: expected exactly"),
                                             ("inf", "scale: expected exactly"), ("zero-non-ntt", "is_ntt_form")])
def test_ciphertexts_that_seal_would_fail_on_are_refused_before_evaluation(app_client, tiny_key, kind: str,
                                                                           match: str) -> None:
    # 19.4: a NaN scale or one off by 1e-10 passed, and an all-zero non-NTT ciphertext was accepted: SEAL then
    # failed mid-evaluation and the client got a 500
    ring, he, key = tiny_key
    r = _infer(app_client, "tiny-he", he, key, _crafted(ring, he, kind))
    assert r.status_code == 400 and match in r.json()["error"], r.text


def test_seal_errors_during_evaluation_are_400_with_one_log_line(app_client, tiny_key, caplog, monkeypatch) -> None:
    # 19.4: a SEAL error mid-evaluation was a 500 with two full tracebacks in the log (a log flood for anyone)
    ring, he, key = tiny_key
    model = app_client.app.state.dataplane.get_model("tiny-he")

    def seal_refuses(cts, keys):
        raise ValueError("encrypted_ntt is not valid for encryption parameters")

    monkeypatch.setattr(model.stages[0].evaluator, "run", seal_refuses)
    with caplog.at_level("INFO"):
        r = _infer(app_client, "tiny-he", he, key, ring.encrypt_to_bytes([_vector(he)]))
    assert r.status_code == 400 and "SEAL refused" in r.json()["error"]
    records = [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert len(records) == 1 and records[0].exc_info is None and "SEAL refused" in records[0].getMessage()
    monkeypatch.undo()
    assert _infer(app_client, "tiny-he", he, key, ring.encrypt_to_bytes([_vector(he)])).status_code == 200


def test_each_request_envelope_is_opened_once(app_client, tiny_key, monkeypatch) -> None:
    """Issue 32: the envelope was opened (unpacked and its checksum computed) twice per request; a wrong plan hash
    is still refused naming the field."""
    from veil.engine import he_model
    from veil.he.envelope import open_envelope

    ring, he, key = tiny_key
    opened: list[int] = []

    def counting(data: bytes, **expect):
        opened.append(len(data))
        return open_envelope(data, **expect)

    monkeypatch.setattr(he_model, "open_envelope", counting)
    assert _infer(app_client, "tiny-he", he, key, ring.encrypt_to_bytes([_vector(he)])).status_code == 200
    assert len(opened) == 1
    r = _infer(app_client, "tiny-he", {**he, "plan_hash": "0" * 64}, key, ring.encrypt_to_bytes([_vector(he)]))
    assert r.status_code == 400 and f"envelope.plan_hash: expected {he['plan_hash']!r}" in r.json()["error"]


# -- issue 18 §2: plans deeper than one parameter set, in client-refresh rounds ---------------------------------
@pytest.fixture(scope="module")
def deep_repo(tmp_path_factory):
    """A depth-2 PolyMLP (11 levels) exported with --refresh and N <= 16384: 2 rounds, cut between the blocks."""
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
    # the cut is the cost model's choice among the candidates (he/cost.py), not a fixed one
    [cut] = manifest["cuts"]
    assert manifest["rounds"] == 2 and manifest["segmentation"]["cuts"] == [cut]
    assert cut in manifest["segmentation"]["candidates"]
    assert "segments.json" in (repo / "deep-he" / "config.pbtxt").read_text()
    session = HeSession.create(deep_live, "deep-he", tmp_path / "k.keyring")
    he = session.he
    assert he["rounds"] == 2 and [s["input"] for s in he["segments"]] == ["x", cut]
    assert all("ops" not in s["plan"] for s in he["segments"])  # layouts only, no program or weights
    x = data.x_test[:3]
    logits = session.run(x)
    expected = reference(repo, x)
    assert np.abs(logits - expected).max() < 1e-2 and np.array_equal(logits.argmax(1), expected.argmax(1))
    assert [r["round"] for r in session.last_rounds] == [0, 1] and session.last_rounds[0]["refresh_seconds"] > 0
    again = HeSession.load(tmp_path / "k.keyring")  # every key set is saved and reloaded
    np.testing.assert_allclose(again.decrypt(again.infer(again.encrypt(x))), logits, atol=1e-2)


@pytest.fixture(scope="module")
def replicated_deep_live(deep_repo, oip, tmp_path_factory):
    """The same depth-2 PolyMLP exported with --refresh --replicate (every segment one image per ciphertext, its block
    tiled by the client), behind a server of its own (its key sets count against no other test's source bound)."""
    _, _, manifest = deep_repo
    repo = tmp_path_factory.mktemp("he-deep-one") / "repo"
    one = export_he(manifest["source"]["checkpoint"], repo, "deep-he-one", refresh=True,
                    max_poly_modulus_degree=16384, replicate=True)
    with oip.live_server(oip.make_config(repo)) as (url, _server):
        yield f"http://{url}", one


def test_replicated_refresh_rounds_tile_each_image_and_match_plaintext(deep_repo, replicated_deep_live,
                                                                       tmp_path) -> None:
    repo, data, _ = deep_repo
    url, manifest = replicated_deep_live
    assert manifest["rounds"] == 2 and manifest["segmentation"]["replicated"] == [True, True]
    session = HeSession.create(url, "deep-he-one", tmp_path / "k.keyring")
    assert all(s["plan"]["replicated"] and s["plan"]["batch_capacity"] == 1 for s in session.he["segments"])
    x = data.x_test[:3]  # three ciphertexts a round, each one image repeated over its slots
    logits = session.run(x)
    expected = reference(repo, x)
    assert np.abs(logits - expected).max() < 1e-2 and np.array_equal(logits.argmax(1), expected.argmax(1))
    assert [r["round"] for r in session.last_rounds] == [0, 1]


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


def test_a_deep_models_rounds_share_one_encoding_budget(deep_repo, oip) -> None:
    # --he-encoded-mb bounds the masks a model keeps encoded, over all its rounds (each round's evaluator used to
    # take the whole 4 GiB default for itself: a CIFAR-size model's server passed 10 GB); 0 encodes none at load
    from veil.engine.dataplane import DataPlane
    from veil.engine.metrics import Metrics
    from veil.engine.server import open_keystore

    repo, _, _ = deep_repo
    config = oip.make_config(repo)
    planes = {mb: DataPlane(repo, config.replace(he_encoded_mb=mb).runtime_options(), Metrics(),
                            lambda: open_keystore(config)) for mb in (0.0, 1.0)}
    for mb, plane in planes.items():
        plane.load_all(["deep-he"])
        stages = plane.models["deep-he"]["1"].stages
        left = [stage.evaluator.encoded_bytes_left for stage in stages]
        assert len(stages) == 2 and left == sorted(left, reverse=True) and 0 <= left[-1] <= mb * 2**20
    assert planes[0.0].models["deep-he"]["1"].stages[-1].evaluator.encoded_bytes_left == 0
    with pytest.raises(ValueError, match="he_encoded_mb: expected >= 0, received -1"):
        config.replace(he_encoded_mb=-1.0).validate()


def test_a_deep_models_rounds_share_one_worker_pool(deep_repo, oip, tmp_path) -> None:
    # --he-processes 2: one pool for the model (a pool per round forked a worker per round, each parsing the same key
    # set: a ResNet-20's 10 rounds took the server past 17 GB), forked at the first request, after every round is
    # encoded and the client's keys are held, so the worker shares them (tests/he/test_parallel.py)
    from veil.engine.dataplane import DataPlane
    from veil.engine.metrics import Metrics
    from veil.engine.server import open_keystore

    repo, data, _ = deep_repo  # keys in a folder of its own: deep_live counts <repo>/.he-keys against its bound
    config = oip.make_config(repo, he_key_dir=str(tmp_path / "keys")).replace(he_processes=2)
    plane = DataPlane(repo, config.runtime_options(), Metrics(), lambda: open_keystore(config))
    plane.load_all(["deep-he"])
    stages = plane.models["deep-he"]["1"].stages
    pools = {id(stage.evaluator.pool) for stage in stages}
    assert len(stages) == 2 and len(pools) == 1 and all(stage.evaluator.workers == [] for stage in stages)
    with oip.live_server(config) as (url, server):  # the rounds run on one worker, end to end
        session = HeSession.create(f"http://{url}", "deep-he", tmp_path / "k.keyring")
        x = data.x_test[:3]
        logits, expected = session.run(x), reference(repo, x)
        served = [stage.evaluator for stage in server.config.app.state.dataplane.models["deep-he"]["1"].stages]
        assert served[0].worker_pids() == served[1].worker_pids() and len(served[0].worker_pids()) == 1
        processes = [worker.process for worker in served[0].workers]
        assert len(processes) == 1 and processes[0].is_alive()
        served = served[0]
    assert np.abs(logits - expected).max() < 1e-2 and np.array_equal(logits.argmax(1), expected.argmax(1))
    # the server's shutdown stops them (they lived on in the process that ran the server, holding its memory)
    assert served.workers == [] and not processes[0].is_alive()


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


def test_fuzzed_key_uploads_and_requests_get_4xx_and_the_server_keeps_serving(app_client, tiny_key) -> None:
    # issue 19, fuzzing in CI: mutated key bundles and request envelopes over HTTP never get a 5xx
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from veil.he.envelope import seal_envelope

    ring, he, key = tiny_key
    bundle = ring.evaluation_keys().to_bytes()
    envelope = seal_envelope(ring.encrypt_to_bytes([_vector(he)]), kind="request", key_id=key["key_id"],
                             params_hash=he["params_hash"], plan_hash=he["plan_hash"], meta={"batch": 1})

    @st.composite
    def mutated(draw, data: bytes) -> bytes:
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
        return bytes(out[:draw(st.integers(0, len(out)))]) if draw(st.booleans()) else bytes(out)

    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(upload=mutated(bundle) | st.binary(max_size=256), request=mutated(envelope))
    def probe(upload: bytes, request: bytes) -> None:
        r = app_client.post("/v2/he/keys", content=upload)
        assert 400 <= r.status_code < 500 and "error" in r.json(), r.text
        header = json.dumps({"inputs": [{"name": "ciphertext", "shape": [1], "datatype": "BYTES",
                                         "parameters": {"binary_data_size": 4 + len(request)}}],
                             "parameters": {"key_id": key["key_id"], "key_secret": key["key_secret"]}}).encode()
        r = app_client.post("/v2/models/tiny-he/infer", content=header + struct.pack("<I", len(request)) + request,
                            headers={"Inference-Header-Content-Length": str(len(header))})
        assert r.status_code == 200 or (400 <= r.status_code < 500 and "error" in r.json()), r.text  # 200: unchanged

    probe()
    assert app_client.get("/v2/health/ready").status_code == 200
    assert _infer(app_client, "tiny-he", he, key, ring.encrypt_to_bytes([_vector(he)])).status_code == 200
