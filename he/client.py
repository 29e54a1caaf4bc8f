"""Encrypted inference from the client's side: keys stay here, only ciphertexts and evaluation keys travel.

    session = HeSession.create("http://127.0.0.1:8000", "digits-he", "keys/digits.keyring")  # keygen + register
    request = session.encrypt(x)                 # envelope bytes (seeded ciphertexts)
    response = session.infer(request)            # POST /v2/models/digits-he/infer, binary BYTES tensor
    logits = session.decrypt(response)           # (B, 10)

Only the standard library talks HTTP here, so a client needs ``veil[client]`` (numpy + tenseal), not torch.
Never send decrypted results back to the server: CKKS decryptions leak information about the secret key
(Li–Micciancio, EUROCRYPT 2021), see docs/he.md.
"""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from veil.he.envelope import open_envelope, seal_envelope
from veil.he.errors import HEError, KeyringError
from veil.he.keys import SecretKeyring
from veil.he.params import CkksParameters
from veil.he.plan import Plan
from veil.he.serialize import ciphertexts_from_bytes

from veil.config import write_atomic


class ServerError(HEError):
    """The server refused a request; the message carries its HTTP status and OIP error text."""


def _request(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[bytes, dict[str, str]]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=600) as response:
            return response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise ServerError(f"{url}: HTTP {exc.code}: {detail}") from None


@dataclass
class HeSession:
    """A client's keyring plus what it registered: server, model, key id and secret, hashes and the plan layout."""

    url: str
    model: str
    key_id: str
    keyring: SecretKeyring
    he: dict[str, Any]  # the model metadata's parameters.he (parameters, hashes, key manifest, plan layout)
    key_secret: str = ""  # returned by POST /v2/he/keys; the server requires it to use or delete the key set

    @property
    def plan(self) -> Plan:
        return Plan(self.he["plan"], {})  # layout only: encode/decode need no weights

    @staticmethod
    def model_he(url: str, model: str) -> dict[str, Any]:
        body, _ = _request(f"{url}/v2/models/{model}")
        he = json.loads(body).get("parameters", {}).get("he")
        if he is None:
            raise ServerError(f"model '{model}' at {url} is not an encrypted-inference model (no parameters.he)")
        return he

    @classmethod
    def create(cls, url: str, model: str, keyring_path: str | Path, passphrase: str | None = None) -> HeSession:
        """Generate keys for the model's parameters and key manifest, save them, register the evaluation keys."""
        url = url.rstrip("/")
        he = cls.model_he(url, model)
        params = CkksParameters.from_dict(he["parameters"])
        if params.hash() != he["params_hash"]:
            raise ServerError(f"model '{model}': params_hash expected {params.hash()}, received {he['params_hash']}")
        keyring = SecretKeyring.generate(params, he["galois_steps"])
        keyring.save(keyring_path, passphrase)
        body, _ = _request(f"{url}/v2/he/keys", keyring.evaluation_keys().to_bytes(),
                           {"Content-Type": "application/octet-stream"})
        registered = json.loads(body)
        session = cls(url, model, registered["key_id"], keyring, he, registered["key_secret"])
        write_atomic(Path(f"{keyring_path}.json"), json.dumps(
            {"url": url, "model": model, "key_id": session.key_id, "key_secret": session.key_secret, "he": he},
            indent=1))
        return session

    @classmethod
    def load(cls, keyring_path: str | Path, passphrase: str | None = None) -> HeSession:
        info = json.loads(Path(f"{keyring_path}.json").read_text())
        if not info.get("key_secret"):
            raise KeyringError(f"{keyring_path}.json: key_secret expected (the server requires it since keys have "
                              "owners), received none; run `veil he keygen` again")
        return cls(info["url"], info["model"], info["key_id"], SecretKeyring.load(keyring_path, passphrase), info["he"],
                   info["key_secret"])

    def encrypt(self, x: np.ndarray) -> bytes:
        """Encrypt a batch (B, *input shape) into a request envelope for this model and key."""
        payload = self.keyring.encrypt_to_bytes(self.plan.encode_inputs(np.asarray(x)))
        return seal_envelope(payload, kind="request", key_id=self.key_id, params_hash=self.he["params_hash"],
                             plan_hash=self.he["plan_hash"], meta={"batch": len(x)})

    def infer(self, envelope: bytes) -> bytes:
        """POST the envelope as a BYTES tensor with the binary extension; returns the result envelope."""
        header = json.dumps({"inputs": [{"name": "ciphertext", "shape": [1], "datatype": "BYTES",
                                         "parameters": {"binary_data_size": 4 + len(envelope)}}],
                             "parameters": {"key_id": self.key_id, "key_secret": self.key_secret,
                                            "binary_data_output": True}}).encode()
        body, headers = _request(f"{self.url}/v2/models/{self.model}/infer",
                                 header + struct.pack("<I", len(envelope)) + envelope,
                                 {"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"})
        json_length = int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"])
        (size,) = struct.unpack_from("<I", body, json_length)
        return body[json_length + 4: json_length + 4 + size]

    def decrypt(self, envelope: bytes) -> np.ndarray:
        """Open a result envelope (checking key, parameters and plan) and decrypt it to (B, *output shape)."""
        opened = open_envelope(envelope, expect_kind="result", expect_key_id=self.key_id,
                               expect_params_hash=self.he["params_hash"], expect_plan_hash=self.he["plan_hash"])
        cts = ciphertexts_from_bytes(self.keyring.params, opened.payload)
        vectors = self.keyring.decrypt(cts)
        batch = opened.meta.get("batch") or len(vectors)
        return self.plan.decode_outputs(vectors, int(batch))
