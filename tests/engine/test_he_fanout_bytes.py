"""HE fan-out without Ray (issue 32): a request's ciphertexts reach the workers as the client's bytes and come back
as bytes, so each ciphertext is parsed once by the server (its checks) and once by its worker, and serialized once.

Before, the server serialized its parsed ciphertexts again for the workers and parsed and re-serialized their
results: three bytes <-> SEAL conversions each way. The workers here are :class:`veil.engine.he_fanout.HeWorker`
objects called in this process, as the Ray actors call them.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tenseal.sealapi as sa
from veil.engine.he_fanout import HeWorker
from veil.he import serialize
from veil.he.client import HeSession
from veil.he.envelope import open_envelope


@pytest.fixture(scope="module")
def served(tiny_he_repo, oip, tmp_path_factory):
    """(config, the served model, a client session with registered keys): one key generation for the module."""
    config = oip.make_config(tiny_he_repo)
    with oip.live_server(config) as (url, server):
        model = server.config.app.state.dataplane.get_model("tiny-he")
        session = HeSession.create(f"http://{url}", "tiny-he", tmp_path_factory.mktemp("keys") / "k.keyring")
        yield config, model, session
        model.fan_out = None


class InProcessPool:
    """A :class:`veil.engine.he_model.FanOut` whose workers are HeWorker objects of this process."""

    def __init__(self, folder: str, config: dict, workers: int) -> None:
        self.workers = [HeWorker(folder, config) for _ in range(workers)]
        self.ready = True
        self.calls: list[int] = []

    def __call__(self, index: int, key_id: str, key_secret: str, payloads: list[bytes]) -> list[bytes]:
        self.calls.append(len(payloads))
        return [w.evaluate(index, key_id, key_secret, p) for w, p in zip(self.workers, payloads, strict=False)]


def count_conversions(monkeypatch) -> dict[str, int]:
    """Count SEAL ciphertexts loaded from bytes and saved to bytes (keys and plaintexts are not counted)."""
    counts = {"parsed": 0, "serialized": 0}
    load, save = serialize.seal_from_bytes, serialize.seal_to_bytes

    def counted_load(obj, context, data, **kwargs):
        counts["parsed"] += isinstance(obj, sa.Ciphertext)
        return load(obj, context, data, **kwargs)

    def counted_save(obj, **kwargs):
        counts["serialized"] += isinstance(obj, sa.Ciphertext)
        return save(obj, **kwargs)

    monkeypatch.setattr(serialize, "seal_from_bytes", counted_load)
    monkeypatch.setattr(serialize, "seal_to_bytes", counted_save)
    return counts


def test_fan_out_parses_each_ciphertext_once_per_process_and_serializes_it_once(tiny_he_repo, served,
                                                                                monkeypatch) -> None:
    config, model, session = served
    model.fan_out = None
    capacity = session.layout(0).batch_capacity
    x = np.random.default_rng(1).normal(size=(3 * capacity + 1, 6)).astype(np.float32)  # 4 ciphertexts
    request = session.encrypt(x)
    local = session.infer(request)  # evaluated in the server (no workers): the reference
    pool = InProcessPool(str(model.path.parent), config.to_dict(), workers=2)
    model.fan_out = pool
    session.infer(request)  # the workers parse and cache the key set once; counted below is a request after it
    with monkeypatch.context() as patch:
        counts = count_conversions(patch)
        fanned = session.infer(request)
    model.fan_out = None
    assert pool.calls == [2, 2]  # two requests, each in two chunks
    assert counts == {"parsed": 4 + 4, "serialized": 4}  # was 12 and 12: the server re-serialized and re-parsed
    assert open_envelope(fanned, expect_kind="result").meta["ciphertexts"] == 4
    assert open_envelope(fanned).payload == open_envelope(local).payload  # the same ciphertexts, bit for bit
    logits = session.decrypt(fanned)
    expected = ort.InferenceSession(str(tiny_he_repo / "plain" / "1" / "model.onnx")).run(None, {"x": x})[0]
    assert np.abs(logits - expected).max() < 1e-2


def test_without_workers_each_ciphertext_is_parsed_and_serialized_once(served, monkeypatch) -> None:
    _, model, session = served
    model.fan_out = None
    request = session.encrypt(np.zeros((2 * session.layout(0).batch_capacity, 6), np.float32))  # 2 ciphertexts
    with monkeypatch.context() as patch:
        counts = count_conversions(patch)
        session.infer(request)
    assert counts == {"parsed": 2, "serialized": 2}


def test_a_worker_result_with_a_missing_ciphertext_is_an_evaluation_failure(served) -> None:
    """The server checks the workers' containers (count per chunk) without parsing their ciphertexts."""
    from veil.he.client import ServerError

    config, model, session = served
    pool = InProcessPool(str(model.path.parent), config.to_dict(), workers=2)

    class DropsOne:
        workers, ready = pool.workers, True

        def __call__(self, *args):
            out = pool(*args)
            return [out[0], serialize.blobs_to_bytes(serialize.ciphertext_blobs(out[1])[:-1])]

    model.fan_out = DropsOne()
    request = session.encrypt(np.zeros((4 * session.layout(0).batch_capacity, 6), np.float32))
    try:
        with pytest.raises(ServerError, match=r"expected \[2, 2\] ciphertexts back, received \[2, 1\]"):
            session.infer(request)
    finally:
        model.fan_out = None
