"""POST /v2/recommend (issue 22): plaintext ranking, refusals with field/expected/received, bounded bodies, a fuzzed
body parser, the spec listed in model metadata, and private (CKKS) queries that equal the plaintext ranking: the
evaluation keys registered once with POST /v2/he/keys, each query carrying its ciphertexts only (issue 33 item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from veil.engine.errors import MalformedRequest
from veil.engine.recommend import parse_request
from veil.engine.server import ServerConfig, create_app
from veil.engine.toy import affine_model, write_repository
from veil.export.spec import write_spec
from veil.he.envelope import open_envelope, seal_envelope
from veil.he.errors import KeyringError
from veil.he.recommend import PrivateRecommendClient
from veil.pave import PaveVector, rank_models

IDENT = {"base": "toy-base", "base_sha256": "a" * 64, "projection_seed": 3, "rank": 2}
DIM = 40


def vec(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=DIM)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three toy models with model specs (m0 carries an adapter spec too), one broken spec, one model without."""
    root = tmp_path_factory.mktemp("recommend-repo")
    write_repository(root, {name: affine_model(seed=i) for i, name in enumerate(["m0", "m1", "m2", "broken", "plain"])})
    for i, name in enumerate(["m0", "m1", "m2"]):
        (root / name / "veil.json").write_text('{"kind": "onnx"}')
        write_spec(root, name, PaveVector("model", IDENT, vec(i)))
    write_spec(root, "m0", PaveVector("model", IDENT, vec(9)), adapter="a1")
    (root / "broken" / "pave.json").write_text('{"format": "veil-pave-spec"}')
    return root


@pytest.fixture(scope="module")
def client(repo: Path):
    config = ServerConfig(repo=str(repo), log_level="warning", intra_op_threads=1)
    with TestClient(create_app(config)) as c:
        yield c


def models() -> dict[str, PaveVector]:
    return {"m0": PaveVector("model", IDENT, vec(0)), "m1": PaveVector("model", IDENT, vec(1)),
            "m2": PaveVector("model", IDENT, vec(2)), "m0:a1": PaveVector("model", IDENT, vec(9))}


def user(seed: int = 1, ident: dict | None = None) -> PaveVector:
    return PaveVector("user", ident or IDENT, vec(seed) + 0.5 * vec(100 + seed))


def test_plaintext_ranking_matches_cosine_and_reports_settings(client: TestClient) -> None:
    u = user()
    r = client.post("/v2/recommend", json={"spec": u.to_dict()})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = rank_models(u, models())
    assert [x["model"] for x in body["ranking"]] == [n for n, _ in expected] and body["ranking"][0]["model"] == "m1"
    assert np.allclose([x["score"] for x in body["ranking"]], [s for _, s in expected], atol=1e-6)
    assert body["spec"] == u.settings() and body["models"] == 4 and body["skipped"] == ["broken"]
    top = client.post("/v2/recommend", json={"spec": u.to_dict(), "top_k": 2}).json()["ranking"]
    assert [x["model"] for x in top] == [n for n, _ in expected[:2]]


def test_spec_is_listed_in_model_metadata(client: TestClient) -> None:
    meta = client.get("/v2/models/m0").json()["parameters"]["veil"]
    assert meta["pave_spec"]["file"] == "pave.json" and meta["pave_spec"]["dim"] == DIM
    assert meta["pave_specs"]["a1"]["file"] == "pave/a1.json"
    assert meta["pave_spec"]["identity_hash"] == PaveVector("model", IDENT, vec(0)).identity_hash


