"""Encrypted inference from the client's side: keys stay here, only ciphertexts and evaluation keys travel.

    session = HeSession.create("http://127.0.0.1:8000", "digits-he", "keys/digits.keyring")  # keygen + register
    request = session.encrypt(x)                 # envelope bytes (seeded ciphertexts)
    response = session.infer(request)            # POST /v2/models/digits-he/infer, binary BYTES tensor
    logits = session.decrypt(response)           # (B, 10)

A deep model (``parameters.he.rounds`` > 1, see docs/he.md "Deep plans") runs in rounds: ``infer`` decrypts
each intermediate result, re-encodes it for the next segment and sends a *fresh* encryption under that
segment's keys (one key set per parameter set); only fresh encryptions ever go back to the server.

Only the standard library talks HTTP here, so a client needs ``veil[client]`` (numpy + tenseal), not torch.
Never send decrypted results back to the server: CKKS decryptions leak information about the secret key
(Li–Micciancio, EUROCRYPT 2021), see docs/he.md.
"""

from __future__ import annotations

import json
import struct
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from veil.he.contract import check_input
from veil.he.envelope import open_envelope, seal_envelope
from veil.he.errors import HEError, KeyringError
from veil.he.keys import SecretKeyring
from veil.he.params import CkksParameters
from veil.he.plan import Plan
from veil.he.serialize import ciphertexts_from_bytes

from veil.atomic import write_atomic


class ServerError(HEError):
    """The server refused a request; the message carries its HTTP status and OIP error text."""