@pytest.mark.parametrize(("body", "status", "needle"), [
    (b"not json", 400, "expected a JSON object, received invalid JSON"),
    (b"[1]", 400, "expected a JSON object, received list"),
    (b'{"spec": {}, "extra": 1}', 400, "received unknown ['extra']"),
    (b"{}", 400, "spec: expected a user PAVE spec"),
    (b'{"spec": {}, "top_k": 0}', 400, "top_k: expected an int >= 1, received 0"),
    (b'{"spec": {"format": "x"}}', 400, "spec: expected exactly the fields"),
])
def test_bad_bodies_get_400_naming_the_field(client: TestClient, body: bytes, status: int, needle: str) -> None:
    r = client.post("/v2/recommend", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status and needle in r.json()["error"], r.text


def test_other_base_wrong_kind_dim_and_content_type_are_refused(client: TestClient) -> None:
    other = user(ident=dict(IDENT, base_sha256="b" * 64))
    r = client.post("/v2/recommend", json={"spec": other.to_dict()})
    assert r.status_code == 400 and "identity.base_sha256: expected 'aaaa" in r.json()["error"]
    assert "different bases" in r.json()["error"]
    r = client.post("/v2/recommend", json={"spec": PaveVector("model", IDENT, vec(1)).to_dict()})
    assert r.status_code == 400 and "spec.kind: expected 'user', received 'model'" in r.json()["error"]
    short = PaveVector("user", IDENT, np.ones(DIM - 1))
    r = client.post("/v2/recommend", json={"spec": short.to_dict()})
    assert r.status_code == 400 and f"spec.dim: expected {DIM}" in r.json()["error"]
    r = client.post("/v2/recommend", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 400 and "Content-Type: expected application/json" in r.json()["error"]
    tampered = dict(user().to_dict(), identity_hash="0" * 64)
    r = client.post("/v2/recommend", json={"spec": tampered})
    assert r.status_code == 400 and "spec.identity_hash: expected" in r.json()["error"]


def test_request_size_is_bounded(client: TestClient) -> None:
    big = b'{"spec": "' + b"x" * (9 * 2**20) + b'"}'
    r = client.post("/v2/recommend", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "POST /v2/recommend's request limit" in r.json()["error"]
    assert client.get("/v2/health/live").status_code == 200  # and keeps serving


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                     max_leaves=12)
_SPEC = user().to_dict()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=200),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(sorted(_SPEC)), _JSON, max_size=8).map(
        lambda d: json.dumps({"spec": {**_SPEC, **d}}).encode()),
    st.tuples(st.sampled_from(sorted(_SPEC)), _JSON).map(lambda kv: json.dumps({"spec": {**_SPEC, kv[0]: kv[1]}}).encode()),
))
def test_fuzz_body_parser_refuses_with_malformed_request_only(body: bytes) -> None:
    """Any body: a (spec, top_k) or MalformedRequest (400) — never another exception (a 500)."""
    try:
        spec, top_k = parse_request(body)
    except MalformedRequest as exc:
        assert str(exc)
    else:
        assert spec.kind == "user" and spec.dim >= 1 and (top_k is None or top_k >= 1)


OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def registered(client: TestClient) -> PrivateRecommendClient:
    """A private client whose evaluation keys are registered once with POST /v2/he/keys (issue 33 item 6)."""
    c = PrivateRecommendClient(user(2))
    r = client.post("/v2/he/keys", content=c.evaluation_keys(), headers=OCTET)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["key_id"] == c.key_id and r.json()["bytes"] == len(c.evaluation_keys())
    c.key_secret = r.json()["key_secret"]
    return c


def test_private_round_trip_equals_plaintext_ranking(client: TestClient, registered: PrivateRecommendClient) -> None:
    """The server gets ciphertexts (and the registered keys' id and secret) only, returns one ciphertext; the
    decrypted ranking is the plaintext one (scores within 1e-4), on the first and on a repeat query."""
    u, c = user(2), registered
    plain = rank_models(u, models())
    for _ in range(2):
        query = c.query()
        assert u.vector.astype("<f4").tobytes() not in query
        r = client.post("/v2/recommend", content=query, headers=OCTET)
        assert r.status_code == 200, r.text[:300]
        ranking = c.ranking(r.content)
        assert [n for n, _ in ranking] == [n for n, _ in plain]
        assert max(abs(a - b) for (_, a), (_, b) in zip(sorted(ranking), sorted(plain), strict=True)) < 1e-4
    r = client.post("/v2/recommend", content=query[:-10] + b"0" * 10, headers=OCTET)
    assert r.status_code == 400 and "sha256" in r.json()["error"]
    other = PrivateRecommendClient(user(2, dict(IDENT, rank=3)), c.keyring, c.key_secret).query()
    r = client.post("/v2/recommend", content=other, headers=OCTET)
    assert r.status_code == 400 and "identity.rank: expected 2" in r.json()["error"]
    assert json.loads(client.get("/v2/models/m1").content)["name"] == "m1"


def test_repeat_private_query_sends_ciphertexts_only(client: TestClient, registered: PrivateRecommendClient) -> None:
    """Issue 33 item 6: the ~8.5 MiB of evaluation keys travel once (POST /v2/he/keys); a query is < 1 MiB."""
    keys, query = registered.evaluation_keys(), registered.query()
    assert len(keys) > 8 * 2**20 and len(query) < 2**20  # D = 40: one ciphertext (~160 KB)
    assert keys not in query and keys[:4096] not in query
    r = client.post("/v2/recommend", content=query, headers=OCTET)
    assert r.status_code == 200 and len(r.content) < 2**20


def test_private_query_needs_registered_keys(client: TestClient, registered: PrivateRecommendClient) -> None:
    """Missing key_secret 400, unknown key_id 404, another owner's secret 403, a query with inline keys 400 — each
    naming the field, as encrypted inference does — and the server keeps serving."""
    unregistered = PrivateRecommendClient(user(2))
    with pytest.raises(KeyringError, match="register"):
        unregistered.query()  # the client says what is missing before sending anything
    unregistered.key_secret = "never-registered"
    r = client.post("/v2/recommend", content=unregistered.query(), headers=OCTET)
    assert r.status_code == 404 and f"no evaluation keys registered under {unregistered.key_id}" in r.json()["error"]
    wrong = PrivateRecommendClient(user(2), registered.keyring, "not-the-secret").query()
    r = client.post("/v2/recommend", content=wrong, headers=OCTET)
    assert r.status_code == 403 and "key_secret: expected the secret returned" in r.json()["error"]
    env = open_envelope(registered.query())
    for meta, needle in ((dict(env.meta, key_secret=""), "envelope.meta.key_secret: expected the secret returned by "
                          "POST /v2/he/keys, received none"),
                         ({k: v for k, v in env.meta.items() if k != "key_secret"} | {"lengths": [1, 2]},
                          "envelope.meta.key_secret: expected the secret returned by POST /v2/he/keys, received a "
                          "query carrying its evaluation keys")):
        body = seal_envelope(env.payload, kind=env.kind, key_id=env.key_id, params_hash=env.params_hash,
                             plan_hash=env.plan_hash, meta=meta)
        r = client.post("/v2/recommend", content=body, headers=OCTET)
        assert r.status_code == 400 and needle in r.json()["error"], r.text
    bad_id = seal_envelope(env.payload, kind=env.kind, key_id="nope", params_hash=env.params_hash,
                           plan_hash=env.plan_hash, meta=env.meta)
    r = client.post("/v2/recommend", content=bad_id, headers=OCTET)
    assert r.status_code == 404 and "key_id: expected 64 lowercase hex digits" in r.json()["error"]
    r = client.post("/v2/recommend", content=registered.query(), headers=OCTET)  # keeps serving
    assert r.status_code == 200 and client.get("/v2/health/live").status_code == 200