def _request(url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
             timeout: float = 600.0) -> tuple[bytes, dict[str, str]]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise ServerError(f"{url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:  # no server there: one line, not 65 of urllib (issue 31)
        reason = getattr(exc, "reason", exc)
        raise ServerError(f"{url}: expected a veil server answering there, received no answer ({reason}); start "
                          "it with `veil serve` or check --server") from None


@dataclass
class HeSession:
    """A client's keyring plus what it registered: server, model, key id and secret, hashes and the plan layout."""

    url: str
    model: str
    key_id: str
    keyring: SecretKeyring
    he: dict[str, Any]  # the model metadata's parameters.he (parameters, hashes, key manifest, plan layout)
    key_secret: str = ""  # returned by POST /v2/he/keys; the server requires it to use or delete the key set
    # params hash -> (key id, key secret, keyring) of every parameter set a deep model's segments use
    rings: dict[str, tuple[str, str, SecretKeyring]] = field(default_factory=dict)
    last_rounds: list[dict[str, Any]] = field(default_factory=list)  # per round of the last infer: times, bytes

    def __post_init__(self) -> None:
        self.rings.setdefault(self.he["params_hash"], (self.key_id, self.key_secret, self.keyring))

    @property
    def plan(self) -> Plan:
        return self.layout(0)

    @property
    def segments(self) -> list[dict[str, Any]]:
        """Per round: parameters, hashes, key manifest and layout (one entry for a one-round model)."""
        return self.he.get("segments") or [{"index": 0, **{k: self.he[k] for k in (
            "parameters", "params_hash", "plan_hash", "galois_steps", "plan")}}]

    def layout(self, k: int) -> Plan:
        """Segment k's slot layout only: encode/decode need no weights."""
        return Plan(self.segments[k]["plan"], {})

    def _ring(self, k: int) -> tuple[str, str, SecretKeyring]:
        return self.rings[self.segments[k]["params_hash"]]

    @staticmethod
    def model_he(url: str, model: str) -> dict[str, Any]:
        """The model metadata's ``parameters.he``, with the input contract (``parameters.veil.input``) as ``input``."""
        body, _ = _request(f"{url}/v2/models/{model}")
        parameters = json.loads(body).get("parameters", {})
        he = parameters.get("he")
        if he is None:
            raise ServerError(f"model '{model}' at {url} is not an encrypted-inference model (no parameters.he)")
        contract = (parameters.get("veil") or {}).get("input")
        return {**he, "input": contract} if contract else he

    @property
    def input_contract(self) -> dict[str, Any] | None:
        """What one input sample must be (dtype, shape, scale, range), as the model's export recorded it."""
        return self.he.get("input")

    def check_input(self, x: Any) -> np.ndarray:
        """``x`` as float64 (B, *input shape) if it meets the model's input contract (shape, a numeric dtype,
        finite values, the declared value range), else :class:`~veil.he.errors.InputContractError`."""
        return check_input(x, self.input_contract, self.layout(0).spec["inputs"][0]["shape"])

    @classmethod
    def create(cls, url: str, model: str, keyring_path: str | Path, passphrase: str | None = None,
               progress: bool = True) -> HeSession:
        """Generate keys for the model's parameters and key manifest, save them, register the evaluation keys.

        With ``progress`` (and ``TQDM_DISABLE`` unset) each key object generated and each upload is reported on
        stderr: key generation of a deep model takes tens of seconds."""
        url = url.rstrip("/")
        he = cls.model_he(url, model)
        sets: dict[str, tuple[CkksParameters, set[int]]] = {}  # one key set per parameter set, in round order
        for seg in he.get("segments") or [he]:
            params = CkksParameters.from_dict(seg["parameters"])
            if params.hash() != seg["params_hash"]:
                raise ServerError(f"model '{model}': params_hash expected {params.hash()}, received {seg['params_hash']}")
            sets.setdefault(seg["params_hash"], (params, set()))[1].update(seg["galois_steps"])
        rings, files = {}, []
        report = _Progress(progress)
        for j, (params_hash, (params, steps)) in enumerate(sets.items()):
            keyring = SecretKeyring.generate(params, sorted(steps))
            keyring.save(_ring_path(keyring_path, j), passphrase)
            what = f"key set {j + 1}/{len(sets)} (N={params.poly_modulus_degree}, {len(steps)} rotation steps)"
            bundle = keyring.evaluation_keys(progress=lambda done, total, what=what: report(
                f"{what}: generated {done}/{total} key objects")).to_bytes()
            report(f"{what}: uploading {len(bundle) / 2**20:.1f} MiB")
            body, _ = _request(f"{url}/v2/he/keys", bundle, {"Content-Type": "application/octet-stream"})
            registered = json.loads(body)
            rings[params_hash] = (registered["key_id"], registered["key_secret"], keyring)
            files.append({"params_hash": params_hash, "key_id": registered["key_id"],
                          "key_secret": registered["key_secret"]})
        key_id, key_secret, keyring = next(iter(rings.values()))
        session = cls(url, model, key_id, keyring, he, key_secret, rings)
        write_atomic(Path(f"{keyring_path}.json"), json.dumps(  # holds the bearer key_secrets: never 0644
            {"url": url, "model": model, "key_id": key_id, "key_secret": key_secret, "he": he, "key_sets": files},
            indent=1), mode=0o600)
        return session

    @classmethod
    def load(cls, keyring_path: str | Path, passphrase: str | None = None) -> HeSession:
        info = json.loads(Path(f"{keyring_path}.json").read_text())
        if not info.get("key_secret"):
            raise KeyringError(f"{keyring_path}.json: key_secret expected (the server requires it since keys have "
                              "owners), received none; run `veil he keygen` again")
        rings = {s["params_hash"]: (s["key_id"], s["key_secret"], SecretKeyring.load(_ring_path(keyring_path, j), passphrase))
                 for j, s in enumerate(info.get("key_sets", []))}
        return cls(info["url"], info["model"], info["key_id"], SecretKeyring.load(keyring_path, passphrase), info["he"],
                   info["key_secret"], rings)

    def encrypt(self, x: np.ndarray) -> bytes:
        """Encrypt a batch (B, *input shape) into the (first round's) request envelope for this model and key.

        ``x`` is checked against the model's input contract first (:meth:`check_input`): a wrong shape, a
        non-numeric dtype, NaN/inf or values outside the declared range (raw 0-16 digits for a model trained on
        pixel / 16) raise :class:`~veil.he.errors.InputContractError` before anything is encrypted."""
        return self._request_envelope(0, self.check_input(x), None)

    def _request_envelope(self, k: int, x: np.ndarray, request_id: str | None) -> bytes:
        """Round k's request: ``x`` encoded with segment k's input layout, encrypted fresh under its keys."""
        seg, (key_id, _, ring) = self.segments[k], self._ring(k)
        payload = ring.encrypt_to_bytes(self.layout(k).encode_inputs(x))  # new randomness, top level
        meta: dict[str, Any] = {"batch": len(x)}
        if len(self.segments) > 1:
            meta |= {"round": k, "plan_hash": self.he["plan_hash"]}
            meta |= {"key_ids": [self._ring(i)[0] for i in range(len(self.segments))]} if k == 0 else \
                {"request_id": request_id}
        return seal_envelope(payload, kind="request", key_id=key_id, params_hash=seg["params_hash"],
                             plan_hash=seg["plan_hash"], meta=meta)

    def infer(self, envelope: bytes) -> bytes:
        """POST the envelope; for a deep model also every refresh round. Returns the final result envelope.

        ``last_rounds`` then holds, per round: server, HTTP (network + queueing) and client refresh seconds,
        and the bytes sent and received.
        """
        self.last_rounds = []
        try:
            k = open_envelope(envelope, expect_kind="request").meta.get("round", 0)
        except HEError:
            k = 0  # the server names what is wrong with it (400)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(self.segments):
            k = 0
        while True:
            start = time.perf_counter()
            result = self._post(envelope, *self._ring(k)[:2])
            http = time.perf_counter() - start
            meta = open_envelope(result, expect_kind="result").meta
            self.last_rounds.append({"round": k, "request_bytes": len(envelope), "result_bytes": len(result),
                                     "server_seconds": meta.get("server_seconds"), "http_seconds": round(http, 6)})
            if meta.get("final", True):
                return result
            start = time.perf_counter()
            envelope = self._refresh(result, k)
            self.last_rounds[-1]["refresh_seconds"] = round(time.perf_counter() - start, 6)
            k += 1

    def _refresh(self, result: bytes, k: int) -> bytes:
        """Round k's result -> round k+1's request: decrypt, decode, re-encode, encrypt fresh (never send back
        a decryption)."""
        opened, vectors = self._open(result, k)
        if opened.meta.get("final") or not opened.meta.get("request_id"):
            raise ServerError(f"round {k} result: expected an intermediate result with a request_id, received meta "
                              f"{ {m: opened.meta.get(m) for m in ('round', 'final', 'request_id')} }")
        x = self.layout(k).decode_outputs(vectors, int(opened.meta.get("batch") or len(vectors)))
        return self._request_envelope(k + 1, x, opened.meta["request_id"])

    def _open(self, envelope: bytes, k: int) -> tuple[Any, list[np.ndarray]]:
        """Open round k's result (key, parameters, plan and round checked) and decrypt it."""
        seg, (key_id, _, ring) = self.segments[k], self._ring(k)
        opened = open_envelope(envelope, expect_kind="result", expect_key_id=key_id,
                               expect_params_hash=seg["params_hash"], expect_plan_hash=seg["plan_hash"])
        if opened.meta.get("round", 0) != k:
            raise ServerError(f"result envelope: meta.round expected {k}, received {opened.meta.get('round')!r}")
        return opened, ring.decrypt(ciphertexts_from_bytes(ring.params, opened.payload))

    def run(self, x: np.ndarray) -> np.ndarray:
        """Encrypt, infer (all rounds) and decrypt a batch (B, *input shape) -> (B, *output shape)."""
        return self.decrypt(self.infer(self.encrypt(x)))

    def _post(self, envelope: bytes, key_id: str, key_secret: str) -> bytes:
        """POST one envelope as a BYTES tensor with the binary extension; returns the result envelope."""
        header = json.dumps({"inputs": [{"name": "ciphertext", "shape": [1], "datatype": "BYTES",
                                         "parameters": {"binary_data_size": 4 + len(envelope)}}],
                             "parameters": {"key_id": key_id, "key_secret": key_secret,
                                            "binary_data_output": True}}).encode()
        body, headers = _request(f"{self.url}/v2/models/{self.model}/infer",
                                 header + struct.pack("<I", len(envelope)) + envelope,
                                 {"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"})
        json_length = int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"])
        (size,) = struct.unpack_from("<I", body, json_length)
        return body[json_length + 4: json_length + 4 + size]

    def decrypt(self, envelope: bytes) -> np.ndarray:
        """Open the final result envelope (checking key, parameters, plan, round) and decrypt it to (B, *output shape)."""
        last = len(self.segments) - 1
        opened, vectors = self._open(envelope, last)
        if not opened.meta.get("final", True):
            raise ServerError(f"result envelope: round {last} expected final, received an intermediate result")
        batch = opened.meta.get("batch") or len(vectors)
        return self.layout(last).decode_outputs(vectors, int(batch))


class _Progress:
    """One stderr line per step with the seconds since the first (a log-friendly progress report)."""

    def __init__(self, enabled: bool) -> None:
        from veil.progress import progress_enabled

        self.enabled = progress_enabled(enabled)  # TQDM_DISABLE honoured as everywhere in veil
        self.start = time.perf_counter()

    def __call__(self, line: str) -> None:
        if self.enabled:
            import sys

            print(f"veil he: {line} ({time.perf_counter() - self.start:.1f} s)", file=sys.stderr, flush=True)


def _ring_path(keyring_path: str | Path, j: int) -> Path:
    """Where the j-th parameter set's keyring lives: the given path for the first, ``PATH.<j>`` after it."""
    return Path(keyring_path) if j == 0 else Path(f"{keyring_path}.{j}")