def test_client_registers_once_then_ranks_over_http(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """PrivateRecommendClient.register / rank (urllib, here routed into the test app): the keys are uploaded once,
    registering again renews them with the held secret, and every query is the ciphertexts alone."""
    import veil.he.client as he_client

    sent: list[tuple[str, int]] = []

    def request(url: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 600.0):
        path = url.removeprefix("http://veil")
        sent.append((path, len(body or b"")))
        r = client.post(path, content=body, headers=headers or {})
        if r.status_code >= 400:
            raise he_client.ServerError(f"{url}: HTTP {r.status_code}: {r.text}")
        return r.content, dict(r.headers)

    monkeypatch.setattr(he_client, "_request", request)
    u = user(4)
    c = PrivateRecommendClient(u)
    first = c.rank("http://veil")  # registers, then queries
    assert [n for n, _ in first] == [n for n, _ in rank_models(u, models())]
    again = c.rank("http://veil")  # a repeat query: no keys sent
    assert [n for n, _ in again] == [n for n, _ in first]
    assert np.allclose([v for _, v in again], [v for _, v in first], atol=1e-4)
    renewed = c.register("http://veil")
    assert renewed["key_id"] == c.key_id and renewed["key_secret"] is None and c.key_secret
    assert [p for p, _ in sent] == ["/v2/he/keys", "/v2/recommend", "/v2/recommend", "/v2/he/keys"]
    assert sent[0][1] > 8 * 2**20 and all(n < 2**20 for p, n in sent if p == "/v2/recommend")
    assert c.last_request_bytes == sent[2][1]


def test_key_registration_refuses_a_secret_key(client: TestClient, registered: PrivateRecommendClient) -> None:
    """The recommendation's key registration is the key store's: a secret keyring is refused (403), never stored."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ring"
        registered.keyring.save(path, "a passphrase")
        r = client.post("/v2/he/keys", content=path.read_bytes(), headers=OCTET)
    assert r.status_code == 403 and "never the secret key" in r.json()["error"]


def test_private_client_needs_no_torch() -> None:
    """veil.he.recommend (the client side of private matching) imports no torch, onnx or safetensors."""
    import subprocess
    import sys

    code = ("import sys, veil.he.recommend; print(sorted(m for m in ('torch', 'onnx', 'safetensors', 'transformers') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def _nested(depth: int, leaf: object = 1) -> str:
    return '{"a":' * depth + json.dumps(leaf) + "}" * depth


@pytest.mark.parametrize("depth", [33, 990, 5000])
def test_deeply_nested_identity_is_400_at_parse_time(client: TestClient, depth: int) -> None:
    """Issue 31 item 8: an identity nested ~990 deep answered 500 RecursionError; nesting is bounded (32) at parse
    time, before the spec is hashed or compared (orjson itself refuses beyond 1024 levels, also 400)."""
    spec = json.dumps({**_SPEC, "identity": {**IDENT, "x": "HOLE"}}).replace('"HOLE"', _nested(depth))
    r = client.post("/v2/recommend", content=f'{{"spec": {spec}}}'.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert "nested at most 32 levels deep" in r.json()["error"] or "invalid JSON" in r.json()["error"]
    if depth < 1024:
        assert r.json()["error"].startswith("spec: expected JSON nested at most 32 levels deep")


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from([*sorted(_SPEC), "identity.x"]), depth=st.integers(1, 1100), leaf=_JSON,
       wrap=st.sampled_from(["object", "list"]))
def test_fuzz_spec_parser_with_deep_nesting(field: str, depth: int, leaf: object, wrap: str) -> None:
    """The recommend spec parser: any field (or an extra identity setting) nested to any depth is a spec or
    MalformedRequest, never another exception (RecursionError was a 500)."""
    nested = (_nested(depth, leaf) if wrap == "object" else "[" * depth + json.dumps(leaf) + "]" * depth)
    spec = {**_SPEC, "identity": {**IDENT, "x": "HOLE"}} if field == "identity.x" else {**_SPEC, field: "HOLE"}
    body = json.dumps({"spec": spec}).replace('"HOLE"', nested).encode()
    try:
        parse_request(body)
    except MalformedRequest as exc:
        assert str(exc)
